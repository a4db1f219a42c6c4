"""The registry object: which benchmark families exist, their settings models and their contracts' folders.

Families are registered into a :class:`Registry` by a call, never by importing a module: the process's registry
(:data:`REGISTRY`) starts with the built-in families, each named by module path (:class:`LazyFamily`) and imported
the first time someone asks for it, so importing the registry imports no family (nor numba, scipy, networkx or
pandas). A family made outside the package (``tests/toy_family``) is one :meth:`Registry.register` call.
Whoever needs to know the families asks the registry: the settings (their models, :mod:`shiftbench.config.settings`),
the
contracts (their folders, :mod:`shiftbench.store.contracts`), the Dagster definitions and the CLI (the families
themselves, typed, through :mod:`shiftbench.families.registry`).

This module sits below the settings, so it knows a family only as what it asks of one (:class:`Registrable`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel

from shiftbench.config.package_files import CONTRACTS_DIR
from shiftbench.errors import InputError


@runtime_checkable
class Registrable(Protocol):
    """What the registry reads of a family (:class:`shiftbench.families.family.Family` has more)."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> type[BaseModel] | None: ...

    @property
    def contracts_dir(self) -> Path | None: ...

    @property
    def measures(self) -> Mapping[str, str]: ...

    @property
    def eval_subsets(self) -> str | None: ...


@dataclass(frozen=True)
class LazyFamily:
    """A family known by where it is: imported on first use. ``family`` and ``settings`` are ``module:attribute``
    (the settings model's module is small, so the settings can be validated without importing the family), and so
    is ``eval_subsets``, the function scoring's extra subsets come from (a small module: scoring a split imports it,
    never the family's build code)."""

    name: str
    family: str
    settings: str | None = None
    contracts_dir: Path | None = None
    eval_subsets: str | None = None

    def load(self) -> Registrable:
        """The family object, checked against what this entry says of it (a mismatch is a bug here)."""
        found = _attribute(self.family)
        settings = _attribute(self.settings) if self.settings else None
        declared = (self.name, settings, self.contracts_dir, self.eval_subsets)
        if (
            not isinstance(found, Registrable)
            or (
                found.name,
                found.settings,
                found.contracts_dir,
                found.eval_subsets,
            )
            != declared
        ):
            raise TypeError(f"{self.family} does not match its registry entry {self}")
        return found


def attribute(path: str) -> object:
    """The object ``module:attribute`` names (its module imported now)."""
    return _attribute(path)


def _attribute(path: str) -> object:
    module, _, attribute = path.partition(":")
    found: object = getattr(importlib.import_module(module), attribute)
    return found


class Registry:
    """Families by name, in registration order; a :class:`LazyFamily` entry is imported when first asked for."""

    def __init__(self, entries: Iterable[Registrable | LazyFamily] = ()) -> None:
        self._entries: dict[str, Registrable | LazyFamily] = {}
        for entry in entries:
            if entry.name in self._entries:
                raise InputError(f"a family named {entry.name!r} is already registered", parameter="family")
            self._entries[entry.name] = entry

    def register(self, family: Registrable) -> None:
        """Make ``family`` known: its settings, contracts, assets, checks, partitions, catalog views, CLI, training.
        Registering the same family again changes nothing; another family of a registered name is refused."""
        if family.name in self._entries and self.get(family.name) is not family:
            raise InputError(f"a family named {family.name!r} is already registered", parameter="family")
        self._entries[family.name] = family

    def unregister(self, name: str) -> None:
        del self._entries[name]

    def names(self) -> list[str]:
        """The registered families' names, in registration order (nothing is imported)."""
        return list(self._entries)

    def get(self, name: str) -> Registrable | None:
        """The family ``name`` (imported now if it is a built-in not used yet), None when unknown."""
        entry = self._entries.get(name)
        if isinstance(entry, LazyFamily):
            self._entries[name] = loaded = entry.load()
            return loaded
        return entry

    def families(self) -> list[Registrable]:
        """Every registered family, imported."""
        return [family for name in self.names() if (family := self.get(name)) is not None]

    def settings_models(self) -> list[type[BaseModel]]:
        """The families' own settings models, in registration order (a built-in's family is not imported)."""
        models: list[type[BaseModel]] = []
        for entry in self._entries.values():
            model = _settings_model(entry)
            if model is not None and model not in models:
                models.append(model)
        return models

    def eval_subsets(self, name: str) -> str | None:
        """Where family ``name``'s extra scoring subsets come from (``module:function``), None when it has none or is
        unknown; a built-in's family is not imported."""
        entry = self._entries.get(name)
        return entry.eval_subsets if entry is not None else None

    def contract_directories(self) -> list[Path]:
        """The folders of the families' own contracts (a built-in's family is not imported)."""
        return [entry.contracts_dir for entry in self._entries.values() if entry.contracts_dir is not None]


def _settings_model(entry: Registrable | LazyFamily) -> type[BaseModel] | None:
    if not isinstance(entry, LazyFamily):
        return entry.settings
    if entry.settings is None:
        return None
    model = _attribute(entry.settings)
    assert isinstance(model, type) and issubclass(model, BaseModel), entry.settings
    return model


# The families shipped with the package, in the order the CLI and the docs list them: each declares its Family in
# ``shiftbench/<name>/family.py``, its settings model in ``settings.py``, its contracts in ``data_contracts/<name>/``.
BUILT_IN = (
    LazyFamily(
        "breeds",
        "shiftbench.breeds.family:BREEDS",
        "shiftbench.breeds.settings:BreedsSettings",
        CONTRACTS_DIR / "breeds",
    ),
    LazyFamily(
        "metashift",
        "shiftbench.metashift.family:METASHIFT",
        "shiftbench.metashift.settings:MetaShiftSettings",
        CONTRACTS_DIR / "metashift",
    ),
    LazyFamily(
        "conds",
        "shiftbench.conds.family:CONDS",
        "shiftbench.conds.settings:CondsSettings",
        CONTRACTS_DIR / "conds",
        "shiftbench.conds.shift_subsets:shift_subsets",
    ),
)


def built_in_registry() -> Registry:
    """A registry of the built-in families only (what a fresh process starts with)."""
    return Registry(BUILT_IN)


# The process's registry: the built-in families, and whatever a caller registers.
REGISTRY = built_in_registry()
