-- Every method on every benchmark: mean and 95 % t interval over seeds of OOD average and worst-group
-- accuracy (ERM baselines as method 'erm'; predictions scored with `shiftbench eval` under their name), on the
-- splits' own images (images: real or generated; leaderboard_with_standins adds the stand-ins); acc_wg over grouping.
SELECT benchmark, method, setting, grouping, images, eval_split, metric, n_seeds, round(mean, 4) AS mean,
       round(ci_low, 4) AS ci_low, round(ci_high, 4) AS ci_high
FROM leaderboard
WHERE metric IN ('acc_avg', 'acc_wg') AND eval_split IN ('test', 'val')
ORDER BY benchmark, metric, mean DESC;
