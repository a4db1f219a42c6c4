"""``shiftbench generate metashift-dg``: distance-controlled MetaShift domain-generalization tasks, as task specs.

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
  at least ``min_subset_size`` images is embedded once, in the class's meta-graph of subsets cut at the
  paper's threshold (:data:`~shiftbench.metashift.metagraph.SUBSET_GRAPH_EDGE_THRESHOLD`), so a community's
  distance to the test subset does not depend on which other communities a spec lists; the built task measures
  exactly the d chosen here.

Class A trains on its largest subsets other than the test context (fixed across variants) and is
tested on ``A(ctx)``. :func:`generate_task` reads the scenes the request's contexts need (built first if not
cached); :func:`generate_dg` chooses from given scenes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl
import yaml
from pydantic import BaseModel, ConfigDict, field_validator

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.families import benchmark_builds
from shiftbench.metashift import build
from shiftbench.metashift.family import METASHIFT
from shiftbench.metashift.metagraph import SUBSET_GRAPH_EDGE_THRESHOLD
from shiftbench.metashift.scenes import RELEASED, SCENES, read_scenes
from shiftbench.metashift.settings import MetaShiftSettings
from shiftbench.metashift.specs import Community, TaskSpec, load_specs, parse_specs
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
        edge_threshold=SUBSET_GRAPH_EDGE_THRESHOLD,
        embedding_dim=request.embedding_dim,
        min_subset_size=request.min_subset_size,
        seed=request.seed,
        train_size=request.train_size,
    )


def _subsets_of(data: TaskData, cls: str) -> list[str]:
    return sorted(s for s in data.subset_images if s.startswith(f"{cls}("))


def _subsets_there(data: TaskData, subset: str) -> str:
    """What there is instead of ``subset``: its class's subsets (the first 8), or that it has none."""
    cls = parse_subset_name(subset)[0]
    there = _subsets_of(data, cls)
    if not there:
        return f"{cls} has no subset in them"
    more = f", and {len(there) - 8} more" if len(there) > 8 else ""
    return f"{cls}'s subsets: {', '.join(there[:8])}{more}"


@dataclass(frozen=True)
class _Pools:
    """The probe's annotations and the images no training pool may hold (leakage)."""

    data: TaskData
    excluded: set[str]
    test_images: frozenset[str]

    def pool(self, subset: str) -> set[str]:
        return set(self.data.subset_images[subset]) - self.excluded - self.test_images


def _check_request(request: DgRequest) -> tuple[str, str]:
    """The task's name and test context, or the error the CLI reports for a bad request."""
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
    return name, context


def _test_communities(request: DgRequest, a_test: str) -> list[Community]:
    a, b = request.classes
    return [
        Community(name=request.test, class_name=b, role="test", members=(request.test,)),
        Community(name=a_test, class_name=a, role="test", members=(a_test,)),
    ]


def _probe(
    objects: CodedObjects | pl.DataFrame,
    images: pl.DataFrame,
    general_contexts: Mapping[str, Sequence[str]],
    request: DgRequest,
    name: str,
    tests: Sequence[Community],
) -> _Pools:
    """Annotations under a spec holding only the tests, so leakage is known before any choice."""
    placeholders = [
        Community(name=f"{t.class_name}(*)", class_name=t.class_name, role="train", members=t.members) for t in tests
    ]
    probe = _task_spec(request, name, [*tests, *placeholders])
    data = build.task_data(objects, images, probe, general_contexts)
    for subset in (t.name for t in tests):
        if subset not in data.subset_images:
            there = _subsets_there(data, subset)
            raise InputError(f"no subset {subset} in these annotations ({there})", parameter="--test")
    excluded = excluded_images(probe, data)
    test_images = (data.subset_images[tests[0].name] | data.subset_images[tests[1].name]) - excluded
    return _Pools(data, excluded, test_images)


def _a_train(pools: _Pools, a: str, a_test: str, need_a: int) -> Community:
    """Class A: its largest subsets other than the test context, until they hold its share."""
    a_members: list[str] = []
    a_pool: set[str] = set()
    for subset in sorted(_subsets_of(pools.data, a), key=lambda s: (-len(pools.pool(s)), s)):
        if subset == a_test or len(a_members) >= MAX_A_MEMBERS or len(a_pool) >= need_a:
            continue
        a_members.append(subset)
        a_pool |= pools.pool(subset)
    if len(a_pool) < need_a:
        raise InputError(
            f"class {a} has only {len(a_pool)} training images outside {a_test} after leakage "
            f"removal, the task needs {need_a} (use a smaller --train-size)",
            parameter="--train-size",
        )
    return Community(name=f"{a}(train)", class_name=a, role="train", members=tuple(a_members))


def _ranked_candidates(
    request: DgRequest, name: str, pools: _Pools, communities: Sequence[Community], need_b: int
) -> list[tuple[float, str]]:
    """B's subsets big enough to train on, by their distance to the test subset (nearest first)."""
    b = request.classes[1]
    candidates = [
        s
        for s in _subsets_of(pools.data, b)
        if s != request.test
        and len(pools.pool(s)) >= max(need_b, 1)
        and len(pools.data.subset_images[s]) >= request.min_subset_size
    ]
    if not candidates:
        raise InputError(
            f"no subset of {b} holds {need_b} training images after leakage removal (use a smaller --train-size)",
            parameter="--train-size",
        )
    others = [Community(name=s, class_name=b, role="other_train", members=(s,)) for s in candidates]
    placeholder = Community(name=f"{b}(*)", class_name=b, role="train", members=(candidates[0],))
    spec = _task_spec(request, name, [*communities, placeholder, *others])
    measured = community_distances(spec, pools.data, pools.excluded)
    return sorted(
        ((float(d), s) for s in candidates if (d := measured[s][1]) is not None and measured[s][2] == "ok"),
    )


