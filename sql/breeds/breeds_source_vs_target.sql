-- BREEDS Section 5 / Figure 4: accuracy on the source subpopulations (id_test, else id_val) against the
-- target subpopulations (test), and relative accuracy target / source, per task, method and image source
-- (stand-in runs included and labelled by image_source; data_tag: the task's @TAG, e.g. wordnet-default), with the
-- relative accuracy's 95 % bootstrap interval the runs measured (acc_relative_low:/high:<source split>).
WITH acc AS (
    SELECT benchmark, data_tag, split_version, method, coalesce(setting, '') AS setting, image_source, eval_split,
           n_seeds, mean
    FROM leaderboard_with_standins
    WHERE metric = 'acc_avg' AND benchmark IN (SELECT benchmark FROM benchmarks WHERE family = 'breeds')
),
source AS (
    SELECT * FROM acc WHERE eval_split IN ('id_test', 'id_val')
    QUALIFY row_number() OVER (PARTITION BY benchmark, split_version, method, setting, image_source
                               ORDER BY eval_split = 'id_test' DESC) = 1
),
bounds AS (
    SELECT benchmark, split_version, method, coalesce(setting, '') AS setting, image_source, metric, mean
    FROM leaderboard_with_standins
    WHERE eval_split = 'test' AND (metric LIKE 'acc_relative_low:%' OR metric LIKE 'acc_relative_high:%')
)
SELECT s.benchmark AS task, s.data_tag, s.split_version, s.method, s.setting, s.image_source,
       least(s.n_seeds, t.n_seeds) AS n_seeds, s.eval_split AS source_split, s.mean AS source_acc,
       t.mean AS target_acc, CASE WHEN s.mean > 0 THEN t.mean / s.mean END AS relative_acc,
       lo.mean AS relative_low, hi.mean AS relative_high
FROM source AS s
JOIN acc AS t ON t.benchmark = s.benchmark AND t.split_version = s.split_version AND t.method = s.method
    AND t.setting = s.setting AND t.image_source IS NOT DISTINCT FROM s.image_source AND t.eval_split = 'test'
LEFT JOIN bounds AS lo ON lo.benchmark = s.benchmark AND lo.split_version = s.split_version AND lo.method = s.method
    AND lo.setting = s.setting AND lo.image_source IS NOT DISTINCT FROM s.image_source
    AND lo.metric = 'acc_relative_low:' || s.eval_split
LEFT JOIN bounds AS hi ON hi.benchmark = s.benchmark AND hi.split_version = s.split_version AND hi.method = s.method
    AND hi.setting = s.setting AND hi.image_source IS NOT DISTINCT FROM s.image_source
    AND hi.metric = 'acc_relative_high:' || s.eval_split
ORDER BY task, s.method, s.setting, s.image_source
