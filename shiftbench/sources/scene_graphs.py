"""Multi-label image annotations for MetaShift: GQA scene graphs, generic tag tables, class groups.

Every reader returns the same two tables, the *scene tables*:

- ``objects``: one row per annotated object: ``image_id``, ``object_id``, ``name``,
  ``attributes`` (list of strings);
- ``images``: one row per image: ``image_id``, ``location``, ``weather`` (GQA's image-level
  fields, NULL when absent) and ``general`` (list of further image-level tags).

GQA files are hundreds of MB of ``{image_id: {..., objects: {object_id: {...}}}}``. They are decoded
with msgspec into typed structs that hold only what MetaShift reads (name, attributes, location, weather;
boxes and relations are skipped by the decoder, types are checked by it): a file in one call, each part of a
large file from ``Raw`` slices of the file's buffer (no copy), one image per call. Files, and the parts of a
large file, are decoded side by side in worker processes (:mod:`shiftbench.sources.gqa_decode`), which turn a
part's structs into integer-coded columns and return only those: half of a 216 MB file within 2.7x the file's
size in its worker, where the DuckDB ``MAP(VARCHAR, JSON)`` route took 12x (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from loky import ProcessPoolExecutor

from shiftbench.errors import InputError
from shiftbench.runtime import progress
from shiftbench.sources.gqa_decode import DecodedPart, decode_part
from shiftbench.sources.scene_codes import CODED_SCHEMA, CodedObjects
from shiftbench.tables.fingerprint import sha256_files, sha256_frames, sha256_table, sha256_text

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
GQA_KIND = "gqa-scene-graphs"  # SceneTables.kind of GQA files (recorded in versions' sources)


@dataclass(frozen=True)
class SceneTables:
    """Objects (integer-coded) and images of one annotation source, with the fingerprint of their content.

    The fingerprint is that of the objects and images as strings, each sorted by every column."""

    coded: CodedObjects
    images: pl.DataFrame
    fingerprint: str
    files_sha256: str
    kind: str

    @property
    def objects(self) -> pl.DataFrame:
        """The objects as strings, made from the codes (a copy, for small sources and tests)."""
        return self.coded.strings()

    @classmethod
    def from_coded(cls, coded: CodedObjects, images: pl.DataFrame, files_sha256: str, kind: str) -> SceneTables:
        """Objects already coded (sorted by image and object, as their strings would be), and the images."""
        images = images.select(list(IMAGES_SCHEMA)).cast(IMAGES_SCHEMA).sort("image_id")  # type: ignore[arg-type]
        fingerprint = sha256_text(f"{kind}|{coded.sha256()}|{sha256_table(images)}")
        return cls(coded, images, fingerprint, files_sha256, kind)

    @classmethod
    def from_frames(cls, objects: pl.DataFrame, images: pl.DataFrame, files_sha256: str, kind: str) -> SceneTables:
        objects = _sorted_by_key(objects.select(list(OBJECTS_SCHEMA)).cast(OBJECTS_SCHEMA), ["image_id", "object_id"])  # type: ignore[arg-type]
        images = images.select(list(IMAGES_SCHEMA)).cast(IMAGES_SCHEMA).sort("image_id")  # type: ignore[arg-type]
        # sha256_table sorts again, by every column: the fingerprint hashes the bytes of the sorted table, and the
        # unused bits after the last value of a bitmap (a column with NULLs) depend on how the rows were ordered
        # before the sort; hashing the images as sorted here gave two ids to the same scene graphs read in another
        # file order (tested). A table without any bitmap (objects have no NULL and no boolean) has bytes fixed by
        # its values: sorted by every column already, it is hashed as it is (at 100x a second sort of 15 M objects
        # took 4-5 s and a copy of the table).
        objects_sha256 = sha256_frames([objects]) if _without_bitmaps(objects) else sha256_table(objects)
        fingerprint = sha256_text(f"{kind}|{objects_sha256}|{sha256_table(images)}")
        image_ids = pl.concat([images["image_id"], objects["image_id"]]).unique().sort()
        return cls(CodedObjects.from_strings(objects, image_ids), images, fingerprint, files_sha256, kind)


def _sorted_by_key(frame: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """``frame`` sorted by every column, as :func:`shiftbench.tables.fingerprint.sha256_table` orders it: by ``key``
    when no
    two rows share it (then the other columns never decide), else by all columns."""
    ordered = frame.sort(key, nulls_last=True)
    repeated = pl.all_horizontal(pl.col(c).eq_missing(pl.col(c).shift(1)) for c in key).fill_null(False).any()
    if ordered.height and ordered.select(repeated).item():
        ordered = frame.sort(frame.columns, nulls_last=True)
    return ordered


def _without_bitmaps(frame: pl.DataFrame) -> bool:
    """No NULL anywhere (list items included) and no boolean column: its Arrow export has no bitmap."""
    for name, dtype in frame.schema.items():
        column = frame[name]
        if dtype == pl.Boolean or column.null_count():
            return False
        if isinstance(dtype, pl.List) and (dtype.inner == pl.Boolean or column.list.explode().null_count()):
            return False
    return True


# Files from this size on are decoded in parts, one per worker process (below it a worker costs more than it saves).
PARALLEL_FROM_BYTES = 64 << 20


def read_gqa_scene_graph_file(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One GQA ``*_sceneGraphs.json`` file as (objects, images) strings, decoded in this process; strict about
    structure and types."""
    objects, images = _scene_from_parts([path], {path: [decode_part(path)]})
    return objects.strings(), images


