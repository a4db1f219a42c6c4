-- BREEDS Section 5.1, Figure 5: robustness of standard models to subpopulation shift, source accuracy (id_test, else
-- id_val) against target accuracy (test) of each architecture on each task, and relative accuracy (target / source)
-- with the 95 % bootstrap interval the runs measured (acc_relative_low:/high:<source split>: one seed's interval;
-- with several seeds, the means of their ends). Per task, method, setting (the run's name without task and seed:
-- preset, with its hash when the run departs from it, and model) and image source (stand-in runs included and
-- labelled by image_source; data_tag: the task's @TAG); the architecture is the run's model (erm_runs.model). Standard
-- training only: no robustness intervention (erm_runs.config records "intervention" only when not none: Figure 6's
-- analysis, breeds_interventions.sql, has them) and no linear probe (retrained on the target domain). Built from the
-- per-run `results` joined with `erm_runs`, so only trained runs (scored predictions name no architecture) and never
-- a run of a hyperparameter search (its config records "search"): ordinary runs only, averaged over their seeds here.
WITH standard AS (
    SELECT run, version, model
    FROM erm_runs
    WHERE family = 'breeds'
      AND coalesce(json_extract_string(config, '$.intervention'), 'none') = 'none'
      AND coalesce(json_extract_string(config, '$.linear_probe'), 'false') <> 'true'
      AND coalesce(json_extract_string(config, '$.search'), '') = ''
),
runs AS (
    SELECT r.benchmark, r.data_tag, r.split_version, r.method, r.setting, r.image_source, r.seed, r.eval_split,
           r.metric, r.value, u.model
    FROM results AS r
    JOIN standard AS u ON u.run = r.run AND u.version = r.version
    WHERE r.metric = 'acc_avg' OR r.metric LIKE 'acc_relative_low:%' OR r.metric LIKE 'acc_relative_high:%'
),
means AS (
    SELECT benchmark, data_tag, split_version, method, setting, image_source, model, eval_split, metric,
           count(DISTINCT seed) AS n_seeds, avg(value) AS mean
    FROM runs
    GROUP BY ALL
),
source AS (
    SELECT * EXCLUDE (eval_split), eval_split AS source_split
    FROM means WHERE metric = 'acc_avg' AND eval_split IN ('id_test', 'id_val')
    QUALIFY row_number() OVER (PARTITION BY benchmark, split_version, method, setting, image_source, model
                               ORDER BY eval_split = 'id_test' DESC) = 1
),
target AS (SELECT * FROM means WHERE metric = 'acc_avg' AND eval_split = 'test'),
bounds AS (  -- the interval's ends per source split they were measured against
    SELECT benchmark, split_version, method, setting, image_source, model, split_part(metric, ':', 2) AS source_split,
           max(mean) FILTER (WHERE metric LIKE 'acc_relative_low:%') AS relative_low,
           max(mean) FILTER (WHERE metric LIKE 'acc_relative_high:%') AS relative_high
    FROM means
    WHERE eval_split = 'test' AND metric LIKE 'acc_relative_%:%'
    GROUP BY ALL
)
SELECT benchmark AS task, s.data_tag, split_version, method, setting, image_source, model,
       least(s.n_seeds, t.n_seeds) AS n_seeds, source_split, s.mean AS source_acc, t.mean AS target_acc,
       CASE WHEN s.mean > 0 THEN t.mean / s.mean END AS relative_acc, b.relative_low, b.relative_high
FROM source AS s
JOIN target AS t USING (benchmark, split_version, method, setting, image_source, model)
LEFT JOIN bounds AS b USING (benchmark, split_version, method, setting, image_source, model, source_split)
ORDER BY task, model, method, setting, image_source
