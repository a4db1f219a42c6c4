-- Every method on every benchmark: mean and 95 % t interval over seeds of OOD average and worst-group
-- accuracy (ERM baselines as method 'erm'; predictions scored with `shiftbench eval` under their name).
SELECT benchmark, method, setting, eval_split, metric, n_seeds, round(mean, 4) AS mean, round(ci_low, 4) AS ci_low,
       round(ci_high, 4) AS ci_high
FROM leaderboard
WHERE metric IN ('acc_avg', 'acc_wg') AND eval_split IN ('test', 'val')
ORDER BY benchmark, metric, mean DESC;