def _require_variants(request: DgRequest, ranked: Sequence[tuple[float, str]], need_b: int) -> None:
    if len(ranked) < request.n:
        raise InputError(
            f"only {len(ranked)} subsets of {request.classes[1]} hold {need_b} training images after leakage "
            f"removal and have a distance to {request.test}; ask for fewer variants (--n) or a smaller --train-size",
            parameter="--n",
        )


def _choose(
    request: DgRequest, quantiles: Sequence[float], ranked: Sequence[tuple[float, str]], pools: _Pools
) -> list[Choice]:
    """One candidate per quantile, with strictly increasing distances."""
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
                f"the {len(ranked)} candidates of {request.classes[1]} do not give {request.n} strictly increasing "
                "distances at these quantiles",
                parameter="--quantiles",
            )
        d, subset = ranked[target]
        choices.append(Choice(subset, q, d, len(pools.pool(subset))))
        index = target
    return choices


def _block(communities: Sequence[Community]) -> dict[str, dict[str, list[str]]]:
    result: dict[str, dict[str, list[str]]] = {}
    for community in communities:
        result.setdefault(community.class_name, {})[community.name] = list(community.members)
    return result


def _document(
    request: DgRequest, name: str, tests: Sequence[Community], a_train: Community, choices: Sequence[Choice]
) -> dict[str, object]:
    a, b = request.classes
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
        "edge_threshold": SUBSET_GRAPH_EDGE_THRESHOLD,
        "embedding_dim": request.embedding_dim,
        "min_subset_size": request.min_subset_size,
        "seed": request.seed,
        "test": _block(tests),
        "train": _block([a_train]),
        "variants": variants,
    }
    return {"family": "metashift", "tasks": {name: entry}}


def _header(request: DgRequest, name: str, source: str, n_ranked: int, need_b: int, choices: Sequence[Choice]) -> str:
    """The comment on top of the spec: how it was generated and where each variant sits."""
    a, b = request.classes
    lines = [
        f"# Generated by `shiftbench generate metashift-dg --classes {a},{b} --test '{request.test}' --n {request.n}`",
        f"# on {source or 'the configured annotations'}: {n_ranked} candidate training subsets of {b} "
        f"(>= {need_b} images after leakage removal); the variants sit at these distance quantiles:",
        *(
            f"#   {_slug(parse_subset_name(c.subset)[1])}: quantile {c.quantile:g}, d = {c.distance:.4f}, "
            f"{c.n_pool} training images available"
            for c in choices
        ),
        "# Build it: SHIFTBENCH_METASHIFT_SPECS=<this file> shiftbench build metashift --benchmark "
        f"{name}-{_slug(parse_subset_name(choices[0].subset)[1])}",
    ]
    return "\n".join(lines) + "\n"


def generate_dg(
    objects: CodedObjects | pl.DataFrame,
    images: pl.DataFrame,
    general_contexts: Mapping[str, Sequence[str]],
    request: DgRequest,
    source: str = "",
) -> GeneratedTask:
    """Pick B's training subsets at the requested distance quantiles and write the task spec."""
    name, context = _check_request(request)
    a = request.classes[0]
    a_test = f"{a}({context})"
    tests = _test_communities(request, a_test)
    pools = _probe(objects, images, general_contexts, request, name, tests)
    need_a, need_b = split_quota(request.train_size, 2)
    a_train = _a_train(pools, a, a_test, need_a)
    ranked = _ranked_candidates(request, name, pools, [*tests, a_train], need_b)
    quantiles = request.wanted_quantiles()
    _require_variants(request, ranked, need_b)
    choices = _choose(request, quantiles, ranked, pools)
    document = _document(request, name, tests, a_train, choices)
    text = _header(request, name, source, len(ranked), need_b, choices)
    text += yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=120)
    parse_specs(text, "<generated>")  # the spec the family will read: validated before anyone sees it
    return GeneratedTask(name, text, tuple(choices), len(ranked), document)


def generate_task(settings: Settings, request: DgRequest) -> GeneratedTask:
    """A distance-controlled MetaShift domain-generalization task, from the scenes the request's contexts need:
    the released attribute annotations when only attributes are asked for and no GQA scene graphs are set, else
    the scene graphs (built first if not cached)."""
    own = settings.of(MetaShiftSettings)
    released = request.context_kinds == ("attribute",) and not own.gqa_scene_graphs
    scenes_input = RELEASED if released else SCENES
    artifact = benchmark_builds.build_inputs(settings, METASHIFT, [scenes_input.name])[scenes_input.name]
    objects, images = read_scenes(artifact)
    source = f"{artifact.meta['dataset']} ({artifact.meta['kind']}, {artifact.fingerprint[:16]})"
    return generate_dg(objects, images, load_specs(own.metashift_specs).general_contexts, request, source)
