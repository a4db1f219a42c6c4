"""MetaShift specs as data (``shiftbench/specs/metashift.yaml``): collections and shift tasks.

A collection spec says how candidate subsets, meta-graphs, communities and embeddings are
built; a task spec lists communities (named unions of candidate subsets) per class and role.
Overrides (CLI ``--set``, Dagster config) make a new validated spec and are recorded in params.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo, field_validator, model_validator

from shiftbench.config.located_yaml import line_of
from shiftbench.errors import InputError, shown
from shiftbench.metashift.embedding import check_embedding
from shiftbench.metashift.metagraph import (
    COMMUNITY_GRAPH_EDGE_THRESHOLD,
    COMMUNITY_METHODS,
    SUBSET_GRAPH_EDGE_THRESHOLD,
    check_edge_threshold,
)
from shiftbench.metashift.subsets import check_context_kinds
from shiftbench.metashift.task_rules import check_communities, split_key
from shiftbench.specs.naming import tagged
from shiftbench.specs.spec_model import (
    Spec,
    as_float,
    at_least,
    build,
    fraction,
    merge_named,
    source_of,
    spec_document,
    spec_texts,
)

TASK_KINDS = ("domain_generalization", "subpopulation", "conflicts")
COMMUNITY_EMBEDDINGS = ("community_graph", "member_mean")
# An overlap coefficient in [0, 1] (checked with the spec: check_edge_threshold); its defaults are in metagraph.py.
EdgeThreshold = Annotated[float, BeforeValidator(as_float)]


COLLECTION_PARAMS = (
    "context_kinds",
    "min_subset_size",
    "min_subsets_per_class",
    "edge_threshold",
    "embedding",
    "embedding_dim",
    "community_method",
    "seed",
    "group_classes",
    "classes",
    "classes_file",
    "max_contexts_per_class",
    "store_distances",
)


class CollectionSpec(Spec):
    OVERRIDABLE: ClassVar[tuple[str, ...]] = COLLECTION_PARAMS

    context_kinds: tuple[str, ...]
    min_subset_size: int = 25
    min_subsets_per_class: int = 6
    edge_threshold: EdgeThreshold = SUBSET_GRAPH_EDGE_THRESHOLD
    embedding: str = "paper"
    embedding_dim: int = 5
    community_method: str = "louvain"
    seed: int = 0
    group_classes: bool = False
    # The declared scope (shiftbench.metashift.scope): the classes built, and a cap on each class's contexts.
    classes: tuple[str, ...] | None = None
    classes_file: str | None = None  # one class per line; relative to the spec file that names it
    max_contexts_per_class: int | None = None
    # Materialize every pair's distance as a table (small collections only); by default distances are a view.
    store_distances: bool = False

    _kinds = field_validator("context_kinds", mode="before")(lambda value: _as_kinds(value))
    _classes = field_validator("classes", mode="before")(lambda value: _as_classes(value))

    @model_validator(mode="after")
    def _valid(self, info: ValidationInfo) -> CollectionSpec:
        return validate_collection(self, source_of(info))

    def params(self) -> dict[str, Any]:
        """The recorded parameters; the scope's class list is recorded resolved (shiftbench.metashift.scope)."""
        values = {name: getattr(self, name) for name in COLLECTION_PARAMS if name not in ("classes", "classes_file")}
        values["context_kinds"] = list(self.context_kinds)
        return values


