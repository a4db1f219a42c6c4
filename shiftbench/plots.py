"""Small PNG plots for materialization metadata (rendered in the Dagster UI as markdown)."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _pyplot() -> Any:
    """matplotlib, imported when a figure is drawn: the CLI and the code location start faster without it."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on build machines
    import matplotlib.pyplot as plt

    return plt


def subclasses_per_superclass(subpopulations: pl.DataFrame, title: str) -> bytes:
    """Stacked bars: number of subclasses of each superclass in each domain."""
    plt = _pyplot()
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


def _png(fig: Figure) -> bytes:
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def _component_grid_layout(graph: Any, seed: int) -> dict[int, Any]:
    """Spring layout per connected component, components on a grid, largest first.

    A spring layout of a disconnected graph pushes the components into the corners and
    shrinks each to a dot (networkx has no component packing); meta-graphs are often
    disconnected, so each component gets its own cell, scaled by the square root of its size.
    """
    import networkx as nx
    import numpy as np

    components = sorted(nx.connected_components(graph), key=lambda c: (-len(c), min(c)))
    columns = math.ceil(math.sqrt(len(components))) if components else 1
    largest = len(components[0]) if components else 1
    positions: dict[int, Any] = {}
    for k, members in enumerate(components):
        sub = graph.subgraph(sorted(members))
        local = nx.spring_layout(sub, weight="weight", seed=seed) if len(members) > 1 else {next(iter(members)): (0, 0)}
        scale = 0.4 * math.sqrt(len(members) / largest)
        centre = np.array([k % columns, -(k // columns)], dtype=float)
        positions.update({node: centre + scale * np.asarray(xy) for node, xy in local.items()})
    return positions


def metagraph_figure(
    nodes: list[str],
    sizes: list[int],
    edges: list[tuple[int, int, float]],
    community: list[int],
    title: str,
    seed: int = 0,
) -> bytes:
    """A class's meta-graph as in MetaShift's Figure 2: subsets coloured by community, edge width = overlap."""
    plt = _pyplot()
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(range(len(nodes)))
    graph.add_weighted_edges_from(edges)
    positions = _component_grid_layout(graph, seed)
    side = min(10.0, 4.0 + 0.12 * len(nodes))  # 900 px at most: fits the Dagster UI's dialog
    fig, ax = plt.subplots(figsize=(side, side * 0.8))
    colours = plt.get_cmap("tab20")
    nx.draw_networkx_edges(
        graph, positions, ax=ax, width=[0.5 + 3 * w for _, _, w in graph.edges(data="weight")], alpha=0.35
    )
    nx.draw_networkx_nodes(
        graph,
        positions,
        ax=ax,
        node_size=[30 + 6 * s**0.5 for s in sizes],
        node_color=[colours(c % 20) for c in community],
        edgecolors="black",
        linewidths=0.4,
    )
    labels = {k: name[name.find("(") + 1 : -1] if "(" in name else name for k, name in enumerate(nodes)}
    nx.draw_networkx_labels(graph, positions, labels=labels, ax=ax, font_size=7)
    ax.set_title(title)
    ax.axis("off")
    fig.tight_layout()
    return _png(fig)


@dataclass(frozen=True)
class MetaGraphDrawing:
    """What :func:`metagraph_figure` draws: plain lists, cheap to send to a worker process."""

    nodes: list[str]
    sizes: list[int]
    edges: list[tuple[int, int, float]]
    community: list[int]
    title: str


def draw_metagraph(drawing: MetaGraphDrawing) -> bytes:
    return metagraph_figure(*astuple(drawing))


def metagraph_figures_started(drawings: Sequence[MetaGraphDrawing], *, in_worker: bool) -> Callable[[], list[bytes]]:
    """Start drawing meta-graphs in one worker process now; the returned call waits for their PNGs (in order).

    Drawing holds Python's lock (about 0.15 s a figure, plus matplotlib's import) and its memory; started as soon
    as the classes are built, a worker draws them while the collection is assembled, written and checked, on
    whichever core those leave idle. Without ``in_worker`` (small builds: a worker's start would cost more), the
    call draws them itself.
    """
    if not in_worker or len(drawings) < 2:
        return lambda: [draw_metagraph(d) for d in drawings]
    from loky import ProcessPoolExecutor  # fresh interpreters: never a fork of this threaded process

    pool = ProcessPoolExecutor(max_workers=1)
    futures = [pool.submit(draw_metagraph, d) for d in drawings]
    pool.shutdown(wait=False)

    def result() -> list[bytes]:
        return [future.result() for future in futures]

    return result


def task_distances(communities: pl.DataFrame, title: str) -> bytes:
    """Distance of each community to its reference (test or minority) community, by role."""
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    rows = communities.filter(pl.col("reference").is_not_null()).sort("class", "role", "community")
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.3 * rows.height + 1.2)))
    roles = sorted(set(rows["role"].to_list()))
    colours = {role: plt.get_cmap("tab10")(k) for k, role in enumerate(roles)}
    labels = [f"{c} -> {r}" for c, r in zip(rows["community"].to_list(), rows["reference"].to_list(), strict=True)]
    values = [v if v is not None else 0.0 for v in rows["distance"].to_list()]
    ax.barh(labels, values, color=[colours[r] for r in rows["role"].to_list()])
    for k, (value, status) in enumerate(
        zip(rows["distance"].to_list(), rows["distance_status"].to_list(), strict=True)
    ):
        ax.text(
            0.01 if value is None else value,
            k,
            " NULL: " + status if value is None else f" {value:.2f}",
            va="center",
            fontsize=7,
        )
    ax.invert_yaxis()
    ax.set_xlabel("spectral-embedding distance")
    ax.set_title(title)
    handles = [Rectangle((0, 0), 1, 1, color=colours[r]) for r in roles]
    ax.legend(handles, roles, fontsize=7, loc="lower right")
    fig.tight_layout()
    return _png(fig)


