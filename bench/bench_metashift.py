"""MetaShift benchmark (speed and memory, not correctness): results go to BENCHMARKS.md.

    .venv/bin/python bench/bench_metashift.py [--scales 1 10 100] [--runs 3] [--large-runs 1] [--timeout 900]
                                              [--impls A B B-gc-off] [--one-file-scale 10]

End to end from GQA scene graphs to distances, for the attribute collection (``metashift-attributes``
with the released scripts' semantics: edges >= 0.2, networkx ``spectral_layout`` dim 5, classes
with more than 5 subsets of >= 25 images), by two implementations:

(A) shiftbench's library path (no Dagster): ``read_gqa_scene_graphs`` (msgspec, integer-coded) and
    ``collection_tables`` (polars joins on integer codes, sparse products for the overlaps, dense eig per
    class; the subset-image and distance tables are streamed tables, not materialized here).
    It also computes Louvain communities and modularity, which (B) does not.
(B) a straightforward reference of the released MetaShift scripts, written below: ``json.load``,
    ``dict[str, set[image_id]]`` of candidate subsets ``name(attribute)``, Python set
    intersections for every pair of subsets of a class, ``nx.spectral_layout(G, dim=5)``,
    Euclidean distances of all pairs.
(B-gc-off) the same code with Python's cyclic garbage collector disabled. ``json.load`` makes
    hundreds of thousands of dicts per file, which trigger full collections; each one walks every
    element of the subset sets built so far, so plain (B) grows quadratically with the input.
    B builds no reference cycles, so disabling the collector changes nothing else.

Sizes: 1x is the fixture ``../shared/fixtures/metashift/gqa_scene_graphs_from_attributes.json``
(19 MB, 59,663 images). 10x and 100x are generated GQA files in a temporary folder (deleted at
the end), one file per 1x chunk: chunk k resamples the fixture's images with replacement (seed k)
under new ids ``k-j``, objects and attributes unchanged; 10x is chunks 0-9, 100x chunks 0-99.
"10x as one file" is chunks 0-9 as a single 190 MB document (real GQA files are single documents
of hundreds of MB: memory per file matters).

Every (size, implementation, repeat) runs in a fresh subprocess (``--one A --scale 10 --data DIR``);
time excludes imports; peak memory is the process's RSS high-water mark (``VmHWM``, which an
exec'd process does not inherit from its parent, unlike ``ru_maxrss``). Before timing, A and B
are run side by side on 1x (and 10x) and must agree on selected subsets, node order, edges
(overlap values), positions and distances.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

FIXTURE = PROJECT.parent / "shared" / "fixtures" / "metashift" / "gqa_scene_graphs_from_attributes.json"
MIN_SUBSET_SIZE = 25
MAX_DROPPED_SUBSETS = 5  # the released scripts drop classes with 5 or fewer large subsets
EDGE_THRESHOLD = 0.2
DIM = 5
OVERRIDES = {
    "edge_threshold": EDGE_THRESHOLD,
    "embedding": "networkx",
    "min_subsets_per_class": MAX_DROPPED_SUBSETS + 1,
}
TOLERANCE = 1e-9
IMPLS = ("A", "B", "B-gc-off")
LABELS = {"A": "A shiftbench", "B": "B reference", "B-gc-off": "B reference, GC off"}
READ_TOTAL = "read_gqa_scene_graphs (all)"
BUILD_TOTAL = "collection_tables (all)"


# ---------------------------------------------------------------------------------------------- helpers


def memory_mb() -> dict[str, float]:
    """RSS now and its high-water mark for this process (/proc), and ru_maxrss, in MiB."""
    import resource

    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {
        "rss_mb": int(status["VmRSS"].split()[0]) / 1024,
        "hwm_mb": int(status["VmHWM"].split()[0]) / 1024,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def paths_for(scale: int, data: Path | None, one_file: bool = False) -> list[Path]:
    if scale == 1:
        return [FIXTURE]
    assert data is not None, "--data is needed for scales above 1"
    if one_file:
        return [data / f"one_file_{scale:03d}.json"]
    return [data / f"chunk_{k:03d}.json" for k in range(scale)]


class Stages:
    """Seconds spent in named functions, by wrapping them in their modules (this process only),
    and the process's RSS high-water mark when each stage last ended (where the peak was reached)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.hwm_mb: dict[str, float] = {}

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)
        self.seconds.setdefault(label, 0.0)  # report order = wrapping order

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - start)

        setattr(owner, attr, wrapper)

    def add(self, label: str, seconds: float) -> None:
        self.seconds[label] += seconds
        self.hwm_mb[label] = memory_mb()["hwm_mb"]


