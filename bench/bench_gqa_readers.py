"""Reading GQA scene graphs: the candidate parsers side by side (issue 15, step 1: choose the reader).

Every candidate reads the same GQA-layout file and produces the same columnar, integer-coded result: the
image ids, and per object its image index, object id, name code and attribute codes (dictionaries for the
strings). Each run is a fresh subprocess, so peak RSS (``ru_maxrss``) is that candidate's alone.

- ``duckdb``: today's reader, ``shiftbench.sources.scene_graphs.read_gqa_scene_graph_file`` (type checks
  included); timed to its string tables, as it runs today (coded afterwards only to compare answers);
- ``json``: the standard library with the garbage collector off, then a Python loop over the dicts;
- ``orjson``: the same loop over orjson's dicts;
- ``simdjson``: pysimdjson's lazy parser, converted per image;
- ``msgspec``: a typed decode into ``Struct``s (unknown fields such as boxes and relations skipped, types
  checked by the decoder; ``gc=False`` structs), then the same loop;
- ``msgspec_raw``: the top level to ``msgspec.Raw`` slices, then one typed decode per image.

    .venv/bin/python bench/bench_gqa_readers.py --generate /tmp/gqa --chunks 11      # ~210 MB, GQA scale
    .venv/bin/python bench/bench_gqa_readers.py --file /tmp/gqa/one_file_011.json --runs 3 \
        --out bench/results/gqa_readers.json
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any

import msgspec

PROJECT = Path(__file__).resolve().parents[1]
IMPLS = ("duckdb", "json", "orjson", "simdjson", "msgspec", "msgspec_raw")


class Coded:
    """Columnar, integer-coded scene tables built incrementally (one dict lookup per string)."""

    def __init__(self) -> None:
        self.image_ids: list[str] = []
        self.object_ids: list[str] = []
        self.image_index = array("i")
        self.name_code = array("i")
        self.attribute_code = array("i")
        self.attribute_offsets = array("q", [0])
        self.names: dict[str, int] = {}
        self.attributes: dict[str, int] = {}

    def add(self, image: int, object_id: str, name: str, attributes: list[str]) -> None:
        self.object_ids.append(object_id)
        self.image_index.append(image)
        self.name_code.append(self.names.setdefault(name, len(self.names)))
        codes = self.attributes
        self.attribute_code.extend([codes.setdefault(a, len(codes)) for a in attributes])
        self.attribute_offsets.append(len(self.attribute_code))

    def digest(self) -> dict[str, Any]:
        """Counts and a content hash independent of the coding order (the same answers for every reader)."""
        names = sorted(self.names, key=self.names.__getitem__)
        attributes = sorted(self.attributes, key=self.attributes.__getitem__)
        h = hashlib.sha256()
        rows = sorted(
            (
                self.image_ids[self.image_index[k]],
                self.object_ids[k],
                names[self.name_code[k]],
                ",".join(
                    attributes[c]
                    for c in self.attribute_code[self.attribute_offsets[k] : self.attribute_offsets[k + 1]]
                ),
            )
            for k in range(len(self.object_ids))
        )
        for row in rows:
            h.update("\t".join(row).encode())
            h.update(b"\n")
        return {"images": len(self.image_ids), "objects": len(self.object_ids), "sha256": h.hexdigest()}


def from_dicts(doc: dict[str, Any]) -> Coded:
    coded = Coded()
    for i, (image_id, graph) in enumerate(doc.items()):
        coded.image_ids.append(image_id)
        for object_id, obj in graph["objects"].items():
            coded.add(i, object_id, obj["name"], obj.get("attributes") or [])
    return coded


def read_json(path: Path) -> Coded:
    gc.disable()
    with path.open("rb") as handle:
        return from_dicts(json.load(handle))


def read_orjson(path: Path) -> Coded:
    import orjson

    gc.disable()
    return from_dicts(orjson.loads(path.read_bytes()))


def read_simdjson(path: Path) -> Coded:
    import simdjson

    gc.disable()
    doc = simdjson.Parser().parse(path.read_bytes())
    coded = Coded()
    for i, (image_id, graph) in enumerate(doc.items()):
        coded.image_ids.append(image_id)
        for object_id, obj in graph["objects"].items():
            attributes = obj.get("attributes")
            coded.add(i, object_id, obj["name"], list(attributes) if attributes is not None else [])
    return coded


class SceneObject(msgspec.Struct, gc=False):
    """What MetaShift reads of an object; boxes and relations are skipped by the decoder."""

    name: str
    attributes: list[str] = []


class SceneGraph(msgspec.Struct, gc=False):
    objects: dict[str, SceneObject]
    location: str | None = None
    weather: str | None = None


def read_msgspec(path: Path) -> Coded:
    gc.disable()
    doc = msgspec.json.decode(path.read_bytes(), type=dict[str, SceneGraph])
    coded = Coded()
    for i, (image_id, graph) in enumerate(doc.items()):
        coded.image_ids.append(image_id)
        for object_id, obj in graph.objects.items():
            coded.add(i, object_id, obj.name, obj.attributes)
    return coded


def read_duckdb(path: Path) -> Any:
    """Today's reader: string tables (polars), type checks included; coded afterwards, outside the timing."""
    sys.path.insert(0, str(PROJECT))
    from shiftbench.sources.scene_graphs import read_gqa_scene_graph_file

    return read_gqa_scene_graph_file(path)