def conds_cell_counts(cells: pl.DataFrame, title: str) -> bytes:
    """Train (and id_val) vs test examples per cell: the shape of a ConDS case at a glance."""
    plt = _pyplot()
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
    return _png(fig)


def conds_value_shares(value_counts: pl.DataFrame, attributes: pl.DataFrame, title: str) -> bytes:
    """Per attribute: share of each value in train vs test, with the shift and association."""
    plt = _pyplot()
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
    return _png(fig)


def erm_learning_curve(curve: pl.DataFrame, best_iteration: int, title: str) -> bytes:
    """Training loss and the selection split's accuracy per evaluation, with the selected iterate."""
    plt = _pyplot()
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
    return _png(fig)


def erm_id_vs_ood(results: pl.DataFrame, title: str) -> bytes:
    """Average and worst-group accuracy on every evaluated split (ID splits first, OOD after)."""
    plt = _pyplot()
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
    return _png(fig)


def _label(row: dict[str, Any]) -> str:
    return f"{row['method']} {row['setting']}".strip()


def accuracy_vs_distance(table: pl.DataFrame, title: str) -> bytes:
    """MetaShift: test accuracy against d, one panel per task family, one line per method and setting."""
    plt = _pyplot()
    families = sorted({(r["task_kind"], r["classes"]) for r in table.iter_rows(named=True)})
    fig, axes = plt.subplots(1, len(families), figsize=(3.6 * len(families) + 0.6, 3.2), squeeze=False)
    for axis, (kind, classes) in zip(axes[0], families, strict=True):
        part = table.filter((pl.col("task_kind") == kind) & (pl.col("classes") == classes)).drop_nulls("distance")
        for label, rows in sorted(part.group_by(pl.concat_str("method", "setting", separator=" ")), key=str):
            rows = rows.sort("distance")
            axis.errorbar(
                rows["distance"].to_list(), rows["acc_mean"].to_list(), yerr=rows["acc_std"].fill_null(0).to_list(),
                marker="o", markersize=4, linewidth=1.2, capsize=2, label=str(label[0]).strip(),
            )  # fmt: skip
        axis.set_title(f"{kind}: {classes}", fontsize=8)
        axis.set_xlabel("distance d (train vs test subsets)")
        axis.set_ylabel("test accuracy")
        axis.set_ylim(0, 1.02)
        axis.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _png(fig)


