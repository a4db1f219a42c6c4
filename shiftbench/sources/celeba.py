"""CelebA's annotation files, read strictly (``SHIFTBENCH_CELEBA_DIR``).

``list_attr_celeba.txt``: line 1 the number of images, line 2 the 40 attribute names, then one
line per image: the file name and 40 values of ``1`` / ``-1`` separated by one or more spaces.
``list_eval_partition.txt`` (optional): ``image_name split`` with 0 train, 1 val, 2 test.

The file is split into tokens by polars (no Python object per value); every error names the
file and line. A header count that disagrees with the rows is an error unless the caller allows
a partial file (then the rows present are used and the mismatch is recorded).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from shiftbench.errors import InputError

ATTRIBUTE_FILE = "list_attr_celeba.txt"
PARTITION_FILE = "list_eval_partition.txt"
N_ATTRIBUTES = 40
PARTITIONS = {"0": "train", "1": "val", "2": "test"}


@dataclass(frozen=True)
class CelebaAttributes:
    table: pl.DataFrame  # image_id, 40 Int8 columns (1 / -1), partition (NULL without the partition file)
    header_count: int
    partial: bool


def _lines(path: Path) -> pl.DataFrame:
    """The file as (line number, text); polars splits lines, nothing is parsed yet."""
    try:
        lines = pl.read_csv(
            path,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            new_columns=["text"],
            schema_overrides={"text": pl.String},
            infer_schema=False,
        )
    except pl.exceptions.NoDataError:
        raise InputError("file is empty", path=path) from None
    except pl.exceptions.ComputeError as exc:
        raise InputError(f"unreadable text file: {str(exc).splitlines()[0]}", path=path) from None
    return lines.with_row_index("line", offset=1).with_columns(pl.col("text").str.strip_chars())


CELEBA_IMAGES = 202_599  # images in CelebA's list_attr_celeba.txt


# The release's list_attr_celeba.txt, by the MD5 CelebA's distribution lists (as torchvision's CelebA checks it).
RELEASE_MD5 = "75e246fa4810816ffd6ee81facbd244c"
TAG_PARTIAL, TAG_FILES = "partial", "celeba-files"


@functools.lru_cache(maxsize=8)
def _file_facts(path: Path, size: int, mtime_ns: int) -> tuple[int, str]:
    """(rows, MD5) of an attribute file: one pass, cached by the file's size and modification time."""
    digest = hashlib.md5(usedforsecurity=False)
    lines = 0
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            lines += chunk.count(b"\n")
            digest.update(chunk)
    return max(lines - 2, 0), digest.hexdigest()  # the count line and the names line


def source_tag(path: Path) -> str | None:
    """None for CelebA's released attribute file (its published MD5); ``partial`` for a file with fewer rows
    (a first-N file, a truncated one); ``celeba-files`` for any other file, whatever its row count.

    Names tell the truth: a row count alone would let a crafted or edited file of 202,599 rows publish under
    the paper's case names.
    """
    if not path.is_file():
        return TAG_PARTIAL
    stat = path.stat()
    rows, md5 = _file_facts(path, stat.st_size, stat.st_mtime_ns)
    if md5 == RELEASE_MD5:
        return None
    return TAG_PARTIAL if rows < CELEBA_IMAGES else TAG_FILES


def file_md5(path: Path) -> str:
    stat = path.stat()
    return _file_facts(path, stat.st_size, stat.st_mtime_ns)[1]


def read_celeba_attributes(path: Path, *, allow_partial: bool = False) -> CelebaAttributes:
    if not path.is_file():
        raise InputError("CelebA attribute file not found", path=path, parameter="SHIFTBENCH_CELEBA_DIR")
    lines = _lines(path)
    if lines.height < 2:
        raise InputError("expected a count line and a line of attribute names", path=path, line=lines.height + 1)
    count_text = lines["text"][0]
    if not count_text.isdigit():
        raise InputError(f"line 1 must be the number of images, found {count_text[:40]!r}", path=path, line=1)
    header_count = int(count_text)
    names = lines["text"][1].split()
    if len(names) != N_ATTRIBUTES or len(set(names)) != N_ATTRIBUTES:
        raise InputError(f"expected {N_ATTRIBUTES} distinct attribute names, found {len(names)}", path=path, line=2)
    rows = lines.slice(2).filter(pl.col("text") != "")
    tokens = rows.with_columns(pl.col("text").str.split(" ").list.filter(pl.element() != "").alias("tokens"))
    wrong = tokens.filter(pl.col("tokens").list.len() != N_ATTRIBUTES + 1)
    if wrong.height:
        first = wrong.row(0, named=True)
        raise InputError(
            f"expected an image name and {N_ATTRIBUTES} values ({N_ATTRIBUTES + 1} fields), "
            f"found {len(first['tokens'])} ({wrong.height} such lines)",
            path=path,
            line=int(first["line"]),
        )
    values = tokens.select(
        "line",
        pl.col("tokens").list.get(0).alias("image_id"),
        *[pl.col("tokens").list.get(k + 1).alias(name) for k, name in enumerate(names)],
    )
    bad = values.filter(pl.any_horizontal([~pl.col(n).is_in(["1", "-1"]) for n in names]))
    if bad.height:
        first = bad.row(0, named=True)
        column = next(n for n in names if first[n] not in ("1", "-1"))
        raise InputError(
            f"{column} is {first[column]!r}; values must be 1 or -1 ({bad.height} such lines)",
            path=path,
            line=int(first["line"]),
        )
    duplicated = values.filter(pl.col("image_id").is_duplicated())
    if duplicated.height:
        first = duplicated.row(0, named=True)
        raise InputError(f"image {first['image_id']!r} is listed twice", path=path, line=int(first["line"]))
    if values.height != header_count and not allow_partial:
        raise InputError(
            f"header says {header_count} images but the file has {values.height} rows (truncated?); "
            "set allow_partial (SHIFTBENCH_CELEBA_ALLOW_PARTIAL=1) to use the rows present",
            path=path,
            line=1,
        )
    table = values.drop("line").with_columns([pl.col(n).cast(pl.Int8) for n in names])
    partition_path = path.parent / PARTITION_FILE
    if partition_path.is_file():
        table = _join_partitions(table, partition_path)
    else:
        table = table.with_columns(pl.lit(None, dtype=pl.String).alias("partition"))
    return CelebaAttributes(table, header_count, values.height != header_count)


def _join_partitions(table: pl.DataFrame, path: Path) -> pl.DataFrame:
    lines = _lines(path).filter(pl.col("text") != "")
    tokens = lines.with_columns(pl.col("text").str.split(" ").list.filter(pl.element() != "").alias("tokens"))
    wrong = tokens.filter(
        (pl.col("tokens").list.len() != 2) | ~pl.col("tokens").list.get(-1, null_on_oob=True).is_in(list(PARTITIONS))
    )
    if wrong.height:
        raise InputError("expected 'image_name split' with split 0, 1 or 2", path=path, line=int(wrong["line"][0]))
    partitions = tokens.select(
        pl.col("tokens").list.get(0).alias("image_id"),
        pl.col("tokens").list.get(1).replace_strict(PARTITIONS).alias("partition"),
    )
    joined = table.join(partitions, on="image_id", how="left")
    missing = joined.filter(pl.col("partition").is_null())
    if missing.height:
        raise InputError(f"image {missing['image_id'][0]!r} has no split ({missing.height} such images)", path=path)
    return joined