def _scene_from_parts(paths: list[Path], decoded: dict[Path, list[DecodedPart]]) -> tuple[CodedObjects, pl.DataFrame]:
    """The files' parts as one source: coded objects and the images, sorted; an image in two files is an error.

    Strings come back only for the images and the vocabulary (thousands of names and attributes): an object
    stays codes, its image a position among the sorted image ids and its strings positions in the vocabulary."""
    parts = [part for path in paths for part in decoded[path]]
    image_ids = pa.concat_arrays([part.image_ids for part in parts])
    # Put in order with Arrow (sort_indices, take), each column gathered once from the parts: at 100x the same join
    # in polars (parts concatenated, converted, then gathered) touched three times the fresh pages, and fresh memory
    # is what a stage pays for on these machines (BENCHMARKS.md); the read's peak fell by 0.3 GiB.
    order = pc.sort_indices(image_ids)  # by UTF-8 bytes, as polars sorts strings
    ordered = image_ids.take(order)
    _check_no_image_twice(paths, decoded, image_ids, ordered)
    images = pl.DataFrame(
        {
            "image_id": pl.Series(ordered),
            "location": pl.Series(pa.concat_arrays([part.locations for part in parts]).take(order)),
            "weather": pl.Series(pa.concat_arrays([part.weathers for part in parts]).take(order)),
        }
    ).with_columns(pl.lit([], dtype=pl.List(pl.String)).alias("general"))
    vocabulary = pl.Series(
        "value", list({s for part in parts for s in (*part.names, *part.attributes)}), dtype=pl.String
    ).sort()  # polars' order (UTF-8 bytes), the order the string table sorts by
    frame = _objects_by_image(parts, vocabulary, order.to_numpy(), len(image_ids))
    return CodedObjects(frame, vocabulary, images["image_id"]), images.cast(IMAGES_SCHEMA)  # type: ignore[arg-type]


def _check_no_image_twice(
    paths: list[Path], decoded: dict[Path, list[DecodedPart]], image_ids: pa.Array, ordered: pa.Array
) -> None:
    """An image in two files is an error naming both files (the first one read, the second the error's path)."""
    if len(ordered) <= 1:
        return
    repeated = pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))
    if not pc.any(repeated).as_py():
        return
    image_id = ordered[pc.index(repeated, True).as_py()].as_py()
    files = np.repeat(np.arange(len(paths)), [sum(len(part.image_ids) for part in decoded[p]) for p in paths])
    first, second = sorted(files[np.flatnonzero(pc.equal(image_ids, image_id).to_numpy(zero_copy_only=False))[:2]])
    raise InputError(f"image {image_id!r} is also in {paths[first]}", path=paths[second])


