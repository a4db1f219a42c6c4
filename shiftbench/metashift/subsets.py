"""Candidate subsets: for every class and every context tag that co-occurs with it, its images.

MetaShift (Liang & Zou, ICLR 2022, Section 3.1) names a subset ``class(context)``: ``cat(sofa)``
holds the images that show a cat and a sofa. Three kinds of context:

- ``object``: another object name present in the image (``cat(sofa)``);
- ``attribute``: an attribute of an object of the class (``cat(black)``: a black cat);
- ``general``: an image-level tag (GQA ``location`` / ``weather`` or a tag table's ``general``
  rows) that appears in the paper's general-context ontology (``cat(indoors)``).

All of it works on integer codes (the objects come coded, :mod:`shiftbench.sources.scene_codes`): joins
in polars, then one sort of one packed 64-bit (subset key, image) number; nothing loops over images.
A context name can exist in two kinds (the object "grass" and the place "grass"): the object
subset keeps ``cat(grass)`` and the other is named ``cat(general:grass)``, so names stay unique.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from shiftbench.errors import InputError
from shiftbench.sources.scene_codes import CodedObjects

CONTEXT_KINDS = ("object", "attribute", "general")
KEY_BITS = 64  # the bits of one sort key (lowered by a test, to run the other path)
SUBSET_COLUMNS = ("subset", "class", "context", "context_kind", "context_group", "n_images", "selected", "selection")
MEMBERSHIP_SCHEMA = {
    "subset": pl.String,
    "class": pl.String,
    "context": pl.String,
    "context_kind": pl.String,
    "context_group": pl.String,
    "image_id": pl.String,
}


def subset_name(class_name: str, context: str) -> str:
    return f"{class_name}({context})"


def parse_subset_name(name: str) -> tuple[str, str]:
    """``cat(remote control)`` -> (``cat``, ``remote control``); the inverse of :func:`subset_name`."""
    head, sep, rest = name.partition("(")
    if not sep or not rest.endswith(")") or not head:
        raise ValueError(f"not a subset name of the form class(context): {name!r}")
    return head, rest[:-1]


def check_context_kinds(kinds: Sequence[str], parameter: str = "context_kinds") -> tuple[str, ...]:
    if isinstance(kinds, str) or not kinds:
        raise InputError(f"must be a non-empty list of {', '.join(CONTEXT_KINDS)}", parameter=parameter)
    unknown = [k for k in kinds if k not in CONTEXT_KINDS]
    if unknown:
        raise InputError(f"unknown context kind {unknown[0]!r}; use {', '.join(CONTEXT_KINDS)}", parameter=parameter)
    return tuple(k for k in CONTEXT_KINDS if k in kinds)


def image_classes(objects: CodedObjects, class_groups: pl.DataFrame | None, classes: Sequence[str]) -> pl.DataFrame:
    """(image, image_id, class, name): the images that show one of ``classes``, through the optional grouping
    (``image`` is the image's code)."""
    names = pl.DataFrame(
        {"name": list(classes), "class": list(classes)}, schema={"name": pl.String, "class": pl.String}
    )
    if class_groups is not None:
        names = class_groups.filter(pl.col("class").is_in(list(classes)))
    codes = objects.codes_of(names["name"].to_list())
    shown = objects.frame.filter(pl.col("name").is_in(pl.Series(codes, dtype=pl.UInt32).implode()))
    shown = shown.select("image", "name").unique()
    shown = shown.select(
        "image",
        objects.image_ids.gather(shown["image"]).alias("image_id"),
        objects.vocabulary.gather(shown["name"]).alias("name"),
    )
    return shown.join(names, on="name", how="inner").select("image", "image_id", "class", "name")


@dataclass(frozen=True)
class Memberships:
    """Candidate subsets and their images, integer-coded.

    ``subsets``: one row per candidate subset (``subset, class, context, context_kind, context_group``,
    and ``class_code``), row k has code k, in subset-name order. ``image_ids``: the images, sorted; an
    image's code is its position. ``pairs``: (``subset``, ``image``) codes, unique, sorted by subset then
    image, so that in strings too they are sorted by (subset, image_id). A GQA-scale object-context
    collection has about 19 M pairs: 8 bytes each here, against about 60 as a table of strings.
    """

    subsets: pl.DataFrame
    image_ids: pl.Series
    pairs: pl.DataFrame

    @property
    def height(self) -> int:
        return self.pairs.height

    def sizes(self) -> np.ndarray:
        """Images per subset, by code."""
        sizes: np.ndarray = np.bincount(self.pairs["subset"].to_numpy(), minlength=self.subsets.height)
        return sizes

    def frame(self, start: int = 0, length: int | None = None) -> pl.DataFrame:
        """(A slice of) the memberships as strings: ``subset, class, context, context_kind, context_group,
        image_id``."""
        pairs = self.pairs.slice(start, length)
        subsets = self.subsets.drop("class_code")
        rows = subsets.gather(pairs["subset"]).with_columns(image_id=self.image_ids.gather(pairs["image"]))
        return rows.select(list(MEMBERSHIP_SCHEMA))

    @classmethod
    def from_frame(cls, frame: pl.DataFrame) -> Memberships:
        """Memberships given as (subset, image_id) strings (a task's few subsets); the class comes from the name."""
        subsets = (
            frame.select("subset")
            .unique()
            .sort("subset")
            .with_columns(
                pl.col("subset").map_elements(lambda n: parse_subset_name(n)[0], return_dtype=pl.String).alias("class")
            )
        )
        subsets = subsets.with_columns(pl.col("class").rank("dense").cast(pl.UInt32).alias("class_code"))
        image_ids = frame["image_id"].unique().sort()
        pairs = (
            frame.select("subset", "image_id")
            .join(subsets.select("subset").with_row_index("code"), on="subset")
            .join(image_ids.to_frame().with_row_index("image"), on="image_id")
            .select(pl.col("code").alias("subset"), "image")
            .unique()
            .sort("subset", "image")
        )
        return cls(subsets, image_ids, pairs)


def _coded(values: pl.Expr, vocabulary: pl.DataFrame) -> pl.Expr:
    """Strings as their codes in ``vocabulary`` (NULL for a string it lacks)."""
    return values.replace_strict(vocabulary["value"], vocabulary["code"], default=None)


def _object_contexts(coded: pl.DataFrame, classes: pl.DataFrame, groups: pl.DataFrame | None) -> pl.DataFrame:
    names = coded.select("image", pl.col("name").alias("context")).unique()
    pairs = classes.join(names, on="image").filter(pl.col("class") != pl.col("context"))
    if groups is not None:  # "furniture(sofa)" would only restate that the image shows furniture
        pairs = pairs.join(groups.rename({"name": "context"}), on=["context", "class"], how="anti")
    return pairs.with_columns(pl.lit(0, pl.UInt8).alias("kind"))


def _object_attributes(objects: CodedObjects, coded: pl.DataFrame, recoded: np.ndarray) -> pl.DataFrame:
    """(image, name, context): one row per attribute of an object, in the larger vocabulary's codes."""
    lists = objects.frame["attributes"].to_arrow(compat_level=pl.CompatLevel.oldest())
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    values = lists.flatten()
    lengths = lists.value_lengths()
    lengths = (pc.fill_null(lengths, 0) if lengths.null_count else lengths).to_numpy()
    exploded = pl.DataFrame(
        {
            "image": np.repeat(coded["image"].to_numpy(), lengths),
            "name": np.repeat(coded["name"].to_numpy(), lengths),
            "context": recoded[(pc.fill_null(values, 0) if values.null_count else values).to_numpy()],
        }
    )
    return exploded.filter(pl.Series(values.is_valid())) if values.null_count else exploded


def _attribute_contexts(exploded: pl.DataFrame, groups: pl.DataFrame | None) -> pl.DataFrame:
    if groups is None:
        exploded = exploded.with_columns(pl.col("name").alias("class"))
    else:
        exploded = exploded.join(groups, on="name", how="inner")
    # Repeats (two black cats in one image) go when all pairs are sorted (_sorted_pairs).
    return exploded.select("image", "class", "context").with_columns(pl.lit(1, pl.UInt8).alias("kind"))


def _general_contexts(
    images: pl.DataFrame, image_codes: pl.DataFrame, classes: pl.DataFrame, context: pl.DataFrame
) -> pl.DataFrame:
    tags = pl.concat(
        [
            images.select("image_id", pl.col("location").alias("value")),
            images.select("image_id", pl.col("weather").alias("value")),
            images.select("image_id", pl.col("general").alias("value")).explode("value"),
        ]
    ).drop_nulls("value")
    tags = tags.join(context, on="value", how="inner").join(image_codes, on="image_id", how="inner")
    tags = tags.select("image", pl.col("code").alias("context")).unique()
    return classes.join(tags, on="image").with_columns(pl.lit(2, pl.UInt8).alias("kind"))


def ontology_frame(general_ontology: Mapping[str, Sequence[str]]) -> pl.DataFrame:
    """(value, context_group) of the general-context ontology; a value listed twice keeps its first group."""
    return pl.DataFrame(
        [(value, group) for group, values in general_ontology.items() for value in values],
        schema={"value": pl.String, "context_group": pl.String},
        orient="row",
    ).unique("value", keep="first", maintain_order=True)


def context_vocabulary(objects: CodedObjects, ontology: pl.DataFrame, class_groups: pl.DataFrame | None) -> pl.Series:
    """Every object name, attribute, general value and class group, sorted: codes sort as the strings would."""
    strings = [objects.vocabulary, ontology["value"]]
    if class_groups is not None:
        strings += [class_groups["class"]]
    return pl.concat([s.rename("value") for s in strings]).unique().sort()


def _context_parts(
    objects: CodedObjects,
    images: pl.DataFrame,
    kinds: Sequence[str],
    vocabulary: pl.DataFrame,
    ontology: pl.DataFrame,
    class_groups: pl.DataFrame | None,
) -> list[pl.DataFrame]:
    """(image, class, context, kind) codes, one frame per context kind asked for (repeats left in)."""
    # The objects' codes, recoded into this larger vocabulary (both sorted: a code keeps its string order).
    recode = objects.vocabulary.to_frame("value").join(vocabulary, on="value", how="left", maintain_order="left")
    recoded = recode["code"].to_numpy()
    coded = pl.DataFrame({"image": objects.frame["image"], "name": recoded[objects.frame["name"].to_numpy()]})
    groups = None
    if class_groups is not None:
        groups = class_groups.select(
            _coded(pl.col("name"), vocabulary).alias("name"), _coded(pl.col("class"), vocabulary).alias("class")
        ).drop_nulls()
    classes = pl.DataFrame()
    if "object" in kinds or "general" in kinds:  # the classes each image shows (attributes are per object)
        classes = coded.select("image", "name").unique()
        classes = (
            classes.rename({"name": "class"})
            if groups is None
            else classes.join(groups, on="name", how="inner").select("image", "class").unique()
        )
    parts = []
    if "object" in kinds:
        parts.append(_object_contexts(coded, classes, groups))
    if "attribute" in kinds and "attributes" in objects.frame.columns:  # a tag table's objects have none
        parts.append(_attribute_contexts(_object_attributes(objects, coded, recoded), groups))
    if "general" in kinds:
        context = ontology.join(vocabulary, on="value").select("value", "code")
        image_codes = objects.image_ids.to_frame().with_row_index("image")
        parts.append(_general_contexts(images, image_codes, classes, context))
    return parts


def _named_keys(key_of: np.ndarray, starts: np.ndarray, values: pl.Series, ontology: pl.DataFrame) -> pl.DataFrame:
    """One row per distinct (class, context, kind) key, named and in subset-name order; ``block`` is its run."""
    size = len(values)
    keys = pl.DataFrame({"key": key_of[starts]}, schema={"key": pl.UInt64}).with_row_index("block")
    keys = keys.with_columns(
        (pl.col("key") // len(CONTEXT_KINDS) // size).cast(pl.UInt32).alias("class"),
        (pl.col("key") // len(CONTEXT_KINDS) % size).cast(pl.UInt32).alias("context"),
        (pl.col("key") % len(CONTEXT_KINDS)).cast(pl.UInt8).alias("kind"),
    )
    keys = keys.with_columns(
        values.gather(keys["class"]).alias("class_name"),
        values.gather(keys["context"]).alias("context_name"),
        pl.Series(CONTEXT_KINDS).gather(keys["kind"]).alias("context_kind"),
    )
    # Unique names: the first kind (object, attribute, general) keeps class(context).
    keys = keys.sort("class_name", "context_name", "kind").with_columns(
        (pl.int_range(pl.len()).over("class", "context") > 0).alias("clash")
    )
    plain = pl.col("class_name") + pl.lit("(") + pl.col("context_name") + pl.lit(")")
    qualified = (
        pl.col("class_name") + pl.lit("(") + pl.col("context_kind") + pl.lit(":") + pl.col("context_name") + pl.lit(")")
    )
    groups_of = ontology.rename({"value": "context_name"}).with_columns(pl.lit("general").alias("context_kind"))
    return (
        keys.with_columns(pl.when(pl.col("clash")).then(qualified).otherwise(plain).alias("subset"))
        .join(groups_of, on=["context_name", "context_kind"], how="left")
        .sort("subset")
    )


def _pairs_in_name_order(
    order: np.ndarray, starts: np.ndarray, counts: np.ndarray, image_of: np.ndarray
) -> pl.DataFrame:
    """The pairs, sorted by key, are runs of images, one run per key: put the runs in subset-name order (a gather,
    no second sort); within a run the images are sorted already."""
    lengths = counts[order]
    first = np.cumsum(lengths) - lengths
    index = np.repeat(starts[order] - first, lengths) + np.arange(len(image_of))
    return pl.DataFrame(
        {
            "subset": np.repeat(np.arange(len(order), dtype=np.uint32), lengths),
            "image": image_of[index],
        }
    )


def candidate_memberships(
    objects: CodedObjects | pl.DataFrame,
    images: pl.DataFrame,
    kinds: Sequence[str],
    general_ontology: Mapping[str, Sequence[str]],
    class_groups: pl.DataFrame | None = None,
) -> Memberships:
    """Every candidate subset whatever its size, and its images (one pair per (subset, image)).

    The joins run on integer codes (images, and one vocabulary for object names, attributes, class
    groups and general tags, so that ``class != context`` compares codes); strings come back only for
    the candidate subsets' names. Objects given as strings are coded first.
    """
    kinds = check_context_kinds(kinds)
    if isinstance(objects, pl.DataFrame):
        objects = CodedObjects.from_strings(objects)
    ontology = ontology_frame(general_ontology)
    vocabulary = context_vocabulary(objects, ontology, class_groups).to_frame().with_row_index("code")
    parts = _context_parts(objects, images, kinds, vocabulary, ontology, class_groups)
    # One 64-bit key per (class, context, kind), and the (key, image) pairs sorted, without repeats.
    size = vocabulary.height
    key = (pl.col("class").cast(pl.UInt64) * size + pl.col("context")) * len(CONTEXT_KINDS) + pl.col("kind")
    key_of, image_of = _sorted_pairs([p.select(key.alias("key"), "image") for p in parts], size, len(objects.image_ids))
    starts = np.flatnonzero(np.r_[True, key_of[1:] != key_of[:-1]]) if len(key_of) else np.zeros(0, dtype=np.int64)
    counts = np.diff(np.r_[starts, len(key_of)])
    keys = _named_keys(key_of, starts, vocabulary["value"], ontology)
    pairs = _pairs_in_name_order(keys["block"].to_numpy(), starts, counts, image_of)
    subsets = keys.select(
        "subset",
        pl.col("class_name").alias("class"),
        pl.col("context_name").alias("context"),
        "context_kind",
        "context_group",
        pl.col("class").alias("class_code"),
    )
    return Memberships(subsets, objects.image_ids, pairs)


def _sorted_pairs(parts: list[pl.DataFrame], vocabulary_size: int, n_images: int) -> tuple[np.ndarray, np.ndarray]:
    """The (key, image) rows of ``parts``, sorted and without repeats (an image shows two black cats once), as
    (key, image) arrays. Both fit one 64-bit number for any real vocabulary and image count: then one sort of one
    column (two-column unique and sort took 2-3x longer at 100x); else the two columns."""
    n_keys = vocabulary_size * vocabulary_size * len(CONTEXT_KINDS)
    bits = max(n_images - 1, 1).bit_length()
    if n_keys << bits < 1 << KEY_BITS:
        packed = pl.concat(
            [p.select(pl.col("key") * (1 << bits) + pl.col("image")).to_series() for p in parts]
            if parts
            else [pl.Series("key", [], dtype=pl.UInt64)]
        )
        pairs = packed.sort().to_numpy()
        if len(pairs) and (pairs[1:] == pairs[:-1]).any():
            pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]]
        return pairs >> np.uint64(bits), (pairs & np.uint64((1 << bits) - 1)).astype(np.uint32)
    rows = pl.concat(parts).unique().sort("key", "image")
    return rows["key"].to_numpy(), rows["image"].to_numpy()


def subset_table(memberships: Memberships, min_subset_size: int, min_subsets_per_class: int) -> pl.DataFrame:
    """One row per candidate subset with its size and whether it enters its class's meta-graph.

    ``selection``: ``selected``; ``too_small`` (fewer than ``min_subset_size`` images); or
    ``class_too_few_subsets`` (the class has fewer than ``min_subsets_per_class`` large subsets;
    the released scripts drop classes with 5 or fewer). ``code`` and ``class_code`` tie a row to the
    memberships' codes.
    """
    sizes = memberships.subsets.with_row_index("code").with_columns(
        pl.Series("n_images", memberships.sizes(), dtype=pl.Int64)
    )
    large = pl.col("n_images") >= min_subset_size
    per_class = sizes.filter(large).group_by("class").agg(pl.len().alias("n_large"))
    sizes = sizes.join(per_class, on="class", how="left").with_columns(pl.col("n_large").fill_null(0))
    selection = (
        pl.when(~large)
        .then(pl.lit("too_small"))
        .when(pl.col("n_large") < min_subsets_per_class)
        .then(pl.lit("class_too_few_subsets"))
        .otherwise(pl.lit("selected"))
    )
    return (
        sizes.with_columns(selection.alias("selection"), (selection == "selected").alias("selected"))
        .drop("n_large")
        .sort("class", "subset")
        .select(*SUBSET_COLUMNS, "code", "class_code")
    )
