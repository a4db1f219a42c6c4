-- MetaShift Section 4.2 / Figure 5: out-of-distribution accuracy of every method against the measured
-- distance d between training and test subsets, per task family (task kind and classes). One row per
-- (task, method, setting, image source) over the seeds of the task's latest split version (the leaderboard's,
-- stand-in runs included and labelled by image_source; data_tag: the task's @TAG, e.g. generated).
SELECT t.benchmark AS task, l.data_tag, t.task_kind, array_to_string(t.classes, ',') AS classes, t.distance_class,
       t.distance, t.paper_distance, l.split_version, l.method, coalesce(l.setting, '') AS setting, l.image_source,
       l.eval_split, l.n_seeds, l.mean AS acc_mean, l.std AS acc_std
FROM leaderboard_with_standins AS l
JOIN metashift_tasks AS t ON t.benchmark = l.benchmark AND t.version = l.split_version
WHERE l.metric = 'acc_avg' AND l.eval_split = 'test' AND t.task_kind <> 'conflicts'  -- no distance to plot
ORDER BY t.task_kind, t.classes, t.distance, l.method, setting, l.image_source
