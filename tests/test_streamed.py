"""Streamed tables and batched fingerprints: the same ids and files as whole tables, batch by batch."""

from __future__ import annotations

import itertools
from pathlib import Path

import networkx as nx
import numpy as np
import polars as pl
import pytest

from shiftbench.metashift import metagraph as mg
from shiftbench.store import Store, damage
from shiftbench.tables import fingerprint
from shiftbench.tables.streamed import StreamedTable


def _table(n: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pl.DataFrame(
        {
            "name": [f"subset-{v}" for v in rng.integers(0, 5_000, n)],
            "count": rng.integers(0, 100, n),
            "value": rng.random(n),
            "flag": rng.random(n) < 0.5,
            "coords": [[1.0, float(k)] for k in range(n)],
        }
    )
    # NULLs in a float column, as the distance table has them
    return frame.with_columns(pl.when(pl.col("count") < 10).then(None).otherwise(pl.col("value")).alias("value"))


def _streamed(frame: pl.DataFrame, cuts: list[int]) -> StreamedTable:
    ordered = frame.sort(frame.columns, nulls_last=True)
    bounds = [0, *cuts, ordered.height]
    return StreamedTable.from_frames(
        ordered.schema, ordered.height, lambda: (ordered.slice(a, b - a) for a, b in itertools.pairwise(bounds))
    )


def test_batched_fingerprints_do_not_depend_on_how_the_rows_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = _table(20_000)
    whole = fingerprint.sha256_table(frame)
    ordered = frame.sort(frame.columns, nulls_last=True)
    assert fingerprint.sha256_frames([ordered]) == whole  # a table under BATCH_ROWS is one batch, as before
    assert fingerprint.sha256_streamed(_streamed(frame, [1, 777, 15_000])) == whole
    monkeypatch.setattr(fingerprint, "BATCH_ROWS", 3_000)  # several batches: still independent of the pieces
    batched = fingerprint.sha256_table(frame)
    assert batched != whole
    for cuts in ([], [2_999, 3_000, 3_001], [5, 6_000, 19_999]):
        assert fingerprint.sha256_streamed(_streamed(frame, cuts)) == batched
    empty = frame.clear()
    assert fingerprint.sha256_frames([empty]) == fingerprint.sha256_table(empty)
    assert fingerprint.sha256_table(empty) != fingerprint.sha256_table(frame.head(1))


def test_a_streamed_table_stages_as_the_same_version_with_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fingerprint, "BATCH_ROWS", 4_096)
    frame = _table(10_000, seed=1)
    small = pl.DataFrame({"k": [1, 2]})
    as_frame = Store(tmp_path / "a").writer.stage("fam", "bench", {"rows": frame, "small": small})
    as_stream = Store(tmp_path / "b").writer.stage(
        "fam", "bench", {"rows": _streamed(frame, [123, 9_000]), "small": small}
    )
    assert as_frame.version == as_stream.version
    written = pl.read_parquet(as_stream.table_path("rows"))
    expected = pl.read_parquet(as_frame.table_path("rows"))
    assert written.columns == expected.columns == ["benchmark", "version", *frame.columns]
    assert written.equals(expected)
    assert as_stream.manifest()["tables"]["rows"]["rows"] == 10_000
    assert damage(as_stream) is None


def test_modularity_is_networkx_s_value_whatever_the_community_order() -> None:
    rng = np.random.default_rng(3)
    graph = nx.gnm_random_graph(40, 150, seed=3)
    nodes = [f"s{k:02d}" for k in range(40)]
    weights = np.zeros((40, 40))
    for u, v in graph.edges:
        weights[u, v] = weights[v, u] = float(rng.random())
    import scipy.sparse as sp

    class_graph = mg.ClassGraph("c", nodes, np.ones(40), sp.csr_array(weights))
    communities = [sorted(c) for c in nx.community.louvain_communities(class_graph.to_networkx(), seed=0)]
    expected = nx.community.modularity(class_graph.to_networkx(), [set(c) for c in communities], weight="weight")
    value = mg.modularity(class_graph, communities)
    assert value == pytest.approx(expected, abs=1e-12)
    assert mg.modularity(class_graph, communities[::-1]) == value
