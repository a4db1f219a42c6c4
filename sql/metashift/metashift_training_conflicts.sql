-- MetaShift Section 4.3 / Figure 4: the conflict zones of every run tracked with track_conflicts. A pair of
-- subsets is in a conflict zone when training on the first raises the second's loss strongly and measurably:
-- its normalised coefficient (per evaluation subset, in [-1, 1]) is at most -0.5 and the coefficient lies at
-- least two standard errors below zero. `same_class` and `shared_context` (the context both subsets name, e.g.
-- 'sofa' for cat(sofa) and dog(sofa)) say whether the conflict is within a class or across classes in one
-- context: GROUP BY them for the zones per class and per context. Runs on the latest version of their split.
WITH pairs AS (
    SELECT c.benchmark AS task, nullif(split_part(c.benchmark, '@', 2), '') AS data_tag, c.run, c.split_version,
           u.image_source, c.training_subset, c.training_class, c.evaluation_subset, c.evaluation_class,
           c.evaluation_domain, c.coefficient, c.normalized_coefficient, c.std_error,
           c.coefficient / nullif(c.std_error, 0) AS t_value,
           regexp_extract(c.training_subset, '\((.*)\)$', 1) AS training_context,
           regexp_extract(c.evaluation_subset, '\((.*)\)$', 1) AS evaluation_context
    FROM erm_training_conflicts AS c
    JOIN erm_runs AS u ON u.run = c.run AND u.version = c.version
)
SELECT task, data_tag, run, split_version, image_source, training_subset, training_class, evaluation_subset,
       evaluation_class, evaluation_domain, training_class = evaluation_class AS same_class,
       CASE WHEN training_context = evaluation_context THEN training_context END AS shared_context,
       coefficient, normalized_coefficient, t_value
FROM pairs
WHERE normalized_coefficient <= -0.5 AND t_value <= -2
ORDER BY task, run, normalized_coefficient, training_subset, evaluation_subset
