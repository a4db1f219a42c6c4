"""BREEDS task builder with the robustness library's semantics, so published splits reproduce.

Given a calibrated hierarchy and the dataset classes:

- superclasses are the nodes at a level (longest path from the root) of the hierarchy
  restricted to ancestors of the dataset classes, optionally only those below ``ancestor``
  (itself included), sorted by id; those with fewer than N subclasses are dropped and labels
  are positions in the sorted list;
- one legacy ``numpy.random.RandomState(seed)`` is shared across superclasses in label order;
- split ``none`` samples N subclasses; ``rand``, ``good`` and ``bad`` split N/2 + N/2 subclasses
  into source and target domains (see :func:`split_superclass`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from shiftbench.errors import InputError
from shiftbench.sources.hierarchy import Hierarchy

Split = Literal["rand", "good", "bad", "none"]
SPLITS: tuple[str, ...] = ("rand", "good", "bad", "none")


@dataclass(frozen=True)
class TaskParams:
    level: int | None
    n_subclasses: int
    split: str = "rand"
    seed: int = 2
    ancestor: str | None = None
    superclasses: tuple[str, ...] | None = None  # these, sorted by id, instead of the nodes at ``level``


@dataclass(frozen=True)
class SuperclassSplit:
    label: int
    superclass: str
    source: tuple[str, ...]  # domain "all" when split is "none"
    target: tuple[str, ...]


def candidates(hierarchy: Hierarchy, params: TaskParams) -> list[str]:
    """The superclass candidates: the nodes at ``level`` (below ``ancestor``), or the listed ones."""
    if params.superclasses is not None:
        unknown = [node for node in params.superclasses if node not in hierarchy.graph]
        if unknown:
            raise InputError(
                f"{len(unknown)} superclass(es) not in the hierarchy, e.g. {', '.join(unknown[:3])}",
                parameter="superclasses",
            )
        return sorted(params.superclasses)
    levels = hierarchy.levels
    nodes = sorted(node for node, level in levels.items() if level == params.level)
    if params.ancestor is not None:
        if params.ancestor not in hierarchy.graph:
            raise InputError(f"unknown node {params.ancestor}", parameter="ancestor")
        below = hierarchy.descendants(params.ancestor) | {params.ancestor}
        nodes = [node for node in nodes if node in below]
    if not nodes:
        where = f" below {params.ancestor}" if params.ancestor else ""
        deepest = max(levels.values(), default=0)
        raise InputError(f"no node at level {params.level}{where} (levels run from 0 to {deepest})", parameter="level")
    return nodes


def subclasses_of(hierarchy: Hierarchy, node: str, classes: frozenset[str]) -> list[str]:
    """The dataset classes a superclass holds: those at or below it, itself only when it is a leaf class.

    ImageNet-1k's classes are leaves; ImageNet-21k also labels inner synsets ("dog" has images of its
    own): a superclass's subpopulations are then the classes strictly below it.
    """
    found = hierarchy.reachable_classes(node, classes)
    if len(found) > 1 and node in classes:
        found.remove(node)
    return found


def superclasses(hierarchy: Hierarchy, classes: frozenset[str], params: TaskParams) -> list[tuple[str, list[str]]]:
    """Sorted (superclass, sorted subclasses) pairs that have at least N subclasses."""
    chosen = candidates(hierarchy, params)
    with_subclasses = [(node, subclasses_of(hierarchy, node, classes)) for node in chosen]
    kept = [(node, subs) for node, subs in with_subclasses if len(subs) >= params.n_subclasses]
    if params.superclasses is not None and len(kept) < len(with_subclasses):
        node, subs = next((n, s) for n, s in with_subclasses if len(s) < params.n_subclasses)
        raise InputError(
            f"superclass {node} ({hierarchy.name(node)}) has {len(subs)} subclass(es), "
            f"fewer than N={params.n_subclasses}",
            parameter="superclasses",
        )
    if not kept:
        largest = max(len(subs) for _, subs in with_subclasses)
        raise InputError(
            f"N={params.n_subclasses} exceeds the subclass count of every superclass at level "
            f"{params.level} (largest: {largest})",
            parameter="n_subclasses",
        )
    return kept


def _ordered_children(hierarchy: Hierarchy, superclass: str, classes: frozenset[str]) -> list[list[str]]:
    """Subclass groups under the first node below ``superclass`` that branches, largest first."""
    node = superclass
    # Down a chain of single children, but not past one that is a class itself (ImageNet-21k's inner classes).
    while len(children := hierarchy.children(node)) == 1 and children[0] not in classes:
        node = children[0]
    groups = [hierarchy.reachable_classes(child, classes) for child in children]
    # sorted() is stable, so ties keep id order.
    return sorted(groups, key=len, reverse=True)


def _fill_sides(groups: list[list[str]], half: int, strategy: str) -> tuple[list[str], list[str]]:
    source: list[str] = []
    target: list[str] = []
    if strategy == "bad":
        spare: list[str] = []
        for group in groups:
            if len(source) <= len(target) and len(source) < half:
                room = half - len(source)
                source.extend(group[:room])
                spare.extend(group[room:])
            elif len(target) < half:
                room = half - len(target)
                target.extend(group[:room])
                spare.extend(group[room:])
        for side in (source, target):
            while len(side) < half and spare:
                side.append(spare.pop(0))
    else:  # "good"
        for group in groups:
            if len(group) == 1:
                if len(source) < half:
                    source.extend(group)
                elif len(target) < half:
                    target.extend(group)
            else:
                n_source = min(len(group) // 2, half - len(source))
                source.extend(group[:n_source])
                n_target = max(0, half - len(target))
                target.extend(group[n_source : n_source + n_target])
    return source, target


def split_superclass(
    hierarchy: Hierarchy,
    superclass: str,
    subclasses: Sequence[str],
    classes: frozenset[str],
    n_subclasses: int,
    split: str,
    rng: np.random.RandomState,
) -> tuple[list[str], list[str]]:
    if split == "none":
        chosen = rng.choice(list(subclasses), n_subclasses, replace=False)
        return [str(s) for s in chosen], []
    half = n_subclasses // 2
    if half == 0:
        raise InputError(f"split {split!r} needs N >= 2, got {n_subclasses}", parameter="n_subclasses")
    if n_subclasses % 2:
        raise odd_subclasses(f"split {split!r}", n_subclasses)
    groups = _ordered_children(hierarchy, superclass, classes)
    if split == "rand":
        pool = sorted(s for group in groups for s in group)
        drawn = [str(s) for s in rng.choice(pool, 2 * half, replace=False)]
        return drawn[:half], drawn[half:]
    source, target = _fill_sides(groups, half, split)
    if len(source) < half or len(target) < half:
        raise InputError(
            f"split {split!r} cannot give superclass {superclass} {half} source and {half} target "
            f"subclasses (got {len(source)} and {len(target)})",
            parameter="n_subclasses",
        )
    return source, target


def odd_subclasses(what: str, n_subclasses: int, source: str | None = None) -> InputError:
    """An odd N where half the subclasses go to the source and half to the target: N/2 rounded down would publish
    N - 1 subclasses while the spec records N."""
    where = f" (in {source})" if source else ""
    message = f"must be even: {what} puts N/2 subclasses in the source and N/2 in the target, got {n_subclasses}"
    return InputError(message + where, parameter="n_subclasses")


def build_task(hierarchy: Hierarchy, dataset_classes: Sequence[str], params: TaskParams) -> list[SuperclassSplit]:
    """The superclasses of a BREEDS task with their source/target subclasses, in label order."""
    if params.split not in SPLITS:
        raise InputError(f"unknown split {params.split!r}; expected one of {', '.join(SPLITS)}", parameter="split")
    if params.n_subclasses < 1:
        raise InputError("must be at least 1", parameter="n_subclasses")
    classes = frozenset(dataset_classes)
    restricted = hierarchy.restrict_to_ancestors(classes)
    selected = superclasses(restricted, classes, params)
    rng = np.random.RandomState(params.seed)
    result: list[SuperclassSplit] = []
    for label, (superclass, subclasses) in enumerate(selected):
        source, target = split_superclass(
            restricted, superclass, subclasses, classes, params.n_subclasses, params.split, rng
        )
        result.append(SuperclassSplit(label, superclass, tuple(source), tuple(target)))
    return result
