-- One results vocabulary for every method (created after the table views): the baselines trained
-- here (ERM, reweighting, GroupDRO, IRM, CORAL: erm_results.method, 'erm' in runs older than the column)
-- next to predictions scored by `shiftbench eval` (the method they were submitted as). `results` shows only results on the latest version of their split (is_current), like its parts.
-- `setting` tells runs of one method apart: for trained runs the run's name without benchmark, seed and
-- stand-in tag ('smoke.mlp', 'smoke.mlp.groupdro', or 'smoke-<hash>.small_cnn' for a run that departed from
-- its preset), NULL for scored predictions.
-- Provenance: `image_source` is where a trained run's images came from, as its erm_runs row records it
-- (imagenet | gqa | celeba | sprites | user, or standin: generated stand-ins, not the dataset's images;
-- read from erm_runs, so runs published by older versions under a real run's name are labelled too),
-- 'predictions' for scored predictions (their images were never ours to see); `data_tag` is the `@TAG`
-- of the split's name (shiftbench/naming.py: 'generated', 'wordnet-default', ...; NULL for the papers'
-- names and the user's own).

CREATE OR REPLACE VIEW results_history AS
SELECT r.benchmark, nullif(split_part(r.benchmark, '@', 2), '') AS data_tag, r.split_version, r.family,
       coalesce(r.method, 'erm') AS method,
       regexp_replace(r.run[length(r.benchmark) + 2:], '\.seed[0-9]+(@standin)?$', '') AS setting,
       u.image_source, r.seed, r.run, r.version, r.eval_split, r.metric, r."group", r.value, r.is_current
FROM erm_results_history AS r
LEFT JOIN erm_runs_history AS u ON u.run = r.run AND u.version = r.version
UNION ALL
SELECT benchmark, nullif(split_part(benchmark, '@', 2), '') AS data_tag, split_version, family, method,
       NULL AS setting, 'predictions' AS image_source, seed, run, version, eval_split, metric, "group", value,
       is_current
FROM eval_results_history;

CREATE OR REPLACE VIEW results AS
SELECT h.*
FROM results_history AS h
SEMI JOIN latest_versions AS l ON l.benchmark = h.run AND l.version = h.version
WHERE h.is_current;

-- Per (benchmark, method, setting, image_source, eval_split, metric) over the seeds of the latest split
-- version: mean, sample standard deviation (ddof 1) and a 95 % Student t interval over seeds
-- (mean ± t(0.975, n-1) · s / √n; NULL below two seeds). Every metric but the per-group ones
-- (acc_group:<g>, count_group:<g>: groups may differ between submissions); acc_wg is aggregated as a
-- number, whichever group was worst. image_source is part of the key: seeds on stand-in images are never
-- averaged with seeds on real ones. `leaderboard_with_standins` holds every row; `leaderboard`, the one a
-- reader quotes, leaves the stand-in rows out (docs/results.md#leaderboard says why).
CREATE OR REPLACE VIEW leaderboard_with_standins AS
WITH per_seed AS (
    SELECT benchmark, data_tag, split_version, method, setting, image_source, eval_split, metric, seed, value
    FROM results
    WHERE metric NOT LIKE 'acc_group:%' AND metric NOT LIKE 'count_group:%'
),
t AS (
    SELECT * FROM (VALUES (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
        (8, 2.306), (9, 2.262), (10, 2.228), (11, 2.201), (12, 2.179), (13, 2.160), (14, 2.145), (15, 2.131),
        (16, 2.120), (17, 2.110), (18, 2.101), (19, 2.093), (20, 2.086), (25, 2.060), (30, 2.042), (40, 2.021),
        (60, 2.000), (120, 1.980)) AS v(df, t975)
),
stats AS (
    SELECT benchmark, data_tag, split_version, method, setting, image_source, eval_split, metric,
           count(value) AS n_seeds, avg(value) AS mean, stddev_samp(value) AS std
    FROM per_seed
    GROUP BY ALL
)
SELECT s.benchmark, s.data_tag, s.split_version, s.method, s.setting, s.image_source, s.eval_split, s.metric,
       s.n_seeds, s.mean, s.std,
       s.mean - q.t975 * s.std / sqrt(s.n_seeds) AS ci_low,
       s.mean + q.t975 * s.std / sqrt(s.n_seeds) AS ci_high
FROM stats AS s
-- t(0.975, n-1) from the table, at the largest tabulated df <= n-1 (conservative between rows).
LEFT JOIN (SELECT df, t975, lead(df, 1, 1000000) OVER (ORDER BY df) AS next_df FROM t) AS q
    ON s.n_seeds - 1 >= q.df AND s.n_seeds - 1 < q.next_df;

CREATE OR REPLACE VIEW leaderboard AS
SELECT *
FROM leaderboard_with_standins
WHERE image_source IS DISTINCT FROM 'standin';
