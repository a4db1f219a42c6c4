"""What a benchmark family gives the pipeline: raw sources, inputs, kinds of benchmarks.

Everything that varies by family lives behind this one description (DomainBed-style registry,
:mod:`shiftbench.families.registry`): the Dagster asset factory (``assets/factory.py``), the CLI and the
library's own build path (:mod:`shiftbench.families.benchmark_builds`) read only these objects. A new family is one
package that builds a :class:`Family` and one line in the registry.

- :class:`RawSource`: files or settings whose content fingerprint is observed (``raw/<name>``).
- :class:`Input`: a parsed input shared by the family's benchmarks, cached by content
  (``CachedArtifact``), e.g. the calibrated hierarchy or the scene tables.
- :class:`Kind`: one kind of published benchmark (BREEDS benchmarks; MetaShift collections and
  tasks; ConDS cases): its specs, how to stage one, which contract tables it has, and how to
  describe a version to a human (neutral metadata the Dagster shell renders).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import BaseModel

from shiftbench.config.settings import Settings
from shiftbench.families.analysis import Analysis
from shiftbench.runtime.cache import CachedArtifact
from shiftbench.specs.spec_model import Spec
from shiftbench.store import StagedVersion
from shiftbench.tables.fingerprint import sha256_json


# -- neutral metadata values (rendered by the Dagster shell and the CLI) --------------------------
@dataclass(frozen=True)
class Table:
    """A small table shown inline."""

    frame: pl.DataFrame


@dataclass(frozen=True)
class Figure:
    """A PNG image."""

    png: bytes
    alt: str


@dataclass(frozen=True)
class Markdown:
    text: str


@dataclass(frozen=True)
class FilePath:
    path: Path


Metadata = dict[str, Any]  # values: str, int, float, bool, None, or one of the classes above


@dataclass(frozen=True)
class Description:
    """How a published version reads: metadata for the UI, one line and warnings for the terminal."""

    metadata: Metadata
    summary: str  # "3,400 examples", "1,412 subsets of 59,663 images"
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RawSource:
    """Files or settings the family reads; their fingerprint is the observed data version."""

    name: str
    description: str
    fingerprint: Callable[[Settings], str]


@dataclass(frozen=True)
class Input:
    """A parsed input shared by the family's benchmarks (a content-addressed cache directory)."""

    key: tuple[str, str]
    description: str
    build: Callable[[Settings, Mapping[str, CachedArtifact]], CachedArtifact]  # upstream inputs by name
    summary: Callable[[CachedArtifact], str]
    rows: str  # the artifact meta key holding its row count
    sources: tuple[str, ...] = ()  # raw source names
    inputs: tuple[str, ...] = ()  # names of inputs it reads (each listed earlier in the family)
    # The tools its step runs, shown by Dagster as the asset's kind tags (compute kinds).
    compute_kinds: frozenset[str] = frozenset({"polars", "parquet"})
    warnings: Callable[[CachedArtifact], list[str]] = lambda artifact: []
    code_version: str = "1"

    @property
    def name(self) -> str:
        return "/".join(self.key)


@dataclass(frozen=True)
class Target:
    """What to build: a benchmark name and its spec (a spec as written, or a named variant of one)."""

    benchmark: str
    spec: Spec  # the variant's overrides already applied
    overrides: Mapping[str, Any] = field(default_factory=dict)  # recorded in benchmarks.params
    # Not part of the definition: the contract check the build runs on the written tables while the version's
    # figures are drawn (shiftbench.families.benchmark_builds.stage_benchmark); a family's stage passes it to
    # stage_tables.
    check: Callable[[Mapping[str, Path]], None] | None = field(default=None, compare=False)


Stage = Callable[[Settings, Target, Mapping[str, CachedArtifact]], StagedVersion]


@dataclass(frozen=True)
class Fanout:
    """A kind whose build splits into units that run apart (worker processes, the steps of one Dagster run on its
    multiprocess or Kubernetes executor): ``plan`` writes what the units read into a work folder and names the
    units, ``unit`` builds one there, ``stage`` stages the version from all of them. Any split gives the version one
    piece gives (same tables, same id)."""

    plan: Callable[[Settings, Target, Mapping[str, CachedArtifact], Path, int], list[str]]
    unit: Callable[[Path, str], None]
    stage: Callable[[Settings, Target, Mapping[str, CachedArtifact], Path], StagedVersion]


