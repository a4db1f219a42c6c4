"""MetaShift figures: meta-graphs of a collection's subsets, a task's community distances, accuracy against d, and the
paper's tables beside ours."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from shiftbench.results.plots import learner_label, png_bytes, pyplot

if TYPE_CHECKING:  # not imported at run time: a worker drawing the figures needs none of the builders
    from shiftbench.metashift.classes import ClassOutcome, ClassResult

MAX_FIGURES = 12  # the largest classes; the UI shows 4 inline (shiftbench.metashift.cards.FIGURES_INLINE)
MAX_FIGURE_NODES = 60  # about what MetaShift's Figure 2 shows per class
FIGURES_IN_WORKER_FROM = 5_000  # selected subsets from which a worker draws the figures (GQA attributes: 8,015)
TASK_FIGURE = "task_distances.png"


def figure_name(class_name: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in class_name)
    return f"metagraph_{safe}.png"


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


@dataclass(frozen=True)
class MetaGraphDrawing:
    """What :func:`metagraph_figure` draws: plain lists, cheap to send to a worker process."""

    nodes: list[str]
    sizes: list[int]
    edges: list[tuple[int, int, float]]
    community: list[int]
    title: str


def metagraph_figure(
    nodes: list[str],
    sizes: list[int],
    edges: list[tuple[int, int, float]],
    community: list[int],
    title: str,
    seed: int = 0,
) -> bytes:
    """A class's meta-graph as in MetaShift's Figure 2: subsets coloured by community, edge width = overlap."""
    plt = pyplot()
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
    return png_bytes(fig)


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


def collection_figures_started(outcomes: Sequence[ClassOutcome], benchmark: str) -> Callable[[], dict[str, bytes]]:
    """Figures of the largest classes' meta-graphs, being drawn from now on (the call waits for them)."""
    results = {o.class_name: o.result for o in outcomes if o.result is not None}
    largest = sorted(results, key=lambda c: (-len(results[c].graph.nodes), c))[:MAX_FIGURES]
    in_worker = sum(len(result.graph.nodes) for result in results.values()) >= FIGURES_IN_WORKER_FROM
    pngs = metagraph_figures_started([_drawing(results[n], n, benchmark) for n in largest], in_worker=in_worker)
    return lambda: {figure_name(name): png for name, png in zip(largest, pngs(), strict=True)}


def _drawing(result: ClassResult, class_name: str, benchmark: str) -> MetaGraphDrawing:
    """A class's meta-graph as its figure shows it."""
    community_of = {m: k for k, members in enumerate(result.communities) for m in members}
    nodes = result.graph.nodes
    # A figure of thousands of labelled nodes is unreadable and takes tens of seconds: draw the
    # largest subsets (nodes come largest first) and their edges, and say so in the title.
    shown = min(len(nodes), MAX_FIGURE_NODES)
    coo = result.graph.weights.tocoo()
    edges = [(int(i), int(j), float(w)) for i, j, w in zip(coo.row, coo.col, coo.data, strict=True) if i < j < shown]
    drawn = f"the {shown} largest of " if shown < len(nodes) else ""
    return MetaGraphDrawing(
        nodes[:shown],
        result.graph.sizes[:shown].tolist(),
        edges,
        [community_of[n] for n in nodes[:shown]],
        f"{class_name}: {drawn}{len(nodes)} subsets, {len(result.communities)} communities ({benchmark})",
    )


def task_distances(communities: pl.DataFrame, title: str) -> bytes:
    """Distance of each community to its reference (test or minority) community, by role."""
    plt = pyplot()
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
    return png_bytes(fig)


