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
echo "[setup] pip install -e .[dev] (torch pinned by constraints-cpu.txt)"
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
