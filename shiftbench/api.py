"""The Python front door: ``shiftbench.load_split(name)`` gives a published split as a researcher uses it.

A :class:`Split` holds the examples (a polars DataFrame with the split column and decoded attribute
values), the version a paper cites, the shift card, a torch ``Dataset`` of any split yielding WILDS-style
``(x, y, metadata)`` with images resolved as the training job resolves them, and ``evaluate``, which
scores predictions with the function ``shiftbench eval`` calls (:func:`shiftbench.splits.evaluation.score`), so the
numbers are the CLI's. Reading goes down the layers only: this module, the split reader
(:mod:`shiftbench.splits.published`), the store; never through training or a family other than the split's own. torch is
imported only by :meth:`Split.dataset`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError, StoreError, shown
from shiftbench.scoring.grouper import Grouper, metadata_table
from shiftbench.splits.published import PublishedSplit, published_split
from shiftbench.store.layout import check_benchmark_name

_BASE = ("benchmark", "version", "example_id", "split", "y")


def load_split(name: str, version: str | None = None, *, home: str | Path | None = None) -> Split:
    """The published benchmark ``name`` at ``version`` (default: its latest) from the warehouse at ``home``
    (default: ``SHIFTBENCH_HOME``, else the README's default). An unknown or malformed name or version is one
    :class:`~shiftbench.errors.InputError` naming it; a version whose files do not match its manifest's
    checksums is never served (:class:`~shiftbench.errors.StoreError` naming the file)."""
    check_benchmark_name(_text(name, "name"), "name")
    if version is not None:
        _text(version, "version")
    settings = Settings.from_env({**os.environ, "SHIFTBENCH_HOME": str(home)} if home is not None else None)
    settings.existing_home(given_as="home" if home is not None else None)
    # A damaged version: StoreError, not served; a version staged but never published: InputError.
    return Split(settings, published_split(settings, name, version, published_only=True, refusal=_paper_name))


def _paper_name(benchmark: str, splits: Mapping[str, str]) -> str | None:
    """Only for a name with no published split are the families asked (their papers' names and tags)."""
    from shiftbench.families.registry import unpublished_paper_name

    return unpublished_paper_name(benchmark, splits)


def _text(value: object, parameter: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"must be a string, got {shown(value)}", parameter=parameter)
    return value


@dataclass
class Split:
    """One published version of a benchmark (see :func:`load_split`)."""

    settings: Settings
    published: PublishedSplit = field(repr=False)

    @property
    def name(self) -> str:
        return self.published.benchmark

    @property
    def version(self) -> str:
        """The content-addressed version id to cite."""
        return self.published.version

    @property
    def family(self) -> str:
        return self.published.family

    @property
    def path(self) -> Path:
        return self.published.path

    @cached_property
    def card(self) -> str:
        """The shift card (``files/card.md``): what shifted, sizes, sources, licences, citation."""
        card = self.path / "files" / "card.md"
        if not card.is_file():
            return ""
        data = card.read_bytes()
        recorded = self.published.manifest.get("attachments", {}).get("card.md", {}).get("sha256")
        if recorded is not None and hashlib.sha256(data).hexdigest() != recorded:
            raise StoreError(f"{card}: checksum mismatch with the manifest of version {self.version}: not served")
        return data.decode("utf-8")

    @cached_property
    def examples(self) -> pl.DataFrame:
        """Every example: ``example_id``, ``split``, ``y``, ``y_name``, ``group`` and the attribute values
        (decoded strings, as the family recorded them)."""
        examples = pl.read_parquet(self.path / "examples.parquet").sort("example_id")
        attributes = self.path / f"{metadata_table(self.family)}.parquet"
        if attributes.is_file():
            extra = pl.read_parquet(attributes)
            columns = [c for c in extra.columns if c not in _BASE and c not in examples.columns]
            examples = examples.join(extra.select("example_id", *columns), on="example_id", how="left")
        return examples

    @property
    def grouper(self) -> Grouper:
        """The split's own groups; ``Grouper.parse("y,object_color")`` for others (WILDS' CombinatorialGrouper)."""
        return Grouper()

    @property
    def splits(self) -> list[str]:
        return sorted(self.examples["split"].unique().to_list())

    def _rows(self, split: str) -> pl.DataFrame:
        if split not in self.splits:
            raise InputError(f"{self.name} has no split {split!r}; splits: {', '.join(self.splits)}", parameter="split")
        return self.examples.filter(pl.col("split") == split)

    def dataset(
        self, split: str, transform: Callable[[Any], Any] | None = None, *, image_size: int | None = None
    ) -> Any:
        """A torch ``Dataset`` of ``split``: ``(x, y, metadata)`` with x a uint8 ``[3, S, S]`` tensor (through
        ``transform`` when given), the image found as the training job finds it, metadata the WILDS fields
        ``[group, y, attributes...]`` as integer codes. ``image_size``: resize to S (default: the first
        image's own size)."""
        from shiftbench.splits.images import image_paths
        from shiftbench.splits.published import split_images
        from shiftbench.splits.split_dataset import SplitDataset
        from shiftbench.splits.split_table import read_split

        self._rows(split)
        table = read_split(self.path)
        images = split_images(self.settings, self.published)
        paths = image_paths(table.example_ids, images.root, images.template)
        size = image_size or _side(paths[0])
        return _transformed(SplitDataset(table, paths, table.indices(split), size), transform)

    def evaluate(
        self, y_pred: Sequence[int] | np.ndarray, split: str, group_by: str | Sequence[str] | Grouper | None = None
    ) -> pl.DataFrame:
        """The metrics ``shiftbench eval`` reports for predictions of every example of ``split`` (in
        ``examples`` order): ``eval_split, metric, group, value``. ``group_by``: metadata fields whose
        value combinations are the groups, as a list or as the CLI's ``"y,object_color"`` (default: the
        split's own groups)."""
        from shiftbench.splits.evaluation import Predictions, score

        rows = self._rows(split)
        values = self._labels(y_pred, rows)
        fields = _group_fields(group_by)
        frame = pl.DataFrame({"row": np.arange(rows.height), "example_id": rows["example_id"], "y_pred": values})
        own = () if fields == ("group",) else fields
        return score(self.published, Predictions(frame), own, group_parameter="group_by").table()

    def _labels(self, y_pred: object, rows: pl.DataFrame) -> np.ndarray:
        """``y_pred`` as int64 class indices, one per row: never by a cast that wraps (``2**64 - 1`` is not -1)."""
        n_classes = int(self.published.examples.select(pl.col("y").max()).item()) + 1
        given: list[int] | None = None
        if isinstance(y_pred, list | tuple) and all(type(v) is int for v in y_pred):
            given = list(y_pred)  # Python ints of any size: judged as they are, never through a float or a wrap
            y_pred = [v if 0 <= v < n_classes else -1 for v in given]
        try:
            values = np.asarray(y_pred)
        except (ValueError, TypeError) as exc:
            raise InputError(f"y_pred is not an array of labels ({exc})", parameter="y_pred") from None
        if values.ndim != 1 or values.shape[0] != rows.height:
            raise InputError(
                f"y_pred must be one label per example of the split: {rows.height} expected, got shape {values.shape}",
                parameter="y_pred",
            )
        if values.dtype.kind not in "iu":
            raise InputError(f"y_pred must hold integer class indices, got {values.dtype}", parameter="y_pred")
        outside = np.flatnonzero((values < 0) | (values >= n_classes))
        if outside.size:
            at = int(outside[0])
            raise InputError(
                f"y_pred[{at}] = {given[at] if given is not None else values[at]} (example "
                f"{rows['example_id'][at]!r}) is not a class in 0..{n_classes - 1} ({outside.size} such)",
                parameter="y_pred",
            )
        return values.astype(np.int64)


def _group_fields(group_by: object) -> tuple[str, ...]:
    """The fields of ``group_by``: a Grouper, a list of names, or the CLI's comma string (never its characters);
    :func:`shiftbench.splits.evaluation.score` checks that the split has them."""
    if group_by is None:
        return ()
    if isinstance(group_by, Grouper):
        fields: tuple[object, ...] = group_by.fields
    elif isinstance(group_by, str):
        fields = tuple(f.strip() for f in group_by.split(","))
    elif isinstance(group_by, Sequence):
        fields = tuple(group_by)
    else:
        raise InputError(f"must be a list of field names or 'a,b', got {shown(group_by)}", parameter="group_by")
    if any(not isinstance(f, str) or not f.strip() for f in fields):
        raise InputError(f"every field must be a non-empty name, got {shown(group_by)}", parameter="group_by")
    return tuple(str(f) for f in fields)


def _transformed(base: Any, transform: Callable[[Any], Any] | None) -> Any:
    """``base`` with its images through ``transform`` (the WILDS convention: ``dataset[i] -> (x, y, m)``)."""
    if transform is None:
        return base
    import torch

    apply = transform

    class Transformed(torch.utils.data.Dataset[tuple[Any, int, Any]]):
        def __len__(self) -> int:
            return len(base)

        def __getitem__(self, item: int) -> tuple[Any, int, Any]:
            x, y, metadata = base[item]
            return apply(x), y, metadata

    return Transformed()


def _side(path: Path) -> int:
    from PIL import Image

    with Image.open(path) as image:
        return int(image.size[0])
