"""Distance-controlled MetaShift domain-generalization tasks, written as task specs.

MetaShift's users pick training contexts by hand to get shifts of different sizes (paper §4.1:
cat vs dog, test on dog(shelf), four dog training sets at increasing distance d). Given two
classes ``A,B`` and a test subset ``B(ctx)``, :func:`generate_dg` picks the training subsets of B
whose distance to the test subset lies at requested quantiles of all candidates' distances, so the
variants' d increase strictly, and writes a task spec the family builds like any other.

The rules of the paper's tasks, kept here:

- **Leakage**: images of two task classes and of ``exclude_images_in`` are dropped; training pools
  never hold a test image (the task builder enforces the same, :mod:`shiftbench.metashift.tasks`).
- **Size**: a candidate must supply its class's share of ``train_size`` after leakage removal, and
  hold at least ``min_subset_size`` images, so no variant needs scaling down.
- **Distance**: the paper's merge (``community_embedding: member_mean``): every subset of B with
  at least ``min_subset_size`` images is embedded once, so a community's distance to the test
  subset does not depend on which other communities a spec lists; the built task measures exactly
  the d chosen here.

Class A trains on its largest subsets other than the test context (fixed across variants) and is
tested on ``A(ctx)``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl
import yaml
from pydantic import BaseModel, ConfigDict, field_validator

from shiftbench.errors import InputError
from shiftbench.metashift import build
from shiftbench.metashift.specs import Community, TaskSpec, parse_specs
from shiftbench.metashift.subsets import parse_subset_name
from shiftbench.metashift.tasks import TaskData, community_distances, excluded_images, split_quota
from shiftbench.sources.scene_codes import CodedObjects
from shiftbench.store import check_benchmark_name

MAX_A_MEMBERS = 12  # class A's training community: its largest subsets, at most this many


class DgRequest(BaseModel):
    """What ``shiftbench generate metashift-dg`` was asked for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    classes: tuple[str, str]
    test: str
    n: int = 4
    quantiles: tuple[float, ...] | None = None
    name: str | None = None
    train_size: int = 400
    min_subset_size: int = 25
    edge_threshold: float = 0.1
    embedding: str = "paper"
    embedding_dim: int = 5
    context_kinds: tuple[str, ...] = ("object", "general")
    exclude_images_in: tuple[str, ...] = ()
    seed: int = 0

    @field_validator("n")
    @classmethod
    def _n(cls, n: int) -> int:
        if n < 1:
            raise InputError(f"must be at least 1, got {n}", parameter="--n")
        return n

    @field_validator("quantiles")
    @classmethod
    def _quantiles(cls, values: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if values is None:
            return None
        if any(not 0.0 <= q <= 1.0 for q in values) or any(b <= a for a, b in itertools.pairwise(values)):
            raise InputError(f"must increase strictly within [0, 1], got {list(values)}", parameter="--quantiles")
        return values

    def wanted_quantiles(self) -> tuple[float, ...]:
        """The requested quantiles, or ``n`` evenly spaced ones ((k + 1) / (n + 1))."""
        if self.quantiles is not None:
            if len(self.quantiles) != self.n:
                raise InputError(f"{len(self.quantiles)} quantiles for --n {self.n}", parameter="--quantiles")
            return self.quantiles
        return tuple(round((k + 1) / (self.n + 1), 6) for k in range(self.n))


@dataclass(frozen=True)
class Choice:
    subset: str
    quantile: float
    distance: float
    n_pool: int  # training images available after leakage removal


@dataclass(frozen=True)
class GeneratedTask:
    name: str
    text: str  # the YAML spec file
    choices: tuple[Choice, ...]
    n_candidates: int
    spec: dict[str, object]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def _task_spec(request: DgRequest, name: str, communities: Sequence[Community]) -> TaskSpec:
    a, b = request.classes
    return TaskSpec(
        name=name,
        base=name,
        kind="domain_generalization",
        classes=(a, b),
        communities=tuple(communities),
        exclude_images_in=request.exclude_images_in,
        distance_class=b,
        context_kinds=request.context_kinds,
        community_embedding="member_mean",
        embedding=request.embedding,
        edge_threshold=request.edge_threshold,
        embedding_dim=request.embedding_dim,
        min_subset_size=request.min_subset_size,
        seed=request.seed,
        train_size=request.train_size,
    )


def _subsets_of(data: TaskData, cls: str) -> list[str]:
    return sorted(s for s in data.subset_images if s.startswith(f"{cls}("))


def generate_dg(
    objects: CodedObjects | pl.DataFrame,
    images: pl.DataFrame,
    general_contexts: Mapping[str, Sequence[str]],
    request: DgRequest,
    source: str = "",
) -> GeneratedTask:
    """Pick B's training subsets at the requested distance quantiles and write the task spec."""
    a, b = request.classes
    if a == b:
        raise InputError("needs two different classes", parameter="--classes")
    try:
        test_class, context = parse_subset_name(request.test)
    except ValueError as exc:
        raise InputError(str(exc), parameter="--test") from None
    if test_class != b:
        raise InputError(f"the test subset must be of the second class {b!r}, got {request.test}", parameter="--test")
    name = check_benchmark_name(request.name or f"{_slug(a)}-{_slug(b)}-{_slug(context)}-dg", "--name")
    a_test = f"{a}({context})"
    tests = [Community(name=request.test, class_name=b, role="test", members=(request.test,))]
    tests.append(Community(name=a_test, class_name=a, role="test", members=(a_test,)))
    placeholders = [
        Community(name=f"{t.class_name}(*)", class_name=t.class_name, role="train", members=t.members) for t in tests
    ]
    probe = _task_spec(request, name, [*tests, *placeholders])
    data = build.task_data(objects, images, probe, general_contexts)
    for subset in (request.test, a_test):
        if subset not in data.subset_images:
            close = _subsets_of(data, parse_subset_name(subset)[0])[:8]
            raise InputError(
                f"no subset {subset} in these annotations (some there: {', '.join(close)})", parameter="--test"
            )
    excluded = excluded_images(probe, data)
    test_images = (data.subset_images[request.test] | data.subset_images[a_test]) - excluded
    need_a, need_b = split_quota(request.train_size, 2)

    def pool(subset: str) -> set[str]:
        return set(data.subset_images[subset]) - excluded - test_images

    # Class A: its largest subsets other than the test context, until they hold its share.
    a_members: list[str] = []
    a_pool: set[str] = set()
    for subset in sorted(_subsets_of(data, a), key=lambda s: (-len(pool(s)), s)):
        if subset == a_test or len(a_members) >= MAX_A_MEMBERS or len(a_pool) >= need_a:
            continue
        a_members.append(subset)
        a_pool |= pool(subset)
    if len(a_pool) < need_a:
        raise InputError(
            f"class {a} has only {len(a_pool)} training images outside {a_test} after leakage "
            f"removal, the task needs {need_a} (use a smaller --train-size)",
            parameter="--train-size",
        )
    a_train = Community(name=f"{a}(train)", class_name=a, role="train", members=tuple(a_members))

    candidates = [
        s
        for s in _subsets_of(data, b)
        if s != request.test
        and len(pool(s)) >= max(need_b, 1)
        and len(data.subset_images[s]) >= request.min_subset_size
    ]
    if not candidates:
        raise InputError(
            f"no subset of {b} holds {need_b} training images after leakage removal (use a smaller --train-size)",
            parameter="--train-size",
        )
    others = [Community(name=s, class_name=b, role="other_train", members=(s,)) for s in candidates]
    placeholder = Community(name=f"{b}(*)", class_name=b, role="train", members=(candidates[0],))
    measured = community_distances(_task_spec(request, name, [*tests, a_train, placeholder, *others]), data, excluded)
    ranked = sorted(
        ((float(d), s) for s in candidates if (d := measured[s][1]) is not None and measured[s][2] == "ok"),
    )
    quantiles = request.wanted_quantiles()
    if len(ranked) < request.n:
        raise InputError(
            f"only {len(ranked)} subsets of {b} hold {need_b} training images after leakage removal and have a "
            f"distance to {request.test}; ask for fewer variants (--n) or a smaller --train-size",
            parameter="--n",
        )
    choices: list[Choice] = []
    index = -1
    for k, q in enumerate(quantiles):
        target = max(round(q * (len(ranked) - 1)), index + 1)
        while target < len(ranked) and choices and ranked[target][0] <= choices[-1].distance:
            target += 1  # equal distances: d must increase strictly
        if target > len(ranked) - (len(quantiles) - k):  # leave room for the remaining quantiles
            target = len(ranked) - (len(quantiles) - k)
        if target <= index or (choices and ranked[target][0] <= choices[-1].distance):
            raise InputError(
                f"the {len(ranked)} candidates of {b} do not give {request.n} strictly increasing "
                "distances at these quantiles",
                parameter="--quantiles",
            )
        d, subset = ranked[target]
        choices.append(Choice(subset, q, d, len(pool(subset))))
        index = target

    def block(communities: Sequence[Community]) -> dict[str, dict[str, list[str]]]:
        result: dict[str, dict[str, list[str]]] = {}
        for community in communities:
            result.setdefault(community.class_name, {})[community.name] = list(community.members)
        return result

    variants = {_slug(parse_subset_name(c.subset)[1]): {"train": {b: {c.subset: [c.subset]}}} for c in choices}
    entry: dict[str, object] = {
        "kind": "domain_generalization",
        "classes": [a, b],
        "context_kinds": list(request.context_kinds),
        **({"exclude_images_in": list(request.exclude_images_in)} if request.exclude_images_in else {}),
        "train_size": request.train_size,
        "distance_class": b,
        "community_embedding": "member_mean",
        "embedding": request.embedding,
        "edge_threshold": request.edge_threshold,
        "embedding_dim": request.embedding_dim,
        "min_subset_size": request.min_subset_size,
        "seed": request.seed,
        "test": block(tests),
        "train": block([a_train]),
        "variants": variants,
    }
    document: dict[str, object] = {"family": "metashift", "tasks": {name: entry}}
    lines = [
        f"# Generated by `shiftbench generate metashift-dg --classes {a},{b} --test '{request.test}' --n {request.n}`",
        f"# on {source or 'the configured annotations'}: {len(ranked)} candidate training subsets of {b} "
        f"(>= {need_b} images after leakage removal); the variants sit at these distance quantiles:",
        *(
            f"#   {_slug(parse_subset_name(c.subset)[1])}: quantile {c.quantile:g}, d = {c.distance:.4f}, "
            f"{c.n_pool} training images available"
            for c in choices
        ),
        "# Build it: SHIFTBENCH_METASHIFT_SPECS=<this file> shiftbench build metashift --benchmark "
        f"{name}-{_slug(parse_subset_name(choices[0].subset)[1])}",
    ]
    text = "\n".join(lines) + "\n" + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=120)
    parse_specs(text, "<generated>")  # the spec the family will read: validated before anyone sees it
    return GeneratedTask(name, text, tuple(choices), len(ranked), document)
