"""Candidate subsets: for every class and every context tag that co-occurs with it, its images.

MetaShift (Liang & Zou, ICLR 2022, Section 3.1) names a subset ``class(context)``: ``cat(sofa)``
holds the images that show a cat and a sofa. Three kinds of context:

- ``object``: another object name present in the image (``cat(sofa)``);
- ``attribute``: an attribute of an object of the class (``cat(black)``: a black cat);
- ``general``: an image-level tag (GQA ``location`` / ``weather`` or a tag table's ``general``
  rows) that appears in the paper's general-context ontology (``cat(indoors)``).

All of it is relational (joins on ``image_id``), done in polars; nothing loops over images.
A context name can exist in two kinds (the object "grass" and the place "grass"): the object
subset keeps ``cat(grass)`` and the other is named ``cat(general:grass)``, so names stay unique.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from shiftbench.errors import InputError

CONTEXT_KINDS = ("object", "attribute", "general")
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


def image_classes(objects: pl.DataFrame, class_groups: pl.DataFrame | None) -> pl.DataFrame:
    """(image_id, class, name): which classes each image shows, through the optional grouping."""
    names = objects.select("image_id", "name").unique()
    if class_groups is None:
        return names.with_columns(pl.col("name").alias("class"))
    return names.join(class_groups, on="name", how="inner")


def _object_contexts(objects: pl.DataFrame, class_groups: pl.DataFrame | None) -> pl.DataFrame:
    classes = image_classes(objects, class_groups).select("image_id", "class").unique()
    names = objects.select("image_id", pl.col("name").alias("context")).unique()
    pairs = classes.join(names, on="image_id").filter(pl.col("class") != pl.col("context"))
    if class_groups is not None:  # "furniture(sofa)" would only restate that the image shows furniture
        members = class_groups.rename({"name": "context"})
        pairs = pairs.join(members, on=["context", "class"], how="anti")
    return pairs.with_columns(pl.lit("object").alias("context_kind"), pl.lit(None, pl.String).alias("context_group"))


def _attribute_contexts(objects: pl.DataFrame, class_groups: pl.DataFrame | None) -> pl.DataFrame:
    exploded = (
        objects.select("image_id", "name", pl.col("attributes").alias("context"))
        .explode("context")
        .drop_nulls("context")
    )
    if class_groups is None:
        exploded = exploded.with_columns(pl.col("name").alias("class"))
    else:
        exploded = exploded.join(class_groups, on="name", how="inner")
    return (
        exploded.select("image_id", "class", "context")
        .unique()
        .with_columns(pl.lit("attribute").alias("context_kind"), pl.lit(None, pl.String).alias("context_group"))
    )


def _general_contexts(
    objects: pl.DataFrame,
    images: pl.DataFrame,
    ontology: Mapping[str, Sequence[str]],
    class_groups: pl.DataFrame | None,
) -> pl.DataFrame:
    vocabulary = pl.DataFrame(
        [(value, group) for group, values in ontology.items() for value in values],
        schema={"context": pl.String, "context_group": pl.String},
        orient="row",
    ).unique("context", keep="first", maintain_order=True)
    tags = pl.concat(
        [
            images.select("image_id", pl.col("location").alias("context")),
            images.select("image_id", pl.col("weather").alias("context")),
            images.select("image_id", pl.col("general").alias("context")).explode("context"),
        ]
    ).drop_nulls("context")
    tags = tags.join(vocabulary, on="context", how="inner").unique()
    classes = image_classes(objects, class_groups).select("image_id", "class").unique()
    return classes.join(tags, on="image_id").with_columns(pl.lit("general").alias("context_kind"))


def candidate_memberships(
    objects: pl.DataFrame,
    images: pl.DataFrame,
    kinds: Sequence[str],
    general_ontology: Mapping[str, Sequence[str]],
    class_groups: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """One row per (candidate subset, image), every candidate whatever its size."""
    kinds = check_context_kinds(kinds)
    parts = []
    if "object" in kinds:
        parts.append(_object_contexts(objects, class_groups))
    if "attribute" in kinds:
        parts.append(_attribute_contexts(objects, class_groups))
    if "general" in kinds:
        parts.append(_general_contexts(objects, images, general_ontology, class_groups))
    columns = ["image_id", "class", "context", "context_kind", "context_group"]
    rows = pl.concat([p.select(columns) for p in parts]) if parts else pl.DataFrame(schema=MEMBERSHIP_SCHEMA)
    # Unique names: the first kind (object, attribute, general) keeps class(context).
    order = {kind: rank for rank, kind in enumerate(CONTEXT_KINDS)}
    keys = (
        rows.select("class", "context", "context_kind")
        .unique()
        .with_columns(pl.col("context_kind").replace_strict(order, return_dtype=pl.Int8).alias("rank"))
        .sort("class", "context", "rank")
        .with_columns((pl.int_range(pl.len()).over("class", "context") > 0).alias("clash"))
    )
    plain = pl.col("class") + pl.lit("(") + pl.col("context") + pl.lit(")")
    qualified = pl.col("class") + pl.lit("(") + pl.col("context_kind") + pl.lit(":") + pl.col("context") + pl.lit(")")
    keys = keys.with_columns(pl.when(pl.col("clash")).then(qualified).otherwise(plain).alias("subset"))
    return (
        rows.join(keys.select("class", "context", "context_kind", "subset"), on=["class", "context", "context_kind"])
        .select(list(MEMBERSHIP_SCHEMA))
        .unique(["subset", "image_id"])
        .sort("subset", "image_id")
    )


def subset_table(memberships: pl.DataFrame, min_subset_size: int, min_subsets_per_class: int) -> pl.DataFrame:
    """One row per candidate subset with its size and whether it enters its class's meta-graph.

    ``selection``: ``selected``; ``too_small`` (fewer than ``min_subset_size`` images); or
    ``class_too_few_subsets`` (the class has fewer than ``min_subsets_per_class`` large subsets;
    the released scripts drop classes with 5 or fewer).
    """
    sizes = memberships.group_by("subset", "class", "context", "context_kind", "context_group").agg(
        pl.len().cast(pl.Int64).alias("n_images")
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
    )
