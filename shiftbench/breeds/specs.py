"""BREEDS benchmark specs: named presets as data (``shiftbench/specs/breeds.yaml``).

A spec is a frozen, typed :class:`BreedsSpec`; overrides (CLI ``--set``, Dagster launchpad
config) produce a new validated spec and are recorded in the published params.

Beyond ImageNet-1k a spec names its classes (``classes``: an ImageNet-21k list shipped from timm's
files, or a wnid file), or a labelled hierarchy (``hierarchy``: a shipped grouping such as
``cifar100`` or a file), or the novel-subpopulations task (``task: novel``). Such a benchmark is
published as ``NAME@TAG``, the tag saying whose classes it holds (``living17@in21k``,
``superclasses@cifar100``): the papers' names stay ImageNet-1k only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationInfo, field_validator, model_validator

from shiftbench.breeds.tasks import SPLITS, TaskParams, odd_subclasses
from shiftbench.config.located_yaml import line_of
from shiftbench.errors import InputError
from shiftbench.specs.naming import TAG_SEPARATOR, tagged
from shiftbench.specs.spec_model import Spec, build, merge_named, source_of, spec_document, spec_texts

SPEC_FIELDS = ("level", "n_subclasses", "split", "seed", "ancestor")
# Recorded only when set, so the ImageNet-1k benchmarks keep their params (and version ids).
BEYOND_FIELDS = ("classes", "hierarchy", "tree", "superclasses", "task", "source_subclasses")
IMAGENET1K = "in1k"
# The ImageNet class lists (shiftbench.sources.imagenet21k.LISTS; in1k is the BREEDS default).
CLASS_LISTS = ("in1k", "in21k", "in22k", "in12k", "in21k-miil", "in21k-miil-w21")
SHIPPED_HIERARCHIES = ("cifar100",)  # shiftbench.sources.labelled_hierarchy.SHIPPED_HIERARCHIES
TASKS = ("breeds", "novel")
WNID_FILE_TAG = "wnids"
_WNID = re.compile(r"^n\d{8}$")


def _as_ids(value: Any) -> Any:
    if isinstance(value, str):  # --set superclasses=n01,n02
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value) if isinstance(value, list) else value


def _as_source_subclasses(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((str(k), tuple(str(s) for s in v) if isinstance(v, list | tuple) else v) for k, v in value.items())
    return value


def _resolve(value: str | None, source: str, shipped: tuple[str, ...]) -> str | None:
    """A shipped name as is; a path relative to the spec file that names it, made absolute."""
    if value is None or value in shipped:
        return value
    path = Path(value).expanduser()
    if not path.is_absolute() and source != "overrides":
        path = Path(source).parent / path
    return str(path)


def _file_tag(path: str) -> str:
    stem = re.sub(r"[^a-z0-9]+", "-", Path(path).stem.lower()).strip("-")
    return stem or "hierarchy"


class BreedsSpec(Spec):
    OVERRIDABLE: ClassVar[tuple[str, ...]] = SPEC_FIELDS

    level: int | None = None
    n_subclasses: int
    split: str = "rand"
    seed: int = 2
    ancestor: str | None = None
    # Whose classes: an ImageNet class list or a wnid file (None: ImageNet-1k, or a hierarchy's leaves).
    classes: str | None = None
    hierarchy: str | None = None  # a labelled hierarchy: a shipped grouping or a file (docs/breeds.md)
    tree: bool = True  # a labelled hierarchy must be a tree (a child under one parent)
    superclasses: tuple[str, ...] | None = None  # these superclasses, instead of those at ``level``
    task: str = "breeds"  # breeds | novel (source: ImageNet-1k subclasses; target: 21k classes outside the 1k)
    source_subclasses: tuple[tuple[str, tuple[str, ...]], ...] | None = None  # novel: per superclass

    _ids = field_validator("superclasses", mode="before")(lambda value: _as_ids(value))
    _sources = field_validator("source_subclasses", mode="before")(lambda value: _as_source_subclasses(value))

    @model_validator(mode="after")
    def _valid(self, info: ValidationInfo) -> BreedsSpec:
        source = source_of(info)
        _check_numbers(self, source)
        _check_selection(self, source)
        _check_classes(self, source)
        if self.task == "novel":
            _check_novel(self, source)
        object.__setattr__(self, "classes", _resolve(self.classes, source, CLASS_LISTS))
        object.__setattr__(self, "hierarchy", _resolve(self.hierarchy, source, SHIPPED_HIERARCHIES))
        return self

    @property
    def class_list(self) -> str:
        """The ImageNet class list (or wnid file) the spec draws from; ``in1k`` by default."""
        if self.classes is None:
            return "in21k" if self.task == "novel" else IMAGENET1K
        return self.classes

    @property
    def is_imagenet1k(self) -> bool:
        """The BREEDS paper's setting: ImageNet-1k classes on the calibrated ImageNet hierarchy."""
        return self.hierarchy is None and self.task == "breeds" and self.class_list == IMAGENET1K

    @property
    def dataset_tag(self) -> str | None:
        """What the benchmark name carries after ``@`` (None: ImageNet-1k, the papers' setting)."""
        if self.hierarchy is not None:
            return self.hierarchy if self.hierarchy in SHIPPED_HIERARCHIES else _file_tag(self.hierarchy)
        if self.is_imagenet1k:
            return None
        return self.class_list if self.class_list in CLASS_LISTS else WNID_FILE_TAG

    def task_params(self) -> TaskParams:
        return TaskParams(self.level, self.n_subclasses, self.split, self.seed, self.ancestor, self.superclasses)

    def params(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in SPEC_FIELDS}
        if self.is_imagenet1k and self.superclasses is None:
            return values  # as recorded before ImageNet-21k: the 1k versions keep their ids
        values["task"] = self.task
        if self.hierarchy is not None:
            values["classes"] = "leaves"
        else:
            values["classes"] = self.class_list if self.class_list in CLASS_LISTS else Path(self.class_list).name
        if self.hierarchy is not None:
            values["hierarchy_file"] = self.dataset_tag
            values["tree"] = self.tree
        if self.superclasses is not None:
            values["superclasses"] = list(self.superclasses)
        if self.source_subclasses is not None:
            values["source_subclasses"] = {k: list(v) for k, v in self.source_subclasses}
        return values


