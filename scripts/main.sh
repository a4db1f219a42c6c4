#!/usr/bin/env bash
# Set everything up and run the main jobs: build, check and publish all 16 BREEDS benchmarks on
# the embedded sources (WordNet from Debian's packages, the packaged ImageNet validation labels,
# the published BREEDS hierarchy when it can be downloaded or SHIFTBENCH_BREEDS_HIERARCHY_DIR),
# then the MetaShift collections and tasks (generated scene sample unless GQA files are set), then
# the 34 ConDS cases on the generated sprites images (plus CelebA's when SHIFTBENCH_CELEBA_DIR is set),
# then three quick ERM baselines (results in erm_results).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SHIFTBENCH_HOME=${SHIFTBENCH_HOME:-$PWD/warehouse}
export DAGSTER_HOME=${DAGSTER_HOME:-$SHIFTBENCH_HOME/dagster_home}

.venv/bin/shiftbench build breeds
# MetaShift on SHIFTBENCH_GQA_SCENE_GRAPHS, or on the embedded generated scene sample when unset.
.venv/bin/shiftbench build metashift
# ConDS on the generated sprites (and CelebA when SHIFTBENCH_CELEBA_DIR is set).
.venv/bin/shiftbench build conds
# Quick ERM baselines on CPU (preset smoke: an MLP, 300 iterations): the spurious correlation of colour
# and shape vs uniform training, and a MetaShift task of the generated scene sample (stand-in images).
.venv/bin/shiftbench train sprites-sc-object_color --preset smoke
.venv/bin/shiftbench train sprites-uniform --preset smoke
.venv/bin/shiftbench train cat-dog-dg-cabinet-bed --preset smoke

query="SELECT b.family, b.benchmark, b.version, coalesce(b.params->>'hierarchy', b.sources->>'dataset') AS source,
  coalesce(s.n_selected || ' subsets', b.n_examples || ' examples') AS size
FROM benchmarks AS b LEFT JOIN (SELECT benchmark, count(*) FILTER (selected) AS n_selected FROM metashift_subsets GROUP BY ALL) AS s USING (benchmark)
ORDER BY b.family, b.benchmark"
echo
echo "Published benchmarks (DuckDB catalog):"
.venv/bin/shiftbench sql "$query"
cat <<MSG

Outputs
  Parquet versions: $SHIFTBENCH_HOME/store/<family>/<benchmark>/versions/<version>/
  DuckDB catalog:   $SHIFTBENCH_HOME/catalog.duckdb

Try
  .venv/bin/shiftbench sql "SELECT superclass_name, domain, count(*) FROM breeds_subpopulations WHERE benchmark = 'entity13' GROUP BY ALL ORDER BY 1, 2"
  .venv/bin/shiftbench sql "SELECT benchmark, distance, paper_distance, n_train, n_test FROM metashift_tasks ORDER BY 1"
  .venv/bin/shiftbench sql "SELECT benchmark, n_train, n_test, sc_observed_fraction, tv_distance FROM conds_cases ORDER BY tv_distance DESC"
  .venv/bin/shiftbench sql "SELECT benchmark, model, eval_split, metric, round(value, 3) AS value FROM erm_results WHERE metric IN ('acc_avg', 'acc_wg') ORDER BY ALL"
  .venv/bin/python -c "import duckdb; print(duckdb.connect('$SHIFTBENCH_HOME/catalog.duckdb', read_only=True).sql('SELECT split, count(*) FROM examples GROUP BY split'))"
  DAGSTER_HOME=$DAGSTER_HOME SHIFTBENCH_HOME=$SHIFTBENCH_HOME .venv/bin/dagster dev    # the UI, with these runs
MSG
