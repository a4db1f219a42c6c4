"""Multi-label image annotations for MetaShift: GQA scene graphs, generic tag tables, class groups.

Every reader returns the same two tables, the *scene tables*:

- ``objects``: one row per annotated object: ``image_id``, ``object_id``, ``name``,
  ``attributes`` (list of strings);
- ``images``: one row per image: ``image_id``, ``location``, ``weather`` (GQA's image-level
  fields, NULL when absent) and ``general`` (list of further image-level tags).

GQA files are hundreds of MB of ``{image_id: {..., objects: {object_id: {...}}}}``. They are decoded
with msgspec in two levels: the top-level mapping into ``Raw`` slices of the file's buffer (no copy),
then one image at a time into typed structs that hold only what MetaShift reads (name, attributes,
location, weather; boxes and relations are skipped by the decoder, types are checked by it). Only one
image's objects exist as Python objects at once: a 231 MB file reads in about 2.4 s within about 2.5x
its size, where the DuckDB ``MAP(VARCHAR, JSON)`` route took 6.2 s and 12x (BENCHMARKS.md, "Reading
GQA scene graphs"). Several files are read side by side.
"""

from __future__ import annotations

import gc
import json
import os
from array import array
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from shiftbench import progress
from shiftbench.errors import InputError
from shiftbench.fingerprint import sha256_files, sha256_table, sha256_text

OBJECTS_SCHEMA = {
    "image_id": pl.String,
    "object_id": pl.String,
    "name": pl.String,
    "attributes": pl.List(pl.String),
}
IMAGES_SCHEMA = {
    "image_id": pl.String,
    "location": pl.String,
    "weather": pl.String,
    "general": pl.List(pl.String),
}
TAG_KINDS = ("object", "general")


class _SceneObject(msgspec.Struct, gc=False):
    """What MetaShift reads of a GQA object (the decoder skips boxes, relations and anything else)."""

    name: str
    attributes: list[str] | None = None


class _SceneGraph(msgspec.Struct, gc=False):
    objects: dict[str, _SceneObject]
    location: str | None = None
    weather: str | None = None


_DECODE_SCENE = msgspec.json.Decoder(_SceneGraph).decode
_DECODE_OBJECT = msgspec.json.Decoder(_SceneObject).decode


@dataclass(frozen=True)
class SceneTables:
    """Objects and images of one annotation source, with the fingerprint of their content."""

    objects: pl.DataFrame
    images: pl.DataFrame
    fingerprint: str
    files_sha256: str
    kind: str

    @classmethod
    def from_frames(cls, objects: pl.DataFrame, images: pl.DataFrame, files_sha256: str, kind: str) -> SceneTables:
        objects = objects.select(list(OBJECTS_SCHEMA)).cast(OBJECTS_SCHEMA).sort("image_id", "object_id")  # type: ignore[arg-type]
        images = images.select(list(IMAGES_SCHEMA)).cast(IMAGES_SCHEMA).sort("image_id")  # type: ignore[arg-type]
        fingerprint = sha256_text(f"{kind}|{sha256_table(objects)}|{sha256_table(images)}")
        return cls(objects, images, fingerprint, files_sha256, kind)


def _json_error_location(path: Path) -> tuple[int | None, str]:
    """Line and message of the first syntax error (slow path: only after DuckDB refused the file)."""
    try:
        with path.open(encoding="utf-8") as handle:
            json.load(handle)
    except json.JSONDecodeError as exc:
        return exc.lineno, exc.msg
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 ({exc.reason})"
    return None, "unreadable"


def _object_problem(error: str) -> str:
    """msgspec's message about one object, in the words of this reader."""
    if "missing required field `name`" in error:
        return "object without 'name'"
    if error.endswith("`$.name`"):
        return "object 'name' is not a string"
    if "`$.attributes[" in error:
        return "'attributes' holds a non-string value"
    if error.endswith("`$.attributes`"):
        return "'attributes' is not a list"
    return "object is not a JSON object"


def _scene_problem(image_id: str, raw: bytes, error: str) -> str:
    """Where in one image's scene graph the decoder stopped, naming the image and the object (slow path:
    msgspec's path does not name dictionary keys, so the image is decoded again, object by object)."""
    where = f"image {image_id!r}"
    if "`$.objects[" not in error:
        if "missing required field `objects`" in error:
            return f"{where}: missing 'objects'"
        if error.endswith("`$.objects`"):
            return f"{where}: 'objects' is not a JSON object"
        for field in ("location", "weather"):
            if error.endswith(f"`$.{field}`"):
                return f"{where}: '{field}' is not a string"
        return f"{where}: scene graph is not a JSON object"
    objects = msgspec.json.decode(raw)["objects"]
    for object_id, value in objects.items():
        try:
            _DECODE_OBJECT(msgspec.json.encode(value))
        except msgspec.ValidationError as exc:
            return f"{where}, object {object_id!r}: {_object_problem(str(exc))}"
    return f"{where}: {error}"


