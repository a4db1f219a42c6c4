"""MetaShift task kind ``conflicts``: the subsets of the paper's training-conflicts experiment (Section 4.3,
Appendix B.3), published with every example's subset so that a training job can attribute each gradient step to the
training subsets in its batch and measure the loss on each evaluation subset.

Selection (deterministic, seeded with :func:`shiftbench.runtime.seeding.rng_for`):

- candidates: per class, the subsets with at least ``min_subset_size`` images after leakage removal (the images of
  ``exclude_images_in`` and those showing two of the task's classes, :func:`tasks.excluded_images`);
- per class (quotas :func:`tasks.split_quota` over the classes), the candidates are permuted once and walked in that
  order: a candidate becomes a training subset when it still has ``images_per_subset + n_id_eval`` images that no
  earlier chosen subset drew, until the class's training quota is filled; then out-of-domain subsets the same way
  from the candidates left, each drawing ``ood_images_per_subset`` images. MetaShift subsets overlap: an image
  belongs to at most one chosen subset and one split;
- within a subset the images are drawn with :func:`tasks.shuffled` from its untaken images; the first ``n_id_eval``
  go to ``id_val`` (in-domain evaluation), the next ``images_per_subset`` to ``train``.

``n_id_eval`` = floor(images_per_subset · s / (1 - s) + 1/2) with ``s`` the ``id_eval_share`` as written in decimal,
computed exactly (50 images at 0.2: 12.5, so 13): s is the share of a training subset's drawn images held out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import polars as pl

from shiftbench.errors import InputError
from shiftbench.metashift import metagraph as mg
from shiftbench.metashift.specs import TaskSpec
from shiftbench.metashift.tasks import (
    COMMUNITY_SCHEMA,
    EXAMPLE_SCHEMA,
    TaskData,
    TaskResult,
    excluded_images,
    graph_from_sets,
    shuffled,
    split_quota,
)
from shiftbench.runtime.seeding import rng_for

ROLES = ("train", "ood")
SPLITS_OF_ROLE = {"train": "train+id_val", "ood": "test"}
# What a training job reads of the manifest (family-agnostic): which column names an example's subset, and what each
# evaluation split measures.
EVALUATION_SPLITS = {"id_val": "in_domain", "test": "out_of_domain"}


def id_eval_images(images_per_subset: int, share: float) -> int:
    """In-domain evaluation images of a training subset: the share of its drawn images, halves rounded up."""
    exact = Fraction(repr(share))
    return math.floor(images_per_subset * exact / (1 - exact) + Fraction(1, 2))


@dataclass(frozen=True)
class Sizes:
    """Images each chosen subset draws, resolved from the spec."""

    train: int
    id_eval: int
    ood: int

    @classmethod
    def of(cls, spec: TaskSpec) -> Sizes:
        assert spec.images_per_subset is not None and spec.id_eval_share is not None  # validated
        id_eval = id_eval_images(spec.images_per_subset, spec.id_eval_share)
        if id_eval == 0:  # no in-domain evaluation, and by default out-of-domain subsets of no image
            raise InputError(
                f"task {spec.name}: id_eval_share={spec.id_eval_share} holds out no image of a training subset of "
                f"{spec.images_per_subset}: raise id_eval_share or images_per_subset",
                parameter="id_eval_share",
            )
        ood = spec.ood_images_per_subset if spec.ood_images_per_subset is not None else id_eval
        return cls(spec.images_per_subset, id_eval, ood)


@dataclass(frozen=True)
class Chosen:
    name: str
    class_name: str
    role: str
    n_available: int  # its images after leakage removal
    drawn: list[str]  # in draw order


def candidates(spec: TaskSpec, data: TaskData, excluded: set[str]) -> dict[str, dict[str, set[str]]]:
    """Per class, its subsets with at least ``min_subset_size`` images after leakage removal."""
    result: dict[str, dict[str, set[str]]] = {}
    for cls in spec.classes:
        prefix = f"{cls}("
        sets = {n: set(images) - excluded for n, images in data.subset_images.items() if n.startswith(prefix)}
        result[cls] = {n: s for n, s in sorted(sets.items()) if len(s) >= spec.min_subset_size}
    return result


def _walk(
    spec: TaskSpec, order: list[str], pools: dict[str, set[str]], taken: set[str], quota: int, need: int
) -> list[tuple[str, list[str]]]:
    """The first ``quota`` subsets of ``order`` that can still supply ``need`` untaken images, with their draws."""
    chosen: list[tuple[str, list[str]]] = []
    for name in order:
        if len(chosen) == quota:
            break
        free = pools[name] - taken
        if len(free) < need:
            continue
        drawn = shuffled(free, rng_for(spec.seed, spec.base, name))[:need]
        taken.update(drawn)
        chosen.append((name, drawn))
    return chosen


def _short(spec: TaskSpec, cls: str, found: int, quota: int, need: int, parameter: str) -> InputError:
    total = getattr(spec, parameter)
    left = "" if parameter == "train_subsets" else " more (besides its training subsets)"
    return InputError(
        f"task {spec.name}: class {cls} has {found} candidate subset(s){left} that can supply {need} images not drawn "
        f"by another subset (subsets of >= {spec.min_subset_size} images after leakage removal); {parameter}="
        f"{total} asks {quota} per class",
        parameter=parameter,
    )


def select(spec: TaskSpec, pools: dict[str, dict[str, set[str]]], sizes: Sizes) -> list[Chosen]:
    """The chosen subsets of every class, training subsets first, with their drawn images."""
    assert spec.train_subsets is not None and spec.ood_subsets is not None  # validated
    n_classes = len(spec.classes)
    train_quota = split_quota(spec.train_subsets, n_classes)
    ood_quota = split_quota(spec.ood_subsets, n_classes)
    taken: set[str] = set()
    chosen: list[Chosen] = []
    for k, cls in enumerate(spec.classes):
        class_pools = pools[cls]
        order = shuffled(set(class_pools), rng_for(spec.seed, spec.base, cls))
        steps = (
            ("train", train_quota[k], sizes.train + sizes.id_eval, "train_subsets"),
            ("ood", ood_quota[k], sizes.ood, "ood_subsets"),
        )
        for role, quota, need, parameter in steps:
            picked = _walk(spec, order, class_pools, taken, quota, need)
            if len(picked) < quota:
                raise _short(spec, cls, len(picked), quota, need, parameter)
            names = {name for name, _ in picked}
            order = [name for name in order if name not in names]
            chosen += [Chosen(name, cls, role, len(class_pools[name]), drawn) for name, drawn in picked]
    return chosen


def communities_of(spec: TaskSpec, pools: dict[str, dict[str, set[str]]]) -> dict[str, int]:
    """Each candidate subset's Louvain community (largest first, numbered from 0) in its class's meta-graph of
    candidate subsets: overlap edges >= the paper's threshold (Section 3.1), seeded with the task's seed."""
    result: dict[str, int] = {}
    for cls in spec.classes:
        sets = pools[cls]
        names = sorted(sets, key=lambda n: (-len(sets[n]), n))  # metagraph.node_order
        if not names:
            continue
        graph = graph_from_sets(cls, names, sets, mg.SUBSET_GRAPH_EDGE_THRESHOLD)
        for number, members in enumerate(mg.detect_communities(graph, "louvain", spec.seed)):
            result.update(dict.fromkeys(members, number))
    return result


def descriptor(spec: TaskSpec, chosen: list[Chosen], community: dict[str, int]) -> dict[str, Any]:
    """The manifest's ``subsets`` block: what a training job needs to track training conflicts, family-agnostic.
    ``order`` is the paper's heatmap layout: by class (spec order), role (train first), community, name."""
    rank = {cls: k for k, cls in enumerate(spec.classes)}
    ordered = sorted(chosen, key=lambda c: (rank[c.class_name], ROLES.index(c.role), community[c.name], c.name))
    return {
        "column": "group",
        "train_split": "train",
        "evaluation_splits": dict(EVALUATION_SPLITS),
        "order": [
            {"subset": c.name, "class": c.class_name, "role": c.role, "community": community[c.name]} for c in ordered
        ],
    }