def source_vs_target(table: pl.DataFrame, title: str) -> bytes:
    """BREEDS: target against source accuracy per task and method (the diagonal is no shift), and the
    relative accuracy target / source."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.5, 3.4))
    for row in table.iter_rows(named=True):
        left.scatter(row["source_acc"], row["target_acc"], s=18)
        left.annotate(f"{row['task']} {_label(row)}", (row["source_acc"], row["target_acc"]), fontsize=5)
    left.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    left.set_xlabel("source accuracy (id_test, else id_val)")
    left.set_ylabel("target accuracy (test)")
    left.set_xlim(0, 1.02)
    left.set_ylim(0, 1.02)
    labels = [f"{r['task']}\n{_label(r)}" for r in table.iter_rows(named=True)]
    right.bar(range(table.height), table["relative_acc"].fill_null(0).to_list(), color="#4C72B0")
    right.set_xticks(range(table.height), labels, fontsize=5, rotation=60, ha="right")
    right.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    right.set_ylabel("relative accuracy (target / source)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _png(fig)


def accuracy_by_shift(table: pl.DataFrame, title: str) -> bytes:
    """ConDS: mean test accuracy over cases by shift kind, and by number of concurrent shifts, per method."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [2, 1]})
    learner = pl.concat_str("method", "setting", separator=" ").str.strip_chars().alias("learner")
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
    return _png(fig)


def conds_grid_vs_paper(table: pl.DataFrame, title: str) -> bytes:
    """ConDS Table 3 side by side: each learner's mean test accuracy over cases (bars) with the paper's
    number for its row (a black tick; rows the paper has and this grid has not run: the tick alone), and
    each learner's accuracy by number of concurrent shifts (the paper's Figure 4 takeaway)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    rows = table.sort("category", "paper_row", "setting").to_dicts()
    labels = [
        f"{r['paper_row'] or r['method']}"
        + (f"\n{r['dataset']} {r['setting']}" if r["n_cases"] else f"\n{r['category']}: not run here")
        for r in rows
    ]
    positions = list(range(len(rows)))
    left.barh(positions, [r["acc_mean"] or 0.0 for r in rows], color="tab:blue", label="measured (mean over cases)")
    paper = [(i, r["paper_acc"]) for i, r in enumerate(rows) if r["paper_acc"] is not None]
    if paper:
        left.scatter([v for _, v in paper], [i for i, _ in paper], marker="|", s=300, color="black",
                     label="the paper (Table 3)", zorder=3)  # fmt: skip
    left.set_yticks(positions, labels, fontsize=6)
    left.invert_yaxis()
    left.set_xlim(0, 1)
    left.set_xlabel("uniform-test accuracy")
    left.legend(fontsize=6, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    columns = ("acc_0_shifts", "acc_1_shift", "acc_2_shifts", "acc_3_shifts")
    for r, label in zip(rows, labels, strict=True):
        points = [(k, r[c]) for k, c in enumerate(columns) if r[c] is not None]
        if points:
            right.plot([k for k, _ in points], [v for _, v in points], marker="o", label=label.replace("\n", " "))
    right.set_xticks(range(4), ["0", "1", "2", "3"])
    right.set_ylim(0, 1.02)
    right.set_xlabel("concurrent shifts")
    right.set_ylabel("mean test accuracy over cases")
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=5)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _png(fig)
