-- Catalog base views over the versioned store (see shiftbench/store.py for the layout).
-- {{publications}} expands to the publication events (one JSON file per publish), {{latest}} to each benchmark's
-- latest version (the log's), and
-- {{benchmarks}} to the union of every version's benchmarks.parquet; either becomes an empty,
-- typed relation while the store has none, so the views always bind.

-- Every view names its files relative to the warehouse, the folder that holds this catalog and store/
-- ('store/<family>/<benchmark>/versions/<version>/<table>.parquet'), and reads them through shiftbench_files,
-- which puts the warehouse in front when the view is bound (at each query), so a moved or copied warehouse
-- works without a rebuild. The warehouse is, in this order:
--   1. the variable shiftbench_home, when set (SET VARIABLE shiftbench_home = '/path/to/warehouse');
--      shiftbench's own reader always sets it;
--   2. else the folder of DuckDB's temporary directory, which is '<database file>.tmp' unless the client set
--      another: the folder holding this catalog whenever a client opened the file itself;
--   3. else nothing: the paths stay relative (to the working directory, or DuckDB's file_search_path).
CREATE OR REPLACE MACRO shiftbench_home() AS coalesce(
    rtrim(CAST(getvariable('shiftbench_home') AS VARCHAR), '/\') || '/',
    nullif(regexp_extract(current_setting('temp_directory'), '^(.*[/\\])[^/\\]+\.tmp$', 1), ''),
    ''
);

CREATE OR REPLACE MACRO shiftbench_files(files) AS list_transform(files, lambda f: shiftbench_home() || f);

CREATE OR REPLACE VIEW publications AS
SELECT family, benchmark, version, CAST(published_at AS TIMESTAMPTZ) AS published_at
FROM {{publications}};

-- The latest version of each benchmark as the publication log says (shiftbench.store.log.latest_event, the same
-- for `shiftbench versions` and `check`): the version of its newest event that is in the store. A damaged latest is
-- still the latest here; its rows are left out of the views (catalog_problems), never replaced by an older version's.
CREATE OR REPLACE VIEW latest_versions AS
SELECT family, benchmark, version, CAST(published_at AS TIMESTAMPTZ) AS published_at
FROM {{latest}};

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
