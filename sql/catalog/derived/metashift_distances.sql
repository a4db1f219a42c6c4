-- metashift_distances: the spectral distance between every pair of subsets of a class, as a view.
-- A collection stores the embedding of each subset (metashift_embeddings: coordinates, meta-graph component and the
-- status that makes a distance undefined), never one row per pair; the pairs are computed here when queried: the
-- Euclidean distance of the coordinates, the squares summed in dimension order (as scipy's pdist, and
-- shiftbench.metashift.embedding.pair_distances, sum them: the same floats), NULL across components
-- (different_components) and within a component whose status is not ok.
-- {{stored}} is the union of the versions that store the table (written before distances became a view, or built
-- with store_distances: true); {{stored_versions}} lists them as 'benchmark/version', so they are not computed twice.

CREATE OR REPLACE VIEW metashift_distances_history AS
SELECT t.benchmark, t.version, t.class, t.subset_a, t.subset_b, t.distance, t.raw_distance, t.status
FROM {{stored}} AS t
SEMI JOIN publications AS p ON p.benchmark = t.benchmark AND p.version = t.version
UNION ALL
SELECT
    a.benchmark,
    a.version,
    a.class,
    a.subset AS subset_a,
    b.subset AS subset_b,
    CASE WHEN a.component = b.component AND a.status = 'ok' THEN d.raw END AS distance,
    d.raw AS raw_distance,
    CASE WHEN a.component <> b.component THEN 'different_components' ELSE a.status END AS status
FROM metashift_embeddings_history AS a
INNER JOIN metashift_embeddings_history AS b
    ON b.benchmark = a.benchmark AND b.version = a.version AND b.class = a.class AND a.subset < b.subset
CROSS JOIN LATERAL (
    SELECT sqrt(list_reduce(
        list_transform(list_zip(a.embedding, b.embedding), lambda x: (x[1] - x[2]) * (x[1] - x[2])),
        lambda s, y: s + y
    )) AS raw
) AS d
WHERE a.benchmark || '/' || a.version NOT IN ({{stored_versions}});

CREATE OR REPLACE VIEW metashift_distances AS
SELECT t.*
FROM metashift_distances_history AS t
SEMI JOIN latest_versions AS l ON l.benchmark = t.benchmark AND l.version = t.version;
