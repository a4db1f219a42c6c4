-- ConDS Sections 4-5 (Figures 3-4): uniform-test accuracy per case, with its shift kind and its number
-- of concurrent shifts (0 for the uniform case), per method and image source (stand-in runs included and
-- labelled by image_source; data_tag: the case's @TAG, e.g. partial); the plot averages cases by kind and count.
SELECT c.benchmark AS conds_case, l.data_tag, c.dataset, c.shift_kind,
       CASE WHEN c.shift_kind = 'uniform' THEN 0 ELSE len(string_split(c.shift_kind, '+')) END AS n_shifts,
       l.split_version, l.method, coalesce(l.setting, '') AS setting, l.image_source, l.n_seeds,
       l.mean AS acc_mean, l.std AS acc_std
FROM leaderboard_with_standins AS l
JOIN conds_cases AS c ON c.benchmark = l.benchmark AND c.version = l.split_version
WHERE l.metric = 'acc_avg' AND l.eval_split = 'test'
ORDER BY c.dataset, n_shifts, c.shift_kind, conds_case, l.method, setting, l.image_source