def read_gqa_scene_graph_file(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One GQA ``*_sceneGraphs.json`` file as (objects, images); strict about structure and types."""
    if not path.is_file():
        raise InputError("scene-graph file not found", path=path, parameter="SHIFTBENCH_GQA_SCENE_GRAPHS")
    data = path.read_bytes()
    try:
        scenes = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.DecodeError:
        line, message = _json_error_location(path)
        raise InputError(f"invalid scene-graph JSON: {message}", path=path, line=line) from None
    except msgspec.ValidationError:
        raise InputError(
            "invalid scene-graph JSON: expected a JSON object mapping image ids to scene graphs", path=path
        ) from None
    if not scenes:
        raise InputError("no scene graphs: the file maps no image id to a scene graph", path=path)
    # Columnar and integer-coded while reading: names and attributes become codes into dictionaries (one
    # dict lookup per string, no Python object kept per object), expanded to strings by polars at the end.
    # The cyclic collector is off for the loop: it would re-walk every list built so far, many times over
    # (nothing here makes a reference cycle).
    image_ids: list[str] = []
    locations: list[str | None] = []
    weathers: list[str | None] = []
    object_ids: list[str] = []
    object_image, name_code, attribute_code = array("i"), array("i"), array("i")
    attribute_offsets = array("q", [0])
    name_codes: dict[str, int] = {}
    attribute_codes: dict[str, int] = {}
    collecting = gc.isenabled()
    gc.disable()
    try:
        for index, (image_id, raw) in enumerate(scenes.items()):
            try:
                scene = _DECODE_SCENE(raw)
            except msgspec.ValidationError as exc:
                raise InputError(_scene_problem(image_id, bytes(raw), str(exc)), path=path) from None
            image_ids.append(image_id)
            locations.append(scene.location)
            weathers.append(scene.weather)
            found = scene.objects
            object_ids.extend(found)
            object_image.extend([index] * len(found))
            for object_id, obj in found.items():
                code = name_codes.get(obj.name)
                if code is None:
                    if not obj.name.strip():
                        raise InputError(f"image {image_id!r}, object {object_id!r}: object 'name' is empty", path=path)
                    code = name_codes[obj.name] = len(name_codes)
                name_code.append(code)
                if obj.attributes:
                    attribute_code.extend([attribute_codes.setdefault(a, len(attribute_codes)) for a in obj.attributes])
                attribute_offsets.append(len(attribute_code))
    finally:
        if collecting:
            gc.enable()
    del scenes, data
    attribute_values = _decode(attribute_codes, attribute_code)
    attributes = pa.LargeListArray.from_arrays(
        pa.array(np.frombuffer(attribute_offsets, dtype=np.int64)),
        attribute_values.to_arrow(compat_level=pl.CompatLevel.oldest()),
    )
    objects = pl.DataFrame(
        {
            "image_id": pl.Series(image_ids, dtype=pl.String).gather(np.frombuffer(object_image, dtype=np.int32)),
            "object_id": pl.Series(object_ids, dtype=pl.String),
            "name": _decode(name_codes, name_code),
            "attributes": pl.Series(attributes, dtype=pl.List(pl.String)),
        }
    )
    images = pl.DataFrame(
        {"image_id": image_ids, "location": locations, "weather": weathers, "general": [[]] * len(image_ids)},
        schema=IMAGES_SCHEMA,  # type: ignore[arg-type]
    )
    return objects, images


def _decode(codes: dict[str, int], coded: array[int]) -> pl.Series:
    """Strings from their codes (``codes`` maps each string to its code, in insertion order)."""
    return pl.Series(list(codes), dtype=pl.String).gather(np.frombuffer(coded, dtype=np.int32))


def read_gqa_scene_graphs(paths: list[Path], workers: int | None = None) -> SceneTables:
    """Several GQA files (e.g. train and val) as one source; an image in two files is an error.

    DuckDB parses one JSON document on one thread, so files are read side by side, one per core
    (``workers``; DuckDB releases the GIL while it parses).
    """
    if not paths:
        raise InputError("no scene-graph file given", parameter="SHIFTBENCH_GQA_SCENE_GRAPHS")
    workers = workers or min(len(paths), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(read_gqa_scene_graph_file, path): path for path in paths}
        for done, future in enumerate(as_completed(futures), start=1):
            progress.report(progress.Event("read", futures[future].name, done, len(paths), "done"))
        parts = [future.result() for future in futures]  # in path order; the first error wins
    images = pl.concat([file_images.with_columns(pl.lit(i).alias("file")) for i, (_, file_images) in enumerate(parts)])
    twice = images.filter(pl.col("image_id").is_duplicated()).sort("image_id", "file")
    if twice.height:
        image_id, first_file = twice.row(0)[0], twice["file"][0]
        second_file = twice.filter(pl.col("image_id") == image_id)["file"][1]
        raise InputError(f"image {image_id!r} is also in {paths[first_file]}", path=paths[second_file])
    objects = pl.concat([file_objects for file_objects, _ in parts])
    if objects.height == 0:
        raise InputError("no objects in any scene graph: nothing to build subsets from", path=paths[0])
    return SceneTables.from_frames(objects, images.drop("file"), sha256_files(paths), kind="gqa-scene-graphs")


def parse_path_list(value: str) -> list[Path]:
    """``SHIFTBENCH_GQA_SCENE_GRAPHS`` is a comma-separated list of files."""
    return [Path(part.strip()) for part in value.split(",") if part.strip()]


def read_tags_table(path: Path) -> SceneTables:
    """A generic ``image_id, tag[, kind]`` table (Parquet or CSV): MetaShift from any multi-label dataset.

    ``kind`` is ``object`` (default: the tag is a class and an object context, like COCO labels)
    or ``general`` (an image-level context such as a scene or weather tag).
    """
    parameter = "SHIFTBENCH_TAGS_TABLE"
    if not path.is_file():
        raise InputError("tag table not found", path=path, parameter=parameter)
    if path.suffix.lower() == ".parquet":
        try:
            frame = pl.read_parquet(path)
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise InputError(f"unreadable Parquet: {exc}", path=path, parameter=parameter) from None
        line_offset = None
    elif path.suffix.lower() in (".csv", ".tsv"):
        try:
            frame = pl.read_csv(path, separator="\t" if path.suffix.lower() == ".tsv" else ",", infer_schema=False)
        except pl.exceptions.PolarsError as exc:
            raise InputError(f"unreadable CSV: {str(exc).splitlines()[0]}", path=path, parameter=parameter) from None
        line_offset = 2  # header is line 1
    else:
        raise InputError("expected a .parquet, .csv or .tsv file", path=path, parameter=parameter)
    missing = [c for c in ("image_id", "tag") if c not in frame.columns]
    if missing:
        raise InputError(f"missing column {missing[0]!r} (have {', '.join(frame.columns)})", path=path)
    if frame.height == 0:
        raise InputError("no rows: the table has no (image_id, tag) pair", path=path, parameter=parameter)
    for column in ("image_id", "tag", "kind"):
        if column in frame.columns and frame.schema[column] != pl.String:
            raise InputError(
                f"column {column!r} must be strings, found {frame.schema[column]} (ids are names, not numbers: "
                "cast them when writing the file)",
                path=path,
            )
    if "kind" not in frame.columns:
        frame = frame.with_columns(pl.lit("object").alias("kind"))
    frame = frame.with_row_index("row").with_columns(pl.col("kind").fill_null("object"))
    for condition, message in (
        (pl.col("image_id").is_null() | (pl.col("image_id").str.strip_chars() == ""), "empty image_id"),
        (pl.col("tag").is_null() | (pl.col("tag").str.strip_chars() == ""), "empty tag"),
        (~pl.col("kind").is_in(TAG_KINDS), f"kind must be one of {', '.join(TAG_KINDS)}"),
    ):
        bad = frame.filter(condition)
        if bad.height:
            row = int(bad["row"][0])
            line = row + line_offset if line_offset is not None else None
            where = "" if line is not None else f"row {row}: "
            raise InputError(f"{where}{message} ({bad.height} such rows)", path=path, line=line)
    tags = frame.select("image_id", "tag", "kind").unique()
    objects = (
        tags.filter(pl.col("kind") == "object")
        .sort("image_id", "tag")
        .select("image_id", pl.col("tag").alias("object_id"), pl.col("tag").alias("name"))
        .with_columns(pl.lit([], dtype=pl.List(pl.String)).alias("attributes"))
    )
    general = tags.filter(pl.col("kind") == "general").group_by("image_id").agg(pl.col("tag").sort().alias("general"))
    images = (
        tags.select("image_id")
        .unique()
        .join(general, on="image_id", how="left")
        .with_columns(
            pl.lit(None, dtype=pl.String).alias("location"),
            pl.lit(None, dtype=pl.String).alias("weather"),
            pl.col("general").fill_null(pl.lit([], dtype=pl.List(pl.String))),
        )
    )
    return SceneTables.from_frames(objects, images, sha256_files([path]), kind="tag-table")


def read_class_groups(path: Path) -> pl.DataFrame:
    """A class grouping ``{"group": ["name", ...]}`` (MetaShift's ``class_hierarchy.json``) as (name, class)."""
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise InputError(
            "class grouping file not found", path=path, parameter="SHIFTBENCH_METASHIFT_CLASS_GROUPS"
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", path=path, line=exc.lineno) from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v) for k, v in data.items()
    ):
        raise InputError("expected a JSON object mapping group names to lists of object names", path=path)
    rows = sorted({(name, group) for group, names in data.items() for name in names})
    return pl.DataFrame(rows, schema={"name": pl.String, "class": pl.String}, orient="row")
