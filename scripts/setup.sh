#!/usr/bin/env bash
# Idempotent set-up on Debian/Ubuntu with Python 3.11: WordNet's Debian packages (the offline
# source of the ImageNet hierarchy), a virtualenv in .venv, and the project with its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if command -v dpkg >/dev/null 2>&1; then
  missing=()
  for pkg in wordnet-base wordnet-sense-index; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    echo "[setup] apt-get install ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "[setup] no dpkg: install WordNet 3.0 yourself or set SHIFTBENCH_IMAGENET_HIERARCHY_DIR" >&2
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PYTHON" -m venv .venv
fi
# Reinstall only when the dependencies changed (the project itself is an editable install).
stamp=.venv/.shiftbench-installed
wanted=$(cat pyproject.toml constraints-cpu.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  echo "[setup] .venv is up to date with pyproject.toml"
  exit 0
fi
echo "[setup] pip install -e .[dev]: dagster, dagster-webserver, polars, duckdb, pyarrow, torch (CPU wheel, pinned"
echo "        by constraints-cpu.txt), scipy, networkx, matplotlib and the dev tools (how long: BENCHMARKS.md)"
started=$(date +%s)
# This machine's pip config lists local mirrors that do not exist; drop that noise only.
set +e
.venv/bin/python -m pip install -q -c constraints-cpu.txt -e ".[dev]" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "[setup] pip install failed" >&2
  exit "$status"
fi
echo "$wanted" > "$stamp"
echo "[setup] installed in $(( $(date +%s) - started ))s"
