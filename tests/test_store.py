"""The versioned store: content ids, immutability, atomic publish (also under SIGKILL), history."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shiftbench.errors import ContractViolation, InputError, StoreError
from shiftbench.store import StagedVersion, Store, damage
from shiftbench.store.content import (
    LayoutMismatch,
    LayoutRecorder,
    UnsupportedLayout,
    array_node,
    legacy_content_matches,
    rebuilt_array,
    stored_content_sha256,
)
from shiftbench.tables.fingerprint import sha256_batches
from shiftbench.warehouse.publishing import check_version

from .conftest import PROJECT, ToyDir, toy_tables


def checked(store: Store, staged: StagedVersion) -> StagedVersion:
    """Run and record the version's contract check (what publishing requires)."""
    check_version(store, staged)
    return staged


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    """Every data file with its inode and mtime: rewriting a file changes one of them."""
    return {
        str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and "publications" not in p.parts and p.name not in {"staged.json", ".lock"}
    }


def test_same_content_same_id_and_no_new_files(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    store = Store(tmp_path / "store")
    tables = toy_tables(toy_breeds_dir())
    first = checked(store, store.writer.stage("breeds", "toy", tables))
    store.log.publish(first)
    before = files_of(store.root)
    second = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir("again"))))
    assert second.version == first.version
    assert not second.created
    assert files_of(store.root) == before
    assert not store.log.publish(second).changed_latest


def test_row_order_does_not_change_the_id(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    tables = toy_tables(toy_breeds_dir())
    shuffled = {k: v.sample(fraction=1.0, shuffle=True, seed=1) for k, v in tables.items()}  # type: ignore[attr-defined]
    a = Store(tmp_path / "a").writer.stage("breeds", "toy", tables)
    b = Store(tmp_path / "b").writer.stage("breeds", "toy", shuffled)
    assert a.version == b.version
    for table in a.tables:  # byte-identical files, not just equal ids
        assert a.table_path(table).read_bytes() == b.table_path(table).read_bytes()


def test_consumed_tables_give_the_same_version_and_are_let_go(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    """``consume``: the store takes each table out of the caller's dict (a large build's frames are not held twice)."""
    kept = Store(tmp_path / "a").writer.stage("breeds", "toy", toy_tables(toy_breeds_dir()))
    given = dict(toy_tables(toy_breeds_dir("again")))
    taken = Store(tmp_path / "b").writer.stage("breeds", "toy", given, consume=True)
    assert given == {} and taken.version == kept.version
    for table in kept.tables:
        assert kept.table_path(table).read_bytes() == taken.table_path(table).read_bytes()


def test_new_content_is_a_new_version_and_history_is_kept(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    store = Store(tmp_path / "store")
    v1 = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=0)))
    store.log.publish(v1)
    v2 = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=1)))
    assert v2.version != v1.version
    assert store.log.latest("toy").version == v1.version  # staged is not published
    store.log.publish(v2)
    assert store.log.latest("toy").version == v2.version
    assert [(v.version, v.is_latest) for v in store.log.versions("toy")] == [
        (v1.version, False),
        (v2.version, True),
    ]
    store.log.publish(v1)  # going back to older content is a new publication of the old version
    assert store.log.latest("toy").version == v1.version
    manifest = v1.manifest()
    assert manifest["tables"]["examples"]["rows"] == pl.read_parquet(v1.table_path("examples")).height
    assert set(manifest["tables"]) == {
        "benchmarks", "examples", "breeds_subpopulations", "breeds_hierarchy", "shift_magnitudes"
    }  # fmt: skip


def test_tampered_files_are_never_published(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    store = Store(tmp_path / "store")
    staged = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir())))
    with staged.table_path("examples").open("ab") as handle:
        handle.write(b"x")
    with pytest.raises(StoreError, match=r"examples\.parquet: \d+ bytes, the manifest of version \w+ says \d+"):
        store.log.publish(staged)
    assert store.log.latest("toy") is None
    data = bytearray(staged.table_path("examples").read_bytes()[:-1])  # same size, one byte changed
    data[100] ^= 0xFF
    staged.table_path("examples").write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"examples\.parquet: checksum mismatch"):
        store.log.publish(staged)
    again = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir())))  # a rebuild repairs it
    assert again.version == staged.version and damage(again) is None
    store.log.publish(again)
    assert store.log.latest("toy").version == staged.version