# ---------------------------------------------------------------------------------------------- (A) shiftbench


def shiftbench_spec() -> tuple[Any, Any]:
    from shiftbench.metashift.specs import load_specs

    specs = load_specs()
    return specs, specs.collections["metashift-attributes"].with_overrides(OVERRIDES)


def run_shiftbench(paths: list[Path], stages: Stages | None = None) -> dict[str, Any]:
    """(A): what a collection build does before writing, with its stages timed when asked."""
    from shiftbench.metashift import build
    from shiftbench.metashift import embedding as em
    from shiftbench.metashift import metagraph as mg
    from shiftbench.sources import scene_graphs

    specs, spec = shiftbench_spec()
    if stages is not None:
        stages.add(READ_TOTAL, 0.0)
        stages.wrap(scene_graphs, "_scene_from_parts", "- coded objects from the workers' parts: recode, sort")
        stages.wrap(scene_graphs.CodedObjects, "sha256", "- objects' fingerprint, as strings from the codes")
        stages.wrap(scene_graphs, "sha256_table", "- images' fingerprint (sort, Arrow IPC, sha256)")
        stages.wrap(scene_graphs, "sha256_files", "- sha256 of the input files")
        stages.add(BUILD_TOTAL, 0.0)
        stages.wrap(build, "candidate_memberships", "- candidate memberships (one packed 64-bit sort)")
        stages.wrap(build, "subset_table", "- subset sizes and selection")
        stages.wrap(mg, "node_order", "- node order")
        stages.wrap(
            mg, "overlap_edges", "- overlap edges (a 64-bit sort per group of classes into CSR, sparse products)"
        )
        stages.wrap(mg, "class_graphs", "- per-class weight matrices")
        stages.wrap(mg, "detect_communities", "- Louvain communities (B does not)")
        stages.wrap(mg, "modularity", "- modularity (B does not)")
        stages.wrap(em, "embed", "- spectral embeddings (dense eig)")
        stages.wrap(em, "pair_distances", "- pair distances")
    start = time.perf_counter()
    scene = scene_graphs.read_gqa_scene_graphs(paths)
    read_s = time.perf_counter() - start
    tables, results, _ = build.collection_tables(
        spec, scene.coded, scene.images, specs.general_contexts, {"bench": True}
    )
    build_s = time.perf_counter() - start - read_s
    if stages is not None:
        stages.add(READ_TOTAL, read_s)
        stages.add(BUILD_TOTAL, build_s)
    return {
        "seconds": read_s + build_s,
        "n_images": scene.images.height,
        "n_objects": scene.coded.height,
        "n_classes": len(results),
        "n_nodes": int(tables["metashift_subsets"]["selected"].sum()),
        "n_edges": tables["metashift_edges"].height,
        "n_distances": tables["metashift_distances"].height,
        "tables": tables,
        "results": results,
    }


# ---------------------------------------------------------------------------------------------- (B) reference


def spectral_positions(adjacency: Any, dim: int) -> tuple[Any, bool]:
    """``nx.spectral_layout(G, dim)`` of a dense adjacency, as an (n, dim) array in node order.

    networkx fails for 3..dim nodes (fewer eigenvectors than dim plus a dim-long centre); those
    are padded with zero columns, as shiftbench does. It never happens here: classes need at
    least 6 nodes. Returns (positions, whether the fallback was used).
    """
    import networkx as nx
    import numpy as np

    graph = nx.from_numpy_array(adjacency)
    n = adjacency.shape[0]
    try:
        pos = nx.spectral_layout(graph, dim=dim)
        return np.array([pos[k] for k in range(n)]), False
    except ValueError:  # networkx's own steps without the centre, then zero columns
        pos = nx.rescale_layout(nx.drawing.layout._spectral(nx.to_numpy_array(graph), dim))
        return np.hstack([pos, np.zeros((n, dim - pos.shape[1]))]), True


