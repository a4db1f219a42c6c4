"""Stage -> check contracts -> publish -> refresh catalog: the one path every family takes.

Dagster runs the three steps as separate nodes (staged asset, blocking contract checks,
publish asset); :func:`stage_check_publish` runs them in one call for library users and tests.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import polars as pl

from shiftbench.catalog import refresh_catalog
from shiftbench.contracts import RuleResult, check_tables, failures
from shiftbench.errors import ContractViolation
from shiftbench.settings import Settings
from shiftbench.store import Publication, StagedVersion, Store


@dataclass(frozen=True)
class PublishOutcome:
    staged: StagedVersion
    publication: Publication
    results: dict[str, list[RuleResult]]


def environment() -> dict[str, str]:
    """Library versions recorded in every manifest, to explain a changed version id later."""
    packages = ("shiftbench", "polars", "pyarrow", "duckdb", "numpy", "networkx", "nltk")
    versions = {"python": platform.python_version()}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def check_staged(staged: StagedVersion, only: list[str] | None = None) -> dict[str, list[RuleResult]]:
    return check_tables({t: staged.table_path(t) for t in staged.tables}, only)


def describe_failures(results: Mapping[str, list[RuleResult]]) -> str:
    return "; ".join(f"{r.table}.{r.rule}: observed {r.observed}, expected {r.expected}" for r in failures(results))


def publish_staged(settings: Settings, staged: StagedVersion) -> Publication:
    publication = Store(settings.store_dir).publish(staged)
    refresh_catalog(settings.catalog_path, settings.store_dir)
    return publication


def stage_check_publish(
    settings: Settings,
    family: str,
    benchmark: str,
    tables: Mapping[str, pl.DataFrame],
    manifest_extra: Mapping[str, Any],
) -> PublishOutcome:
    """Publish a version only if every contract holds; otherwise raise and publish nothing."""
    staged = Store(settings.store_dir).stage(family, benchmark, tables, manifest_extra=manifest_extra)
    return check_and_publish(settings, staged)


def check_and_publish(settings: Settings, staged: StagedVersion) -> PublishOutcome:
    """Publish a staged version only if every contract holds; otherwise raise and publish nothing."""
    results = check_staged(staged)
    if failures(results):
        raise ContractViolation(
            f"{staged.benchmark} version {staged.version} breaks its contracts, not published: "
            f"{describe_failures(results)}"
        )
    return PublishOutcome(staged, publish_staged(settings, staged), results)
