"""Small PNG plots for materialization metadata (rendered in the Dagster UI as markdown)."""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> Any:
    """matplotlib, imported when a figure is drawn: the CLI and the code location start faster without it."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on build machines
    import matplotlib.pyplot as plt

    return plt


def png_markdown(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def png_bytes(fig: Figure) -> bytes:
    plt = pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def erm_learning_curve(curve: pl.DataFrame, best_iteration: int, title: str) -> bytes:
    """Training loss and the selection split's accuracy per evaluation, with the selected iterate."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
    for (split, metric), part in sorted(curve.group_by("split", "metric"), key=lambda kv: str(kv[0])):
        part = part.sort("iteration")
        axis = left if metric == "loss_avg" else right
        axis.plot(part["iteration"].to_list(), part["value"].to_list(), label=f"{split} {metric}", linewidth=1.2)
    for axis, label in ((left, "cross-entropy"), (right, "accuracy")):
        axis.axvline(best_iteration, color="grey", linestyle=":", linewidth=1)
        axis.set_xlabel("iteration")
        axis.set_ylabel(label)
        axis.legend(fontsize=6)
    right.set_ylim(0, 1.02)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def erm_id_vs_ood(results: pl.DataFrame, title: str) -> bytes:
    """Average and worst-group accuracy on every evaluated split (ID splits first, OOD after)."""
    plt = pyplot()
    order = ["train", "ood_train", "id_val", "id_test", "val", "test"]
    accuracy = results.filter(pl.col("metric").is_in(["acc_avg", "acc_wg"]))
    splits = [s for s in order if s in set(accuracy["eval_split"].to_list())]
    fig, ax = plt.subplots(figsize=(1.3 * len(splits) + 2, 3))
    for offset, metric, colour in ((-0.2, "acc_avg", "#4C72B0"), (0.2, "acc_wg", "#DD8452")):
        values = []
        for split in splits:
            row = accuracy.filter((pl.col("eval_split") == split) & (pl.col("metric") == metric))
            values.append(row["value"][0] if row.height and row["value"][0] is not None else 0.0)
        ax.bar([k + offset for k in range(len(splits))], values, width=0.4, color=colour, label=metric)
    ax.set_xticks(range(len(splits)), splits, fontsize=7)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


STANDIN_MARK = " [stand-in images]"  # how an analysis figure marks a learner trained on generated stand-ins


def method_label(row: dict[str, Any]) -> str:
    """``method setting``, marked when the results are on stand-in images (the analyses' ``image_source``)."""
    label = f"{row['method']} {row['setting']}".strip()
    return label + STANDIN_MARK if row.get("image_source") == "standin" else label


def learner_label() -> pl.Expr:
    """:func:`method_label` as a polars expression over an analysis table (``learner``)."""
    marked = pl.when(pl.col("image_source") == "standin").then(pl.lit(STANDIN_MARK)).otherwise(pl.lit(""))
    return pl.concat_str(pl.concat_str("method", "setting", separator=" ").str.strip_chars(), marked).alias("learner")


def training_conflicts(table: pl.DataFrame, title: str) -> bytes:
    """The paper's Figure 4/9 layout: rows training subsets, columns evaluation subsets (in-domain, then
    out-of-domain), each in the tracked split's order (class, meta-graph community); normalised coefficients in
    [-1, 1], green where training on the row subset lowers the column subset's loss."""
    import numpy as np

    plt = pyplot()
    rows = table.select("row", "training_subset").unique().sort("row")
    columns = table.select("column", "evaluation_subset", "evaluation_domain").unique().sort("column")
    grid = np.full((rows.height, columns.height), np.nan)
    for row, column, value in table.select("row", "column", "normalized_coefficient").iter_rows():
        grid[row, column] = value
    fig, ax = plt.subplots(figsize=(2.5 + 0.22 * columns.height, 1.8 + 0.22 * rows.height))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(rows.height), rows["training_subset"].to_list(), fontsize=6)
    ax.set_xticks(range(columns.height), columns["evaluation_subset"].to_list(), fontsize=6, rotation=90)
    domains = columns["evaluation_domain"].to_list()
    split_at = next((k for k, d in enumerate(domains) if d == "out_of_domain"), None)
    if split_at:
        ax.axvline(split_at - 0.5, color="black", linewidth=1.2)
    ax.set_xlabel("evaluation subsets: in-domain" + (" | out-of-domain" if split_at is not None else ""), fontsize=7)
    ax.set_ylabel("training subsets", fontsize=7)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01).ax.tick_params(labelsize=6)
    ax.set_title(f"{title}\ntraining conflicts (normalised coefficients; green: training on the row helps)", fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)