def run_reference(paths: list[Path], stages: Stages | None = None) -> dict[str, Any]:
    """(B): the released scripts' way, in plain Python sets, numpy and networkx."""
    import numpy as np

    stages = stages or Stages()
    start = time.perf_counter()
    subsets: dict[str, set[str]] = defaultdict(set)
    n_images = n_objects = 0
    for path in paths:
        t0 = time.perf_counter()
        with path.open(encoding="utf-8") as handle:
            graphs = json.load(handle)
        t1 = time.perf_counter()
        for image_id, graph in graphs.items():
            n_images += 1
            for obj in graph["objects"].values():
                n_objects += 1
                name = obj["name"]
                for attribute in obj.get("attributes") or ():
                    subsets[f"{name}({attribute})"].add(image_id)
        del graphs
        stages.add("parse: json.load", t1 - t0)
        stages.add("subsets: Python sets", time.perf_counter() - t1)

    t0 = time.perf_counter()
    by_class: dict[str, list[str]] = defaultdict(list)
    for subset, images in subsets.items():
        if len(images) >= MIN_SUBSET_SIZE:
            by_class[subset.partition("(")[0]].append(subset)
    classes = {
        name: sorted(members, key=lambda s: (-len(subsets[s]), s))
        for name, members in sorted(by_class.items())
        if len(members) > MAX_DROPPED_SUBSETS
    }
    stages.add("subsets: select and order", time.perf_counter() - t0)

    out: dict[str, dict[str, Any]] = {}
    fallbacks = 0
    for name, nodes in classes.items():
        t0 = time.perf_counter()
        n = len(nodes)
        overlap = np.zeros((n, n))
        for i in range(n):
            a = subsets[nodes[i]]
            for j in range(i + 1, n):
                b = subsets[nodes[j]]
                overlap[i, j] = overlap[j, i] = len(a & b) / min(len(a), len(b))
        overlap[overlap < EDGE_THRESHOLD] = 0.0
        t1 = time.perf_counter()
        positions, fallback = spectral_positions(overlap, DIM)
        fallbacks += fallback
        t2 = time.perf_counter()
        i_idx, j_idx = np.triu_indices(n, k=1)
        distances = np.linalg.norm(positions[i_idx] - positions[j_idx], axis=1)
        t3 = time.perf_counter()
        out[name] = {"nodes": nodes, "overlap": overlap, "positions": positions, "distances": distances}
        stages.add("meta-graphs: pairwise set intersections", t1 - t0)
        stages.add("embeddings: nx.spectral_layout", t2 - t1)
        stages.add("distances: pairs", t3 - t2)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "n_images": n_images,
        "n_objects": n_objects,
        "n_classes": len(out),
        "n_nodes": sum(len(c["nodes"]) for c in out.values()),
        "n_edges": sum(int(np.count_nonzero(np.triu(c["overlap"], k=1))) for c in out.values()),
        "n_distances": sum(len(c["distances"]) for c in out.values()),
        "layout_fallbacks": fallbacks,
        "classes": out,
    }


