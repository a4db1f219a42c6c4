#!/usr/bin/env bash
# Set everything up and run the main jobs, offline and with no settings: build, check and publish the
# 16 BREEDS benchmarks exactly as published (WordNet from Debian's packages + the BREEDS calibration
# shipped as an edit file, the packaged ImageNet validation labels), then MetaShift: the
# metashift-attributes collection from the released attribute annotations shipped with the package,
# and the object-context collection and tasks on the generated scene sample (named NAME@generated;
# GQA scene graphs when SHIFTBENCH_GQA_SCENE_GRAPHS is set), then the 34 ConDS cases on the generated
# sprites images (plus CelebA's when SHIFTBENCH_CELEBA_DIR is set), then three quick ERM baselines and a run
# tracking MetaShift's training conflicts, the papers' analyses and the leaderboard. How long it takes, measured: BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SHIFTBENCH_HOME=${SHIFTBENCH_HOME:-$PWD/warehouse}
export DAGSTER_HOME=${DAGSTER_HOME:-$SHIFTBENCH_HOME/dagster_home}

.venv/bin/shiftbench build breeds
# MetaShift on SHIFTBENCH_GQA_SCENE_GRAPHS, or on the released attributes + the generated scene sample.
.venv/bin/shiftbench build metashift
# The task's name here: the paper's on GQA's released files, else NAME@generated, NAME@tags or NAME@gqa-files.
task=$(.venv/bin/shiftbench build metashift --list | awk '$1 ~ /^cat-dog-dg-cabinet-bed(@|$)/ {print $1; exit}')
# ConDS on the generated sprites (and CelebA when SHIFTBENCH_CELEBA_DIR is set).
.venv/bin/shiftbench build conds
# Quick ERM baselines on CPU (preset quick: a small CNN with flips and quarter turns, 600 iterations):
# uniform training learns the shapes (ID ~0.93, test ~0.94), the spurious correlation of colour and shape does
# not generalise (ID ~0.99, test ~0.33). Then the MetaShift task (preset smoke: an MLP, 300 iterations): the
# generated scene sample has no images, so it trains on generated stand-ins and is published as
# <run>@standin, labelled image_source = standin (images standin), and left out of the leaderboard unless asked
# for (--include-standin); on GQA's scene graphs with SHIFTBENCH_GQA_IMAGES_DIR it trains on the real images.
# The sprites runs are on the ConDS sprites' own images, which are generated: the leaderboard labels them
# images generated, never real.
.venv/bin/shiftbench train sprites-sc-object_color --preset quick
.venv/bin/shiftbench train sprites-uniform --preset quick
.venv/bin/shiftbench train "$task" --preset smoke
# MetaShift's second application (Section 4.3): training conflicts between subsets, tracked after every step on
# the metashift-conflicts task (26 training subsets x 50 images, 48 evaluation subsets; stand-in images here):
# the table erm_training_conflicts, its heatmap (the paper's Figure 4 layout) and the conflict zones' analysis.
conflicts=$(.venv/bin/shiftbench build metashift --list | awk '$1 ~ /^metashift-conflicts(@|$)/ {print $1; exit}')
.venv/bin/shiftbench train "$conflicts" --preset smoke --set track_conflicts=true
# The papers' analyses over these results (tables, views and plots; those without results say so; an
# analysis over stand-in runs says so in its table, image_source, and in its figure's title).
.venv/bin/shiftbench analyse

query="SELECT b.family, b.benchmark, b.version, coalesce(b.params->>'hierarchy', b.sources->>'dataset') AS source,
  coalesce(s.n_selected || ' subsets', b.n_examples || ' examples') AS size
