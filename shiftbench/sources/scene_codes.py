"""Scene objects with their strings as integer codes: the form MetaShift's builders join on.

As strings, the objects table (image id, object id, name, a list of attribute strings per object) was the
largest thing a build held: at 100x (15 M objects) about 5 GiB with its sorted copy, and the subset joins
coded it all again before joining. Here an object is integer codes from the reader on: its image as a
position among the sorted image ids, its name and attributes as positions in one sorted vocabulary. Codes
are in string order, so sorting by codes sorts as the strings would.

The fingerprint is still the string table's (no version id changes): the strings are made back from the
codes :data:`shiftbench.tables.fingerprint.BATCH_ROWS` rows at a time while hashing, never as one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from shiftbench.tables import fingerprint
from shiftbench.tables.streamed import prefetched

CODED_SCHEMA = pl.Schema(
    {"image": pl.UInt32(), "object_id": pl.String(), "name": pl.UInt32(), "attributes": pl.List(pl.UInt32())}
)


@dataclass(frozen=True)
class CodedObjects:
    """Objects as codes, in the order of the string table sorted by every column (image id, object id first)."""

    # CODED_SCHEMA: image (into image_ids), object_id, name and attributes (into vocabulary); a tag table's objects have
    # image and name only (the object id is the tag, and there are no attributes), sorted by (image, name)
    frame: pl.DataFrame
    vocabulary: pl.Series  # String, sorted, unique: every name and attribute
    image_ids: pl.Series  # String, sorted, unique: every image of the source (some may have no object)

    @property
    def height(self) -> int:
        return self.frame.height

    @classmethod
    def from_strings(cls, objects: pl.DataFrame, image_ids: pl.Series | None = None) -> CodedObjects:
        """Objects given as strings (``image_id, object_id, name, attributes``), kept in their order; the images
        are ``image_ids`` (sorted, unique; by default the objects' own)."""
        vocabulary = (
            pl.concat([objects["name"], objects["attributes"].explode().drop_nulls()]).unique().sort().rename("value")
        )
        if image_ids is None:
            image_ids = objects["image_id"].unique().sort()
        codes = pl.Series(np.arange(len(vocabulary), dtype=np.uint32))
        image_codes = pl.Series(np.arange(len(image_ids), dtype=np.uint32))
        frame = objects.select(
            pl.col("image_id").replace_strict(image_ids, image_codes, return_dtype=pl.UInt32).alias("image"),
            "object_id",
            pl.col("name").replace_strict(vocabulary, codes, return_dtype=pl.UInt32),
            pl.col("attributes").list.eval(pl.element().replace_strict(vocabulary, codes, return_dtype=pl.UInt32)),
        )
        return cls(frame.cast(CODED_SCHEMA), vocabulary.rename("value"), image_ids.rename("image_id"))

    def strings(self, start: int = 0, length: int | None = None) -> pl.DataFrame:
        """(A slice of) the objects as strings: ``image_id, object_id, name, attributes``."""
        frame = pl.from_arrow(self.arrow_strings(start, length))
        assert isinstance(frame, pl.DataFrame)
        return frame

    def arrow_strings(self, start: int = 0, length: int | None = None) -> pa.Table:
        """(A slice of) the objects as strings, as the Arrow table :func:`shiftbench.tables.fingerprint.arrow_batch`
        makes of :meth:`strings`, made by Arrow's ``take`` from the codes (4-8x faster than through polars: no
        string view to convert back, and every buffer holds exactly the slice's rows)."""
        frame = self.frame.slice(start, length)
        old = pl.CompatLevel.oldest()
        vocabulary = self.vocabulary.to_arrow(compat_level=old)
        names = vocabulary.take(frame["name"].to_arrow())
        if "attributes" not in frame.columns:  # a tag table's objects: the tag is the object, without attributes
            empty = pa.LargeListArray.from_arrays(
                pa.array(np.zeros(frame.height + 1, dtype=np.int64)), pa.array([], type=pa.large_string())
            )
            image_ids = self.image_ids.to_arrow(compat_level=old).take(frame["image"].to_arrow())
            return pa.table({"image_id": image_ids, "object_id": names, "name": names, "attributes": empty})
        lists = frame["attributes"].to_arrow(compat_level=old)
        lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
        first, last = (lists.offsets[0].as_py(), lists.offsets[-1].as_py()) if len(lists) else (0, 0)
        offsets = pc.subtract(lists.offsets, first) if len(lists) else pa.array([0], pa.int64())
        values = vocabulary.take(lists.values.slice(first, last - first))  # values under NULL lists too
        attributes = pa.LargeListArray.from_arrays(offsets, values, mask=lists.is_null() if lists.null_count else None)
        if lists.null_count:  # as arrow_batch's take leaves them: a NULL list spans no values
            attributes = attributes.take(pa.array(np.arange(len(attributes), dtype=np.int64)))
        columns = {
            "image_id": self.image_ids.to_arrow(compat_level=old).take(frame["image"].to_arrow()),
            "object_id": frame["object_id"].to_arrow(compat_level=old),
            "name": names,
            "attributes": attributes,
        }
        return pa.table(columns)

    def sha256(self) -> str:
        """The fingerprint :func:`shiftbench.tables.fingerprint.sha256_frames` gives the string table, from the codes,
        :data:`shiftbench.tables.fingerprint.BATCH_ROWS` rows at a time."""
        rows = fingerprint.BATCH_ROWS
        batches = (self.arrow_strings(start, rows) for start in range(0, self.height, rows))
        # The next batch is made (Arrow's take) on a worker thread while this one is hashed: both release the GIL
        # (100x: 1.4 s -> 0.9 s); a batch is ~125 MB at most, two at a time.
        return fingerprint.sha256_batches(self.arrow_strings(0, 0).schema, prefetched(batches))

    def with_images(self, images: np.ndarray) -> CodedObjects:
        """The objects of the images coded ``images`` (same codes, same order)."""
        wanted = pl.Series(images, dtype=pl.UInt32).implode()
        return CodedObjects(self.frame.filter(pl.col("image").is_in(wanted)), self.vocabulary, self.image_ids)

    def codes_of(self, values: list[str]) -> np.ndarray:
        """The codes of those of ``values`` in the vocabulary."""
        return np.flatnonzero(self.vocabulary.is_in(pl.Series(values, dtype=pl.String).implode()).to_numpy())

    def write(self, directory: Path) -> None:
        self.frame.write_parquet(directory / "objects.parquet")
        self.vocabulary.to_frame().write_parquet(directory / "vocabulary.parquet")
        self.image_ids.to_frame().write_parquet(directory / "image_ids.parquet")

    @classmethod
    def read(cls, directory: Path) -> CodedObjects:
        return cls(
            pl.read_parquet(directory / "objects.parquet"),
            pl.read_parquet(directory / "vocabulary.parquet").to_series(),
            pl.read_parquet(directory / "image_ids.parquet").to_series(),
        )
