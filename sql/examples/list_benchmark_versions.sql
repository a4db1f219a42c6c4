-- Every published version, newest first, with its split strategy and hierarchy.
SELECT benchmark, version, created_at, is_latest,
       params ->> 'split' AS split, params ->> 'hierarchy' AS hierarchy, n_examples
FROM benchmarks_history
ORDER BY benchmark, created_at DESC;
