-- Two views per published table {{table}}: all published versions, and the latest only.
-- {{source}} is the union of the table's Parquet files across versions (or an empty, typed
-- relation built from the table's contract while no version has the table).

CREATE OR REPLACE VIEW {{table}}_history AS
SELECT t.*
FROM {{source}} AS t
SEMI JOIN publications AS p ON p.benchmark = t.benchmark AND p.version = t.version;

CREATE OR REPLACE VIEW {{table}} AS
SELECT t.*
FROM {{source}} AS t
SEMI JOIN latest_versions AS l ON l.benchmark = t.benchmark AND l.version = t.version;