def _as_kinds(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # --set context_kinds=object,general
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        raise InputError(f"must be a list, got {shown(value)}", parameter="context_kinds")
    return check_context_kinds(list(value))


def _as_classes(value: Any) -> Any:
    """``--set classes=cat,dog`` or a YAML list; ``null`` is every class. A class named twice is refused, as a
    classes_file refuses it (shiftbench.metashift.scope.read_class_list)."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if value is not None and (
        not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) for v in value)
    ):
        raise InputError(f"must be a non-empty list of class names, got {shown(value)}", parameter="classes")
    if value is None:
        return None
    twice = next((name for i, name in enumerate(value) if name in value[:i]), None)
    if twice is not None:
        raise InputError(f"class {shown(twice)} is listed twice", parameter="classes")
    return tuple(value)


def validate_collection(spec: CollectionSpec, source: str) -> CollectionSpec:
    at_least(spec.min_subset_size, "min_subset_size", 1, source)
    at_least(spec.min_subsets_per_class, "min_subsets_per_class", 1, source)
    if spec.max_contexts_per_class is not None:
        at_least(spec.max_contexts_per_class, "max_contexts_per_class", spec.min_subsets_per_class, source)
    if spec.classes is not None and spec.classes_file is not None:
        raise InputError(f"give classes or classes_file, not both (in {source})", parameter="classes_file")
    if spec.classes_file is not None and not Path(spec.classes_file).is_absolute() and Path(source).is_file():
        # a file named by a spec file is found next to it, wherever the spec file is read from
        spec = spec.model_copy(update={"classes_file": str(Path(source).parent / spec.classes_file)})
    check_edge_threshold(spec.edge_threshold)
    check_embedding(spec.embedding, spec.embedding_dim)
    if spec.community_method not in COMMUNITY_METHODS:
        raise InputError(
            f"must be one of {', '.join(COMMUNITY_METHODS)}, got {spec.community_method!r} (in {source})",
            parameter="community_method",
        )
    at_least(spec.seed, "seed", 0, source)
    return spec


class Community(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: str
    class_name: str
    role: str
    members: tuple[str, ...]


TASK_PARAMS = (
    "context_kinds",
    "community_embedding",
    "embedding",
    "edge_threshold",
    "embedding_dim",
    "min_subset_size",
    "seed",
    "id_val_fraction",
    "allow_scale_down",
    "train_size",
    "test_size",
    "minority_fraction",
)
# Kind conflicts (paper Section 4.3, Appendix B.3): the task selects its own subsets; only these parameters are its
# own (the other kinds' parameters, merged from task_defaults, are neither used nor recorded for it).
CONFLICTS_PARAMS: tuple[str, ...] = ("context_kinds", "min_subset_size", "seed", "allow_scale_down")
CONFLICTS_PARAMS += ("train_subsets", "ood_subsets", "images_per_subset", "id_eval_share", "ood_images_per_subset")
_CONFLICTS_ONLY = tuple(p for p in CONFLICTS_PARAMS if p not in TASK_PARAMS)


class TaskSpec(Spec):
    OVERRIDABLE: ClassVar[tuple[str, ...]] = TASK_PARAMS + _CONFLICTS_ONLY

    base: str
    kind: str
    classes: tuple[str, ...]
    communities: tuple[Community, ...]
    exclude_images_in: tuple[str, ...] = ()
    distance_class: str | None = None
    paper_distance: float | None = None
    context_kinds: tuple[str, ...] = ("object", "general")
    community_embedding: str = "community_graph"
    embedding: str = "networkx"
    edge_threshold: EdgeThreshold = COMMUNITY_GRAPH_EDGE_THRESHOLD
    embedding_dim: int = 5
    min_subset_size: int = 25
    seed: int = 0
    id_val_fraction: float = 0.0
    allow_scale_down: bool = False
    train_size: int = 400
    test_size: int | None = None
    minority_fraction: float | None = None
    # kind conflicts only (null elsewhere): subsets per role, images per training subset, in-domain evaluation share
    train_subsets: int | None = None
    ood_subsets: int | None = None
    images_per_subset: int | None = None
    id_eval_share: float | None = None
    ood_images_per_subset: int | None = None  # null: as many as a training subset's in-domain evaluation images

    _kinds = field_validator("context_kinds", mode="before")(lambda value: _as_kinds(value))
    _floats = field_validator("id_val_fraction", "minority_fraction", "paper_distance", "id_eval_share", mode="before")(
        lambda value: as_float(value)
    )

    @model_validator(mode="after")
    def _valid(self, info: ValidationInfo) -> TaskSpec:
        return validate_task(self, source_of(info))

    def params(self) -> dict[str, Any]:
        """The recorded parameters: those of the spec's kind only (the other kinds' records are as they were before
        kind conflicts existed, so their version ids did not change)."""
        values = {name: getattr(self, name) for name in (CONFLICTS_PARAMS if self.kind == "conflicts" else TASK_PARAMS)}
        values["context_kinds"] = list(self.context_kinds)
        if self.kind == "conflicts":
            values.update(kind=self.kind, task=self.base, classes=list(self.classes))
            values["exclude_images_in"] = list(self.exclude_images_in)
            return values
        values.update(
            kind=self.kind,
            task=self.base,
            classes=list(self.classes),
            exclude_images_in=list(self.exclude_images_in),
            distance_class=self.distance_class,
            paper_distance=self.paper_distance,
            communities={
                c.name: {"class": c.class_name, "role": c.role, "members": list(c.members)} for c in self.communities
            },
        )
        return values

    def with_overrides(self, overrides: Mapping[str, Any]) -> Self:
        """As :meth:`Spec.with_overrides`, refusing a parameter that the spec's kind does not use."""
        own = CONFLICTS_PARAMS if self.kind == "conflicts" else TASK_PARAMS
        unknown = sorted(set(overrides) - set(own))
        if unknown:
            raise InputError(
                f"not a parameter of a task of kind {self.kind}; expected one of {', '.join(own)}", parameter=unknown[0]
            )
        return super().with_overrides(overrides)

    def by_role(self, *roles: str) -> list[Community]:
        return [c for c in self.communities if c.role in roles]