def _recoded(
    parts: list[DecodedPart], vocabulary: pl.Series, n_images: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The parts' codes recoded into the vocabulary's, in file order, each into its place in one array:
    (name per object, attribute values, attribute offsets per object, objects per image)."""
    code_of = {value: code for code, value in enumerate(vocabulary.to_list())}
    n_objects = sum(len(part.name_code) for part in parts)
    name = np.empty(n_objects, dtype=np.uint32)
    values = np.empty(sum(len(part.attribute_code) for part in parts), dtype=np.uint32)
    offsets = np.zeros(n_objects + 1, dtype=np.int64)
    counts = np.empty(n_images, dtype=np.uint32)  # objects per image, file order
    objects_before = values_before = images_before = 0
    for part in parts:  # a part may have no image (a file of one image decoded in two parts)
        objects, images_here = len(part.name_code), len(part.image_ids)
        here = slice(objects_before, objects_before + objects)
        name_map = np.array([code_of[n] for n in part.names], dtype=np.uint32)
        attribute_map = np.array([code_of[a] for a in part.attributes], dtype=np.uint32)
        np.take(name_map, part.name_code, out=name[here])
        np.take(
            attribute_map, part.attribute_code, out=values[values_before : values_before + len(part.attribute_code)]
        )
        np.add(part.attribute_offsets[1:], values_before, out=offsets[here.start + 1 : here.stop + 1])
        counts[images_before : images_before + images_here] = np.bincount(part.object_image, minlength=images_here)
        objects_before, values_before, images_before = (
            here.stop,
            values_before + len(part.attribute_code),
            images_before + images_here,
        )
    return name, values, offsets, counts


def _image_order_index(order: np.ndarray, counts: np.ndarray, lengths: np.ndarray, n_objects: int) -> np.ndarray:
    """Which object (file order) is row k of the result, the runs of objects put in image-id order: a gather, no
    sort of 15 M rows at 100x, its index made with few and narrow temporaries.

    Row k is object k + (the first object of its image in the file - the first row of its image in the result):
    the shift is repeated over each image's run. Unsigned arithmetic wraps, and the sum is in range."""
    kind = np.uint32 if n_objects < 2**32 else np.uint64
    first_object = np.cumsum(counts, dtype=kind)
    np.subtract(first_object, counts, out=first_object)
    first_row = np.cumsum(lengths, dtype=kind)
    np.subtract(first_row, lengths, out=first_row)
    shift = np.subtract(first_object[order], first_row)
    del first_object, first_row
    index = np.repeat(shift, lengths)
    del shift
    np.add(index, np.arange(n_objects, dtype=kind), out=index)
    return index


def _objects_by_image(
    parts: list[DecodedPart], vocabulary: pl.Series, order: np.ndarray, n_images: int
) -> pl.DataFrame:
    """The objects coded, sorted by image (``order``: the images' file positions in image-id order), then by
    object id within an image, which the file's order often is already; else one sort by both (ids are unique in
    an image, being JSON object keys: the order is total)."""
    name, values, offsets, counts = _recoded(parts, vocabulary, n_images)
    lengths = counts[order]  # objects per image, in image-id order
    take = pa.array(_image_order_index(order, counts, lengths, len(name)))
    attributes = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)).take(take)
    del offsets, values
    frame = pl.DataFrame(
        {
            "image": np.repeat(np.arange(len(order), dtype=np.uint32), lengths),
            "object_id": pl.Series(pa.chunked_array([part.object_ids for part in parts], pa.large_string()).take(take)),
            "name": pl.Series(pa.array(name).take(take)),
            "attributes": pl.Series(attributes),
        },
        schema=CODED_SCHEMA,
    )
    within = (pl.col("image") != pl.col("image").shift(1)) | (pl.col("object_id") > pl.col("object_id").shift(1))
    if not frame.select(within.fill_null(True).all()).item():
        frame = frame.sort("image", "object_id")
    return frame