FROM benchmarks AS b LEFT JOIN (SELECT benchmark, count(*) FILTER (selected) AS n_selected FROM metashift_subsets GROUP BY ALL) AS s USING (benchmark)
ORDER BY b.family, b.benchmark"
echo
echo "Published benchmarks (DuckDB catalog):"
.venv/bin/shiftbench sql "$query" --max-rows 80
echo
echo "How much each BREEDS split shifts (view shift_magnitudes; every version has rows, see docs/shift_magnitudes.md):"
.venv/bin/shiftbench sql "SELECT regexp_replace(benchmark, '-(good|bad|nosplit)(@.*)?$', '\\2') AS benchmark,
  round(max(value) FILTER (NOT regexp_matches(benchmark, '-(good|bad|nosplit)(@|$)')), 3) AS rand,
  round(max(value) FILTER (regexp_matches(benchmark, '-good(@|$)')), 3) AS good,
  round(max(value) FILTER (regexp_matches(benchmark, '-bad(@|$)')), 3) AS bad
FROM shift_magnitudes WHERE family = 'breeds' AND measure = 'subclass_distance_mean' AND scope = 'all'
GROUP BY 1 ORDER BY 1"
echo
echo "Novel subpopulations (living17-novel@in21k): Living-17's ImageNet-1k source, ImageNet-21k classes outside the 1k as target:"
.venv/bin/shiftbench sql "SELECT superclass_name, domain, string_agg(subclass_name, ' | ' ORDER BY rank) AS subclasses
FROM breeds_subpopulations WHERE benchmark = 'living17-novel@in21k' AND y < 4 GROUP BY ALL ORDER BY min(y), domain"
echo
echo "Training conflicts on $conflicts (the strongest: training on the first subset raises the second's loss; heatmap: files/training_conflicts.png of the run's version):"
.venv/bin/shiftbench sql "SELECT training_subset, evaluation_subset, evaluation_domain, round(normalized_coefficient, 2) AS normalized,
  round(coefficient / std_error, 1) AS t FROM erm_training_conflicts ORDER BY normalized_coefficient, t LIMIT 8"
echo
echo "Leaderboard (shiftbench leaderboard: the mean over seeds (number of seeds) on the splits' own images; column images and the legend under it say whose):"
.venv/bin/shiftbench leaderboard --splits id_val,test --metrics acc_avg
echo
echo "With the rows on stand-in images too (--include-standin; images standin: not results on the datasets' images):"
.venv/bin/shiftbench leaderboard --include-standin --splits id_val,test --metrics acc_avg
cat <<MSG

Outputs
  Parquet versions: $SHIFTBENCH_HOME/store/<family>/<benchmark>/versions/<version>/
  DuckDB catalog:   $SHIFTBENCH_HOME/catalog.duckdb

Try
  .venv/bin/shiftbench sql "SELECT superclass_name, domain, count(*) FROM breeds_subpopulations WHERE benchmark = 'entity13' GROUP BY ALL ORDER BY 1, 2"
  .venv/bin/shiftbench sql "SELECT benchmark, distance, paper_distance, n_train, n_test FROM metashift_tasks ORDER BY 1"
  .venv/bin/shiftbench sql "SELECT family, benchmark, measure, round(value, 3) AS value FROM shift_magnitudes WHERE scope = 'all' ORDER BY ALL"
  cat $SHIFTBENCH_HOME/store/breeds/living17/versions/*/files/card.md          # the shift card (and croissant.json next to it)
  .venv/bin/shiftbench generate metashift-dg --classes cat,dog --test 'dog(shelf)' --n 4   # a distance-controlled task spec
  .venv/bin/shiftbench sql "SELECT benchmark, n_train, n_test, sc_observed_fraction, tv_distance FROM conds_cases ORDER BY tv_distance DESC"
  .venv/bin/shiftbench sql "SELECT benchmark, model, eval_split, metric, round(value, 3) AS value FROM erm_results WHERE metric IN ('acc_avg', 'acc_wg') ORDER BY ALL"
  .venv/bin/python -c "import duckdb; con = duckdb.connect('$SHIFTBENCH_HOME/catalog.duckdb', read_only=True); print(con.sql('SELECT split, count(*) FROM examples GROUP BY split'))"
  DAGSTER_HOME=$DAGSTER_HOME SHIFTBENCH_HOME=$SHIFTBENCH_HOME .venv/bin/dagster dev    # the UI, with these runs
MSG