def validate_task(spec: TaskSpec, source: str) -> TaskSpec:
    where = f"task {spec.name} ({source})"
    if spec.kind not in TASK_KINDS:
        raise InputError(f"{where}: kind must be one of {', '.join(TASK_KINDS)}", parameter="kind")
    if spec.kind == "conflicts":
        validate_conflicts(spec, where)
    else:
        for name in _CONFLICTS_ONLY:
            if getattr(spec, name) is not None:
                raise InputError(f"{where}: only a task of kind conflicts takes {name}", parameter=name)
    if len(spec.classes) < 2 or len(set(spec.classes)) != len(spec.classes):
        raise InputError(f"{where}: needs at least two distinct classes", parameter="classes")
    if spec.community_embedding not in COMMUNITY_EMBEDDINGS:
        raise InputError(f"{where}: must be one of {', '.join(COMMUNITY_EMBEDDINGS)}", parameter="community_embedding")
    check_embedding(spec.embedding, spec.embedding_dim)
    check_edge_threshold(spec.edge_threshold)
    at_least(spec.min_subset_size, "min_subset_size", 1, where)
    at_least(spec.seed, "seed", 0, where)
    fraction(spec.id_val_fraction, "id_val_fraction", where, high_open=True)
    at_least(spec.train_size, "train_size", len(spec.classes), where)
    if spec.test_size is not None:
        at_least(spec.test_size, "test_size", 1, where)
    check_communities(spec, where)
    if spec.kind == "subpopulation":
        if spec.minority_fraction is None:
            raise InputError(f"{where}: needs minority_fraction", parameter="minority_fraction")
        fraction(spec.minority_fraction, "minority_fraction", where)
        if spec.test_size is None or spec.test_size % (2 * len(spec.classes)):
            raise InputError(
                f"{where}: test_size must be a multiple of the number of groups ({2 * len(spec.classes)})",
                parameter="test_size",
            )
        for cls in spec.classes:
            per_role = [c.role for c in spec.communities if c.class_name == cls]
            if sorted(per_role) != ["majority", "minority"]:
                raise InputError(
                    f"{where}: class {cls} needs exactly one majority and one minority group", parameter="groups"
                )
    if spec.distance_class is not None and spec.distance_class not in spec.classes:
        raise InputError(f"{where}: distance_class {spec.distance_class!r} is not a class", parameter="distance_class")
    return spec


