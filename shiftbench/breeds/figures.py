"""BREEDS figures: subclasses per superclass of a benchmark, source against target accuracy (its analysis)."""

from __future__ import annotations

import io

import polars as pl

from shiftbench.plots import method_label, png_bytes, pyplot

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
