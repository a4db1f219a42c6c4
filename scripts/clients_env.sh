#!/usr/bin/env bash
# Idempotent: .venv-clients, the third-party clients the client tests load shiftbench's outputs with
# (scripts/clients-requirements.txt says which and why they need an environment of their own). About 5.8 GB the
# first time (what the install costs, measured: BENCHMARKS.md); nothing after.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv-clients/.clients-installed
wanted=$(cat scripts/clients-requirements.txt scripts/clients-nodeps.txt | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  echo "[clients] .venv-clients is up to date with scripts/clients-requirements.txt"
  exit 0
fi
[ -x .venv-clients/bin/python ] || "$PYTHON" -m venv .venv-clients
echo "[clients] pip install -r scripts/clients-requirements.txt into .venv-clients"
started=$(date +%s)
set +e
.venv-clients/bin/python -m pip install -q -r scripts/clients-requirements.txt 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory"
status=${PIPESTATUS[0]}
if [ "$status" -eq 0 ]; then
  # Reference implementations whose declared dependencies would replace the pinned torch (clients-nodeps.txt).
  .venv-clients/bin/python -m pip install -q --no-deps -r scripts/clients-nodeps.txt 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory"
  status=${PIPESTATUS[0]}
fi
set -e
if [ "$status" -ne 0 ]; then
  echo "[clients] pip install failed" >&2
  exit "$status"
fi
echo "$wanted" > "$stamp"
echo "[clients] installed in $(( $(date +%s) - started ))s"
