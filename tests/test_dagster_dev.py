"""`dagster dev` from the repository root serves the graph, partitions and checks (GraphQL)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import PROJECT

QUERY = "{ assetNodes { assetKey { path } groupName isPartitioned hasAssetChecks partitionKeys } }"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_dagster_dev_serves_the_asset_graph(tmp_path: Path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n")
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "SHIFTBENCH_HOME": str(tmp_path / "warehouse")}
    # Popen restores default signal handling, so SIGTERM stops dagster dev cleanly (DAGSTER.md).
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
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and nodes is None:
            time.sleep(1)
            try:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/graphql",
                    data=json.dumps({"query": QUERY}).encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=5) as response:
                    data = json.loads(response.read())
                nodes = (data.get("data") or {}).get("assetNodes") or None
            except OSError:
                continue
        assert nodes, "dagster dev did not serve the asset graph in 90 s"
        by_key = {"/".join(n["assetKey"]["path"]): n for n in nodes}
        staged = by_key["breeds/staged_benchmark"]
        assert staged["isPartitioned"]
        assert staged["hasAssetChecks"]
        assert len(staged["partitionKeys"]) == 16
        assert by_key["breeds/benchmark"]["groupName"] == "breeds"
        assert by_key["raw/breeds_specs"]["groupName"] == "sources"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