def read_gqa_scene_graphs(paths: list[Path], workers: int | None = None) -> SceneTables:
    """Several GQA files (e.g. train and val) as one source; an image in two files is an error.

    msgspec decodes with the GIL held, so files are decoded side by side in worker processes (``workers``, one
    per core by default), a file of :data:`PARALLEL_FROM_BYTES` or more in one part per worker; a single small
    file is decoded here (a worker would cost more than it saves).
    """
    if not paths:
        raise InputError("no scene-graph file given", parameter="SHIFTBENCH_GQA_SCENE_GRAPHS")
    workers = workers or os.cpu_count() or 1
    units = [
        (path, part, parts)
        for path in paths
        for parts in [workers if path.is_file() and path.stat().st_size >= PARALLEL_FROM_BYTES else 1]
        for part in range(parts)
    ]
    decoded: dict[Path, list[DecodedPart]] = {path: [] for path in paths}
    if workers == 1 or len(units) == 1:
        for done, path in enumerate(paths, start=1):
            decoded[path] = [decode_part(path)]
            progress.report(progress.Event("read", path.name, done, len(paths), "done"))
    else:
        # loky's workers are fresh interpreters (forking the caller, which runs threads, is unsafe) that never run
        # the caller's main script again, as multiprocessing's spawn and forkserver do: a user's script without an
        # `if __name__ == "__main__"` guard would start workers without end (tested).
        with ProcessPoolExecutor(max_workers=min(workers, len(units))) as pool:
            futures = {pool.submit(decode_part, *unit): unit for unit in units}
            left = {path: sum(1 for unit in units if unit[0] == path) for path in paths}
            done = 0
            for future in as_completed(futures):
                path = futures[future][0]
                left[path] -= 1
                if not left[path] and future.exception() is None:
                    done += 1
                    progress.report(progress.Event("read", path.name, done, len(paths), "done"))
            for future, (path, _, _) in futures.items():  # in path order: the first error wins
                try:
                    decoded[path].append(future.result())
                except InputError as exc:  # the bad input, one line: not chained to the worker's traceback
                    raise exc.with_traceback(None) from None
    objects, images = _scene_from_parts(paths, decoded)
    if objects.height == 0:
        raise InputError("no objects in any scene graph: nothing to build subsets from", path=paths[0])
    # GQA objects have no NULL (a missing attribute list is an empty one): the string table has no bitmap and
    # is hashed as sorted (see SceneTables.from_frames), here from the codes.
    kind = GQA_KIND
    fingerprint = sha256_text(f"{kind}|{objects.sha256()}|{sha256_table(images)}")
    read = {path: part.file_sha256 for path in paths for part in decoded[path] if part.file_sha256 is not None}
    return SceneTables(objects, images, fingerprint, sha256_files(paths, known=read), kind)


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
        return _read_tags_parquet(path)
    if path.suffix.lower() in (".csv", ".tsv"):
        try:
            frame = pl.read_csv(path, separator="\t" if path.suffix.lower() == ".tsv" else ",", infer_schema=False)
        except pl.exceptions.PolarsError as exc:
            raise InputError(f"unreadable CSV: {str(exc).splitlines()[0]}", path=path, parameter=parameter) from None
        line_offset = 2  # header is line 1
    else:
        raise InputError("expected a .parquet, .csv or .tsv file", path=path, parameter=parameter)
    return _tags_from_frame(frame, path, line_offset)


def _tags_from_frame(frame: pl.DataFrame, path: Path, line_offset: int | None) -> SceneTables:
    """A tag table read as strings (CSV): checked, then coded."""
    parameter = "SHIFTBENCH_TAGS_TABLE"
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


