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
    benchmark,
    version,
    class,
    subset_a,
    subset_b,
    CASE WHEN same_component AND status_a = 'ok' THEN raw END AS distance,
    raw AS raw_distance,
    CASE WHEN same_component THEN status_a ELSE 'different_components' END AS status
FROM (
    -- a plain join and projection: a query's filters on benchmark, version and class reach both scans (1,698
    -- subsets of a class, 1.44 M pairs, in about 0.3 s)
    SELECT
        a.benchmark,
        a.version,
        a.class,
        a.subset AS subset_a,
        b.subset AS subset_b,
        a.component = b.component AS same_component,
        a.status AS status_a,
        sqrt(list_reduce(
            list_transform(list_zip(a.embedding, b.embedding), lambda x: (x[1] - x[2]) * (x[1] - x[2])),
            lambda s, y: s + y
        )) AS raw
    FROM metashift_embeddings_history AS a
    INNER JOIN metashift_embeddings_history AS b
        ON b.benchmark = a.benchmark AND b.version = a.version AND b.class = a.class AND a.subset < b.subset
    WHERE a.benchmark || '/' || a.version NOT IN ({{stored_versions}})
) AS pairs;

CREATE OR REPLACE VIEW metashift_distances AS
SELECT t.*
FROM metashift_distances_history AS t
SEMI JOIN latest_versions AS l ON l.benchmark = t.benchmark AND l.version = t.version;