def validate_conflicts(spec: TaskSpec, where: str) -> None:
    """Kind conflicts: its own parameters given and in range; it lists no communities (it selects subsets)."""
    if spec.communities:
        raise InputError(
            f"{where}: a task of kind conflicts selects its subsets itself: give no train/test/val/groups",
            parameter="communities",
        )
    for name in ("train_subsets", "ood_subsets", "images_per_subset", "id_eval_share"):
        if getattr(spec, name) is None:
            raise InputError(f"{where}: a task of kind conflicts needs {name}", parameter=name)
    for name, low in (("train_subsets", max(1, len(spec.classes))), ("ood_subsets", 0), ("images_per_subset", 1)):
        at_least(getattr(spec, name), name, low, where)
    fraction(spec.id_eval_share or 0.0, "id_eval_share", where, low_open=True, high_open=True)
    if spec.ood_images_per_subset is not None:
        at_least(spec.ood_images_per_subset, "ood_images_per_subset", 1, where)
    if spec.allow_scale_down:
        raise InputError(
            f"{where}: a task of kind conflicts does not scale down (its sizes are the experiment's design): lower "
            "train_subsets, ood_subsets or images_per_subset instead",
            parameter="allow_scale_down",
        )


def _communities(block: Any, role: str, where: str, source: str, line: int | None) -> list[Community]:
    if block is None:
        return []
    if not isinstance(block, dict):
        raise InputError(f"{where}: {role} must map classes to communities", path=source, line=line)
    result = []
    for cls, communities in block.items():
        if not isinstance(communities, dict):
            raise InputError(
                f"{where}: {role}.{cls} must map community names to lists of subsets", path=source, line=line
            )
        for name, members in communities.items():
            if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
                raise InputError(f"{where}: {role}.{cls}.{name} must be a list of subset names", path=source, line=line)
            result.append(Community(name=str(name), class_name=str(cls), role=role, members=tuple(members)))
    return result


_TASK_ENTRY_KEYS = {
    "kind",
    "classes",
    "exclude_images_in",
    "distance_class",
    "test",
    "train",
    "val",
    "groups",
    "minority",
    "variants",
    "paper_distance",
    *TASK_PARAMS,
    *_CONFLICTS_ONLY,
}


def _task_specs(name: str, data: dict[str, Any], defaults: dict[str, Any], source: str) -> list[TaskSpec]:
    where = f"task {name}"
    entry = data["tasks"][name]
    line = line_of(data, "tasks", name)
    unknown = sorted(set(entry) - _TASK_ENTRY_KEYS)
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r}", path=source, line=line_of(entry, unknown[0]))
    variants = entry.get("variants") or {"": {}}
    if not isinstance(variants, dict) or not all(v is None or isinstance(v, dict) for v in variants.values()):
        raise InputError(f"{where}: variants must map names to mappings", path=source, line=line)
    kind = entry.get("kind")
    own_name, tag = split_key(str(name), source, line)  # NAME@TAG: the task's own tag (task_rules)

    def communities_of(block: Any, role: str) -> list[Community]:
        return _communities(block, role, where, source, line)

    specs = []
    all_train = {v: communities_of((variant or {}).get("train"), "train") for v, variant in variants.items()}
    for suffix, variant in variants.items():
        variant = dict(variant or {})
        unknown = sorted(set(variant) - _TASK_ENTRY_KEYS)
        if unknown:
            raise InputError(f"{where}-{suffix}: unknown field {unknown[0]!r}", path=source, line=line)
        merged = {**defaults, **{k: v for k, v in entry.items() if k in TASK_PARAMS + _CONFLICTS_ONLY}, **variant}
        communities = communities_of(entry.get("test"), "test") + communities_of(entry.get("train"), "train")
        communities += all_train[suffix]
        for other, trains in all_train.items():
            if other != suffix:
                communities += [c.model_copy(update={"role": "other_train"}) for c in trains]
        communities += communities_of(entry.get("val"), "val")
        if kind == "subpopulation":
            minority = set(entry.get("minority") or [])
            for c in communities_of(entry.get("groups"), "groups"):
                communities.append(c.model_copy(update={"role": "minority" if c.name in minority else "majority"}))
        values = {
            **{k: merged[k] for k in TASK_PARAMS + _CONFLICTS_ONLY if k in merged},
            "name": f"{own_name}-{suffix}" if suffix else own_name,
            "base": str(name),
            "kind": str(kind),
            "classes": tuple(entry.get("classes") or ()),
            "communities": tuple(communities),
            "exclude_images_in": tuple(entry.get("exclude_images_in") or ()),
            "distance_class": entry.get("distance_class"),
            "paper_distance": variant.get("paper_distance", entry.get("paper_distance")),
        }

        def lines(parameter: str, suffix: str = suffix) -> int | None:
            return (
                line_of(entry, "variants", suffix, parameter)
                or line_of(data, "tasks", name, parameter)
                or line_of(data, "task_defaults", parameter)
                or line
            )

        spec = build(TaskSpec, values, source, lines)  # validated under its name, then given its tag
        specs.append(spec.model_copy(update={"name": tagged(spec.name, tag)}) if tag else spec)
    return specs


