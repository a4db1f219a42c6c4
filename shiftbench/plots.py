"""Small PNG plots for materialization metadata (rendered in the Dagster UI as markdown)."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # headless: no display on build machines

import matplotlib.pyplot as plt
import polars as pl


def subclasses_per_superclass(subpopulations: pl.DataFrame, title: str) -> bytes:
    """Stacked bars: number of subclasses of each superclass in each domain."""
    counts = subpopulations.group_by("y", "superclass_name", "domain").agg(pl.len().alias("n")).sort("y", "domain")
    labels = counts.select("y", "superclass_name").unique().sort("y")
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


def png_markdown(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"