def _read_tags_parquet(path: Path) -> SceneTables:
    """A Parquet tag table read as dictionary codes: no string per row is ever made.

    Open Images' image-level labels are 150 M rows of two strings; as polars strings they took about 40 GiB to
    read, check, deduplicate and code. Here each string column comes back as dictionary indices; the checks look at
    the dictionaries (a blank string, a NULL) and name the first row; codes become positions in the sorted strings,
    and the (image, tag, kind) rows are deduplicated as one packed 64-bit number each. The objects (kind
    ``object``) are the coded ``CodedObjects`` of the tag reader (image, tag), so the fingerprint is the string
    table's, as before.
    """
    parameter = "SHIFTBENCH_TAGS_TABLE"
    try:
        schema = pq.read_schema(path)
        columns = [c for c in ("image_id", "tag", "kind") if c in schema.names]
        missing = [c for c in ("image_id", "tag") if c not in schema.names]
        if missing:
            raise InputError(f"missing column {missing[0]!r} (have {', '.join(schema.names)})", path=path)
        for column in columns:
            kind = schema.field(column).type
            kind = kind.value_type if pa.types.is_dictionary(kind) else kind
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                polars_type = pl.from_arrow(pa.array([], type=kind)).dtype  # type: ignore[union-attr]
                raise InputError(
                    f"column {column!r} must be strings, found {polars_type} (ids are names, not numbers: cast them "
                    "when writing the file)",
                    path=path,
                )
        table = pq.read_table(path, columns=columns, read_dictionary=columns).unify_dictionaries()
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"unreadable Parquet: {exc}", path=path, parameter=parameter) from None
    if table.num_rows == 0:
        raise InputError("no rows: the table has no (image_id, tag) pair", path=path, parameter=parameter)
    image, image_ids = _sorted_codes(table.column("image_id"), path, "empty image_id")
    tag, tags = _sorted_codes(table.column("tag"), path, "empty tag")
    if "kind" in columns:
        kind_codes, kinds = _sorted_codes(table.column("kind"), path, None)
        unknown = [k for k, value in enumerate(kinds.to_list()) if value not in TAG_KINDS]
        if unknown:
            rows = np.flatnonzero(np.isin(kind_codes, unknown))
            raise InputError(
                f"row {int(rows[0])}: kind must be one of {', '.join(TAG_KINDS)} ({len(rows)} such rows)", path=path
            )
        general_code = kinds.to_list().index("general") if "general" in kinds.to_list() else -1
        is_general = kind_codes == general_code
    else:
        is_general = np.zeros(len(image), dtype=bool)
    del table
    image_bits = max(len(image_ids) - 1, 1).bit_length()
    tag_bits = max(len(tags) - 1, 1).bit_length()
    objects = _unique_packed(image[~is_general], tag[~is_general], tag_bits)
    general = _unique_packed(image[is_general], tag[is_general], tag_bits)
    if image_bits + tag_bits > 64:  # pragma: no cover - more than 2^64 (image, tag) pairs
        raise InputError("too many images and tags to code", path=path)
    vocabulary = tags.rename("value")
    coded = CodedObjects(
        pl.DataFrame(
            {"image": objects[0].astype(np.uint32), "name": objects[1].astype(np.uint32)},
            schema={"image": pl.UInt32, "name": pl.UInt32},
        ),
        vocabulary,
        image_ids.rename("image_id"),
    )
    lists = pl.DataFrame({"image": general[0], "tag": vocabulary.gather(general[1])})
    lists = lists.group_by("image").agg(pl.col("tag").alias("general"))  # sorted within: codes in string order
    images = (
        pl.DataFrame({"image": np.arange(len(image_ids)), "image_id": image_ids})
        .join(lists, on="image", how="left")
        .select(
            "image_id",
            pl.lit(None, dtype=pl.String).alias("location"),
            pl.lit(None, dtype=pl.String).alias("weather"),
            pl.col("general").fill_null(pl.lit([], dtype=pl.List(pl.String))),
        )
    )
    return SceneTables.from_coded(coded, images, sha256_files([path]), kind="tag-table")


def _sorted_codes(column: pa.ChunkedArray, path: Path, blank: str | None) -> tuple[np.ndarray, pl.Series]:
    """A dictionary-encoded column as codes into its sorted, distinct strings; a NULL or (with ``blank``) a blank
    string is an error naming the first row."""
    dictionary = column.chunk(0).dictionary if column.num_chunks else pa.array([], type=pa.string())
    indices = pa.chunked_array([chunk.indices for chunk in column.chunks], type=pa.int32())
    if indices.null_count and blank is not None:
        rows = np.flatnonzero(pc.is_null(indices).to_numpy(zero_copy_only=False))
        raise InputError(f"row {int(rows[0])}: {blank} ({len(rows)} such rows)", path=path)
    codes = pc.fill_null(indices, 0).to_numpy().astype(np.int64)
    strings = pl.Series(pl.from_arrow(dictionary)).cast(pl.String)
    if blank is not None:
        empty = np.flatnonzero((strings.str.strip_chars() == "").to_numpy())
        if len(empty):
            rows = np.flatnonzero(np.isin(codes, empty))
            if len(rows):
                raise InputError(f"row {int(rows[0])}: {blank} ({len(rows)} such rows)", path=path)
    used = np.zeros(len(strings), dtype=bool)
    used[codes] = True
    kept = np.flatnonzero(used)
    order = strings.gather(kept).arg_sort().to_numpy()
    rank = np.empty(len(strings), dtype=np.int64)
    rank[kept[order]] = np.arange(len(kept))
    return rank[codes], strings.gather(kept[order])


def _unique_packed(first: np.ndarray, second: np.ndarray, second_bits: int) -> tuple[np.ndarray, np.ndarray]:
    packed = (first.astype(np.uint64) << np.uint64(second_bits)) | second.astype(np.uint64)
    packed = pl.Series(packed).unique().sort().to_numpy()
    return (packed >> np.uint64(second_bits)).astype(np.int64), (packed & np.uint64((1 << second_bits) - 1)).astype(
        np.int64
    )


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