def _rows(spec: TaskSpec, chosen: list[Chosen], sizes: Sizes) -> tuple[pl.DataFrame, pl.DataFrame]:
    labels = {cls: k for k, cls in enumerate(spec.classes)}
    examples: list[tuple[str, str, int, str, str]] = []
    communities: list[tuple[Any, ...]] = []
    for c in chosen:
        y = labels[c.class_name]
        if c.role == "train":
            examples += [(i, "id_val", y, c.class_name, c.name) for i in c.drawn[: sizes.id_eval]]
            examples += [(i, "train", y, c.class_name, c.name) for i in c.drawn[sizes.id_eval :]]
        else:
            examples += [(i, "test", y, c.class_name, c.name) for i in c.drawn]
        split = SPLITS_OF_ROLE[c.role]
        missing: list[str] = []  # no member subset is missing: the subset was found in the data
        row = (c.name, c.class_name, y, c.role, split, [c.name], missing, c.n_available, len(c.drawn))
        communities.append((*row, None, None, "not_applicable"))  # no reference, no distance
    return (
        pl.DataFrame(examples, schema=EXAMPLE_SCHEMA, orient="row"),
        pl.DataFrame(communities, schema=COMMUNITY_SCHEMA, orient="row"),
    )


def build_conflicts(spec: TaskSpec, data: TaskData) -> tuple[TaskResult, dict[str, Any]]:
    """The task's examples, chosen subsets and summary, and the manifest's ``subsets`` descriptor."""
    excluded = excluded_images(spec, data)
    pools = candidates(spec, data, excluded)
    sizes = Sizes.of(spec)
    chosen = select(spec, pools, sizes)
    examples, communities = _rows(spec, chosen, sizes)
    counts = dict(examples.group_by("split").len().iter_rows())
    summary = {
        "task_kind": spec.kind,
        "classes": list(spec.classes),
        "distance_class": None,
        "distance": None,
        "distance_status": "not_applicable",
        "paper_distance": None,
        "minority_fraction": None,
        "n_train": int(counts.get("train", 0)),
        "n_id_val": int(counts.get("id_val", 0)),
        "n_val": 0,
        "n_test": int(counts.get("test", 0)),
        "scaled_down": False,
    }
    notes = {
        "excluded_images": len(excluded),
        "candidate_subsets": {cls: len(pools[cls]) for cls in spec.classes},
        "id_eval_images_per_subset": sizes.id_eval,
        "ood_images_per_subset_used": sizes.ood,
    }
    result = TaskResult(examples, communities, summary, notes)
    return result, {"subsets": descriptor(spec, chosen, communities_of(spec, pools))}
