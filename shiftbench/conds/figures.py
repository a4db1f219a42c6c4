"""ConDS figures: examples per cell, value shares train vs test, accuracy by shift, the grid beside the paper."""

from __future__ import annotations

from typing import Any

import polars as pl

from shiftbench.results.plots import STANDIN_MARK, learner_label, method_label, png_bytes, pyplot

# How a figure names the data on each side of a comparison: ConDS datasets here, and the paper's (Table 3).
DATASET_NAMES = {"celeba": "CelebA"}
DATASET_NOTES = {"sprites": "shiftbench's generated sprites"}


def dataset_name(dataset: str, data_tag: str | None = None, *, long: bool = False) -> str:
    """A ConDS dataset as a reader should read it: a tag says the data is not the paper's (``CelebA @partial``);
    ``long`` adds what the data is where its name would mislead (``sprites``: shiftbench's own, not dSprites)."""
    name = DATASET_NAMES.get(dataset, dataset) + (f" @{data_tag}" if data_tag else "")
    return f"{name} ({DATASET_NOTES[dataset]})" if long and dataset in DATASET_NOTES else name


def conds_cell_counts(cells: pl.DataFrame, title: str) -> bytes:
    """Train (and id_val) vs test examples per cell: the shape of a ConDS case at a glance."""
    plt = pyplot()
    ordered = cells.sort("cell")
    fig, ax = plt.subplots(figsize=(9, 3.6))
    x = list(range(ordered.height))
    ax.bar(x, ordered["n_train"].to_list(), color="#4C72B0", label="train")
    ax.bar(x, ordered["n_id_val"].to_list(), bottom=ordered["n_train"].to_list(), color="#8DA0CB", label="id_val")
    ax.plot(x, ordered["n_test"].to_list(), "o", color="#DD8452", markersize=3, label="test")
    if ordered.height <= 24:
        ax.set_xticks(x, [c.replace("|", "\n") for c in ordered["cell"].to_list()], fontsize=5)
    else:
        ax.set_xticks([])
        ax.set_xlabel(f"{ordered.height} cells (label x attribute values), in name order")
    ax.set_ylabel("examples")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return png_bytes(fig)