def _check_numbers(spec: BreedsSpec, source: str) -> None:
    if spec.level is not None and spec.level < 0:
        raise InputError(f"must be >= 0 (in {source})", parameter="level")
    if spec.n_subclasses < 1:
        raise InputError(f"must be >= 1 (in {source})", parameter="n_subclasses")
    if not 0 <= spec.seed < 2**32:
        raise InputError(f"must be in [0, 2**32) for numpy's RandomState (in {source})", parameter="seed")
    if spec.split not in SPLITS:
        raise InputError(f"must be one of {', '.join(SPLITS)}, got {spec.split!r}", parameter="split")
    if spec.task not in TASKS:
        raise InputError(f"must be one of {', '.join(TASKS)}, got {spec.task!r}", parameter="task")
    if spec.n_subclasses % 2 and (spec.task == "novel" or spec.split != "none"):
        what = "a novel task" if spec.task == "novel" else f"split {spec.split!r}"
        raise odd_subclasses(what, spec.n_subclasses, source)


def _check_selection(spec: BreedsSpec, source: str) -> None:
    if spec.source_subclasses is not None and spec.superclasses is None:
        object.__setattr__(spec, "superclasses", tuple(k for k, _ in spec.source_subclasses))
    if spec.superclasses is not None:
        if spec.level is not None or spec.ancestor is not None:
            raise InputError(f"give either superclasses or level/ancestor, not both (in {source})", parameter="level")
        if not spec.superclasses:
            raise InputError(f"must list at least one superclass (in {source})", parameter="superclasses")
        if len(set(spec.superclasses)) != len(spec.superclasses):
            raise InputError(f"lists a superclass twice (in {source})", parameter="superclasses")
        object.__setattr__(spec, "superclasses", tuple(sorted(spec.superclasses)))  # labels: positions by id
    elif spec.level is None:
        raise InputError(f"required: the superclasses' level, or a superclasses list (in {source})", parameter="level")


