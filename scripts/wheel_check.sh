#!/usr/bin/env bash
# The installed package, not the checkout: build the wheel from the tracked files, install it into a fresh
# virtual environment outside the checkout, and run a user's short path from an empty folder there: build a
# sprites case, train on it (a Dagster run with its Pipes subprocess), load it with shiftbench.load_split (a torch
# Dataset item too), score predictions made from it, query the results.
# The fresh environment gets exactly the wheel's dependencies as pip resolves them from the index (with the CPU
# constraints): those .venv holds at the resolved version are linked in (scripts/wheel_env.py), any other is
# installed; dev tools and undeclared packages stay out, and the editable install is never seen.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/src" "$work/run"
git ls-files -z | xargs -0 cp --parents -t "$work/src"
.venv/bin/pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" "$work/src" >/dev/null
.venv/bin/python -m venv "$work/venv"
wheel=$(ls "$work"/dist/shiftbench-*.whl)
# One import name: the wheel holds shiftbench/ (assets, pipelines, sql and data_contracts mapped into it) and its
# metadata, nothing else at the top of site-packages.
tops=$(.venv/bin/python -c 'import sys, zipfile; print(*sorted({n.split("/")[0] for n in zipfile.ZipFile(sys.argv[1]).namelist()}))' "$wheel")
[[ "$tops" =~ ^shiftbench\ shiftbench-[0-9.]+\.dist-info$ ]] || { echo "[wheel] installs more than shiftbench: $tops" >&2; exit 1; }
.venv/bin/python -m pip install --dry-run --ignore-installed --quiet --report "$work/resolved.json" \
  -c constraints-cpu.txt "$wheel" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
.venv/bin/python scripts/wheel_env.py "$work/resolved.json" \
  "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" "$work/venv/bin/python"
"$work/venv/bin/python" -m pip install --quiet --no-deps --no-index "$wheel"
"$work/venv/bin/python" -m pip check | grep -v "^No broken requirements" || true
export SHIFTBENCH_HOME="$work/home" SHIFTBENCH_SPRITES_PER_COMBINATION=40 DAGSTER_HOME=
cd "$work/run"
"$work/venv/bin/python" - <<'EOF'
import importlib.util, shiftbench, shiftbench.store.contracts, shiftbench.warehouse.catalog, sys
where = shiftbench.__file__
assert importlib.util.find_spec("pytest") is None, "a dev tool is importable: the environment is not the wheel's"
assert importlib.util.find_spec("assets") is None and importlib.util.find_spec("pipelines") is None
import shiftbench.pipelines.definitions, shiftbench.config.package_files as files
assert files.SQL_DIR.is_relative_to(files.PACKAGE_DIR) and files.CONTRACTS_DIR.is_relative_to(files.PACKAGE_DIR)
assert (files.CONTRACTS_DIR / "breeds" / "breeds_hierarchy.yaml").is_file()
assert where.startswith(sys.prefix), f"shiftbench imported from {where}, not the wheel's environment"
assert len(shiftbench.store.contracts.contracts()) >= 30 and (shiftbench.warehouse.catalog.SQL_DIR / "catalog").is_dir()
print(f"[wheel] shiftbench from {where}")
EOF
sb="$work/venv/bin/shiftbench"
"$sb" build conds --benchmark sprites-uniform >build.log && tail -n 2 build.log
# The shipped class lists and hierarchy files travel in the wheel: a 21k task and the CIFAR-100 grouping build.
"$sb" build breeds --benchmark living17@in21k --benchmark superclasses@cifar100 >breeds.log 2>&1 \
  || { cat breeds.log >&2; exit 1; }
grep -q "2 published" breeds.log || { echo "[wheel] the breeds build published less than 2" >&2; cat breeds.log >&2; exit 1; }
echo "[wheel] living17@in21k and superclasses@cifar100 built from the wheel's data"
"$sb" train sprites-uniform --preset smoke --set max_iters=20 --set eval_every=10 >train.log 2>&1
grep "^\[train\] sprites-uniform.smoke" train.log
"$work/venv/bin/python" - <<'EOF'
import shiftbench
split = shiftbench.load_split("sprites-uniform")  # the front door, as a user loads a split
x, y, metadata = split.dataset("test")[0]
assert tuple(x.shape) == (3, 64, 64), x.shape
split.examples.select("example_id", split.examples["y"].alias("y_pred")).write_parquet("predictions.parquet")
print(f"[wheel] load_split: {split.name} {split.version}, {split.examples.height} examples, splits {split.splits}")
EOF
"$sb" eval sprites-uniform predictions.parquet --method oracle >eval.log && head -n 1 eval.log
"$sb" sql "SELECT method, round(mean, 4) AS test_acc FROM leaderboard WHERE eval_split = 'test' AND metric = 'acc_avg' ORDER BY method"
echo "[wheel] the wheel built, trained and scored from $work/run, outside the checkout"
