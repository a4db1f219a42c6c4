-- ConDS Table 3 (Jeon et al., TMLR 2025): each learner's uniform-test accuracy averaged over the cases of
-- a dataset (a case counts once: the mean over its seeds), beside the paper's number for the same learner,
-- and broken down as the paper's takeaways read it: by the number of concurrent shifts (Figure 4: more
-- shifts hurt) and by whether the shift includes SC (the hardest shift, even combined).
-- A trained run is matched to a paper row by method, model, augmentation and pre-training (erm_runs'
-- config); dSprites, Shapes3D and SmallNorb are the paper's "controlled" datasets, CelebA and DeepFashion
-- its "real-world" ones. The paper's number is a mean over its datasets of the category and 3 seeds (in
-- percent in the paper): `paper_datasets` names them, `dataset` the data here, and `comparison` says what
-- the two sides are: 'different datasets' (shiftbench's generated sprites, a user's table, stand-in images
-- or a tagged, partial CelebA against the paper's datasets: not a reproduction) or 'one of the paper''s
-- datasets' (the real CelebA against the paper's mean over CelebA and DeepFashion). Paper rows with no result
-- here are listed (measured columns NULL) for the categories that have results, so what is left to run shows;
-- paper_row is empty for a learner the paper has no row for. Runs on stand-in images are learners of their
-- own (image_source), never averaged with runs on the real images.
WITH paper(paper_row, method, model, augment, pretrained, category, paper_acc) AS (
    VALUES
        ('ResNet18', 'erm', 'resnet18', 'none', false, 'controlled', 0.6243::DOUBLE),
        ('ResNet18', 'erm', 'resnet18', 'none', false, 'real-world', 0.5391::DOUBLE),
        ('ResNet18, pre-trained', 'erm', 'resnet18', 'none', true, 'controlled', 0.8153::DOUBLE),
        ('ResNet18, pre-trained', 'erm', 'resnet18', 'none', true, 'real-world', 0.6164::DOUBLE),
        ('ResNet50', 'erm', 'resnet50', 'none', false, 'controlled', 0.6013::DOUBLE),
        ('ResNet50', 'erm', 'resnet50', 'none', false, 'real-world', 0.5258::DOUBLE),
        ('ResNet50, pre-trained', 'erm', 'resnet50', 'none', true, 'controlled', 0.8264::DOUBLE),
        ('ResNet50, pre-trained', 'erm', 'resnet50', 'none', true, 'real-world', 0.6776::DOUBLE),
        ('ImageNet augmentation', 'erm', 'resnet18', 'imagenet', false, 'controlled', 0.6925::DOUBLE),
        ('ImageNet augmentation', 'erm', 'resnet18', 'imagenet', false, 'real-world', 0.4882::DOUBLE),
        ('AugMix', 'erm', 'resnet18', 'augmix', false, 'controlled', 0.6899::DOUBLE),
        ('AugMix', 'erm', 'resnet18', 'augmix', false, 'real-world', 0.5199::DOUBLE),
        ('RandAugment', 'erm', 'resnet18', 'randaugment', false, 'controlled', 0.7147::DOUBLE),
        ('RandAugment', 'erm', 'resnet18', 'randaugment', false, 'real-world', 0.5194::DOUBLE),
        ('AutoAugment', 'erm', 'resnet18', 'autoaugment', false, 'controlled', 0.6965::DOUBLE),
        ('AutoAugment', 'erm', 'resnet18', 'autoaugment', false, 'real-world', 0.5215::DOUBLE),
        ('GroupDRO', 'groupdro', 'resnet18', 'none', false, 'controlled', 0.6326::DOUBLE),
        ('GroupDRO', 'groupdro', 'resnet18', 'none', false, 'real-world', 0.4817::DOUBLE),
        ('IRM', 'irm', 'resnet18', 'none', false, 'controlled', 0.5983::DOUBLE),
        ('IRM', 'irm', 'resnet18', 'none', false, 'real-world', 0.3947::DOUBLE)
),
paper_sets(category, paper_datasets) AS (
    VALUES ('controlled', 'dSprites, Shapes3D, SmallNorb'), ('real-world', 'CelebA, DeepFashion')
),
learners AS (
    SELECT regexp_replace(run[length(benchmark) + 2:], '\.seed[0-9]+(@standin)?$', '') AS setting, method, image_source,
           min(model) AS model, min(coalesce(json_extract_string(config, '$.augment'), 'none')) AS augment,
           bool_or(json_extract_string(config, '$.init_checkpoint') IS NOT NULL) AS pretrained
    FROM erm_runs
    WHERE family = 'conds'
    GROUP BY ALL
),
per_case AS (
    SELECT c.dataset, CASE WHEN c.dataset IN ('celeba', 'deepfashion') THEN 'real-world' ELSE 'controlled' END AS category,
           c.shift_kind, CASE WHEN c.shift_kind = 'uniform' THEN 0 ELSE len(string_split(c.shift_kind, '+')) END AS n_shifts,
           l.method, coalesce(l.setting, '') AS setting, l.image_source, l.data_tag, l.n_seeds, l.mean
    FROM leaderboard_with_standins AS l
    JOIN conds_cases AS c ON c.benchmark = l.benchmark AND c.version = l.split_version
    WHERE l.metric = 'acc_avg' AND l.eval_split = 'test'
),
measured AS (
    SELECT dataset, category, method, setting, image_source, data_tag, count(*) AS n_cases, min(n_seeds) AS n_seeds_min, avg(mean) AS acc_mean,
           avg(mean) FILTER (WHERE n_shifts = 0) AS acc_0_shifts, avg(mean) FILTER (WHERE n_shifts = 1) AS acc_1_shift,
           avg(mean) FILTER (WHERE n_shifts = 2) AS acc_2_shifts, avg(mean) FILTER (WHERE n_shifts = 3) AS acc_3_shifts,
           avg(mean) FILTER (WHERE list_contains(string_split(shift_kind, '+'), 'sc')) AS acc_with_sc,
           avg(mean) FILTER (WHERE n_shifts > 0 AND NOT list_contains(string_split(shift_kind, '+'), 'sc')) AS acc_without_sc
    FROM per_case
    GROUP BY ALL
),
matched AS (
    SELECT m.*, l.model, l.augment, l.pretrained, p.paper_row, p.paper_acc
    FROM measured AS m
    LEFT JOIN learners AS l ON l.method = m.method AND l.setting = m.setting AND l.image_source = m.image_source
    LEFT JOIN paper AS p
        ON p.method = m.method AND p.model = l.model AND p.augment = l.augment AND p.pretrained = l.pretrained
        AND p.category = m.category
)
SELECT dataset, data_tag, category, method, setting, image_source, model, augment, pretrained,
       coalesce(paper_row, '') AS paper_row, paper_acc,
       CASE WHEN paper_acc IS NOT NULL THEN d.paper_datasets END AS paper_datasets,
       CASE WHEN paper_acc IS NULL THEN NULL
            WHEN dataset = 'celeba' AND data_tag IS NULL AND image_source = 'celeba' THEN 'one of the paper''s datasets'
            ELSE 'different datasets' END AS comparison,
       n_cases, n_seeds_min,
       acc_mean, acc_mean - paper_acc AS acc_minus_paper, acc_0_shifts, acc_1_shift, acc_2_shifts, acc_3_shifts,
       acc_with_sc, acc_without_sc
FROM matched
LEFT JOIN paper_sets AS d USING (category)
UNION ALL
SELECT '' AS dataset, NULL AS data_tag, p.category, p.method, '' AS setting, '' AS image_source, p.model, p.augment,
       p.pretrained, p.paper_row, p.paper_acc, d.paper_datasets, NULL AS comparison,
       0 AS n_cases, NULL AS n_seeds_min, NULL AS acc_mean, NULL AS acc_minus_paper, NULL AS acc_0_shifts,
       NULL AS acc_1_shift, NULL AS acc_2_shifts, NULL AS acc_3_shifts, NULL AS acc_with_sc, NULL AS acc_without_sc
FROM paper AS p
LEFT JOIN paper_sets AS d USING (category)
WHERE p.category IN (SELECT category FROM measured)
  AND NOT EXISTS (SELECT 1 FROM matched AS m WHERE m.category = p.category AND m.paper_row = p.paper_row)
