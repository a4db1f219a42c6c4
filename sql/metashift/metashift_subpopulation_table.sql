-- MetaShift Section 4.2, Table 2: average and worst-group test accuracy of each method on cat vs dog with
-- indoor/outdoor as the spurious attribute, the minority groups p = 12 %, 6 % and 1 % of the 1,700 training images
-- (tasks cat-dog-indoor-outdoor-p12, -p06, -p01), beside the paper's numbers. Ours: the leaderboard's means over
-- seeds of the latest split versions, over the split's own groups (stand-in runs included and labelled by
-- image_source; data_tag: the task's @TAG). The paper's: ResNet-18 from ImageNet weights, DomainBed's protocol, on
-- the Visual Genome images. A method of the paper with no run here has a row with empty setting and image_source; a
-- run here of a method the paper did not run has NULL paper columns.
WITH paper(method, minority_percent, paper_acc_avg, paper_acc_wg) AS (
    VALUES ('erm', 12, 0.840, 0.715), ('erm', 6, 0.823, 0.701), ('erm', 1, 0.759, 0.562),
           ('irm', 12, 0.825, 0.729), ('irm', 6, 0.830, 0.715), ('irm', 1, 0.773, 0.528),
           ('groupdro', 12, 0.837, 0.701), ('groupdro', 6, 0.818, 0.715), ('groupdro', 1, 0.762, 0.576),
           ('coral', 12, 0.835, 0.667), ('coral', 6, 0.816, 0.694), ('coral', 1, 0.755, 0.597),
           ('cdann', 12, 0.836, 0.750), ('cdann', 6, 0.810, 0.701), ('cdann', 1, 0.774, 0.625)
),
ours AS (
    SELECT benchmark, data_tag, split_version, method, coalesce(setting, '') AS setting, image_source,
           CAST(regexp_extract(benchmark, '^cat-dog-indoor-outdoor-p([0-9]+)', 1) AS INTEGER) AS minority_percent,
           min(n_seeds) AS n_seeds,
           max(mean) FILTER (WHERE metric = 'acc_avg') AS acc_avg,
           max(mean) FILTER (WHERE metric = 'acc_wg') AS acc_wg
    FROM leaderboard_with_standins
    WHERE eval_split = 'test' AND metric IN ('acc_avg', 'acc_wg') AND coalesce(grouping, 'group') = 'group'
      AND regexp_matches(benchmark, '^cat-dog-indoor-outdoor-p[0-9]+(@.*)?$')
    GROUP BY ALL
)
SELECT coalesce(o.minority_percent, p.minority_percent) AS minority_percent, coalesce(o.method, p.method) AS method,
       coalesce(o.setting, '') AS setting, coalesce(o.image_source, '') AS image_source,
       coalesce(o.benchmark, 'cat-dog-indoor-outdoor-p' || lpad(CAST(p.minority_percent AS VARCHAR), 2, '0')) AS task,
       o.data_tag, o.split_version, o.n_seeds, o.acc_avg, o.acc_wg, CAST(p.paper_acc_avg AS DOUBLE) AS paper_acc_avg,
       CAST(p.paper_acc_wg AS DOUBLE) AS paper_acc_wg,
       'ResNet-18 (ImageNet weights), DomainBed protocol, Visual Genome images' AS paper_data
FROM ours AS o
FULL OUTER JOIN paper AS p ON p.method = o.method AND p.minority_percent = o.minority_percent
WHERE EXISTS (SELECT 1 FROM ours)  -- the paper's numbers alone are no analysis of results: nothing to publish
ORDER BY minority_percent DESC, method, setting, image_source
