"""The novel-subpopulations task: seen ImageNet-1k subclasses as the source, unseen ImageNet-21k ones as the target.

Hendrycks and Dietterich's "subtype robustness", in BREEDS form: each superclass's source domain holds
ImageNet-1k classes (which an ILSVRC-trained or -pretrained model has seen), its target domain holds
ImageNet-21k classes outside the 1k below the same superclass (which it has never seen). As in BREEDS,
``n_subclasses`` is N/2 source + N/2 target subclasses and one legacy ``RandomState(seed)`` is shared
across superclasses in label order. The source is drawn from the 1k classes below the superclass, or
given per superclass (``source_subclasses``: Living-17's source subclasses for ``living17-novel@in21k``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from shiftbench.breeds.tasks import SuperclassSplit, TaskParams, candidates, odd_subclasses, subclasses_of
from shiftbench.errors import InputError
from shiftbench.sources.hierarchy import Hierarchy


def _given_sources(
    hierarchy: Hierarchy, superclass: str, given: Sequence[str], seen: frozenset[str], half: int
) -> list[str]:
    below = hierarchy.descendants(superclass)
    for wnid in given:
        if wnid not in seen:
            raise InputError(f"{wnid} (under {superclass}) is not an ImageNet-1k class", parameter="source_subclasses")
        if wnid not in below:
            raise InputError(
                f"{wnid} is not below superclass {superclass} ({hierarchy.name(superclass)}) in the hierarchy",
                parameter="source_subclasses",
            )
    if len(given) != half:
        raise InputError(
            f"{superclass} lists {len(given)} source subclass(es); N/2 = {half} are needed",
            parameter="source_subclasses",
        )
    return list(given)


def build_novel_task(
    hierarchy: Hierarchy,
    seen: Sequence[str],
    unseen: Sequence[str],
    params: TaskParams,
    given: Mapping[str, Sequence[str]] | None = None,
) -> list[SuperclassSplit]:
    """Superclasses with N/2 seen (source) and N/2 unseen (target) subclasses each, in label order.

    ``seen``: the ImageNet-1k classes; ``unseen``: the list's classes outside the 1k. A superclass
    chosen by level without enough of either is dropped, as in BREEDS; a listed one is an error.
    """
    half = params.n_subclasses // 2
    if half == 0:
        raise InputError(f"a novel task needs N >= 2, got {params.n_subclasses}", parameter="n_subclasses")
    if params.n_subclasses % 2:
        raise odd_subclasses("a novel task", params.n_subclasses)
    seen_set, unseen_set = frozenset(seen), frozenset(unseen)
    kept: list[tuple[str, list[str], list[str]]] = []
    for node in candidates(hierarchy, params):
        sources = subclasses_of(hierarchy, node, seen_set) if given is None else list(given.get(node, ()))
        targets = [wnid for wnid in subclasses_of(hierarchy, node, unseen_set) if wnid != node]
        if len(targets) >= half and (given is not None or len(sources) >= half):
            kept.append((node, sources, targets))
        elif params.superclasses is not None:
            raise InputError(
                f"superclass {node} ({hierarchy.name(node)}) has {len(targets)} ImageNet-21k subclass(es) outside "
                f"the 1k and {len(sources)} inside; N/2 = {half} of each are needed",
                parameter="superclasses",
            )
    if not kept:
        raise InputError(
            f"no superclass at level {params.level} has N/2 = {half} subclasses both inside and outside ImageNet-1k",
            parameter="n_subclasses",
        )
    rng = np.random.RandomState(params.seed)
    result: list[SuperclassSplit] = []
    for label, (node, sources, targets) in enumerate(kept):
        if given is None:
            source = [str(s) for s in rng.choice(sorted(sources), half, replace=False)]
        else:
            source = _given_sources(hierarchy, node, sources, seen_set, half)
        target = [str(s) for s in rng.choice(sorted(targets), half, replace=False)]
        result.append(SuperclassSplit(label, node, tuple(source), tuple(target)))
    return result
