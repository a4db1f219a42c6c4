"""MetaShift specs as data (``shiftbench/specs/metashift.yaml``): collections and shift tasks.

A collection spec says how candidate subsets, meta-graphs, communities and embeddings are
built; a task spec lists communities (named unions of candidate subsets) per class and role.
Overrides (CLI ``--set``, Dagster config) make a new validated spec and are recorded in params.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from shiftbench.errors import InputError
from shiftbench.metashift.embedding import check_embedding
from shiftbench.metashift.metagraph import COMMUNITY_METHODS, check_edge_threshold
from shiftbench.metashift.subsets import check_context_kinds, parse_subset_name
from shiftbench.spec_files import check_bool, check_fraction, check_int, parse_yaml, spec_texts

TASK_KINDS = ("domain_generalization", "subpopulation")
COMMUNITY_EMBEDDINGS = ("community_graph", "member_mean")
# Roles of a community in a task: train of this variant, train of another variant (only for
# leakage rules and the distance graph), test, val (OOD validation), majority / minority groups.
ROLES = ("train", "other_train", "test", "val", "majority", "minority")


@dataclass(frozen=True)
class CollectionSpec:
    name: str
    context_kinds: tuple[str, ...]
    min_subset_size: int = 25
    min_subsets_per_class: int = 6
    edge_threshold: float = 0.1
    embedding: str = "paper"
    embedding_dim: int = 5
    community_method: str = "louvain"
    seed: int = 0
    group_classes: bool = False

    def params(self) -> dict[str, Any]:
        values = asdict(self)
        values.pop("name")
        values["context_kinds"] = list(self.context_kinds)
        return values

    def with_overrides(self, overrides: Mapping[str, Any]) -> CollectionSpec:
        allowed = [f.name for f in fields(self) if f.name != "name"]
        unknown = sorted(set(overrides) - set(allowed))
        if unknown:
            raise InputError(f"unknown parameter; expected one of {', '.join(allowed)}", parameter=unknown[0])
        values = dict(overrides)
        if "context_kinds" in values:
            values["context_kinds"] = _as_kinds(values["context_kinds"])
        return validate_collection(replace(self, **values), "overrides")


def _as_kinds(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):  # --set context_kinds=object,general
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list | tuple):
        raise InputError(f"must be a list, got {value!r}", parameter="context_kinds")
    return check_context_kinds(list(value))


def validate_collection(spec: CollectionSpec, source: str) -> CollectionSpec:
    check_context_kinds(list(spec.context_kinds))
    check_int(spec.min_subset_size, "min_subset_size", 1, source)
    check_int(spec.min_subsets_per_class, "min_subsets_per_class", 1, source)
    check_edge_threshold(spec.edge_threshold)
    check_embedding(spec.embedding, spec.embedding_dim)
    if spec.community_method not in COMMUNITY_METHODS:
        raise InputError(
            f"must be one of {', '.join(COMMUNITY_METHODS)}, got {spec.community_method!r} (in {source})",
            parameter="community_method",
        )
    check_int(spec.seed, "seed", 0, source)
    check_bool(spec.group_classes, "group_classes", source)
    return spec


@dataclass(frozen=True)
class Community:
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


@dataclass(frozen=True)
class TaskSpec:
    name: str
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
    edge_threshold: float = 0.2
    embedding_dim: int = 5
    min_subset_size: int = 25
    seed: int = 0
    id_val_fraction: float = 0.0
    allow_scale_down: bool = False
    train_size: int = 400
    test_size: int | None = None
    minority_fraction: float | None = None

    def params(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in TASK_PARAMS}
        values["context_kinds"] = list(self.context_kinds)
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

    def with_overrides(self, overrides: Mapping[str, Any]) -> TaskSpec:
        unknown = sorted(set(overrides) - set(TASK_PARAMS))
        if unknown:
            raise InputError(f"unknown parameter; expected one of {', '.join(TASK_PARAMS)}", parameter=unknown[0])
        values = dict(overrides)
        if "context_kinds" in values:
            values["context_kinds"] = _as_kinds(values["context_kinds"])
        return validate_task(replace(self, **values), "overrides")

    def by_role(self, *roles: str) -> list[Community]:
        return [c for c in self.communities if c.role in roles]


def validate_task(spec: TaskSpec, source: str) -> TaskSpec:
    where = f"task {spec.name} ({source})"
    if spec.kind not in TASK_KINDS:
        raise InputError(f"{where}: kind must be one of {', '.join(TASK_KINDS)}", parameter="kind")
    if len(spec.classes) < 2 or len(set(spec.classes)) != len(spec.classes):
        raise InputError(f"{where}: needs at least two distinct classes", parameter="classes")
    check_context_kinds(list(spec.context_kinds))
    if spec.community_embedding not in COMMUNITY_EMBEDDINGS:
        raise InputError(f"{where}: must be one of {', '.join(COMMUNITY_EMBEDDINGS)}", parameter="community_embedding")
    check_embedding(spec.embedding, spec.embedding_dim)
    check_edge_threshold(spec.edge_threshold)
    check_int(spec.min_subset_size, "min_subset_size", 1, where)
    check_int(spec.seed, "seed", 0, where)
    check_fraction(spec.id_val_fraction, "id_val_fraction", where, high_open=True)
    check_bool(spec.allow_scale_down, "allow_scale_down", where)
    check_int(spec.train_size, "train_size", len(spec.classes), where)
    if spec.test_size is not None:
        check_int(spec.test_size, "test_size", 1, where)
    names = [c.name for c in spec.communities]
    if len(set(names)) != len(names):
        raise InputError(f"{where}: a community name is used twice", parameter="communities")
    for community in spec.communities:
        if community.class_name not in spec.classes:
            raise InputError(
                f"{where}: community {community.name} is of class {community.class_name!r}, "
                f"not one of {', '.join(spec.classes)}",
                parameter="communities",
            )
        if not community.members:
            raise InputError(f"{where}: community {community.name} has no member subsets", parameter="communities")
        for member in community.members:
            try:
                member_class, _ = parse_subset_name(member)
            except ValueError as exc:
                raise InputError(f"{where}: {exc}", parameter="communities") from None
            if member_class != community.class_name:
                raise InputError(
                    f"{where}: community {community.name} of class {community.class_name} lists {member}",
                    parameter="communities",
                )
    for subset in spec.exclude_images_in:
        try:
            parse_subset_name(subset)
        except ValueError as exc:
            raise InputError(f"{where}: {exc}", parameter="exclude_images_in") from None
    if spec.kind == "domain_generalization":
        for cls in spec.classes:
            roles = {c.role for c in spec.communities if c.class_name == cls}
            for role in ("train", "test"):
                if role not in roles:
                    raise InputError(f"{where}: class {cls} has no {role} community", parameter=role)
    if spec.kind == "subpopulation":
        if spec.minority_fraction is None:
            raise InputError(f"{where}: needs minority_fraction", parameter="minority_fraction")
        check_fraction(spec.minority_fraction, "minority_fraction", where)
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


def _communities(block: Any, role: str, where: str) -> list[Community]:
    if block is None:
        return []
    if not isinstance(block, dict):
        raise InputError(f"{where}: {role} must map classes to communities")
    result = []
    for cls, communities in block.items():
        if not isinstance(communities, dict):
            raise InputError(f"{where}: {role}.{cls} must map community names to lists of subsets")
        for name, members in communities.items():
            if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
                raise InputError(f"{where}: {role}.{cls}.{name} must be a list of subset names")
            result.append(Community(str(name), str(cls), role, tuple(members)))
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
}


def _task_specs(name: str, entry: dict[str, Any], defaults: dict[str, Any], source: str) -> list[TaskSpec]:
    where = f"task {name}"
    unknown = sorted(set(entry) - _TASK_ENTRY_KEYS)
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r}", path=source)
    variants = entry.get("variants") or {"": {}}
    kind = entry.get("kind")
    specs = []
    all_train = {v: _communities((variant or {}).get("train"), "train", where) for v, variant in variants.items()}
    for suffix, variant in variants.items():
        variant = dict(variant or {})
        unknown = sorted(set(variant) - _TASK_ENTRY_KEYS)
        if unknown:
            raise InputError(f"{where}-{suffix}: unknown field {unknown[0]!r}", path=source)
        merged = {**defaults, **{k: v for k, v in entry.items() if k in TASK_PARAMS}, **variant}
        communities = _communities(entry.get("test"), "test", where) + _communities(entry.get("train"), "train", where)
        communities += all_train[suffix]
        for other, trains in all_train.items():
            if other != suffix:
                communities += [replace(c, role="other_train") for c in trains]
        communities += _communities(entry.get("val"), "val", where)
        if kind == "subpopulation":
            minority = set(entry.get("minority") or [])
            for c in _communities(entry.get("groups"), "groups", where):
                communities.append(replace(c, role="minority" if c.name in minority else "majority"))
        params = {k: merged[k] for k in TASK_PARAMS if k in merged}
        if "context_kinds" in params:
            params["context_kinds"] = _as_kinds(params["context_kinds"])
        try:
            spec = TaskSpec(
                name=f"{name}-{suffix}" if suffix else str(name),
                base=str(name),
                kind=str(kind),
                classes=tuple(entry.get("classes") or ()),
                communities=tuple(communities),
                exclude_images_in=tuple(entry.get("exclude_images_in") or ()),
                distance_class=entry.get("distance_class"),
                paper_distance=variant.get("paper_distance", entry.get("paper_distance")),
                **params,
            )
        except TypeError as exc:
            raise InputError(f"{where}: {exc}", path=source) from None
        specs.append(validate_task(spec, source))
    return specs


@dataclass(frozen=True)
class MetashiftSpecs:
    general_contexts: dict[str, list[str]]
    collections: dict[str, CollectionSpec]
    tasks: dict[str, TaskSpec]

    def names(self) -> list[str]:
        return sorted([*self.collections, *self.tasks])


def parse_specs(text: str, source: str) -> MetashiftSpecs:
    data = parse_yaml(text, source)
    if not isinstance(data, dict) or data.get("family") != "metashift":
        raise InputError("expected a mapping with family: metashift", path=source)
    ontology = data.get("general_contexts") or {}
    if not isinstance(ontology, dict) or not all(isinstance(v, list) for v in ontology.values()):
        raise InputError("general_contexts must map groups to lists of context names", path=source)
    collection_defaults = dict(data.get("collection_defaults") or {})
    collections: dict[str, CollectionSpec] = {}
    for name, entry in (data.get("collections") or {}).items():
        values = {**collection_defaults, **(entry or {})}
        if "context_kinds" in values:
            values["context_kinds"] = _as_kinds(values["context_kinds"])
        try:
            spec = CollectionSpec(name=str(name), **values)
        except TypeError as exc:
            raise InputError(f"collection {name}: {exc}", path=source) from None
        collections[spec.name] = validate_collection(spec, source)
    task_defaults = dict(data.get("task_defaults") or {})
    tasks: dict[str, TaskSpec] = {}
    for name, entry in (data.get("tasks") or {}).items():
        if not isinstance(entry, dict):
            raise InputError(f"task {name}: expected a mapping", path=source)
        for task in _task_specs(str(name), entry, task_defaults, source):
            if task.name in collections or task.name in tasks:
                raise InputError(f"name {task.name!r} is used twice", path=source)
            tasks[task.name] = task
    return MetashiftSpecs({str(k): [str(x) for x in v] for k, v in ontology.items()}, collections, tasks)


def load_specs(extra: Path | None = None) -> MetashiftSpecs:
    """Shipped specs, plus collections and tasks of ``SHIFTBENCH_METASHIFT_SPECS`` (same format)."""
    parsed = [
        parse_specs(text, source) for text, source in spec_texts("metashift", "SHIFTBENCH_METASHIFT_SPECS", extra)
    ]
    specs = parsed[0]
    for more in parsed[1:]:
        specs = MetashiftSpecs(
            {**specs.general_contexts, **more.general_contexts},
            {**specs.collections, **more.collections},
            {**specs.tasks, **more.tasks},
        )
    return specs