def accuracy_vs_distance(table: pl.DataFrame, title: str) -> bytes:
    """MetaShift: test accuracy against d, one panel per task family and data tag, one line per learner (method,
    setting; marked when on stand-in images)."""
    plt = pyplot()
    # Tasks of other data (another @TAG: the generated scene sample, tags) are panels of their own, never one line.
    families = sorted({(r["task_kind"], r["classes"], r["data_tag"] or "") for r in table.iter_rows(named=True)})
    width = max(5.0, 3.6 * len(families) + 0.6)  # room for the title's provenance lines (shiftbench.families.analysis)
    fig, axes = plt.subplots(1, len(families), figsize=(width, 3.6), squeeze=False)
    for axis, (kind, classes, tag) in zip(axes[0], families, strict=True):
        same_data = pl.col("data_tag").fill_null("") == tag
        part = table.filter((pl.col("task_kind") == kind) & (pl.col("classes") == classes) & same_data)
        part = part.drop_nulls("distance")
        for label, rows in sorted(part.with_columns(learner_label()).group_by("learner"), key=str):
            rows = rows.sort("distance")
            axis.errorbar(
                rows["distance"].to_list(), rows["acc_mean"].to_list(), yerr=rows["acc_std"].fill_null(0).to_list(),
                marker="o", markersize=4, linewidth=1.2, capsize=2, label=str(label[0]),
            )  # fmt: skip
        axis.set_title(f"{kind}: {classes}" + (f" (@{tag} data)" if tag else ""), fontsize=8)
        axis.set_xlabel("distance d (train vs test subsets)")
        axis.set_ylabel("test accuracy")
        axis.set_ylim(0, 1.02)
        axis.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def training_conflicts(table: pl.DataFrame, title: str) -> bytes:
    """MetaShift §4.3: the strongest conflict zones of each tracked run (training subset -> evaluation subset),
    by normalised coefficient; in-domain and out-of-domain evaluation subsets coloured apart."""
    plt = pyplot()
    runs = sorted(set(table["run"].to_list()))
    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 0.6 + 2.6 * len(runs)), squeeze=False)
    for axis, run in zip(axes[:, 0], runs, strict=True):
        part = table.filter(pl.col("run") == run).sort("normalized_coefficient").head(15)
        labels = [
            f"{r['training_subset']} -> {r['evaluation_subset']}"
            + (" (OOD)" if r["evaluation_domain"] == "out_of_domain" else "")
            for r in part.iter_rows(named=True)
        ]
        colours = ["#C44E52" if d == "in_domain" else "#8172B2" for d in part["evaluation_domain"].to_list()]
        axis.barh(range(part.height), part["normalized_coefficient"].to_list(), color=colours)
        axis.set_yticks(range(part.height), labels, fontsize=6)
        axis.invert_yaxis()
        axis.set_xlim(-1.05, 0)
        axis.set_xlabel("normalised coefficient (training on the first subset raises the second's loss)", fontsize=7)
        axis.set_title(f"{run}: {table.filter(pl.col('run') == run).height} conflict pairs", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def subpopulation_table(table: pl.DataFrame, title: str) -> bytes:
    """MetaShift Table 2: per minority share p, each method's average and worst-group accuracy, the paper's bars
    hatched beside ours (one bar per run setting and image source; none where no run exists)."""
    plt = pyplot()
    shares = sorted(set(table["minority_percent"].to_list()), reverse=True)
    fig, axes = plt.subplots(2, len(shares), figsize=(3.4 * len(shares) + 0.6, 5.2), squeeze=False)
    for column, share in enumerate(shares):
        part = table.filter(pl.col("minority_percent") == share)
        methods = sorted(set(part["method"].to_list()))
        pairs = (("acc_avg", "paper_acc_avg", "average"), ("acc_wg", "paper_acc_wg", "worst group"))
        for row, (ours, paper, name) in enumerate(pairs):
            axis = axes[row][column]
            for k, method in enumerate(methods):
                rows = part.filter(pl.col("method") == method)
                published = next((v for v in rows[paper].to_list() if v is not None), None)
                if published is not None:
                    axis.bar(k - 0.2, published, width=0.38, color="#DDDDDD", hatch="//", edgecolor="grey")
                measured = [v for v in rows[ours].to_list() if v is not None]
                if measured:
                    axis.bar(k + 0.2, sum(measured) / len(measured), width=0.38, color="#4C72B0")
            axis.set_xticks(range(len(methods)), methods, fontsize=6, rotation=45)
            axis.set_ylim(0, 1.02)
            axis.set_title(f"p = {share} %: {name} (hatched: the paper's)", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)


def multiclass_table(table: pl.DataFrame, title: str) -> bytes:
    """MetaShift Table 3: accuracy against the paper's d of the dog training data, one solid line per learner
    (method, setting, the tasks' @TAG; marked when on stand-in images) beside the paper's method (dashed, same
    colour); ours on the test split (task 1's: dog(shelf) and cat(shelf)) and on dog(shelf) alone, the paper's OOD
    accuracy in both."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.0), squeeze=False)
    methods = sorted(set(table["method"].to_list()))
    colours = {method: plt.get_cmap("tab10")(k % 10) for k, method in enumerate(methods)}
    paper = table.drop_nulls("paper_acc_ood").select("method", "paper_distance", "paper_acc_ood").unique()
    ours = table.filter(pl.col("image_source") != "").with_columns(learner_label())  # '': the paper's row only
    panels = (("acc_ood", "the test split (dog(shelf) + cat(shelf))"), ("acc_dog_shelf", "dog(shelf)"))
    for axis, (column, evaluated) in zip(axes[0], panels, strict=True):
        for method in sorted(set(paper["method"].to_list())):
            rows = paper.filter(pl.col("method") == method).sort("paper_distance")
            axis.plot(
                rows["paper_distance"].to_list(), rows["paper_acc_ood"].to_list(), linestyle="--", marker="s",
                markersize=3, linewidth=1, color=colours[method], label=f"{method} (paper)",
            )  # fmt: skip
        for learner, tag in sorted(set(ours.select("learner", pl.col("data_tag").fill_null("")).iter_rows())):
            same = (pl.col("learner") == learner) & (pl.col("data_tag").fill_null("") == tag)  # one line per data
            rows = ours.filter(same).drop_nulls(column).sort("paper_distance")
            if rows.is_empty():
                continue
            axis.plot(
                rows["paper_distance"].to_list(), rows[column].to_list(), marker="o", markersize=4, linewidth=1.4,
                color=colours[rows["method"][0]], label=f"{learner} (@{tag})" if tag else learner,
            )  # fmt: skip
        axis.set_xticks(sorted(set(table["paper_distance"].to_list())))
        axis.set_xlabel("the paper's d of the dog training data to dog(shelf)", fontsize=7)
        axis.set_ylabel("accuracy")
        axis.set_ylim(0, 1.02)
        axis.set_title(f"ours on {evaluated}; dashed: the paper's OOD accuracy", fontsize=7)
        axis.legend(fontsize=5)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return png_bytes(fig)
