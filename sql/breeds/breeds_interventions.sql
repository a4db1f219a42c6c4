-- BREEDS Section 5.2, Figure 6 (interventions of Appendix A.7.3, Table 14): relative accuracy (target / source) of
-- models trained with a robustness intervention beside standard training, with the 95 % bootstrap interval the runs
-- measured (acc_relative_low:/high:<source split>: one seed's interval; with several seeds, the means of their
-- ends). Per task, method, setting (the run's name without task and seed: preset, with its hash when the run departs
-- from it, and model) and image source (stand-in runs included and labelled by image_source; data_tag: the task's
-- @TAG): the architecture (erm_runs.model), the intervention (erm_runs.config's "intervention", recorded only when
-- not none) with its settings as a label, and the means over seeds of source accuracy (id_test, else id_val) and
-- target accuracy (test). Built from the per-run `results` joined with `erm_runs`, so only trained runs (scored
-- predictions name no architecture), never a linear probe (retrained on the target domain) and never a run of a
-- hyperparameter search (its config records "search"): ordinary runs only, averaged over their seeds here.
WITH trained AS (
    SELECT run, version, model, coalesce(json_extract_string(config, '$.intervention'), 'none') AS intervention,
           CASE coalesce(json_extract_string(config, '$.intervention'), 'none')
               WHEN 'gaussian_noise' THEN 'gaussian_noise std ' || json_extract_string(config, '$.noise_std')
               WHEN 'random_erasing' THEN 'random_erasing p ' || json_extract_string(config, '$.erasing_p')
                   || ' scale ' || array_to_string(CAST(json_extract(config, '$.erasing_scale') AS DOUBLE[]), '-')
                   || ' ratio ' || array_to_string(CAST(json_extract(config, '$.erasing_ratio') AS DOUBLE[]), '-')
               WHEN 'pgd_l2' THEN 'pgd_l2 eps ' || json_extract_string(config, '$.pgd_eps')
                   || ' step ' || json_extract_string(config, '$.pgd_step_size')
                   || ' steps ' || json_extract_string(config, '$.pgd_steps')
               ELSE coalesce(json_extract_string(config, '$.intervention'), 'none')
           END AS intervention_settings
    FROM erm_runs
    WHERE family = 'breeds'
      AND coalesce(json_extract_string(config, '$.linear_probe'), 'false') <> 'true'
      AND coalesce(json_extract_string(config, '$.search'), '') = ''
),
runs AS (
    SELECT r.benchmark, r.data_tag, r.split_version, r.method, r.setting, r.image_source, r.seed, r.eval_split,
           r.metric, r.value, u.model, u.intervention, u.intervention_settings
    FROM results AS r
    JOIN trained AS u ON u.run = r.run AND u.version = r.version
    WHERE r.metric = 'acc_avg' OR r.metric LIKE 'acc_relative_low:%' OR r.metric LIKE 'acc_relative_high:%'
),
means AS (
    SELECT benchmark, data_tag, split_version, method, setting, image_source, model, intervention,
           intervention_settings, eval_split, metric, count(DISTINCT seed) AS n_seeds, avg(value) AS mean
    FROM runs
    GROUP BY ALL
),
source AS (
    SELECT * EXCLUDE (eval_split), eval_split AS source_split
    FROM means WHERE metric = 'acc_avg' AND eval_split IN ('id_test', 'id_val')
    QUALIFY row_number() OVER (PARTITION BY benchmark, split_version, method, setting, image_source, model,
                                            intervention_settings
                               ORDER BY eval_split = 'id_test' DESC) = 1
),
target AS (SELECT * FROM means WHERE metric = 'acc_avg' AND eval_split = 'test'),
bounds AS (  -- the interval's ends per source split they were measured against
    SELECT benchmark, split_version, method, setting, image_source, model, intervention_settings,
           split_part(metric, ':', 2) AS source_split,
           max(mean) FILTER (WHERE metric LIKE 'acc_relative_low:%') AS relative_low,
           max(mean) FILTER (WHERE metric LIKE 'acc_relative_high:%') AS relative_high
    FROM means
    WHERE eval_split = 'test' AND metric LIKE 'acc_relative_%:%'
    GROUP BY ALL
)
SELECT benchmark AS task, s.data_tag, split_version, method, setting, image_source, model, s.intervention,
       intervention_settings, least(s.n_seeds, t.n_seeds) AS n_seeds, source_split, s.mean AS source_acc,
       t.mean AS target_acc, CASE WHEN s.mean > 0 THEN t.mean / s.mean END AS relative_acc, b.relative_low,
       b.relative_high
FROM source AS s
JOIN target AS t USING (benchmark, split_version, method, setting, image_source, model, intervention_settings)
LEFT JOIN bounds AS b
    USING (benchmark, split_version, method, setting, image_source, model, intervention_settings, source_split)
ORDER BY task, model, intervention_settings, method, setting, image_source
