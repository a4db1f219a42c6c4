-- Catalog base views over the versioned store (see shiftbench/store.py for the layout).
-- {{publications}} expands to the publication events (one JSON file per publish) and
-- {{benchmarks}} to the union of every version's benchmarks.parquet; either becomes an empty,
-- typed relation while the store has none, so the views always bind.

CREATE OR REPLACE VIEW publications AS
SELECT family, benchmark, version, CAST(published_at AS TIMESTAMPTZ) AS published_at
FROM {{publications}};

CREATE OR REPLACE VIEW latest_versions AS
SELECT family, benchmark, arg_max(version, published_at) AS version, max(published_at) AS published_at
FROM publications
GROUP BY family, benchmark;

CREATE OR REPLACE VIEW benchmarks_history AS
WITH first_published AS (
    SELECT benchmark, version, min(published_at) AS created_at
    FROM publications
    GROUP BY benchmark, version
)
SELECT
    b.family,
    b.benchmark,
    b.version,
    f.created_at,
    CAST(b.params AS JSON) AS params,
    CAST(b.sources AS JSON) AS sources,
    b.n_examples,
    b.spec,
    coalesce(l.version = b.version, FALSE) AS is_latest
FROM {{benchmarks}} AS b
INNER JOIN first_published AS f ON f.benchmark = b.benchmark AND f.version = b.version
LEFT JOIN latest_versions AS l ON l.benchmark = b.benchmark AND l.version = b.version;

CREATE OR REPLACE VIEW benchmarks AS
SELECT * FROM benchmarks_history WHERE is_latest;
