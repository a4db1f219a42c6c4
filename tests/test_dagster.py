"""The Dagster code location: graph snapshot, end-to-end runs on the real BREEDS hierarchy,
blocking contract checks, overrides, and the nightly automation."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import polars as pl
import pytest

from shiftbench.settings import Settings

from .conftest import BREEDS_FIXTURE, PROJECT, PUBLISHED_SPLITS

warnings.filterwarnings("ignore", message=".*is currently in beta.*")

from assets import breeds as breeds_assets  # noqa: E402
from pipelines.definitions import defs  # noqa: E402
from pipelines.resources import ShiftbenchSettings  # noqa: E402

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def _describe(condition: dg.AutomationCondition | None) -> str | None:
    """A stable text form of an automation condition tree (name, then children)."""
    if condition is None:
        return None
    children = [_describe(c) for c in condition.children]
    label = condition.get_label() or condition.name
    return f"{label}({', '.join(c for c in children if c)})" if children else label


def graph_summary() -> dict[str, Any]:
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "group": node.group_name,
            "materializable": node.is_materializable,
            "partitions": node.partitions_def.get_partition_keys() if node.partitions_def else None,
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "code_version": node.code_version,
            "automation": _describe(node.automation_condition),
            "checks": sorted(c.name for c in node.check_keys),
        }
    return {
        "assets": assets,
        "jobs": sorted(job.name for job in defs.resolve_all_job_defs() if not job.name.startswith("__")),
        "schedules": sorted((s.name, s.cron_schedule) for s in defs.schedules or []),  # type: ignore[union-attr]
        "sensors": sorted(s.name for s in defs.sensors or []),  # type: ignore[union-attr]
    }


def test_asset_graph_snapshot(snapshot: Any) -> None:
    assert graph_summary() == snapshot


def test_checks_are_blocking_and_automation_sensor_runs_by_default() -> None:
    graph = defs.resolve_asset_graph()
    specs = list(graph.get(dg.AssetKey(["breeds", "staged_benchmark"])).check_keys)
    assert len(specs) == 4
    staged = breeds_assets.staged_benchmark
    assert all(spec.blocking for spec in staged.check_specs)
    sensor = defs.resolve_sensor_def("shiftbench_automation")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


@pytest.mark.slow
def test_definitions_validate_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "DAGSTER_HOME": str(tmp_path)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Validation successful" in proc.stdout + proc.stderr


@pytest.fixture
def real_settings(make_settings: Callable[..., Settings], fixtures: Path) -> Settings:
    return make_settings(SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(BREEDS_FIXTURE))


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def run_inputs(settings: Settings, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def("breeds_inputs")
    resources = {
        "settings": ShiftbenchSettings(
            home=str(settings.home), offline=True, breeds_hierarchy_dir=str(settings.breeds_hierarchy_dir)
        )
    }
    return job.execute_in_process(instance=instance, run_config=QUIET, resources=resources)


def run_benchmark(
    settings: Settings, instance: dg.DagsterInstance, name: str, config: dict[str, Any] | None = None
) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def("breeds_benchmarks")
    resources = {
        "settings": ShiftbenchSettings(
            home=str(settings.home), offline=True, breeds_hierarchy_dir=str(settings.breeds_hierarchy_dir)
        )
    }
    run_config = {**QUIET, "ops": {"breeds__staged_benchmark": {"config": config or {}}}}
    return job.execute_in_process(
        instance=instance,
        partition_key=name,
        run_config=run_config,
        resources=resources,
        raise_on_error=False,
    )


@pytest.mark.slow
def test_end_to_end_publishes_the_published_living17(real_settings: Settings, instance: dg.DagsterInstance) -> None:
    inputs = run_inputs(real_settings, instance)
    assert inputs.output_for_node("breeds__calibrated_hierarchy").meta["kind"] == "breeds-published"
    result = run_benchmark(real_settings, instance, "living17")
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert sorted(c.check_name for c in checks) == [f"contract_{t}" for t in sorted(breeds_assets.BREEDS_TABLES)]
    assert all(c.passed for c in checks)
    meta = result.asset_materializations_for_node("breeds__benchmark")[0].metadata
    version = meta["version"].value
    assert meta["became_latest"].value is True
    assert meta["dagster/row_count"].value == 17 * 4 * 50  # val images only
    assert "data:image/png;base64," in meta["subclasses_per_superclass"].value
    assert "breeds_subpopulations" in meta["duckdb_query"].value
    preview = meta["preview"].value
    assert [c.name for c in preview.schema.columns][:3] == ["y", "superclass_name", "domain"]
    assert len(meta["subclasses_per_domain"].value.records) == 17

    published = json.loads(PUBLISHED_SPLITS.read_text())["benchmarks"]["living17"]["superclasses"]
    with duckdb.connect(str(real_settings.catalog_path), read_only=True) as con:
        rows = con.execute(
            "SELECT y, domain, list(subclass_wnid ORDER BY rank) FROM breeds_subpopulations "
            "WHERE benchmark = 'living17' GROUP BY ALL ORDER BY y, domain"
        ).fetchall()
        assert con.execute("SELECT version FROM benchmarks WHERE benchmark='living17'").fetchone() == (version,)
        splits = dict(con.execute("SELECT split, count(*) FROM examples GROUP BY split").fetchall())
    expected = [(s["label"], d, s[d]) for s in published for d in ("source", "target")]
    assert rows == expected
    assert splits == {"id_test": 1700, "test": 1700}

    # Same inputs again: same version, nothing new written, still latest.
    again = run_benchmark(real_settings, instance, "living17")
    meta2 = again.asset_materializations_for_node("breeds__benchmark")[0].metadata
    assert meta2["version"].value == version
    assert meta2["became_latest"].value is False


@pytest.mark.slow
def test_overrides_and_new_name_are_recorded(real_settings: Settings, instance: dg.DagsterInstance) -> None:
    run_inputs(real_settings, instance)
    result = run_benchmark(real_settings, instance, "living17", {"seed": 3, "publish_as": "living17-seed3"})
    assert result.success
    with duckdb.connect(str(real_settings.catalog_path), read_only=True) as con:
        row = con.execute(
            "SELECT spec, params->>'seed', params->'overrides' FROM benchmarks WHERE benchmark='living17-seed3'"
        ).fetchone()
        assert con.execute("SELECT count(*) FROM benchmarks WHERE benchmark='living17'").fetchone() == (0,)
    assert row is not None
    assert row[0] == "living17"
    assert row[1] == "3"
    assert json.loads(row[2]) == {"seed": 3}


@pytest.mark.slow
def test_a_failed_contract_blocks_publication(
    real_settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_inputs(real_settings, instance)
    assert run_benchmark(real_settings, instance, "living17").success
    good = instance.get_latest_materialization_event(dg.AssetKey(["breeds", "benchmark"]))
    assert good is not None

    from shiftbench.breeds import pipeline

    original = pipeline.build_tables

    def broken(*args: Any, **kwargs: Any) -> dict[str, pl.DataFrame]:
        tables = original(*args, **kwargs)
        sub = tables["breeds_subpopulations"]  # one subclass in both domains
        extra = sub.filter(pl.col("domain") == "source").head(1).with_columns(pl.lit("target").alias("domain"))
        tables["breeds_subpopulations"] = pl.concat([sub, extra])
        return tables

    monkeypatch.setattr(pipeline, "build_tables", broken)
    result = run_benchmark(real_settings, instance, "living17", {"seed": 5})
    assert not result.success
    failed = {c.check_name for c in result.get_asset_check_evaluations() if not c.passed}
    assert "contract_breeds_subpopulations" in failed
    assert result.asset_materializations_for_node("breeds__benchmark") == []
    with duckdb.connect(str(real_settings.catalog_path), read_only=True) as con:
        params = con.execute("SELECT params->>'seed' FROM benchmarks WHERE benchmark='living17'").fetchone()
    assert params == ("2",)  # the previous version is still the latest


@pytest.mark.slow
def test_nightly_rebuild_only_when_a_spec_or_source_changed(
    real_settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagster._core.definitions.observe import observe  # not exported in 1.13 (DAGSTER.md)

    resources = {
        "settings": ShiftbenchSettings(
            home=str(real_settings.home),
            offline=True,
            breeds_hierarchy_dir=str(real_settings.breeds_hierarchy_dir),
        )
    }
    sources = [a for a in breeds_assets.raw_sources if a.key != breeds_assets.breeds_specs.key]
    observe(sources, instance=instance, resources=resources)
    observe([breeds_assets.breeds_specs], instance=instance)
    run_inputs(real_settings, instance)
    for name in breeds_assets.BREEDS_PARTITIONS.get_partition_keys():
        assert run_benchmark(real_settings, instance, name).success

    start = datetime(2030, 1, 1, 2, 0)
    breeds_only = dg.AssetSelection.groups("breeds", "sources") - dg.AssetSelection.key_prefixes("metashift")
    first = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, evaluation_time=start, asset_selection=breeds_only
    )
    tick = start + timedelta(hours=1, minutes=5)  # past 03:00
    quiet = dg.evaluate_automation_conditions(
        defs=defs, instance=instance, evaluation_time=tick, cursor=first.cursor, asset_selection=breeds_only
    )
    assert quiet.total_requested == 0

    # Change one spec: only that benchmark's partitions are requested the next night.
    from shiftbench.breeds import specs as specs_module

    changed = dict(specs_module.load_specs())
    changed["living17"] = changed["living17"].with_overrides({"seed": 9})
    monkeypatch.setattr(breeds_assets, "load_specs", lambda: changed)
    observe([breeds_assets.breeds_specs], instance=instance)
    night = dg.evaluate_automation_conditions(
        defs=defs,
        instance=instance,
        evaluation_time=tick + timedelta(days=1),
        cursor=quiet.cursor,
        asset_selection=breeds_only,
    )
    requested = {
        (key.to_user_string(), partition)
        for result in night.results
        for key in [result.key]
        if isinstance(key, dg.AssetKey)
        for partition in (result.true_subset.expensively_compute_partition_keys() if result.true_subset.size else [])
    }
    assert ("breeds/staged_benchmark", "living17") in requested
    assert all(partition == "living17" for _, partition in requested)
