-- Examples per split of every latest benchmark.
SELECT benchmark, split, count(*) AS n
FROM examples
GROUP BY ALL
ORDER BY benchmark, split;