def test_only_a_version_that_passed_its_checks_is_published(
    tmp_path: Path, toy_breeds_dir: ToyDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "store")
    good = store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=0))
    with pytest.raises(ContractViolation, match="has not been checked"):
        store.log.publish(good)  # whoever calls it: no recorded check, no publication
    checked(store, good)
    store.log.publish(good)

    tables = toy_tables(toy_breeds_dir(), seed=1)
    sub = tables["breeds_subpopulations"]
    tables["breeds_subpopulations"] = sub.with_columns(pl.lit("source").alias("domain"))  # no target domain
    bad = checked(store, store.writer.stage("breeds", "toy", tables))
    record = store.checks.check_record(bad)
    assert record is not None and not record.passed
    with pytest.raises(ContractViolation, match="failed its contract checks"):
        store.log.publish(bad)
    assert store.log.latest("toy").version == good.version

    # A check describes exactly the files and contracts it ran on.
    import shiftbench.store.checks as store_checks

    monkeypatch.setattr(store_checks, "contracts_fingerprint", lambda tables: "other contracts")
    with pytest.raises(ContractViolation, match="other contracts than today's"):
        store.log.publish(good)


def test_an_unchanged_version_reuses_its_recorded_check(
    tmp_path: Path, toy_breeds_dir: ToyDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "store")
    staged = store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir()))
    first = check_version(store, staged)
    import shiftbench.warehouse.publishing as publishing

    def no_rerun(*args: object, **kwargs: object) -> None:
        raise AssertionError("the contracts ran again")

    monkeypatch.setattr(publishing, "check_staged", no_rerun)
    again = check_version(store, staged)
    assert {t: [(r.rule, r.passed) for r in rules] for t, rules in again.items()} == {
        t: [(r.rule, r.passed) for r in rules] for t, rules in first.items()
    }


def test_the_check_runs_on_the_written_tables_while_the_attachments_are_made(
    tmp_path: Path, toy_breeds_dir: ToyDir
) -> None:
    """What a build does (benchmark_builds.stage_benchmark): the contracts run on the new version's table files while
    its figures are drawn; the recorded outcome is the one a check of the staged version records."""
    import threading

    from shiftbench.warehouse.publishing import check_files, record_results

    store = Store(tmp_path / "store")
    tables = toy_tables(toy_breeds_dir())
    checking = threading.Event()
    seen: dict[str, object] = {}

    def figures() -> dict[str, bytes]:
        seen["drawn while checking"] = checking.wait(timeout=30)
        return {"figure.png": b"png"}

    def check(files: dict[str, Path]) -> None:
        checking.set()
        seen["files"] = sorted(files)
        seen["manifest yet"] = any((path.parent / "manifest.json").exists() for path in files.values())
        seen["results"] = check_files(files)

    staged = store.writer.stage("breeds", "toy", tables, attachments=figures, while_attaching=check)
    assert seen["drawn while checking"] is True and seen["manifest yet"] is False
    assert seen["files"] == sorted(staged.tables) == sorted(tables)
    record_results(store, staged, seen["results"])  # type: ignore[arg-type]
    assert store.checks.valid_check(staged) is not None
    store.log.publish(staged)

    calls = []  # an unchanged version writes nothing: nothing to check there (its recorded check is reused)
    again = store.writer.stage("breeds", "toy", tables, while_attaching=lambda files: calls.append(files))
    assert not again.created and calls == []
    # Nothing being drawn: the caller checks once stage has returned (and the build's tables are freed).
    other = store.writer.stage("breeds", "toy2", tables, attachments={"a.png": b"png"}, while_attaching=calls.append)
    assert other.created and calls == []


def test_benchmark_names_are_checked(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    store = Store(tmp_path / "store")
    with pytest.raises(InputError, match="invalid benchmark name"):
        store.writer.stage("breeds", "../escape", toy_tables(toy_breeds_dir()))
    store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir()))
    with pytest.raises(InputError, match="already belongs to family 'breeds'"):
        store.writer.stage("metashift", "toy", toy_tables(toy_breeds_dir()))