# ---------------------------------------------------------------------------------------------- agreement


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Same selected subsets, node order, edges (overlaps), positions and distances."""
    import numpy as np
    import polars as pl

    tables, results, classes = a["tables"], a["results"], b["classes"]
    selected_a = set(tables["metashift_subsets"].filter(pl.col("selected"))["subset"].to_list())
    selected_b = {s for c in classes.values() for s in c["nodes"]}
    assert selected_a == selected_b, f"selected subsets differ: {sorted(selected_a ^ selected_b)[:10]}"
    assert sorted(results) == sorted(classes), "classes differ"
    for name, c in classes.items():
        assert results[name].graph.nodes == c["nodes"], f"node order differs in {name}"

    def pair(x: str, y: str) -> tuple[str, str]:
        return (x, y) if x < y else (y, x)

    edges_b, dist_b = {}, {}
    for name, c in classes.items():
        nodes, overlap = c["nodes"], c["overlap"]
        i_idx, j_idx = np.triu_indices(len(nodes), k=1)
        for i, j, d in zip(i_idx.tolist(), j_idx.tolist(), c["distances"].tolist(), strict=True):
            key = (name, *pair(nodes[i], nodes[j]))
            dist_b[key] = d
            if overlap[i, j] > 0:
                edges_b[key] = float(overlap[i, j])
    edges_a = {
        (r["class"], r["subset_a"], r["subset_b"]): r["overlap"]
        for r in tables["metashift_edges"].iter_rows(named=True)
    }
    assert edges_a.keys() == edges_b.keys(), f"edges differ: {sorted(edges_a.keys() ^ edges_b.keys())[:10]}"
    overlap_diff = max((abs(edges_a[k] - edges_b[k]) for k in edges_a), default=0.0)
    distances = tables["metashift_distances"].collect()
    dist_a = {(r["class"], r["subset_a"], r["subset_b"]): r["raw_distance"] for r in distances.iter_rows(named=True)}
    assert dist_a.keys() == dist_b.keys(), "distance pairs differ"
    distance_diff = max((abs(dist_a[k] - dist_b[k]) for k in dist_a), default=0.0)
    position_diff = max(
        (float(np.abs(results[n].embedding.coords - c["positions"]).max()) for n, c in classes.items()), default=0.0
    )
    assert overlap_diff <= TOLERANCE, f"overlaps differ by {overlap_diff}"
    assert position_diff <= TOLERANCE, f"positions differ by {position_diff}"
    assert distance_diff <= TOLERANCE, f"distances differ by {distance_diff}"
    return {
        "classes": len(classes),
        "selected_subsets": len(selected_a),
        "edges": len(edges_a),
        "edges_exactly_equal": sum(edges_a[k] == edges_b[k] for k in edges_a),
        "max_overlap_diff": overlap_diff,
        "distances": len(dist_a),
        "distances_exactly_equal": sum(dist_a[k] == dist_b[k] for k in dist_a),
        "max_distance_diff": distance_diff,
        "max_position_diff": position_diff,
        "a_distance_status": dict(distances.group_by("status").len().iter_rows()),
        "b_layout_fallbacks": b["layout_fallbacks"],
    }


# ---------------------------------------------------------------------------------------------- data


def generate(out_dir: Path, chunks: int, one_file_scale: int) -> dict[str, Any]:
    """GQA files of the fixture's shape: chunk k resamples its images (seed k) as ``k-j``.

    With ``one_file_scale`` n > 1, also chunks 0..n-1 in one file (the same images, one document).
    """
    import numpy as np
    import polars as pl

    from shiftbench.sources.scene_graphs import read_gqa_scene_graphs

    scene = read_gqa_scene_graphs([FIXTURE])
    objects = scene.objects
    for column in ("image_id", "object_id"):
        assert not objects[column].str.contains(r'["\\\x00-\x1f]').any(), f"{column} needs JSON escaping"
    names = {v: json.dumps(v) for v in objects["name"].unique().to_list()}
    attributes = {v: json.dumps(v) for v in objects["attributes"].explode().drop_nulls().unique().to_list()}
    fragments = (
        objects.with_columns(
            pl.concat_str(
                pl.lit('"'),
                pl.col("object_id"),
                pl.lit('": {"name": '),
                pl.col("name").replace_strict(names, return_dtype=pl.String),
                pl.lit(', "x": 0, "y": 0, "w": 0, "h": 0, "attributes": ['),
                pl.col("attributes")
                .list.eval(pl.element().replace_strict(attributes, return_dtype=pl.String))
                .list.join(", "),
                pl.lit('], "relations": []}'),
            ).alias("fragment")
        )
        .group_by("image_id")
        .agg(pl.col("fragment").str.join(", "))
    )
    fragments = (
        scene.images.select("image_id")
        .join(fragments, on="image_id", how="left")
        .sort("image_id")
        .select(
            pl.concat_str(
                pl.lit('{"width": 0, "height": 0, "objects": {'), pl.col("fragment").fill_null(""), pl.lit("}}")
            )
        )
        .to_series()
    )
    n = len(fragments)
    out_dir.mkdir(parents=True, exist_ok=True)
    total = 0
    merged: list[str] = []
    for k in range(max(chunks, one_file_scale)):
        index = np.random.default_rng(k).integers(0, n, n)
        body = pl.DataFrame({"j": np.arange(n), "fragment": fragments.gather(index)}).select(
            pl.concat_str(pl.lit(f'"{k}-'), pl.col("j").cast(pl.String), pl.lit('": '), pl.col("fragment"))
        )
        inner = ", ".join(body.to_series().to_list())
        if k < one_file_scale:
            merged.append(inner)
        path = out_dir / f"chunk_{k:03d}.json"
        path.write_text("{" + inner + "}", encoding="utf-8")
        total += path.stat().st_size
    json.loads((out_dir / "chunk_000.json").read_text("utf-8"))  # valid JSON
    one_file_bytes = 0
    if one_file_scale > 1:
        path = out_dir / f"one_file_{one_file_scale:03d}.json"
        path.write_text("{" + ", ".join(merged) + "}", encoding="utf-8")
        one_file_bytes = path.stat().st_size
    return {"chunks": chunks, "images_per_chunk": n, "bytes": total, "one_file_bytes": one_file_bytes}


# ---------------------------------------------------------------------------------------------- workers


def worker_one(impl: str, scale: int, data: Path | None, one_file: bool) -> dict[str, Any]:
    import gc

    import numpy  # noqa: F401  (imports are outside the timed part, for both)

    if impl == "A":
        import polars  # noqa: F401

        from shiftbench.metashift import build  # noqa: F401
        from shiftbench.sources import scene_graphs  # noqa: F401
    else:
        import networkx  # noqa: F401
    paths = paths_for(scale, data, one_file)
    before = memory_mb()
    stages = Stages()
    run = run_shiftbench if impl == "A" else run_reference
    if impl == "B-gc-off":
        gc.disable()  # B builds no reference cycles; the collector only re-walks the growing sets
    result = run(paths, stages)
    record = {k: v for k, v in result.items() if k not in ("tables", "results", "classes")}
    return {
        "impl": impl,
        "scale": scale,
        **record,
        "stages": dict(stages.seconds),
        "stage_hwm_mb": stages.hwm_mb,
        "rss_after_imports_mb": before["rss_mb"],
        **memory_mb(),
    }


def worker_check(scale: int, data: Path | None) -> dict[str, Any]:
    paths = paths_for(scale, data)
    return compare(run_shiftbench(paths), run_reference(paths))


def spawn(args: list[str], timeout: float) -> dict[str, Any]:
    """Run this script as a worker; its last stdout line is ``RESULT <json>``."""
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"status": "stopped", "wall_s": time.perf_counter() - start, "timeout_s": timeout}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"status": "failed", "returncode": done.returncode, "error": " | ".join(tail)}
    return {"status": "ok", **json.loads(lines[-1][len("RESULT ") :])}


# ---------------------------------------------------------------------------------------------- report


def machine() -> dict[str, str]:
    import importlib.metadata as md

    free = subprocess.run(["free", "-g"], capture_output=True, text=True, check=False).stdout.split("\n")[1].split()
    versions = {p: md.version(p) for p in ("polars", "duckdb", "networkx", "numpy", "scipy")}
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (nproc), {free[1]} GB (free -g)",
        "python": platform.python_version(),
        **versions,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["status"] == "ok"]
    if len(ok) < len(runs):
        bad = next(r for r in runs if r["status"] != "ok")
        return {"status": bad["status"], **bad}
    times = [r["seconds"] for r in ok]
    median_run = sorted(ok, key=lambda r: r["seconds"])[(len(ok) - 1) // 2]
    return {
        "status": "ok",
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "runs": len(ok),
        "peak_mb": max(r["hwm_mb"] for r in ok),
        "rss_after_imports_mb": statistics.median(r["rss_after_imports_mb"] for r in ok),
        "stages": median_run["stages"],
        "stage_hwm_mb": median_run["stage_hwm_mb"],
        **{k: median_run[k] for k in ("n_images", "n_objects", "n_classes", "n_nodes", "n_edges", "n_distances")},
    }


def fmt_time(s: dict[str, Any]) -> str:
    if s["status"] == "stopped":
        return f"> {s['timeout_s']:.0f} s (stopped)"
    if s["status"] != "ok":
        return f"failed ({s.get('error', '')[:80]})"
    if s["runs"] == 1:
        return f"{s['median_s']:.2f} s"
    return f"{s['median_s']:.2f} s ({s['min_s']:.2f}-{s['max_s']:.2f})"


def ratio(a: dict[str, Any], b: dict[str, Any], key: str) -> str:
    if a["status"] == "ok" and b["status"] == "ok":
        return f"{b[key] / a[key]:.2f}x"
    if b["status"] == "stopped" and a["status"] == "ok" and key == "median_s":
        return f"> {b['timeout_s'] / a[key]:.1f}x"
    return "-"


def markdown(summary: dict[str, dict[str, dict[str, Any]]]) -> str:
    rows = [
        "| size | images | objects | subsets / classes / edges | impl | time: median (range) | runs "
        "| peak RSS | time / A | RSS / A |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scale, by_impl in summary.items():
        a = by_impl["A"]
        known = next((s for s in by_impl.values() if s["status"] == "ok"), a)
        for impl, s in by_impl.items():
            counts = f"{s['n_nodes']:,} / {s['n_classes']} / {s['n_edges']:,}" if s["status"] == "ok" else "-"
            peak = f"{s['peak_mb']:,.0f} MiB" if s["status"] == "ok" else "-"
            runs = str(s.get("runs", "-"))
            rt, rm = (ratio(a, s, "median_s"), ratio(a, s, "peak_mb")) if impl != "A" else ("", "")
            images = f"{known['n_images']:,}" if known["status"] == "ok" else "-"
            objects = f"{known['n_objects']:,}" if known["status"] == "ok" else "-"
            rows.append(
                f"| {scale} | {images} | {objects} | {counts} | {LABELS[impl]} | {fmt_time(s)} | {runs} | {peak} "
                f"| {rt} | {rm} |"
            )
    scales = list(summary)
    impls = list(next(iter(summary.values())))
    multi = [x for x in scales if "one file" not in x]
    rows += ["", "| growth | " + " | ".join(f"{x} → {y}" for x, y in itertools.pairwise(multi)) + " |"]
    rows.append("| --- |" + " --- |" * (len(multi) - 1))
    for impl in impls:
        cells = []
        for x, y in itertools.pairwise(multi):
            sx, sy = summary[x][impl], summary[y][impl]
            if sx["status"] == "ok" and sy["status"] == "ok":
                cells.append(f"time {sy['median_s'] / sx['median_s']:.1f}x, RSS {sy['peak_mb'] / sx['peak_mb']:.1f}x")
            else:
                cells.append("-")
        rows.append(f"| {LABELS[impl]} | " + " | ".join(cells) + " |")
    for impl in impls:
        labels = list(dict.fromkeys(k for by_impl in summary.values() for k in by_impl[impl].get("stages", {})))
        if not labels:
            continue
        rows += [
            "",
            f"| {LABELS[impl]}: stage (s, and RSS high-water mark when it ended; median run) | "
            + " | ".join(scales)
            + " |",
        ]
        rows.append("| --- |" + " --- |" * len(scales))
        for stage in labels:
            cells = []
            for x in scales:
                s = summary[x][impl]
                if stage in s.get("stages", {}):
                    hwm = s["stage_hwm_mb"].get(stage)
                    cells.append(f"{s['stages'][stage]:.2f} s" + (f", {hwm:,.0f} MiB" if hwm is not None else ""))
                else:
                    cells.append("-")
            rows.append(f"| {stage} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--runs", type=int, default=3, help="runs per implementation below 100x")
    parser.add_argument("--large-runs", type=int, default=1, help="runs per implementation at 100x and above")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a run is stopped")
    parser.add_argument("--check-scales", type=int, nargs="*", default=[1, 10], help="A == B checked here")
    parser.add_argument("--out", type=Path, default=PROJECT / "bench" / "results" / "metashift.json")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument(
        "--one-file-scale", type=int, default=10, help="also this scale as a single file (real GQA files are big)"
    )
    parser.add_argument("--one-file", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--generate", type=int, metavar="CHUNKS", help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if "A" not in args.impls:
        parser.error("--impls must include A (ratios are to A)")

    worker: Callable[[], dict[str, Any]] | None = None
    if args.one:
        worker = lambda: worker_one(args.one, args.scale, args.data, args.one_file)  # noqa: E731
    elif args.check:
        worker = lambda: worker_check(args.scale, args.data)  # noqa: E731
    elif args.generate:
        worker = lambda: generate(args.data, args.generate, args.one_file_scale)  # noqa: E731
    if worker is not None:
        print("RESULT " + json.dumps(worker()), flush=True)
        return

    started = time.perf_counter()
    results: dict[str, Any] = {"environment": machine(), "command": " ".join(sys.argv[1:])}
    print(json.dumps(results["environment"]), flush=True)
    data = Path(tempfile.mkdtemp(prefix="shiftbench-metashift-"))
    try:
        largest = max(args.scales)
        one_file_scale = args.one_file_scale if args.one_file_scale in args.scales and args.one_file_scale > 1 else 0
        sizes: list[tuple[str, int, bool]] = []
        for scale in args.scales:
            sizes.append((f"{scale}x", scale, False))
            if scale == one_file_scale:
                sizes.append((f"{scale}x as one file", scale, True))
        if largest > 1:
            command = ["--generate", str(largest), "--one-file-scale", str(one_file_scale), "--data", str(data)]
            generated = spawn(command, args.timeout)
            assert generated["status"] == "ok", generated
            results["generated"] = generated
            print(
                f"generated {generated['chunks']} files, {generated['bytes'] / 1e9:.2f} GB; "
                f"one file: {generated['one_file_bytes'] / 1e6:.0f} MB",
                flush=True,
            )
        results["agreement"] = {}
        for scale in [s for s in args.check_scales if s in args.scales]:
            check = spawn(["--check", "--scale", str(scale), "--data", str(data)], args.timeout)
            assert check["status"] == "ok", f"A and B disagree at {scale}x: {check}"
            results["agreement"][f"{scale}x"] = check
            print(f"agreement {scale}x: {json.dumps(check)}", flush=True)
        summary: dict[str, dict[str, dict[str, Any]]] = {}
        raw: dict[str, list[dict[str, Any]]] = {}
        for name, scale, one_file in sizes:
            runs = args.runs if scale < 100 else args.large_runs
            by_impl: dict[str, list[dict[str, Any]]] = {impl: [] for impl in args.impls}
            for _ in range(runs):
                for impl in args.impls:
                    command = ["--one", impl, "--scale", str(scale), "--data", str(data)]
                    one = spawn([*command, "--one-file"] if one_file else command, args.timeout)
                    by_impl[impl].append(one)
                    shown = f"{one['seconds']:.2f} s, {one['hwm_mb']:.0f} MiB" if one["status"] == "ok" else one
                    print(f"{name} {impl}: {shown}", flush=True)
            summary[name] = {impl: summarise(r) for impl, r in by_impl.items()}
            raw.update({f"{name} {impl}": r for impl, r in by_impl.items()})
        results["summary"] = summary
        results["runs"] = raw
    finally:
        shutil.rmtree(data, ignore_errors=True)
    results["total_wall_s"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print()
    print(markdown(summary))
    print(f"\ntotal wall time {results['total_wall_s']:.0f} s; raw results: {args.out}")


if __name__ == "__main__":
    main()
