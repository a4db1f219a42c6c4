"""`dagster dev` from the repository root serves the graph, and runs the CLI made show under their jobs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shiftbench.config.settings import Settings

from .conftest import BREEDS_FIXTURE, PROJECT

ASSETS = "{ assetNodes { assetKey { path } groupName isPartitioned hasAssetChecks partitionKeys } }"
JOB_RUNS = """{ pipelineOrError(params: {repositoryLocationName: "shiftbench", repositoryName: "__repository__",
  pipelineName: "breeds_benchmarks"}) { ... on Pipeline { runs { runId status tags { key value } } } } }"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _query(port: int, query: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["data"]


@pytest.mark.slow
def test_dagster_dev_serves_the_graph_and_lists_cli_runs_under_their_job(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings(SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(BREEDS_FIXTURE))
    home = tmp_path / "dagster_home"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SHIFTBENCH_")},
        "DAGSTER_HOME": str(home),
        "SHIFTBENCH_HOME": str(settings.home),
        "SHIFTBENCH_OFFLINE": "1",
        "SHIFTBENCH_BREEDS_HIERARCHY_DIR": str(BREEDS_FIXTURE),
    }
    cli = subprocess.run(
        [sys.executable, "-m", "shiftbench.pipelines.cli", "build", "--benchmark", "living17"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    port = _free_port()
    # Popen restores default signal handling, so SIGTERM stops dagster dev cleanly.
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port)],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        nodes = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and nodes is None:
            time.sleep(0.25)
            try:
                nodes = (_query(port, ASSETS) or {}).get("assetNodes") or None
            except OSError:
                continue
        assert nodes, "dagster dev did not serve the asset graph in 120 s"
        by_key = {"/".join(n["assetKey"]["path"]): n for n in nodes}
        staged = by_key["breeds/staged_benchmark"]
        assert staged["isPartitioned"] and staged["hasAssetChecks"]
        assert "living17" in staged["partitionKeys"]  # added by the CLI (the sensor adds the rest)
        assert by_key["breeds/benchmark"]["groupName"] == "breeds"
        assert by_key["raw/breeds_benchmark_specs"]["groupName"] == "sources"
        runs = _query(port, JOB_RUNS)["pipelineOrError"]["runs"]
        assert len(runs) == 1 and runs[0]["status"] == "SUCCESS"  # the CLI's run, under its job
        tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
        assert tags["dagster/asset_partition_range_start"] == "living17"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