def _check_classes(spec: BreedsSpec, source: str) -> None:
    if spec.hierarchy is not None and spec.classes is not None:
        raise InputError(
            f"a labelled hierarchy's classes are its leaves: give hierarchy or classes, not both (in {source})",
            parameter="classes",
        )
    if spec.hierarchy is None and not spec.tree:
        raise InputError(f"tree applies to a labelled hierarchy only (in {source})", parameter="tree")
    value = spec.classes
    if value is not None and value not in CLASS_LISTS and not value.endswith((".txt", ".csv", ".wnids")):
        raise InputError(
            f"must be one of {', '.join(CLASS_LISTS)} or a wnid file (.txt), got {value!r} (in {source})",
            parameter="classes",
        )


def _check_novel(spec: BreedsSpec, source: str) -> None:
    if spec.hierarchy is not None or spec.class_list == IMAGENET1K:
        raise InputError(
            f"a novel task draws its target from ImageNet-21k classes outside the 1k: classes must be an ImageNet-21k "
            f"list or a wnid file (in {source})",
            parameter="classes",
        )
    if spec.split != "rand":
        raise InputError(f"a novel task has no split variants: its split is fixed (in {source})", parameter="split")
    for superclass, subclasses in spec.source_subclasses or ():
        bad = [s for s in (superclass, *subclasses) if not _WNID.match(s)]
        if bad or not subclasses:
            what = f"malformed wnid {bad[0]!r}" if bad else f"no subclasses for {superclass}"
            raise InputError(f"{what} (in {source})", parameter="source_subclasses")


def _entry_tag(key: str, spec: BreedsSpec, source: str, line: int | None) -> str:
    """The benchmark name of an entry: ``NAME@TAG``, the tag said by the spec (a written tag must agree)."""
    base, _, written = key.partition(TAG_SEPARATOR)
    expected = spec.dataset_tag
    if written and expected is None:
        raise InputError(
            f"invalid benchmark name {key!r}: '@' is reserved for shiftbench's source tags (NAME@TAG)",
            path=source,
            line=line,
        )
    if written and written != expected:
        want = tagged(base, expected)
        raise InputError(
            f"benchmark {key}: the tag after '@' must say whose classes it holds: {want}", path=source, line=line
        )
    return tagged(base, expected)


def parse_specs(text: str, source: str) -> dict[str, BreedsSpec]:
    data = spec_document(text, source, {"defaults": dict, "benchmarks": dict, "variants": dict}, family="breeds")
    defaults = dict(data.get("defaults") or {})
    variants = dict(data.get("variants") or {})
    specs: dict[str, BreedsSpec] = {}
    for key, entry in (data.get("benchmarks") or {}).items():
        if entry is not None and not isinstance(entry, dict):
            raise InputError(f"benchmark {key}: expected a mapping", path=source, line=line_of(data, "benchmarks", key))
        entry = dict(entry or {})
        with_variants = entry.pop("variants", True)
        base = str(key).partition(TAG_SEPARATOR)[0]
        values = {**defaults, **entry, "name": base}

        def lines(parameter: str, key: Any = key) -> int | None:
            return line_of(data, "benchmarks", key, parameter) or line_of(data, "defaults", parameter)

        spec = build(BreedsSpec, values, source, lines)
        name = _entry_tag(str(key), spec, source, line_of(data, "benchmarks", key))
        specs[name] = spec.model_copy(update={"name": name})
        if with_variants is not True:
            if with_variants is not False:
                message = f"benchmark {key}: variants must be true or false"
                raise InputError(message, path=source, line=lines("variants"))
            continue
        for suffix, change in variants.items():
            if change is not None and not isinstance(change, dict):
                raise InputError(f"variant {suffix}: expected a mapping", path=source, line=line_of(data, "variants"))
            variant = {**values, **(change or {}), "name": f"{base}-{suffix}"}

            def variant_lines(parameter: str, suffix: Any = suffix) -> int | None:
                return line_of(data, "variants", suffix, parameter)

            built = build(BreedsSpec, variant, source, variant_lines)
            variant_name = tagged(built.name, built.dataset_tag)
            specs[variant_name] = built.model_copy(update={"name": variant_name})
    return specs


def load_specs(extra: Path | None = None) -> dict[str, BreedsSpec]:
    """Shipped specs, plus those of ``extra`` (``SHIFTBENCH_BREEDS_SPECS``, same format)."""
    texts = spec_texts("breeds", extra, "SHIFTBENCH_BREEDS_SPECS")
    return merge_named(((parse_specs(text, source), source) for text, source in texts), "benchmark")
