"""What a worst-group accuracy is over, in words, where some groups of a split have no example.

``acc_wg`` is the accuracy of the worst group *with examples* (:mod:`shiftbench.scoring.metrics`: an empty group has a
NULL
accuracy and never counts as the worst). On a split where many groups are empty (the small ConDS sprites: 36 of
the 81 cells have no id_val example) the printed ``0.0000`` is the worst of the others, often a group of one or two
examples. :func:`notes` says so, from a results table's ``count_group:<g>`` rows and the ``acc_wg`` row's group; the
training summary (``shiftbench train``, the run's Dagster metadata) and ``shiftbench eval`` print it beside acc_wg.
"""

from __future__ import annotations

import polars as pl

METADATA_PREFIX = "worst_group/"  # the run's metadata key of a split's note: worst_group/<split>


def note(split: str, with_examples: int, groups: int, worst_examples: int | None) -> str:
    """``worst of 45 groups with examples, 2 examples in it; 36 of 81 have none in id_val``, or '' when every
    group has examples."""
    if with_examples >= groups:
        return ""
    if with_examples == 0:
        return f"no group has an example in {split}"
    size = f", {worst_examples} example{'s' if worst_examples != 1 else ''} in it" if worst_examples else ""
    return (
        f"worst of {with_examples} group{'s' if with_examples != 1 else ''} with examples{size}; "
        f"{groups - with_examples} of {groups} have none in {split}"
    )


def notes(results: pl.DataFrame) -> dict[str, str]:
    """Per evaluated split with empty groups, the note on its acc_wg (splits whose groups all have examples: none).
    ``results``: ``eval_split``, ``metric``, ``group``, ``value`` rows of one run (erm_results, eval_results)."""
    counts = results.filter(pl.col("metric").str.starts_with("count_group:"))
    worst = results.filter(pl.col("metric") == "acc_wg").select("eval_split", pl.col("group").alias("worst"))
    sizes = counts.join(worst, on="eval_split", how="left")
    out = {}
    for split, part in sizes.group_by("eval_split", maintain_order=True):
        in_worst = part.filter(pl.col("group") == pl.col("worst"))["value"]
        text = note(
            str(split[0]),
            int((part["value"] > 0).sum()),
            part.height,
            int(in_worst[0]) if in_worst.len() and in_worst[0] is not None else None,
        )
        if text:
            out[str(split[0])] = text
    return dict(sorted(out.items()))


def metadata(results: pl.DataFrame) -> dict[str, str]:
    """The notes as a run's metadata entries (``worst_group/<split>``)."""
    return {f"{METADATA_PREFIX}{split}": text for split, text in notes(results).items()}
