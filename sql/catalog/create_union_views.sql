-- One results vocabulary for every method (created after the table views): the baselines trained
-- here (ERM, reweighting, GroupDRO, IRM, CORAL: erm_results.method, 'erm' in runs older than the column)
-- next to predictions scored by `shiftbench eval` (the method they were submitted as). `results` shows only results on the latest version of their split (is_current), like its parts.
-- `setting` tells runs of one method apart: for trained runs the run's name without benchmark, seed and
-- stand-in tag ('smoke.mlp', 'smoke.mlp.groupdro', or 'smoke-<hash>.small_cnn' for a run that departed from
-- its preset); for scored predictions the grouping part of the run's name ('by-object_color', NULL for the
-- split's own groups). `grouping` names the groups acc_wg and the per-group metrics are over: 'group' (the
-- split's own) or the metadata fields, comma-separated (a trained run's group_by, `shiftbench eval --group-by`).
-- Provenance: `image_source` is where the images came from: a trained run's, as its erm_runs row records it
-- (imagenet | gqa | celeba | sprites | user | standin; read from erm_runs, so runs published by older versions
-- under a real run's name are labelled too), for scored predictions the scored split's (eval_runs.image_source;
-- 'unrecorded' for versions scored before it was recorded). `images` is what that means (shiftbench/scoring/provenance.py, the
-- macro below): real | generated (the split's own images are generated: the ConDS sprites, NAME@generated) |
-- standin (generated stand-ins in place of the split's images) | unrecorded. `data_tag` is the `@TAG` of the
-- split's name (shiftbench/specs/naming.py: 'generated', 'wordnet-default', ...; NULL for the papers' names and the
-- user's own).

CREATE OR REPLACE MACRO shiftbench_images(image_source, data_tag) AS CASE
    WHEN image_source IS NULL OR image_source IN ('', 'unrecorded') THEN 'unrecorded'
    WHEN image_source = 'standin' THEN 'standin'
    WHEN image_source = 'sprites' OR data_tag IS NOT DISTINCT FROM 'generated' THEN 'generated'
    ELSE 'real'
END;

CREATE OR REPLACE VIEW results_history AS
WITH trained AS (
    SELECT r.*, nullif(split_part(r.benchmark, '@', 2), '') AS data_tag, u.image_source,
           coalesce(nullif(regexp_replace(json_extract_string(u.config, '$.group_by'), '\s', '', 'g'), ''), 'group')
               AS grouping
    FROM erm_results_history AS r
    LEFT JOIN erm_runs_history AS u ON u.run = r.run AND u.version = r.version
),
scored AS (
    SELECT r.*, nullif(split_part(r.benchmark, '@', 2), '') AS data_tag,
           coalesce(u.image_source, 'unrecorded') AS image_source,
           CASE WHEN len(coalesce(u.group_by, [])) = 0 THEN 'group' ELSE array_to_string(u.group_by, ',') END
               AS grouping
    FROM eval_results_history AS r
    LEFT JOIN eval_runs_history AS u ON u.run = r.run AND u.version = r.version
)
SELECT benchmark, data_tag, split_version, family, coalesce(method, 'erm') AS method,
       regexp_replace(run[length(benchmark) + 2:], '\.seed[0-9]+(@standin)?$', '') AS setting, grouping,
       image_source, shiftbench_images(image_source, data_tag) AS images, seed, run, version, eval_split, metric,
       "group", value, is_current
FROM trained
UNION ALL
SELECT benchmark, data_tag, split_version, family, method,
       nullif(regexp_extract(run[length(benchmark) + 2:], '^[a-z0-9_-]+\.(by-[^.]+)\.seed[0-9]+$', 1), '')
           AS setting,
       grouping, image_source, shiftbench_images(image_source, data_tag) AS images, seed, run, version, eval_split,
       metric, "group", value, is_current
FROM scored;

CREATE OR REPLACE VIEW results AS
SELECT h.*
FROM results_history AS h
SEMI JOIN latest_versions AS l ON l.benchmark = h.run AND l.version = h.version
WHERE h.is_current;

-- A hyperparameter search's picks (shiftbench/erm/search.py, shiftbench/scoring/selection.py): the runs whose config names a
-- search space, one per (benchmark, split version, learner, preset, space, images, selection method, trial = seed):
-- the draw scoring highest on the method's split and metric (selection_methods), ties to the lowest draw. n_draws:
-- the draws of that trial the method chose among (a draw without the method's split is not counted).
CREATE OR REPLACE VIEW search_selection AS
WITH runs AS (
    SELECT DISTINCT r.benchmark, r.data_tag, r.split_version, r.method, r.grouping, r.image_source, r.images,
           r.seed AS trial, r.run, r.version, u.model, u.preset, json_extract_string(u.config, '$.search') AS search,
           CAST(json_extract_string(u.config, '$.search_draw') AS BIGINT) AS draw
    FROM results AS r
    JOIN erm_runs_history AS u ON u.run = r.run AND u.version = r.version
    WHERE json_extract_string(u.config, '$.search') IS NOT NULL
),
scored AS (
    SELECT runs.*, m.selection, m.label AS selection_label, m.eval_split AS selection_split,
           m.metric AS selection_metric, v.value AS selection_value
    FROM runs
    CROSS JOIN selection_methods AS m
    JOIN results AS v ON v.run = runs.run AND v.version = runs.version AND v.eval_split = m.eval_split
        AND v.metric = m.metric
)
SELECT benchmark, data_tag, split_version, method, model, preset, search, grouping, image_source, images, selection,
       selection_label, selection_split, selection_metric, trial, draw, run, version, selection_value,
       count(*) OVER w AS n_draws
FROM scored
WINDOW w AS (PARTITION BY benchmark, split_version, method, model, preset, search, grouping, image_source, selection,
             trial)
QUALIFY row_number() OVER (w ORDER BY selection_value DESC, draw) = 1;

-- Per (benchmark, method, setting, grouping, image_source, eval_split, metric) over the seeds of the latest split
-- version: mean, sample standard deviation (ddof 1) and a 95 % Student t interval over seeds
-- (mean ± t(0.975, n-1) · s / √n; NULL below two seeds). Every metric but the per-group ones
-- (acc_group:<g>, count_group:<g>: groups may differ between submissions); acc_wg is aggregated as a
-- number, whichever group was worst, over the row's `grouping`. image_source is part of the key: seeds on
-- stand-in images are never averaged with seeds on real ones. `leaderboard_with_standins` holds every row;
-- `leaderboard`, the one a reader quotes, holds the rows on the splits' own images, real or generated, each
-- labelled by `images` (docs/results.md#results-and-the-leaderboard says why).
CREATE OR REPLACE VIEW leaderboard_with_standins AS
WITH per_seed AS (
    SELECT benchmark, data_tag, split_version, method, setting, grouping, image_source, images, eval_split, metric,
           seed, value, 'none' AS selection
    FROM results
    WHERE metric NOT LIKE 'acc_group:%' AND metric NOT LIKE 'count_group:%'
    UNION ALL
    -- a search's picks: one row per trial (its seed), the setting naming the preset, the space, the learner and the
    -- selection method (so that a query keyed on the setting, as the analyses are, never mixes two methods)
    SELECT p.benchmark, p.data_tag, p.split_version, p.method,
           p.preset || '.search-' || p.search || '.' || p.model || CASE WHEN p.method = 'erm' THEN '' ELSE '.' || p.method END
               || ':' || p.selection AS setting,
           p.grouping, p.image_source, p.images, r.eval_split, r.metric, p.trial AS seed, r.value, p.selection
    FROM search_selection AS p
    JOIN results AS r ON r.run = p.run AND r.version = p.version
    WHERE r.metric NOT LIKE 'acc_group:%' AND r.metric NOT LIKE 'count_group:%'
),
t AS (
    SELECT * FROM (VALUES (1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (6, 2.447), (7, 2.365),
        (8, 2.306), (9, 2.262), (10, 2.228), (11, 2.201), (12, 2.179), (13, 2.160), (14, 2.145), (15, 2.131),
        (16, 2.120), (17, 2.110), (18, 2.101), (19, 2.093), (20, 2.086), (25, 2.060), (30, 2.042), (40, 2.021),
        (60, 2.000), (120, 1.980)) AS v(df, t975)
),
stats AS (
    SELECT benchmark, data_tag, split_version, method, setting, grouping, image_source, images, eval_split, metric,
           selection, count(value) AS n_seeds, avg(value) AS mean, stddev_samp(value) AS std
    FROM per_seed
    GROUP BY ALL
)
SELECT s.benchmark, s.data_tag, s.split_version, s.method, s.setting, s.grouping, s.image_source, s.images,
       s.eval_split, s.metric, s.n_seeds, s.mean, s.std,
       s.mean - q.t975 * s.std / sqrt(s.n_seeds) AS ci_low,
       s.mean + q.t975 * s.std / sqrt(s.n_seeds) AS ci_high,
       s.selection
FROM stats AS s
-- t(0.975, n-1) from the table, at the largest tabulated df <= n-1 (conservative between rows).
LEFT JOIN (SELECT df, t975, lead(df, 1, 1000000) OVER (ORDER BY df) AS next_df FROM t) AS q
    ON s.n_seeds - 1 >= q.df AND s.n_seeds - 1 < q.next_df;

CREATE OR REPLACE VIEW leaderboard AS
SELECT *
FROM leaderboard_with_standins
WHERE images IN ('real', 'generated');