def conds_value_shares(value_counts: pl.DataFrame, attributes: pl.DataFrame, title: str) -> bytes:
    """Per attribute: share of each value in train vs test, with the shift and association."""
    plt = pyplot()
    names = attributes["attribute"].to_list()
    fig, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 2.8), squeeze=False)
    for ax, row in zip(axes[0], attributes.iter_rows(named=True), strict=True):
        part = value_counts.filter(pl.col("attribute") == row["attribute"])
        values = part.filter(pl.col("split") == "train")["value"].to_list()
        for offset, split, colour in ((-0.2, "train", "#4C72B0"), (0.2, "test", "#DD8452")):
            shares = part.filter(pl.col("split") == split)["share"].to_list()
            ax.bar([k + offset for k in range(len(values))], shares, width=0.4, color=colour, label=split)
        ax.set_xticks(range(len(values)), values, fontsize=6, rotation=30)
        note = f"{row['shift']}" + (f", V={row['cramers_v']:.2f}" if row["cramers_v"] is not None else "")
        ax.set_title(f"{row['attribute']} ({note})", fontsize=7)
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("share")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def accuracy_by_shift(table: pl.DataFrame, title: str) -> bytes:
    """ConDS: mean test accuracy over cases by shift kind, and by number of concurrent shifts, per learner and
    dataset (a learner on stand-in images marked)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [2, 1]})
    # A learner per dataset: cases of different datasets are never averaged into one bar.
    tag = pl.when(pl.col("data_tag").is_not_null()).then("@" + pl.col("data_tag")).otherwise(pl.lit(""))
    learner = pl.format("{} on {}{}", learner_label(), pl.col("dataset"), tag).alias("learner")
    learners = sorted(set(table.select(learner)["learner"].to_list()))
    width = 0.8 / max(1, len(learners))
    for axis, key in ((left, "shift_kind"), (right, "n_shifts")):
        means = table.with_columns(learner).group_by(key, "learner").agg(pl.col("acc_mean").mean())
        keys = sorted(set(means[key].to_list()), key=lambda k: (str(k) != "uniform", len(str(k)), str(k)))
        for offset, name in enumerate(learners):
            values = {r[key]: r["acc_mean"] for r in means.filter(pl.col("learner") == name).iter_rows(named=True)}
            axis.bar(
                [k + offset * width for k in range(len(keys))], [values.get(k, 0.0) for k in keys], width=width,
                label=name,
            )  # fmt: skip
        slanted = key == "shift_kind"
        centres = [k + width * (len(learners) - 1) / 2 for k in range(len(keys))]
        axis.set_xticks(centres, [str(k) for k in keys], fontsize=6, rotation=45 if slanted else 0,
                        ha="right" if slanted else "center")  # fmt: skip
        axis.set_ylim(0, 1.02)
        axis.set_ylabel("mean test accuracy over cases")
        axis.set_xlabel("shift kind" if key == "shift_kind" else "concurrent shifts")
    left.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def conds_grid_vs_paper(table: pl.DataFrame, title: str) -> bytes:
    """ConDS Table 3 side by side: each learner's mean test accuracy over cases (bars) with the paper's
    number for its row (a black tick; rows the paper has and this grid has not run: the tick alone), and
    each learner's accuracy by number of concurrent shifts (the paper's Figure 4 takeaway). Every label names
    the data on its side (here: the ConDS dataset; the paper: the datasets its number averages), and the title
    says so when the two sides are different datasets."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [3, 2]})
    rows = table.sort("category", "paper_row", "setting", "image_source").to_dicts()
    labels = [_grid_label(r) for r in rows]
    here = sorted({dataset_name(r["dataset"], r["data_tag"], long=True) for r in rows if r["n_cases"]})
    theirs = sorted({r["paper_datasets"] for r in rows if r["paper_datasets"]})
    positions = list(range(len(rows)))
    left.barh(positions, [r["acc_mean"] or 0.0 for r in rows], color="tab:blue",
              label=f"here, mean over cases on: {'; '.join(here)}")  # fmt: skip
    paper = [(i, r["paper_acc"]) for i, r in enumerate(rows) if r["paper_acc"] is not None]
    if paper:
        left.scatter([v for _, v in paper], [i for i, _ in paper], marker="|", s=300, color="black",
                     label=f"the paper (Table 3), mean over: {'; '.join(theirs)}", zorder=3)  # fmt: skip
    left.set_yticks(positions, labels, fontsize=6)
    left.invert_yaxis()
    left.set_xlim(0, 1)
    left.set_xlabel("uniform-test accuracy")
    left.legend(fontsize=6, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=1, frameon=False)
    columns = ("acc_0_shifts", "acc_1_shift", "acc_2_shifts", "acc_3_shifts")
    for r, label in zip(rows, labels, strict=True):
        points = [(k, r[c]) for k, c in enumerate(columns) if r[c] is not None]
        if points:
            right.plot([k for k, _ in points], [v for _, v in points], marker="o", label=label.replace("\n", " "))
    right.set_xticks(range(4), ["0", "1", "2", "3"])
    right.set_ylim(0, 1.02)
    right.set_xlabel("concurrent shifts")
    right.set_ylabel("mean test accuracy over cases (here)")
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=5, loc="lower left")
    fig.suptitle(f"{title}\n{_grid_sides(rows, here, theirs)}", fontsize=8)
    fig.tight_layout(rect=(0.03, 0, 1, 1))  # room for the longest row label
    return png_bytes(fig)


def _grid_label(row: dict[str, Any]) -> str:
    """A row of the grid: the paper's row (or the learner) over the data it was measured on here."""
    if not row["n_cases"]:
        return f"{row['paper_row']}\n{row['category']}: not run here"
    here = dataset_name(row["dataset"], row["data_tag"])
    if not row["paper_row"]:  # the learner's own name: method, setting (marked on stand-ins)
        return f"{method_label(row)}\non {here}"
    marked = STANDIN_MARK if row["image_source"] == "standin" else ""
    return f"{row['paper_row']}{marked}\non {here}, {row['setting'] or 'scored'}"


def _grid_sides(rows: list[dict[str, Any]], here: list[str], theirs: list[str]) -> str:
    """The line under the title that says which data each side is, and whether they are the same."""
    compared = {r["comparison"] for r in rows if r["comparison"]}
    if not compared:
        return f"here: {'; '.join(here) or 'no results'} (no paper number to compare)"
    if compared == {"different datasets"}:
        verdict = "different datasets: not a reproduction of the paper's numbers"
    elif "different datasets" in compared:
        verdict = "some rows on different datasets (their labels say which): not a reproduction"
    else:
        verdict = "CelebA here against the paper's mean over CelebA and DeepFashion"
    return f"here: {'; '.join(here)} | the paper: {'; '.join(theirs)} | {verdict}"