@dataclass(frozen=True)
class Kind:
    """One kind of benchmark a family publishes; each spec (or named variant) is one benchmark."""

    family: str
    name: str  # benchmark, collection, task, case
    plural: str
    description: str
    tables: tuple[str, ...]  # the contract tables of a version
    inputs: tuple[str, ...]  # names of the family inputs a build reads
    spec_model: type[Spec]
    specs: Callable[[Settings], Mapping[str, Spec]]  # shipped + the user's extra spec file
    stage: Stage  # (settings, target, inputs by name) -> a staged, not yet checked version
    describe: Callable[[StagedVersion], Description]
    unavailable: Callable[[Settings, Spec], str | None] = lambda settings, spec: None  # why it cannot build here
    trainable: bool = True  # has examples an ERM baseline can train on
    code_version: str = "1"
    # The tools its steps run, shown by Dagster as the assets' kind tags (compute kinds).
    compute_kinds: frozenset[str] = frozenset({"polars", "parquet"})
    spec_source: str = ""  # the setting naming the user's extra spec file
    # What else defines a spec's content besides itself (MetaShift's general contexts, a ConDS dataset).
    spec_context: Callable[[Settings, Spec], Any] = lambda settings, spec: None
    # The inputs one spec reads, when not all of ``inputs`` (MetaShift: the released attributes or the scenes).
    needs: Callable[[Settings, Spec], tuple[str, ...]] | None = None
    # How one build fans out into units (MetaShift collections: buckets of classes), when it can.
    fanout: Fanout | None = None
    # A small shipped benchmark of this kind, built from what the package ships (tests and demos use it).
    example: str = ""

    def inputs_needed(self, settings: Settings, specs: Iterable[Spec]) -> tuple[str, ...]:
        """The inputs building ``specs`` reads (in ``inputs`` order): nothing else is built or loaded."""
        if self.needs is None:
            return self.inputs
        wanted = {name for spec in specs for name in self.needs(settings, spec)}
        return tuple(name for name in self.inputs if name in wanted)

    @property
    def staged_key(self) -> tuple[str, str]:
        return (self.family, f"staged_{self.name}")

    @property
    def publish_key(self) -> tuple[str, str]:
        return (self.family, self.name)

    def fingerprint(self, settings: Settings, target: Target) -> str:
        """The content fingerprint of a target's definition: the data version of its spec source."""
        definition = [
            target.spec.model_dump(mode="json"),
            dict(target.overrides),
            self.spec_context(settings, target.spec),
        ]
        return sha256_json(definition)

    @property
    def qualified(self) -> str:
        """``<family>_<plural>``: the name of its partitions, its job and its spec source."""
        return f"{self.family}_{self.plural}"

    @property
    def op_name(self) -> str:
        """``<family>__<plural>``: the op that stages and publishes the kind (its run config's key)."""
        return f"{self.family}__{self.plural}"

    @property
    def fanout_prefix(self) -> str:
        """``<family>__<name>``: the prefix of the fan-out job's ops (``_plan``, ``_unit``, ``_publish``)."""
        return f"{self.family}__{self.name}"

    @property
    def baseline_op(self) -> str:
        """``erm__<family>_<name>_baseline``: the op that trains an ERM baseline on the kind's splits."""
        return f"erm__{self.family}_{self.name}_baseline"


@dataclass(frozen=True)
class Family:
    name: str
    title: str  # as the paper names it
    description: str
    raw_sources: tuple[RawSource, ...]
    inputs: tuple[Input, ...]
    kinds: tuple[Kind, ...]
    # Why ERM cannot train this family's benchmarks with these settings (None: it can).
    training_unavailable: Callable[[Settings], str | None] = lambda settings: None
    # The names of the specs shipped with the package (the papers' names), and the tag a version's
    # recorded sources give its name (None: the paper's sources): see shiftbench.specs.naming.
    shipped_names: Callable[[], frozenset[str]] = frozenset
    source_tag: Callable[[Mapping[str, Any]], str | None] = lambda manifest: None
    # What a tag says about the data (``generated`` -> "the generated scene sample, not Visual Genome ..."): why a
    # paper's name is refused for it and what gives the paper's name back (None: a tag the family does not give).
    tag_meaning: Callable[[str], str | None] = lambda tag: None
    # Whether a tag says "a paper's content from other sources" (the default: every tag). BREEDS' dataset tags
    # (``@in21k``, ``@cifar100``) name other classes: a refused paper name never points at them.
    is_source_tag: Callable[[str], bool] = lambda tag: True
    # The family's own settings (a pydantic model; ``Settings.of``) and its own tables' contracts (a folder of
    # ODCS YAML files in its package): the Dagster resource, the catalog and the checks read them from here.
    settings: type[BaseModel] | None = None
    contracts_dir: Path | None = None
    # Named subsets of a version's examples scored besides splits and groups (``shiftbench eval``; ConDS: the
    # examples a shift concerns): ``module:function``, a function of the version's folder and its examples giving a
    # boolean mask per name, declared by path so that scoring imports that module only, never the family's build.
    eval_subsets: str | None = None
    # Why a version may have no training examples (said when ERM is asked to train on one), if the family knows.
    no_training_examples: str = ""
    # The papers' analyses over this family's results (tables with contracts, a query and a figure each).
    analyses: tuple[Analysis, ...] = ()
    # Its shift measures (name -> what it means): the words of its versions' ``shift_magnitudes`` rows
    # (shiftbench.warehouse.magnitudes: one vocabulary across families, a name means one thing).
    measures: Mapping[str, str] = field(default_factory=dict)

    def kind(self, name: str) -> Kind:
        return next(k for k in self.kinds if k.name == name)

    def input(self, name: str) -> Input:
        return next(i for i in self.inputs if i.name == name)

    def inputs_for(self, names: Iterable[str]) -> list[Input]:
        """The inputs ``names`` and everything they read, in build order (each is listed after what it reads)."""
        wanted = set(names)
        for item in reversed(self.inputs):
            if item.name in wanted:
                wanted |= set(item.inputs)
        return [item for item in self.inputs if item.name in wanted]