_KILL_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {project!r})
sys.path.insert(0, {tests!r})
from pathlib import Path
from shiftbench.store import Store
from shiftbench.warehouse.publishing import check_version
import shiftbench.store.layout as store_layout
import shiftbench.store.writing as store_writing
from conftest import toy_tables

stage = {stage!r}
store = Store(Path({root!r}))
tables = toy_tables(Path({toy!r}), seed=7)
if stage == "write":
    original = store_writing.write_table
    def write_then_die(frame, path):
        original(frame, path)
        os.kill(os.getpid(), signal.SIGKILL)   # mid-build: one table written
    store_writing.write_table = write_then_die
    store.writer.stage("breeds", "toy", tables)
elif stage == "publish":
    staged = store.writer.stage("breeds", "toy", tables)
    check_version(store, staged)
    def die(path, text):
        os.kill(os.getpid(), signal.SIGKILL)   # after staging and checking, while writing the publication
    store_layout.write_atomic = die
    store.log.publish(staged)
"""


@pytest.mark.parametrize("stage", ["write", "publish"])
def test_a_killed_build_leaves_the_previous_latest(tmp_path: Path, toy_breeds_dir: ToyDir, stage: str) -> None:
    toy = toy_breeds_dir()
    store = Store(tmp_path / "store")
    good = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy, seed=0)))
    store.log.publish(good)
    script = _KILL_SCRIPT.format(
        project=str(PROJECT), tests=str(PROJECT / "tests"), stage=stage, root=str(store.root), toy=str(toy)
    )
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert store.log.latest("toy").version == good.version
    assert [v.version for v in store.log.versions("toy")] == [good.version]
    versions = sorted(p.name for p in (store.layout.benchmark_dir("breeds", "toy") / "versions").iterdir())
    if stage == "write":
        assert versions == [good.version]  # the half-written build is only in .staging
        assert any(store.layout.staging_dir.iterdir())
    else:
        assert len(versions) == 2  # complete but unpublished: invisible
    # The next build recovers: same content as the killed one, now published.
    retry = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy, seed=7)))
    store.log.publish(retry)
    assert store.log.latest("toy").version == retry.version


def test_garbage_collection_keeps_the_latest(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    store = Store(tmp_path / "store")
    versions = []
    for seed in range(3):
        staged = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=seed)))
        store.log.publish(staged)
        versions.append(staged.version)
    assert len(store.retention.garbage_collect(keep=2, dry_run=True).removed) == 1
    collection = store.retention.garbage_collect(keep=1)
    removed = collection.removed
    assert sorted(p.name for p in removed) == sorted(versions[:2])
    assert [v.version for v in store.log.versions("toy")] == [versions[2]]
    # The log keeps every event (it is a chain); removed.json says which versions gc deleted.
    events = sorted((store.layout.benchmark_dir("breeds", "toy") / "publications").glob("*.json"))
    assert [json.loads(e.read_text())["version"] for e in events] == versions
    removed_file = json.loads((store.layout.benchmark_dir("breeds", "toy") / "removed.json").read_text())
    assert sorted(removed_file["removed"]) == sorted(versions[:2])
    assert [p.name for p in (store.layout.benchmark_dir("breeds", "toy") / "versions").iterdir()] == [versions[2]]
    assert not collection.kept and not store.log.problems


def test_garbage_collection_never_removes_the_last_intact_version(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    store = Store(tmp_path / "store")
    versions = []
    for seed in range(3):
        staged = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=seed)))
        store.log.publish(staged)
        versions.append(staged)
    manifest = versions[2].path / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # the latest's manifest truncated
    removed = store.retention.garbage_collect(keep=1).removed
    assert [p.name for p in removed] == [versions[0].version]  # the newest intact one stays beside the damaged
    assert versions[1].path.is_dir() and versions[2].path.is_dir()


def test_the_publication_log_is_a_chain_and_a_gap_is_named(tmp_path: Path, toy_breeds_dir: ToyDir) -> None:
    """Deleting the newest event would make an older version latest again: the log's head names what is missing;
    an edited or forged event breaks the chain and is named too."""
    published = []
    for name in ("removed", "edited", "forged"):
        store = Store(tmp_path / name)
        for seed in range(3):
            staged = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=seed)))
            store.log.publish(staged)
            published.append(staged.version)
        assert not store.log.problems and store.log.latest("toy").version == published[-1]
        directory = store.layout.benchmark_dir("breeds", "toy") / "publications"
        events = sorted(directory.glob("*.json"))
        assert [json.loads(e.read_text())["sequence"] for e in events] == [1, 2, 3]
        if name == "removed":
            events[-1].unlink()
            expected = rf"{events[-1]}: missing: the log's head names it"
        elif name == "edited":
            events[1].write_text(events[1].read_text().replace(published[-2], published[-3]))
            expected = rf"{events[2]}: does not follow {events[1].name}"
        else:
            forged = json.loads(events[0].read_text())
            (directory / f"{99999999999999999999:020d}-{forged['version']}.json").write_text(json.dumps(forged))
            expected = r"publication event 1 is the log's event 4"
        fresh = Store(tmp_path / name)
        fresh.log.versions()
        assert any(re.search(expected, problem) for problem in fresh.log.problems), fresh.log.problems


def test_garbage_collection_never_deletes_a_version_waiting_for_its_checks(
    tmp_path: Path, toy_breeds_dir: ToyDir
) -> None:
    store = Store(tmp_path / "store")
    published = checked(store, store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=0)))
    store.log.publish(published)
    older = store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=1))  # staged, unchecked, recent
    waiting = store.writer.stage("breeds", "toy", toy_tables(toy_breeds_dir(), seed=2))  # the one staged last
    assert store.retention.garbage_collect(keep=1).removed == []
    import os

    old = older.path.stat().st_mtime - 2 * 3600  # an abandoned build, two hours old
    os.utime(older.path, (old, old))
    assert store.retention.garbage_collect(keep=1).removed == [older.path]
    assert waiting.path.is_dir()
    latest = store.layout.latest_staged("breeds", "toy")
    assert latest is not None and latest.version == waiting.version


def _garbage_bitmap(rng: np.random.Generator, bits: np.ndarray, extra: int) -> pa.Buffer:
    """``bits`` packed, with random bits after the last one and ``extra`` random bytes after them."""
    packed = bytearray(np.packbits(bits, bitorder="little").tobytes())
    if len(bits) % 8:
        packed[-1] |= int(rng.integers(0, 256)) & ~((1 << len(bits) % 8) - 1) & 0xFF
    return pa.py_buffer(bytes(packed) + rng.integers(0, 256, extra, dtype=np.uint8).tobytes())


def _messy_array(rng: np.random.Generator, kind: str, n: int) -> pa.Array:
    """An array as a build may hand it to the fingerprint: bytes under its NULLs, after its bitmaps' last bits and
    after its buffers' last values, some of it a slice of a larger array."""
    valid = rng.random(n) > 0.3
    validity = _garbage_bitmap(rng, valid, int(rng.integers(0, 3)) * int(rng.integers(0, 2)))
    nulls = int((~valid).sum())
    if kind in ("int64", "int32", "float64"):
        values = rng.integers(-100, 100, n + int(rng.integers(0, 4))).astype(kind)
        return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), n, [validity, pa.py_buffer(values)], nulls)
    if kind == "bool":
        values = _garbage_bitmap(rng, rng.random(n) > 0.5, int(rng.integers(0, 3)))
        return pa.Array.from_buffers(pa.bool_(), n, [validity, values], nulls)
    if kind == "string":
        offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 5, n))]).astype(np.int64)
        data = rng.integers(97, 123, int(offsets[-1]) + int(rng.integers(0, 80)), dtype=np.uint8).tobytes()
        buffers = [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
        return pa.Array.from_buffers(pa.large_string(), n, buffers, nulls)
    lengths = rng.integers(0, 4, n)
    lengths[~valid] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    child = _messy_array(rng, str(rng.choice(["float64", "string"])), int(offsets[-1]) + 1)
    return pa.Array.from_buffers(pa.large_list(child.type), n, [validity, pa.py_buffer(offsets)], nulls, 0, [child])


def _ipc(array: pa.Array) -> bytes:
    table = pa.table({"x": array})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_a_recorded_layout_rebuilds_exactly_the_bytes_the_content_hash_was_made_of() -> None:
    """Arrow's IPC writer writes bytes no reader sees (under NULLs, after a bitmap's last bit, after a buffer's last
    value when the buffer is at most its padded size): what :mod:`shiftbench.store.content` records of them, with the
    rows alone, must give the writer's very bytes, for every kind of column the contracts declare, sliced or not."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(1500):
        kind = str(rng.choice(["int64", "int32", "float64", "bool", "string", "list"]))
        array = _messy_array(rng, kind, int(rng.integers(1, 40)))
        if rng.random() < 0.4:
            start = int(rng.integers(0, len(array)))
            array = array.slice(start, int(rng.integers(1, len(array) - start + 1)))
        try:
            node = array_node(array)
        except UnsupportedLayout:  # empty lists over a child with values: recorded as no layout, never guessed
            assert kind == "list"
            continue
        rows_only = pa.array(array.to_pylist(), array.type)  # what the Parquet file gives back
        assert _ipc(rebuilt_array(rows_only, node)) == _ipc(array), (kind, node)
        checked += 1
    assert checked > 1300


def test_a_layout_can_fill_only_bytes_that_no_row_holds() -> None:
    array = pa.array(["a", None, "c"], pa.large_string())
    with pytest.raises(LayoutMismatch, match="not NULL"):
        rebuilt_array(array, {"nulls": {"0": "7a7a"}})  # row 0 holds a value: a layout cannot change it
    assert rebuilt_array(array, {"nulls": {"1": "7a7a"}}).to_pylist() == ["a", None, "c"]


def test_a_table_staged_before_layouts_is_verified_when_its_hash_can_be_found_again(tmp_path: Path) -> None:
    """Versions staged before layouts were recorded: the bits after a bitmap's last value are tried clear and set
    (what polars leaves), bytes under NULLs cannot be found again (check then says the hash was not recomputed)."""
    rng = np.random.default_rng(3)
    valid = np.array([True, False, True, True, False])
    padded = _garbage_bitmap(rng, valid, 0)
    padded = pa.py_buffer(bytes([padded.to_pybytes()[0] | 0xE0]))
    values = pa.py_buffer(np.array([10, 0, 12, 13, 0], dtype=np.int64))  # zeros under the NULLs, as polars writes
    numbers = pa.Array.from_buffers(pa.int64(), 5, [padded, values], 2)
    under_null = pa.array(["a", "hidden", "c", "d", "e"], pa.large_string())
    strings = pa.Array.from_buffers(pa.large_string(), 5, [pa.py_buffer(np.packbits(valid, bitorder="little")),
                                                           *under_null.buffers()[1:]], 2)  # fmt: skip
    for name, column in (("numbers", numbers), ("strings", strings)):
        rows = pa.table({"benchmark": pa.array(["b"] * 5, pa.large_string()), name: column})
        expected = sha256_batches(rows.schema, [rows])
        path = tmp_path / f"{name}.parquet"
        pq.write_table(rows.append_column("version", pa.array(["v"] * 5, pa.large_string())), path)
        assert stored_content_sha256(path, []) != expected  # the rows alone do not give the hash back
        assert legacy_content_matches(path, expected) is (name == "numbers")
        recorder = LayoutRecorder()
        assert sha256_batches(rows.schema, [rows], recorder) == expected
        assert recorder.layout and stored_content_sha256(path, recorder.layout) == expected


@pytest.mark.slow
def test_every_table_of_a_collection_with_streamed_distances_hashes_again_from_its_file(tmp_path: Path) -> None:
    """A MetaShift collection with ``store_distances``: its distance table is streamed (hashed batch by batch from
    codes, never a frame) and its other tables are frames; staged, each hashes again from its Parquet file and the
    layout staging recorded, to the content hash its version id was made of."""
    from shiftbench.metashift import collection
    from shiftbench.metashift.specs import load_specs
    from shiftbench.sources.generated_scenes import generate_scene_tables
    from shiftbench.store.content import content_findings

    specs = load_specs()
    objects, images, _ = generate_scene_tables()
    spec = specs.collections["metashift"].with_overrides({"store_distances": True})
    tables, _, _ = collection.build_collection(spec, objects, images, specs.general_contexts, {})
    staged = Store(tmp_path / "store").writer.stage("metashift", "streamed", tables)
    verified, notes, rewritten = content_findings(staged)
    assert (verified, notes, rewritten) == (len(staged.manifest()["tables"]), [], [])
    assert "metashift_distances" in staged.manifest()["tables"]