def coded_from_tables(objects: Any, images: Any) -> Coded:
    coded = Coded()
    index = {image_id: i for i, image_id in enumerate(images["image_id"].to_list())}
    coded.image_ids = images["image_id"].to_list()
    for image_id, object_id, name, attributes in objects.iter_rows():
        coded.add(index[image_id], object_id, name, attributes)
    return coded


def read_msgspec_raw(path: Path) -> Coded:
    """Two-level decode: the top-level mapping to ``msgspec.Raw`` slices of the file's buffer (no copy),
    then one image at a time into Structs, so only one image's objects exist as Python objects at once."""
    gc.disable()
    data = path.read_bytes()
    images = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    decode = msgspec.json.Decoder(SceneGraph).decode
    coded = Coded()
    for i, (image_id, raw) in enumerate(images.items()):
        coded.image_ids.append(image_id)
        for object_id, obj in decode(raw).objects.items():
            coded.add(i, object_id, obj.name, obj.attributes)
    return coded


READERS = {
    "json": read_json,
    "orjson": read_orjson,
    "simdjson": read_simdjson,
    "msgspec": read_msgspec,
    "msgspec_raw": read_msgspec_raw,
}


def worker(impl: str, path: Path, digest: bool) -> dict[str, Any]:
    start, cpu = time.perf_counter(), time.process_time()
    result = read_duckdb(path) if impl == "duckdb" else READERS[impl](path)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    coded = coded_from_tables(*result) if impl == "duckdb" else result
    out: dict[str, Any] = {"impl": impl, "wall_s": wall, "cpu_s": cpu, "peak_rss_mib": peak}
    out.update(coded.digest() if digest else {"images": len(coded.image_ids), "objects": len(coded.object_ids)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", type=Path, metavar="DIR")
    parser.add_argument("--chunks", type=int, default=11)
    parser.add_argument("--file", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--one", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--digest", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        sys.path.insert(0, str(PROJECT / "bench"))
        from bench_metashift import generate

        print(json.dumps(generate(args.generate, 1, args.chunks)))
        return
    if args.one:
        print(json.dumps(worker(args.one, args.file, args.digest)))
        return
    results: dict[str, list[dict[str, Any]]] = {impl: [] for impl in args.impls}
    digests = {}
    for run in range(args.runs):
        for impl in args.impls:  # interleaved, so drifting machine load hits every candidate alike
            command = [sys.executable, __file__, "--one", impl, "--file", str(args.file)]
            output = subprocess.run(command + (["--digest"] if run == 0 else []), capture_output=True, text=True)
            if output.returncode:
                raise SystemExit(f"{impl} failed: {output.stderr[-2000:]}")
            row = json.loads(output.stdout.strip().splitlines()[-1])
            if run == 0:
                digests[impl] = row["sha256"]
            results[impl].append(row)
            print(json.dumps(row), flush=True)
    assert len(set(digests.values())) == 1, f"the readers disagree: {digests}"
    summary = {
        impl: {key: statistics.median(r[key] for r in rows) for key in ("wall_s", "cpu_s", "peak_rss_mib")}
        | {"images": rows[0]["images"], "objects": rows[0]["objects"], "runs": len(rows)}
        for impl, rows in results.items()
    }
    report = {
        "file": str(args.file),
        "bytes": args.file.stat().st_size,
        "summary": summary,
        "same_content_sha256": next(iter(digests.values())),
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
    }
    print(json.dumps(report["summary"], indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
