"""MetaShift shift tasks: communities -> leakage-free pools -> sampled WILDS splits, and distances.

Pools follow the released task scripts:

- a community's images: the union of its members', a member ``class(*)`` being every image of the class
  (:mod:`shiftbench.metashift.task_rules`);
- excluded images: those of the ``exclude_images_in`` subsets (``cat(dog)``) and any image that
  shows two of the task's classes;
- domain generalization: test pools = community images - excluded; train pools (every variant's)
  = images - excluded - test images; ``val`` pools (the scripts' "additional test") = images -
  excluded - train images of every variant - test images. Pools are the same for all variants,
  so variants differ only in which training communities they draw from;
- subpopulation shift: minority pools = images - excluded; majority pools = images - excluded -
  minority images. Each group's pool is shuffled once; its first ``test_size / groups`` images
  are the (balanced) test set, shared by every minority fraction p; training takes the next
  round(p · n) images of the minority group and n - round(p · n) of the majority group per class.

An image is in one community per split (the first listed). Sampling sorts ids, then permutes
them with a generator seeded from (seed, task, community), so the cat training images are the
same in every variant of a task. Sizes that the pools cannot supply are an error naming the
community, unless ``allow_scale_down`` is set: then every size shrinks by one factor, recorded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from shiftbench.errors import InputError
from shiftbench.metashift import embedding as em
from shiftbench.metashift import metagraph as mg
from shiftbench.metashift.specs import Community, TaskSpec
from shiftbench.metashift.subsets import Memberships, parse_subset_name
from shiftbench.metashift.task_rules import is_whole_class
from shiftbench.runtime.seeding import rng_for

EXAMPLE_SCHEMA = {"image_id": pl.String, "split": pl.String, "y": pl.Int32, "y_name": pl.String, "group": pl.String}
COMMUNITY_SCHEMA = pl.Schema(
    {
        "community": pl.String(),
        "class": pl.String(),
        "y": pl.Int32(),
        "role": pl.String(),
        "split": pl.String(),
        "members": pl.List(pl.String),
        "missing_members": pl.List(pl.String),
        "n_available": pl.Int64(),
        "n_selected": pl.Int64(),
        "reference": pl.String(),
        "distance": pl.Float64(),
        "distance_status": pl.String(),
    }
)
_SPLIT_OF_ROLE = {"train": "train", "test": "test", "val": "val", "other_train": None}


def excluded_images(spec: TaskSpec, data: TaskData) -> set[str]:
    """Images no community of the task may use: those of ``exclude_images_in`` and those showing two classes."""
    excluded: set[str] = set()
    for subset in spec.exclude_images_in:
        excluded |= data.subset_images.get(subset, frozenset())
    seen: dict[str, int] = {}
    for cls in spec.classes:
        for image in data.class_images.get(cls, frozenset()):
            seen[image] = seen.get(image, 0) + 1
    return excluded | {image for image, count in seen.items() if count > 1}


def shuffled(images: set[str], rng: np.random.Generator) -> list[str]:
    ordered = sorted(images)
    return [ordered[k] for k in rng.permutation(len(ordered))]


@dataclass(frozen=True)
class TaskData:
    """What a task reads: images per candidate subset and per class."""

    subset_images: Mapping[str, frozenset[str]]
    class_images: Mapping[str, frozenset[str]]

    def member_images(self, member: str) -> frozenset[str] | None:
        """A community member's images: a candidate subset's, or every image of a class for ``class(*)``
        (:mod:`shiftbench.metashift.task_rules`); None when the data have none."""
        if is_whole_class(member):
            return self.class_images.get(parse_subset_name(member)[0])
        return self.subset_images.get(member)


@dataclass
class TaskResult:
    examples: pl.DataFrame
    communities: pl.DataFrame
    summary: dict[str, Any]
    notes: dict[str, Any]


class _Builder:
    def __init__(self, spec: TaskSpec, data: TaskData) -> None:
        self.spec = spec
        self.data = data
        self.missing: dict[str, list[str]] = {}
        self.notes: dict[str, Any] = {}
        self.excluded = self._excluded()
        self.images = {c.name: self._community_images(c) - self.excluded for c in spec.communities}

    def _excluded(self) -> set[str]:
        excluded = excluded_images(self.spec, self.data)
        self.notes["excluded_images"] = len(excluded)
        return excluded

    def _community_images(self, community: Community) -> set[str]:
        images: set[str] = set()
        missing = []
        for member in community.members:
            found = self.data.member_images(member)
            if found is None:
                missing.append(member)
            else:
                images |= found
        if missing:
            if not self.spec.allow_scale_down:
                raise InputError(
                    f"task {self.spec.name}: community {community.name} names subset(s) that do not exist in "
                    f"this data: {', '.join(missing)} (allow_scale_down=true builds without them)",
                    parameter="communities",
                )
            self.missing[community.name] = missing
        return images

    def empty_check(self, pools: Mapping[str, set[str]]) -> None:
        for community in self.spec.communities:
            if community.role == "other_train":
                continue
            if not pools[community.name]:
                raise InputError(
                    f"task {self.spec.name}: community {community.name} ({community.role}) has no image left "
                    "after leakage removal",
                    parameter="communities",
                )


def _label(spec: TaskSpec) -> dict[str, int]:
    return {cls: k for k, cls in enumerate(spec.classes)}


def _assign_once(order: list[Community], pools: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """Each image goes to the first listed community of the split that holds it."""
    taken: set[str] = set()
    result = {}
    for community in order:
        result[community.name] = pools[community.name] - taken
        taken |= result[community.name]
    return result


def split_quota(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def _hold_out(sample: list[str], fraction: float) -> tuple[list[str], list[str]]:
    n = math.floor(fraction * len(sample) + 0.5)
    return sample[n:], sample[:n]


def build_domain_generalization(spec: TaskSpec, data: TaskData) -> tuple[_Builder, pl.DataFrame, dict[str, Any]]:
    builder = _Builder(spec, data)
    images = builder.images
    tests = spec.by_role("test")
    test_all = set().union(*(images[c.name] for c in tests))
    trains = spec.by_role("train", "other_train")
    train_pools = {c.name: images[c.name] - test_all for c in trains}
    train_all = set().union(*train_pools.values()) if train_pools else set()
    pools = {c.name: images[c.name] for c in tests}
    pools.update(train_pools)
    pools.update({c.name: images[c.name] - train_all - test_all for c in spec.by_role("val")})
    builder.empty_check(pools)
    labels = _label(spec)
    rows: list[tuple[str, str, int, str, str]] = []
    selected: dict[str, int] = {}

    # Training: train_size split evenly over classes, then over each class's communities.
    own = spec.by_role("train")
    quotas: dict[str, int] = {}
    for cls, class_quota in zip(spec.classes, split_quota(spec.train_size, len(spec.classes)), strict=True):
        members = [c for c in own if c.class_name == cls]
        for community, quota in zip(members, split_quota(class_quota, len(members)), strict=True):
            quotas[community.name] = quota
    requested = dict(quotas)
    while True:
        samples, short = {}, {}
        taken: set[str] = set()
        for community in own:
            candidates = shuffled(pools[community.name] - taken, rng_for(spec.seed, spec.base, community.name))
            if len(candidates) < quotas[community.name]:
                short[community.name] = len(candidates)
            samples[community.name] = candidates[: quotas[community.name]]
            taken |= set(samples[community.name])
        if not short:
            break
        name, available = next(iter(short.items()))
        if not spec.allow_scale_down:
            raise InputError(
                f"task {spec.name}: community {name} has {available} training images after leakage removal, "
                f"the task needs {quotas[name]} (set allow_scale_down=true to scale the task down)",
                parameter="train_size",
            )
        scale = min(short[n] / quotas[n] for n in short)
        quotas = {n: math.floor(q * scale) for n, q in quotas.items()}
    if quotas != requested:
        builder.notes["scaled_down"] = {"requested": requested, "used": quotas}
    for community in own:
        train, id_val = _hold_out(samples[community.name], spec.id_val_fraction)
        y = labels[community.class_name]
        rows += [(i, "train", y, community.class_name, community.name) for i in train]
        rows += [(i, "id_val", y, community.class_name, community.name) for i in id_val]
        selected[community.name] = len(samples[community.name])

    for split, role in (("test", "test"), ("val", "val")):
        communities = spec.by_role(role)
        assigned = _assign_once(communities, pools)
        for community in communities:
            chosen = sorted(assigned[community.name])
            if spec.test_size is not None and role == "test":
                cap = split_quota(spec.test_size, len(communities))[communities.index(community)]
                chosen = shuffled(assigned[community.name], rng_for(spec.seed, spec.base, community.name))[:cap]
            y = labels[community.class_name]
            rows += [(i, split, y, community.class_name, community.name) for i in chosen]
            selected[community.name] = len(chosen)
    examples = pl.DataFrame(rows, schema=EXAMPLE_SCHEMA, orient="row")
    stats = {name: (len(pool), selected.get(name, 0)) for name, pool in pools.items()}
    return builder, examples, stats


def build_subpopulation(spec: TaskSpec, data: TaskData) -> tuple[_Builder, pl.DataFrame, dict[str, Any]]:
    builder = _Builder(spec, data)
    images = builder.images
    minority = spec.by_role("minority")
    majority = spec.by_role("majority")
    minority_all = set().union(*(images[c.name] for c in minority))
    pools = {c.name: images[c.name] for c in minority}
    pools.update({c.name: images[c.name] - minority_all for c in majority})
    builder.empty_check(pools)
    order = {c.name: shuffled(pools[c.name], rng_for(spec.seed, spec.base, c.name)) for c in [*minority, *majority]}
    assert spec.test_size is not None and spec.minority_fraction is not None  # validated
    p = spec.minority_fraction
    n_groups = len(minority) + len(majority)
    per_class = dict(zip(spec.classes, split_quota(spec.train_size, len(spec.classes)), strict=True))
    test_per_group = spec.test_size // n_groups
    requested = {"train_size": spec.train_size, "test_size": spec.test_size}

    def needs(t: int, per: dict[str, int]) -> dict[str, int]:
        result = {}
        for c in [*minority, *majority]:
            n_min = math.floor(p * per[c.class_name] + 0.5)
            result[c.name] = t + (n_min if c.role == "minority" else per[c.class_name] - n_min)
        return result

    while True:
        need = needs(test_per_group, per_class)
        short = {n: len(order[n]) for n, k in need.items() if len(order[n]) < k}
        if not short:
            break
        name = next(iter(short))
        if not spec.allow_scale_down:
            raise InputError(
                f"task {spec.name}: group {name} has {short[name]} images after leakage removal, the task needs "
                f"{need[name]} ({test_per_group} test + training) (set allow_scale_down=true to scale it down)",
                parameter="train_size",
            )
        scale = min(short[n] / need[n] for n in short)
        test_per_group = math.floor(test_per_group * scale)
        per_class = {cls: math.floor(q * scale) for cls, q in per_class.items()}
    used = {"train_size": sum(per_class.values()), "test_size": test_per_group * n_groups}
    if used != requested:
        builder.notes["scaled_down"] = {"requested": requested, "used": used}
    labels = _label(spec)
    rows: list[tuple[str, str, int, str, str]] = []
    stats = {}
    for c in [*minority, *majority]:
        y = labels[c.class_name]
        test = order[c.name][:test_per_group]
        n_min = math.floor(p * per_class[c.class_name] + 0.5)
        n_train = n_min if c.role == "minority" else per_class[c.class_name] - n_min
        train, id_val = _hold_out(order[c.name][test_per_group : test_per_group + n_train], spec.id_val_fraction)
        rows += [(i, "test", y, c.class_name, c.name) for i in test]
        rows += [(i, "train", y, c.class_name, c.name) for i in train]
        rows += [(i, "id_val", y, c.class_name, c.name) for i in id_val]
        stats[c.name] = (len(pools[c.name]), len(test) + n_train)
    return builder, pl.DataFrame(rows, schema=EXAMPLE_SCHEMA, orient="row"), stats


# -- distances ---------------------------------------------------------------------------------
def graph_from_sets(class_name: str, names: list[str], sets: Mapping[str, set[str]], threshold: float) -> mg.ClassGraph:
    memberships = Memberships.from_frame(
        pl.DataFrame(
            [(n, i) for n in names for i in sorted(sets[n])],
            schema={"subset": pl.String, "image_id": pl.String},
            orient="row",
        )
    )
    nodes = pl.DataFrame(
        {
            "class": [class_name] * len(names),
            "subset": names,
            "n_images": [len(sets[n]) for n in names],
            "node": list(range(len(names))),
        },
        schema={"class": pl.String, "subset": pl.String, "n_images": pl.Int64, "node": pl.Int64},
    ).join(memberships.subsets.with_row_index("code").select("subset", "code", "class_code"), on="subset", how="left")
    edges = mg.overlap_edges(memberships, nodes, threshold)
    return mg.class_graphs(nodes, edges)[class_name]


def _reference(spec: TaskSpec, cls: str) -> Community | None:
    role = "test" if spec.kind == "domain_generalization" else "minority"
    found = [c for c in spec.communities if c.class_name == cls and c.role == role]
    return found[0] if found else None


def community_distances(
    spec: TaskSpec, data: TaskData, excluded: set[str]
) -> dict[str, tuple[str | None, float | None, str]]:
    """Per community: (reference community, distance to it, status) under ``community_embedding``."""
    result: dict[str, tuple[str | None, float | None, str]] = {}
    for cls in spec.classes:
        reference = _reference(spec, cls)
        mine = [c for c in spec.communities if c.class_name == cls]
        if reference is None:  # a class trained on, never tested on (task_rules): nothing to measure
            result.update({c.name: (None, None, "not_applicable") for c in mine})
            continue
        sets = {c.name: set().union(*(data.member_images(m) or () for m in c.members)) - excluded for c in mine}
        if spec.community_embedding == "community_graph":
            # Released order: sorted train (all variants), sorted test, sorted additional test.
            groups = [("train", "other_train", "majority"), ("test", "minority"), ("val",)]
            names = [n for roles in groups for n in sorted(c.name for c in mine if c.role in roles)]
            names = [n for n in names if sets[n]]
            graph = graph_from_sets(cls, names, sets, spec.edge_threshold)
            emb = em.embed(graph.weights, spec.embedding_dim, spec.embedding)
            index = {n: k for k, n in enumerate(names)}
            coords = {n: (emb.coords[k], int(emb.component[k]), str(emb.component_status[k])) for n, k in index.items()}
        else:
            coords = _member_mean_coords(spec, data, cls, mine, excluded)
        ref = coords.get(reference.name)
        for community in mine:
            if community.name == reference.name:
                continue
            here = coords.get(community.name)
            if ref is None or here is None:
                result[community.name] = (reference.name, None, "no_member_in_graph")
                continue
            status = "different_components" if here[1] != ref[1] or here[1] < 0 else here[2]
            if status == "ok" and ref[2] != "ok":
                status = ref[2]
            value = em.point_distance(here[0], ref[0]) if status == "ok" else None
            result[community.name] = (reference.name, value, status)
    return result


def _member_mean_coords(
    spec: TaskSpec, data: TaskData, cls: str, mine: list[Community], excluded: set[str]
) -> dict[str, tuple[np.ndarray, int, str]]:
    """The paper's merge: a community sits at the size-weighted mean of its members' embeddings."""
    prefix = f"{cls}("
    sets = {name: set(images) - excluded for name, images in data.subset_images.items() if name.startswith(prefix)}
    names = sorted((n for n, s in sets.items() if len(s) >= spec.min_subset_size), key=lambda n: (-len(sets[n]), n))
    graph = graph_from_sets(cls, names, sets, spec.edge_threshold)
    emb = em.embed(graph.weights, spec.embedding_dim, spec.embedding)
    index = {n: k for k, n in enumerate(names)}
    coords: dict[str, tuple[np.ndarray, int, str]] = {}
    for community in mine:
        present = [index[m] for m in community.members if m in index]
        if not present:
            continue
        comps = {int(emb.component[k]) for k in present}
        statuses = {str(emb.component_status[k]) for k in present}
        weights = np.array([len(sets[names[k]]) for k in present], dtype=np.float64)
        mean = (emb.coords[present] * weights[:, None]).sum(axis=0) / weights.sum()
        if len(comps) > 1:
            coords[community.name] = (mean, -1, "different_components")
        else:
            status = "ok" if statuses == {"ok"} else sorted(statuses - {"ok"})[0]
            coords[community.name] = (mean, comps.pop(), status)
    return coords


def build_task(spec: TaskSpec, data: TaskData) -> TaskResult:
    """Examples, per-community statistics and distances, and a one-row summary of one task."""
    builder, examples, stats = (
        build_domain_generalization(spec, data)
        if spec.kind == "domain_generalization"
        else build_subpopulation(spec, data)
    )
    distances = community_distances(spec, data, builder.excluded)
    labels = _label(spec)
    rows = []
    for community in spec.communities:
        reference, value, status = distances.get(community.name, (None, None, "reference"))
        n_available, n_selected = stats.get(community.name, (0, 0))
        split = _SPLIT_OF_ROLE.get(community.role, "train+test")
        rows.append(
            (
                community.name,
                community.class_name,
                labels[community.class_name],
                community.role,
                split,
                list(community.members),
                builder.missing.get(community.name, []),
                n_available,
                n_selected,
                reference,
                value,
                status,
            )
        )
    communities = pl.DataFrame(rows, schema=COMMUNITY_SCHEMA, orient="row")
    task_distance, task_status = None, "not_applicable"
    if spec.kind == "domain_generalization" and spec.distance_class is not None:
        own = [c.name for c in spec.by_role("train") if c.class_name == spec.distance_class]
        found = [distances.get(n, (None, None, "no_member_in_graph")) for n in own]
        bad = [s for _, _, s in found if s != "ok"]
        task_status = bad[0] if bad else "ok"
        # A training set of several communities is at the mean of their distances (paper, released code).
        task_distance = float(np.mean([v for _, v, _ in found])) if not bad and found else None
    counts = examples.group_by("split").len()
    count = dict(zip(counts["split"].to_list(), counts["len"].to_list(), strict=True))
    summary = {
        "task_kind": spec.kind,
        "classes": list(spec.classes),
        "distance_class": spec.distance_class,
        "distance": task_distance,
        "distance_status": task_status,
        "paper_distance": spec.paper_distance,
        "minority_fraction": spec.minority_fraction,
        "n_train": int(count.get("train", 0)),
        "n_id_val": int(count.get("id_val", 0)),
        "n_val": int(count.get("val", 0)),
        "n_test": int(count.get("test", 0)),
        "scaled_down": "scaled_down" in builder.notes,
    }
    notes = dict(builder.notes)
    if builder.missing:
        notes["missing_subsets"] = builder.missing
    return TaskResult(examples, communities, summary, notes)
