"""BREEDS figures: subclasses per superclass of a benchmark, and its analyses' (source against target accuracy,
Figure 5's architectures, Figure 6's interventions)."""

from __future__ import annotations

import io
from typing import Any

import polars as pl

from shiftbench.results.plots import method_label, png_bytes, pyplot

# At most this many superclasses are drawn (an ImageNet-21k level has hundreds: a figure of 400 bars is 110
# inches tall and takes seconds); the title says how many there are.
MAX_SUPERCLASSES = 60


def subclasses_per_superclass(subpopulations: pl.DataFrame, title: str) -> bytes:
    """Stacked bars: number of subclasses of each superclass in each domain (the first ``MAX_SUPERCLASSES``)."""
    plt = pyplot()
    counts = subpopulations.group_by("y", "superclass_name", "domain").agg(pl.len().alias("n")).sort("y", "domain")
    labels = counts.select("y", "superclass_name").unique().sort("y")
    if labels.height > MAX_SUPERCLASSES:
        title = f"{title} (the first {MAX_SUPERCLASSES} of {labels.height} superclasses)"
        labels = labels.head(MAX_SUPERCLASSES)
        counts = counts.filter(pl.col("y").is_in(labels["y"].implode()))
    height = max(2.5, 0.28 * labels.height + 1.2)
    fig, ax = plt.subplots(figsize=(7, height), dpi=90)
    left = [0] * labels.height
    colors = {"source": "#4C72B0", "target": "#DD8452", "all": "#55A868"}
    positions = {y: i for i, y in enumerate(labels["y"].to_list())}
    for domain in ("source", "target", "all"):
        part = counts.filter(pl.col("domain") == domain)
        if part.height == 0:
            continue
        values = [0] * labels.height
        for y, n in zip(part["y"].to_list(), part["n"].to_list(), strict=True):
            values[positions[y]] = n
        ax.barh(range(labels.height), values, left=left, color=colors[domain], label=domain)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(range(labels.height), [name[:32] for name in labels["superclass_name"].to_list()], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("subclasses")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def source_vs_target(table: pl.DataFrame, title: str) -> bytes:
    """BREEDS: target against source accuracy per task and method (the diagonal is no shift), and the
    relative accuracy target / source with its 95 % bootstrap interval (BREEDS Figure 6's)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.5, 3.4))
    for row in table.iter_rows(named=True):
        left.scatter(row["source_acc"], row["target_acc"], s=18)
        left.annotate(f"{row['task']} {method_label(row)}", (row["source_acc"], row["target_acc"]), fontsize=5)
    left.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    left.set_xlabel("source accuracy (id_test, else id_val)")
    left.set_ylabel("target accuracy (test)")
    left.set_xlim(0, 1.02)
    left.set_ylim(0, 1.02)
    labels = [f"{r['task']}\n{method_label(r)}" for r in table.iter_rows(named=True)]
    relative = table["relative_acc"].fill_null(0).to_list()
    right.bar(range(table.height), relative, color="#4C72B0")
    if "relative_low" in table.columns:  # the 95 % bootstrap intervals the runs measured, where they did
        for k, row in enumerate(table.iter_rows(named=True)):
            if row["relative_low"] is not None and row["relative_high"] is not None:
                right.plot([k, k], [row["relative_low"], row["relative_high"]], color="black", linewidth=0.8)
    right.set_xticks(range(table.height), labels, fontsize=5, rotation=60, ha="right")
    right.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    right.set_ylabel("relative accuracy (target / source, 95 % interval)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")  # one per architecture (BREEDS Figure 5's symbols)
INTERVENTION_COLOURS = {
    "none": "#4C72B0",
    "gaussian_noise": "#55A868",
    "random_erasing": "#DD8452",
    "pgd_l2": "#C44E52",
}


def _learner(row: dict[str, Any]) -> str:
    """``method setting`` and whose images: marked as stand-ins (:func:`method_label`), else the image source."""
    label = method_label(row)
    return label if row["image_source"] == "standin" else f"{label} [{row['image_source']} images]"


def _any_standin(table: pl.DataFrame) -> bool:
    return "standin" in set(table["image_source"].to_list())


def _task_axes(plt: Any, tasks: list[str], size: tuple[float, float], columns: int) -> tuple[Any, list[Any]]:
    """One panel of ``size`` per task, ``columns`` a row at most; the figure wide enough for a title."""
    columns = min(columns, max(1, len(tasks)))
    rows = -(-max(1, len(tasks)) // columns)
    figsize = (max(6.5, size[0] * columns), size[1] * rows + 0.8)
    fig, axes = plt.subplots(rows, columns, figsize=figsize, squeeze=False)
    flat = [axis for row in axes for axis in row]
    for axis in flat[len(tasks) :]:
        axis.set_visible(False)
    return fig, flat


def architectures(table: pl.DataFrame, title: str) -> bytes:
    """BREEDS Figure 5: per task, target against source accuracy, one point per architecture (a symbol each) and
    learner, labelled with its method, setting and images (hollow: stand-ins); the no-shift diagonal (dotted) and
    the paper's baseline (dashed grey): the constant fraction of source accuracy the least accurate learner keeps."""
    plt = pyplot()
    tasks = sorted(set(table["task"].to_list()))
    models = sorted(set(table["model"].to_list()))
    marker = {model: MARKERS[k % len(MARKERS)] for k, model in enumerate(models)}
    fig, axes = _task_axes(plt, tasks, (4.6, 4.2), 3)
    for axis, task in zip(axes, tasks, strict=False):
        rows = table.filter(pl.col("task") == task).sort("source_acc").to_dicts()
        axis.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        if len(rows) > 1 and rows[0]["relative_acc"] is not None:
            axis.plot([0, 1], [0, rows[0]["relative_acc"]], color="#AAAAAA", linestyle="--", linewidth=1)
        for row in rows:
            standin = row["image_source"] == "standin"
            axis.scatter(
                row["source_acc"], row["target_acc"], marker=marker[row["model"]], s=30,
                facecolors="none" if standin else "#DD8452", edgecolors="#DD8452",
            )  # fmt: skip
            point = (row["source_acc"], row["target_acc"])
            axis.annotate(_learner(row), point, xytext=(3, 3), textcoords="offset points", fontsize=5)
        axis.set_xlim(0, 1.02)
        axis.set_ylim(0, 1.02)
        axis.set_xlabel("source accuracy (id_test, else id_val)", fontsize=7)
        axis.set_ylabel("target accuracy (test)", fontsize=7)
        axis.set_title(task, fontsize=8)
    handles = [plt.Line2D([], [], marker=marker[m], linestyle="", color="#DD8452", label=m) for m in models]
    handles.append(plt.Line2D([], [], color="grey", linestyle=":", label="no shift"))
    handles.append(plt.Line2D([], [], color="#AAAAAA", linestyle="--", label="least accurate's relative accuracy"))
    axes[0].legend(handles=handles, fontsize=6, loc="upper left")  # above the diagonal: rarely a point there
    fig.suptitle(title + ("\n(hollow: stand-in images)" if _any_standin(table) else ""), fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def interventions(table: pl.DataFrame, title: str) -> bytes:
    """BREEDS Figure 6: per task, the relative accuracy (target / source) of each architecture under each
    intervention (bars; hatched: stand-ins), with the 95 % bootstrap interval the runs measured, and source accuracy
    in each bar's label (the paper plots the two against each other: the accuracy-robustness trade-off); a dotted
    line at each architecture's relative accuracy under standard training."""
    plt = pyplot()
    tasks = sorted(set(table["task"].to_list()))
    most = max((table.filter(pl.col("task") == t).height for t in tasks), default=1)
    fig, axes = _task_axes(plt, tasks, (7.5, 0.32 * most + 1.2), 1)
    for axis, task in zip(axes, tasks, strict=False):
        rows = table.filter(pl.col("task") == task).sort("model", "intervention", "intervention_settings").to_dicts()
        for k, row in enumerate(rows):
            colour = INTERVENTION_COLOURS.get(row["intervention"], "#8172B2")
            hatch = "//" if row["image_source"] == "standin" else None
            axis.barh(k, row["relative_acc"] or 0.0, color=colour, hatch=hatch, edgecolor="white", height=0.7)
            if row["relative_low"] is not None and row["relative_high"] is not None:
                axis.plot([row["relative_low"], row["relative_high"]], [k, k], color="black", linewidth=0.9)
        for model in sorted({r["model"] for r in rows}):
            at = [k for k, r in enumerate(rows) if r["model"] == model]
            standard = [r["relative_acc"] for r in rows if r["model"] == model and r["intervention"] == "none"]
            if standard and standard[0] is not None:
                axis.plot([standard[0]] * 2, [at[0] - 0.45, at[-1] + 0.45], color="grey", linestyle=":", linewidth=1)
        labels = [
            f"{r['model']}: {r['intervention_settings']} (source {r['source_acc']:.2f})\n{_learner(r)}" for r in rows
        ]
        axis.set_yticks(range(len(rows)), labels, fontsize=5.5)
        axis.invert_yaxis()
        ends = [r[c] for r in rows for c in ("relative_acc", "relative_high") if r[c] is not None]
        axis.set_xlim(0, max([1.05, *(end + 0.05 for end in ends)]))
        axis.set_xlabel("relative accuracy (target / source), 95 % interval", fontsize=7)
        axis.set_title(task, fontsize=8)
    fig.suptitle(title + ("\n(hatched: stand-in images)" if _any_standin(table) else ""), fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)
