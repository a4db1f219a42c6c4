-- Two views per published table {{table}}: all published versions, and the latest only.
-- {{source}} is the union of the table's Parquet files across versions (or an empty, typed
-- relation built from the table's contract while no version has the table). {{key}} is the column
-- naming the store entry (benchmark; run for ERM results, whose benchmark column is the split's).

CREATE OR REPLACE VIEW {{table}}_history AS
SELECT t.*
FROM {{source}} AS t
SEMI JOIN publications AS p ON p.benchmark = t.{{key}} AND p.version = t.version;

CREATE OR REPLACE VIEW {{table}} AS
SELECT t.*
FROM {{source}} AS t
SEMI JOIN latest_versions AS l ON l.benchmark = t.{{key}} AND l.version = t.version;