@dataclass(frozen=True)
class MetashiftSpecs:
    general_contexts: dict[str, list[str]]
    collections: dict[str, CollectionSpec]
    tasks: dict[str, TaskSpec]

    def names(self) -> list[str]:
        return sorted([*self.collections, *self.tasks])


def parse_specs(text: str, source: str) -> MetashiftSpecs:
    sections = {"general_contexts": dict, "collection_defaults": dict, "collections": dict}
    data = spec_document(text, source, {**sections, "task_defaults": dict, "tasks": dict}, family="metashift")
    ontology = data.get("general_contexts") or {}
    if not isinstance(ontology, dict) or not all(isinstance(v, list) for v in ontology.values()):
        raise InputError(
            "general_contexts must map groups to lists of context names",
            path=source,
            line=line_of(data, "general_contexts"),
        )
    collection_defaults = dict(data.get("collection_defaults") or {})
    collections: dict[str, CollectionSpec] = {}
    for name, entry in (data.get("collections") or {}).items():
        if entry is not None and not isinstance(entry, dict):
            raise InputError(
                f"collection {name}: expected a mapping", path=source, line=line_of(data, "collections", name)
            )
        values = {**collection_defaults, **(entry or {}), "name": str(name)}

        def lines(parameter: str, name: Any = name) -> int | None:
            return line_of(data, "collections", name, parameter) or line_of(data, "collection_defaults", parameter)

        collections[str(name)] = build(CollectionSpec, values, source, lines)
    task_defaults = dict(data.get("task_defaults") or {})
    tasks: dict[str, TaskSpec] = {}
    for name, entry in (data.get("tasks") or {}).items():
        if not isinstance(entry, dict):
            raise InputError(f"task {name}: expected a mapping", path=source, line=line_of(data, "tasks", name))
        for task in _task_specs(name, data, task_defaults, source):
            if task.name in collections or task.name in tasks:
                raise InputError(f"name {task.name!r} is used twice", path=source, line=line_of(data, "tasks", name))
            tasks[task.name] = task
    return MetashiftSpecs({str(k): [str(x) for x in v] for k, v in ontology.items()}, collections, tasks)


@functools.lru_cache(maxsize=8)
def _parsed(text: str, source: str) -> MetashiftSpecs:
    """A spec file's specs, parsed once per text (the shipped file's YAML takes 0.3 s, and one build reads it several
    times); callers get fresh dictionaries from :func:`load_specs`."""
    return parse_specs(text, source)


def load_specs(extra: Path | None = None) -> MetashiftSpecs:
    """Shipped specs, plus collections and tasks of ``extra`` (``SHIFTBENCH_METASHIFT_SPECS``, same format)."""
    parsed = [
        (_parsed(text, source), source) for text, source in spec_texts("metashift", extra, "SHIFTBENCH_METASHIFT_SPECS")
    ]
    benchmarks = merge_named(((dict(p.collections) | dict(p.tasks), source) for p, source in parsed), "benchmark")
    contexts = merge_named(((p.general_contexts, source) for p, source in parsed), "general context group")
    return MetashiftSpecs(
        contexts,
        {n: s for n, s in benchmarks.items() if isinstance(s, CollectionSpec)},
        {n: s for n, s in benchmarks.items() if isinstance(s, TaskSpec)},
    )
