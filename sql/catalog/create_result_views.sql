-- Two views per results table {{table}} (ERM runs): rows are keyed by the run ({{key}}), while
-- `benchmark` and `split_version` name the split the model was trained on. `is_current` says whether
-- that split version is still the latest of its benchmark; the plain view shows only current results,
-- so a result trained on a split that was republished since can never be mistaken for a current one.

CREATE OR REPLACE VIEW {{table}}_history AS
SELECT t.*, coalesce(t.split_version = s.version, FALSE) AS is_current
FROM {{source}} AS t
SEMI JOIN publications AS p ON p.benchmark = t.{{key}} AND p.version = t.version
LEFT JOIN latest_versions AS s ON s.benchmark = t.benchmark;

CREATE OR REPLACE VIEW {{table}} AS
SELECT h.*
FROM {{table}}_history AS h
SEMI JOIN latest_versions AS l ON l.benchmark = h.{{key}} AND l.version = h.version
WHERE h.is_current;
