#!/usr/bin/env bash
# Set everything up and run every check: lint, format, types, and the whole test suite
# (including the slower real-data tests on ../shared/fixtures). `.ci/run` runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's seconds, printed at the end (BENCHMARKS.md records the breakdown, so growth shows where it lands).
phases=()
phase() { phases+=("$1 $((SECONDS - phase_start)) s"); phase_start=$SECONDS; }
phase_start=$SECONDS
# The third-party clients the client tests load our outputs with (WILDS, torchvision for DomainBed, DuckDB 1.x), in an
# environment of their own: installed in the background while .venv is set up and linted and typed (each install
# mostly waits on downloads and unpacking; mypy is one core), waited for before pytest. Its log is printed then.
clients_log=$(mktemp)
bash scripts/clients_env.sh >"$clients_log" 2>&1 &
clients_pid=$!
trap 'kill "$clients_pid" 2>/dev/null || true; rm -f "$clients_log"' EXIT
bash scripts/setup.sh
phase setup
# The files some tests read that no install gives (timm's wheel, in .downloads/): fetched, then required.
bash scripts/test_downloads.sh
phase downloads
export SHIFTBENCH_REQUIRE_TIMM_WHEEL=1
# CI runs as root: the tests that mount a small tmpfs (a full disk, a read-only target) must run, not skip.
export SHIFTBENCH_REQUIRE_MOUNT=1
echo "[test] ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
phase lint
echo "[test] mypy (--strict on the library) on the package as it is imported"
bash scripts/typecheck.sh
phase types
clients_status=0
wait "$clients_pid" || clients_status=$?
cat "$clients_log"
[ "$clients_status" -eq 0 ] || { echo "[test] scripts/clients_env.sh failed (exit $clients_status)" >&2; exit "$clients_status"; }
phase "clients env wait"
export SHIFTBENCH_REQUIRE_CLIENTS=1
echo "[test] a single-node Slurm cluster for the tests marked slurm (stopped on exit)"
# scripts/slurm_local.sh installs slurm-wlm and munge when missing and prints the SLURM_CONF to export.
trap 'bash scripts/slurm_local.sh stop; rm -f "$clients_log"' EXIT
eval "$(bash scripts/slurm_local.sh start)"
phase "slurm start"
export SHIFTBENCH_REQUIRE_SLURM=1
echo "[test] pytest (on every core: pytest-xdist; the summary at the end names every skip with its reason)"
# worksteal: an idle worker takes queued tests from a busy one, so one 90 s Dagster test does not leave a
# worker waiting at the end (on 2 cores: 362 s against 420 s with the default scheduling, same machine).
# --durations-min 30: every test over 30 s is listed (printed, never failed), so the slow list stays in view (issue 50).
.venv/bin/python -m pytest -q -n "${SHIFTBENCH_TEST_WORKERS:-auto}" --dist worksteal --durations=0 --durations-min=30 "$@"
phase pytest
echo "[test] the wheel in a fresh environment, outside the checkout"
bash scripts/wheel_check.sh
phase "wheel check"
printf '[test] phases: %s\n' "$(IFS=';'; echo "${phases[*]}")"
