"""MetaShift at GQA scale (issue 15's goals table): the CLI, the library path and the reference, side by side.

    .venv/bin/python bench/bench_metashift_gqa.py [--images 113000] [--runs 1] [--out bench/results/metashift_gqa.json]

Input: one GQA-shaped document from ``bench/gqa_shaped.py`` (113,000 images, ~16 objects each, 0-3
attributes each, ~216 MB), written to a temporary folder and deleted at the end. Both collections are built
with the released scripts' settings (``embedding=networkx``, ``edge_threshold=0.2``, classes with more than
5 subsets of >= 25 images):

- ``objects``: object-presence contexts (``--benchmark metashift --set context_kinds=object``);
- ``attributes``: ``metashift-attributes`` (attribute contexts) on the same file.

Per collection, each in a fresh process:

- ``cli``: ``shiftbench build metashift ... --name NAME`` in a new ``SHIFTBENCH_HOME``: Dagster, contracts,
  figures, cards, publish and the catalog included; wall time and peak RSS from ``/usr/bin/time``;
- ``library``: ``read_gqa_scene_graphs`` + ``collection_tables`` + ``Store.stage`` (hashing and writing
  every table), no Dagster and no contracts; time after imports, peak RSS (``VmHWM``);
- ``reference`` and ``reference-gc-off``: the released scripts' way (``json.load``, ``dict[str, set]`` of
  candidate subsets, Python set intersections of every pair of a class's subsets, ``nx.spectral_layout``,
  all pair distances), with Python's collector on (as the scripts run) and off.

The reference's ``nx.spectral_layout`` switches to an unseeded ARPACK solver from 500 nodes on, so its
positions for large classes are not reproducible; shiftbench's ``networkx`` mode always takes the dense
solver networkx uses below 500 nodes (bit-identical there). The counts (candidate subsets, selected subsets,
classes, distance pairs) are compared between all implementations.
"""

from __future__ import annotations

import argparse
import gc
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
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "bench"))
from process_memory import run_sampled  # noqa: E402  (bench/ is on the path above)

SETTINGS = {"embedding": "networkx", "edge_threshold": 0.2}
COLLECTIONS = {
    "objects": ("metashift", {"context_kinds": ["object"], **SETTINGS}),
    "attributes": ("metashift-attributes", SETTINGS),
}
IMPLS = ("cli", "library", "reference", "reference-gc-off")
MIN_SUBSET_SIZE, MIN_SUBSETS = 25, 6


def hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_library(path: Path, collection: str, home: Path) -> dict[str, Any]:
    from shiftbench.metashift import collection as collections
    from shiftbench.metashift.specs import load_specs
    from shiftbench.sources.scene_graphs import read_gqa_scene_graphs
    from shiftbench.store import Store

    name, overrides = COLLECTIONS[collection]
    specs = load_specs()
    spec = specs.collections[name].with_overrides(overrides)
    start = time.perf_counter()
    scene = read_gqa_scene_graphs([path])
    read_s = time.perf_counter() - start
    tables, results, _ = collections.build_collection(spec, scene.coded, scene.images, specs.general_contexts, {})
    build_s = time.perf_counter() - start - read_s
    Store(home / "store").writer.stage("metashift", f"bench-{collection}", tables)
    seconds = time.perf_counter() - start
    classes = tables["metashift_classes"]
    return {
        "seconds": seconds,
        "stages": {"read": read_s, "build_collection": build_s, "stage (hash + write)": seconds - read_s - build_s},
        "candidate_subsets": int(classes["n_candidates"].sum()),  # type: ignore[index]
        "selected": int(tables["metashift_subsets"]["selected"].sum()),  # type: ignore[index]
        "classes": len(results),
        "pairs": sum(len(r.graph.nodes) * (len(r.graph.nodes) - 1) // 2 for r in results.values()),
        "hwm_mb": hwm_mb(),
    }


def run_reference(path: Path, collection: str) -> dict[str, Any]:
    import networkx as nx
    import numpy as np

    start = time.perf_counter()
    with path.open(encoding="utf-8") as handle:
        graphs = json.load(handle)
    subsets: dict[str, set[str]] = defaultdict(set)
    for image_id, graph in graphs.items():
        objects = graph["objects"].values()
        if collection == "objects":
            names = {o["name"] for o in objects}
            for name in names:
                for context in names:
                    if context != name:
                        subsets[f"{name}({context})"].add(image_id)
        else:
            for o in objects:
                for attribute in o.get("attributes") or ():
                    subsets[f"{o['name']}({attribute})"].add(image_id)
    del graphs
    parsed_s = time.perf_counter() - start
    by_class: dict[str, list[str]] = defaultdict(list)
    for subset, images in subsets.items():
        if len(images) >= MIN_SUBSET_SIZE:
            by_class[subset.partition("(")[0]].append(subset)
    classes = {
        name: sorted(members, key=lambda s: (-len(subsets[s]), s))
        for name, members in sorted(by_class.items())
        if len(members) >= MIN_SUBSETS
    }
    pairs = 0
    for nodes in classes.values():
        n = len(nodes)
        overlap = np.zeros((n, n))
        for i in range(n):
            a = subsets[nodes[i]]
            for j in range(i + 1, n):
                b = subsets[nodes[j]]
                overlap[i, j] = overlap[j, i] = len(a & b) / min(len(a), len(b))
        overlap[overlap < SETTINGS["edge_threshold"]] = 0.0
        layout = nx.spectral_layout(nx.from_numpy_array(overlap), dim=5)
        positions = np.array([layout[k] for k in range(n)])
        i_idx, j_idx = np.triu_indices(n, k=1)
        pairs += len(np.linalg.norm(positions[i_idx] - positions[j_idx], axis=1))
    return {
        "seconds": time.perf_counter() - start,
        "stages": {"parse + subsets": parsed_s, "pairs, layouts, distances": time.perf_counter() - start - parsed_s},
        "candidate_subsets": len(subsets),
        "selected": sum(len(c) for c in classes.values()),
        "classes": len(classes),
        "pairs": pairs,
        "hwm_mb": hwm_mb(),
    }


def run_cli(path: Path, collection: str, home: Path) -> dict[str, Any]:
    name, overrides = COLLECTIONS[collection]
    sets = [
        arg
        for key, value in overrides.items()
        for arg in ("--set", f"{key}={','.join(value) if isinstance(value, list) else value}")
    ]
    command = [
        "/usr/bin/time",
        "-f",
        "WALL %e RSS_KB %M",
        str(PROJECT / ".venv" / "bin" / "shiftbench"),
        "build",
        "metashift",
        "--benchmark",
        f"{name}@gqa-files",
        *sets,
        "--name",
        f"bench-{collection}",
    ]  # fmt: skip  (a GQA-shaped file is not GQA's release: the names carry @gqa-files)
    env = {**os.environ, "SHIFTBENCH_HOME": str(home), "SHIFTBENCH_GQA_SCENE_GRAPHS": str(path)}
    done, stdout, stderr, tree_kb = run_sampled(command, env)
    line = next(line for line in stderr.splitlines()[::-1] if line.startswith("WALL "))
    _, wall, _, rss = line.split()
    if done.returncode != 0:
        raise RuntimeError(f"CLI failed ({done.returncode}): {(stdout + stderr)[-2000:]}")
    return {
        "seconds": float(wall),
        "hwm_mb": int(rss) / 1024,  # the largest single process (/usr/bin/time), as the goals were measured
        "tree_peak_mb": tree_kb / 1024,  # with its reading and figure workers (bench/process_memory.py)
        "output_tail": stdout.strip().splitlines()[-6:],
        "distance_query": distance_query(home, f"bench-{collection}@gqa-files"),
    }


def distance_query(home: Path, benchmark: str) -> dict[str, Any]:
    """The distances of the collection's largest class, computed by the catalog's view (a fresh connection, the
    median of 3 queries)."""
    import duckdb

    with duckdb.connect(str(home / "catalog.duckdb"), read_only=True) as con:
        largest, n = con.execute(
            "SELECT class, n_subsets FROM metashift_graphs WHERE benchmark = ? ORDER BY n_subsets DESC LIMIT 1",
            [benchmark],
        ).fetchone()  # type: ignore[misc]
        query = (
            "SELECT count(*), count(distance), avg(distance) FROM metashift_distances WHERE benchmark = ? AND class = ?"
        )
        times = []
        for _ in range(3):
            start = time.perf_counter()
            pairs, defined, _ = con.execute(query, [benchmark, largest]).fetchone()  # type: ignore[misc]
            times.append(time.perf_counter() - start)
    return {"class": largest, "subsets": n, "pairs": pairs, "defined": defined, "median_s": statistics.median(times)}


def worker(impl: str, path: Path, collection: str, home: Path) -> dict[str, Any]:
    if impl == "library":
        import polars  # noqa: F401  (imports outside the timed part)

        import shiftbench.metashift.collection  # noqa: F401  (imported outside the timed part)

        return run_library(path, collection, home)
    import networkx  # noqa: F401
    import numpy  # noqa: F401

    if impl == "reference-gc-off":
        gc.disable()
    return run_reference(path, collection)


def spawn(impl: str, path: Path, collection: str, home: Path) -> dict[str, Any]:
    if impl == "cli":
        return run_cli(path, collection, home)
    command = [
        sys.executable,
        __file__,
        "--one",
        impl,
        "--file",
        str(path),
        "--collection",
        collection,
        "--home",
        str(home),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{impl} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=113_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--collections", nargs="+", default=list(COLLECTIONS), choices=list(COLLECTIONS))
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--out", type=Path, default=PROJECT / "bench" / "results" / "metashift_gqa.json")
    parser.add_argument("--one", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--collection", choices=list(COLLECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(worker(args.one, args.file, args.collection, args.home)), flush=True)
        return

    import gqa_shaped

    tmp = Path(tempfile.mkdtemp(prefix="shiftbench-gqa-"))
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "command": " ".join(sys.argv[1:]),
    }
    try:
        path = tmp / "gqa.json"
        results["input"] = gqa_shaped.generate(path, n_images=args.images)
        print(json.dumps(results["input"]), flush=True)
        runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for _ in range(args.runs):
            for collection in args.collections:
                for impl in args.impls:
                    home = tmp / f"home-{collection}-{impl}-{len(runs[f'{collection} {impl}'])}"
                    one = spawn(impl, path, collection, home)
                    shutil.rmtree(home, ignore_errors=True)
                    runs[f"{collection} {impl}"].append(one)
                    print(f"{collection} {impl}: {one['seconds']:.1f} s, {one['hwm_mb']:,.0f} MiB "
                          f"{json.dumps({k: v for k, v in one.items() if k not in ('seconds', 'hwm_mb')})}",
                          flush=True)  # fmt: skip
        results["runs"] = runs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {
        key: {
            "median_s": statistics.median(r["seconds"] for r in rs),
            "peak_mb": max(r["hwm_mb"] for r in rs),
            "tree_peak_mb": max(r.get("tree_peak_mb", r["hwm_mb"]) for r in rs),
        }
        for key, rs in runs.items()
    }
    results["summary"] = summary
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(
        "\n| collection | implementation | time (median) | peak RSS (largest process) | with its workers "
        "| reference (collector on) / this | reference (collector off) / this |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for collection in args.collections:
        ref = summary.get(f"{collection} reference")
        off = summary.get(f"{collection} reference-gc-off")
        for impl in args.impls:
            s = summary[f"{collection} {impl}"]
            r1 = f"{ref['median_s'] / s['median_s']:.2f}x" if ref else "-"
            r2 = f"{off['median_s'] / s['median_s']:.2f}x" if off else "-"
            print(
                f"| {collection} | {impl} | {s['median_s']:.1f} s | {s['peak_mb']:,.0f} MiB "
                f"| {s['tree_peak_mb']:,.0f} MiB | {r1} | {r2} |"
            )


if __name__ == "__main__":
    main()
