"""The Dagster code location: one asset factory over the registry, batched runs with per-partition results,
publishing guarded whatever is selected, named variants as their own partitions, ERM under its split,
and the automation (three nights that request nothing that fails; a changed spec and its results)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pytest

from shiftbench.config.settings import Settings

from .conftest import BREEDS_FIXTURE, PROJECT, PUBLISHED_SPLITS

warnings.filterwarnings("ignore", message=".*is currently in (beta|preview).*")

from shiftbench.assets import erm as erm_assets  # noqa: E402
from shiftbench.assets.factory import spec_source_key  # noqa: E402
from shiftbench.assets.resources import resource_class  # noqa: E402
from shiftbench.families import registry  # noqa: E402
from shiftbench.families.family import Kind  # noqa: E402
from shiftbench.pipelines.definitions import build_definitions, defs  # noqa: E402
from shiftbench.pipelines.sensors import partitions_sensor  # noqa: E402
from shiftbench.store import Store  # noqa: E402

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
RANGE = ("dagster/asset_partition_range_start", "dagster/asset_partition_range_end")


def _describe(condition: dg.AutomationCondition | None) -> str | None:
    """A stable text form of an automation condition tree (name, then children)."""
    if condition is None:
        return None
    children = [_describe(c) for c in condition.children]
    label = condition.get_label() or condition.name
    return f"{label}({', '.join(c for c in children if c)})" if children else label


def graph_summary(definitions: dg.Definitions) -> dict[str, Any]:
    graph = definitions.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        partitions = node.partitions_def
        assets[key.to_user_string()] = {
            "group": node.group_name,
            "materializable": node.is_materializable,
            "partitions": type(partitions).__name__ if partitions else None,
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "code_version": node.code_version,
            "automation": _describe(node.automation_condition),
            "checks": sorted(c.name for c in node.check_keys),
        }
    return {
        "assets": assets,
        "jobs": sorted(job.name for job in definitions.resolve_all_job_defs() if not job.name.startswith("__")),
        "sensors": sorted(s.name for s in definitions.sensors or []),  # type: ignore[union-attr]
    }


def test_asset_graph_snapshot(snapshot: Any) -> None:
    assert graph_summary(defs) == snapshot


KINDS = {f"{kind.family}/{kind.name}": kind for kind in registry.kinds()}


@pytest.mark.parametrize("kind_name", sorted(KINDS))
def test_one_factory_makes_every_kinds_guarded_batched_assets(kind_name: str) -> None:
    kind = KINDS[kind_name]
    graph = defs.resolve_asset_graph()
    staged = graph.get(dg.AssetKey(list(kind.staged_key)))
    publish = graph.get(dg.AssetKey(list(kind.publish_key)))
    assert {c.name for c in staged.check_keys} == {f"contract_{t}" for t in kind.tables}
    assets_def = defs.resolve_assets_def(staged.key)
    assert all(spec.blocking for spec in assets_def.check_specs)
    assert assets_def.backfill_policy == dg.BackfillPolicy.single_run()  # N partitions = one run
    assert isinstance(staged.partitions_def, dg.DynamicPartitionsDefinition)
    assert staged.partitions_def.name == kind.qualified
    assert staged.key in publish.parent_keys and spec_source_key(kind) in staged.parent_keys
    assert kind.example  # every kind names a small shipped benchmark for the tests below


def test_results_live_under_their_split_and_the_sensors_run() -> None:
    graph = defs.resolve_asset_graph()
    # Results live under their split: every ERM asset has the split's publish asset upstream.
    erm_keys = [k for k in graph.get_all_asset_keys() if k.path[0] == "erm" and "staged_" in k.path[1]]
    assert erm_keys
    for key in erm_keys:
        kind = next(k for k in registry.kinds() if key == erm_assets.baseline_keys(k)[0])
        assert dg.AssetKey(list(kind.publish_key)) in graph.get(key).parent_keys
    for name in ("shiftbench_partitions", "shiftbench_automation"):
        assert defs.resolve_sensor_def(name).default_status == dg.DefaultSensorStatus.RUNNING
    automated = defs.resolve_sensor_def("shiftbench_automation").asset_selection.resolve(graph)  # type: ignore[union-attr]
    raw = {k for k in graph.get_all_asset_keys() if k.path[0] == "raw" and not k.path[1].endswith("_specs")}
    assert raw and raw <= automated  # the nightly observation of raw files runs under the daemon too
    assert not defs.schedules  # observation is driven by the automation, not by wall-clock schedules


def test_erm_assets_exist_only_where_images_are(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SHIFTBENCH_IMAGENET_DIR", raising=False)
    monkeypatch.delenv("SHIFTBENCH_IMAGENET21K_DIR", raising=False)
    monkeypatch.delenv("SHIFTBENCH_GQA_SCENE_GRAPHS", raising=False)
    keys = {k.to_user_string() for k in build_definitions().resolve_asset_graph().get_all_asset_keys()}
    assert "erm/conds_case_baseline" in keys and "erm/metashift_task_baseline" in keys  # sprites, stand-ins
    assert "erm/breeds_benchmark_baseline" not in keys  # BREEDS trains on ImageNet's train images
    monkeypatch.setenv("SHIFTBENCH_IMAGENET21K_DIR", str(tmp_path))  # ImageNet-21k's images are enough too
    keys = {k.to_user_string() for k in build_definitions().resolve_asset_graph().get_all_asset_keys()}
    assert "erm/breeds_benchmark_baseline" in keys
    monkeypatch.delenv("SHIFTBENCH_IMAGENET21K_DIR")
    monkeypatch.setenv("SHIFTBENCH_IMAGENET_DIR", str(tmp_path))
    keys = {k.to_user_string() for k in build_definitions().resolve_asset_graph().get_all_asset_keys()}
    assert "erm/breeds_benchmark_baseline" in keys


def test_the_code_location_imports_without_torch() -> None:
    code = "import sys, shiftbench.pipelines.definitions; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=PROJECT, timeout=120).returncode == 0


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


# -- running the code location -------------------------------------------------------------------------
def test_sources_are_asset_spec_external_assets_not_source_assets() -> None:
    """Dagster deprecates SourceAsset: every source is an AssetSpec-based observable external asset."""
    assert not [a for a in defs.assets or [] if isinstance(a, dg.SourceAsset)]
    graph = defs.resolve_asset_graph()
    sources = [graph.get(k) for k in graph.get_all_asset_keys() if k.path[0] == "raw"]
    assert sources and all(node.is_observable and not node.is_materializable for node in sources)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """An in-memory instance: the same storage classes as the daemon's SQLite ones (SQL over SQLite), without a
    connection per query and a file per run (the tests of the CLI's own instance use ``DagsterInstance.get()``)."""
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def settings_resource(settings: Settings) -> Any:
    fields = {name: str(value) for name, value in settings.model_dump().items() if value not in (None, (), False)}
    fields["offline"] = "1" if settings.offline else None
    fields.update({name: str(value) for name, value in settings.family_values.items()})  # the families' own
    return resource_class()(**{k: v for k, v in fields.items() if v is not None})


def sync(instance: dg.DagsterInstance, settings: Settings, cursor: str | None = None) -> str | None:
    """One tick of the partition sensor, applied as the daemon applies it; returns the new cursor."""
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"settings": settings_resource(settings)}
    )
    result = partitions_sensor(context)
    assert isinstance(result, dg.SensorResult) and result.skip_reason is None, result
    for request in result.dynamic_partitions_requests or []:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
    for event in result.asset_events or []:
        instance.report_runless_asset_event(event)
    return result.cursor


def location(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> dg.Definitions:
    """The code location as ``dagster dev`` would load it with ``settings`` in the environment."""
    import os

    from shiftbench.config.settings import variable

    for key in list(os.environ):
        if key.startswith("SHIFTBENCH_"):
            monkeypatch.delenv(key)
    defaults = Settings.parse({})
    for name, value in settings.model_dump().items():
        if value != getattr(defaults, name):
            text = ",".join(map(str, value)) if isinstance(value, tuple) else "1" if value is True else str(value)
            monkeypatch.setenv(variable(name), text)
    for name, value in settings.family_values.items():  # the families' own settings, as they were given
        monkeypatch.setenv(variable(name), str(value))
    return build_definitions()


def run_kind(
    definitions: dg.Definitions,
    instance: dg.DagsterInstance,
    kind: Kind,
    names: list[str],
    *,
    assets: list[dg.AssetKey] | None = None,
    config: dict[str, Any] | None = None,
) -> dg.ExecuteInProcessResult:
    """One run of the kind's job over ``names`` (contiguous in the partitions' order)."""
    job = definitions.resolve_job_def(kind.qualified)
    run_config = {**QUIET, **({"ops": {kind.op_name: {"config": config}}} if config else {})}
    return job.execute_in_process(
        instance=instance,
        tags=dict(zip(RANGE, (names[0], names[-1]), strict=True)),
        run_config=run_config,
        asset_selection=assets,
        raise_on_error=False,
    )


def without_inputs(kind: Kind) -> list[dg.AssetKey]:
    """The kind's staged and publish assets: a run of the kind's job on the inputs an earlier run built."""
    return [dg.AssetKey(list(kind.staged_key)), dg.AssetKey(list(kind.publish_key))]


def published(result: dg.ExecuteInProcessResult, key: tuple[str, str]) -> list[str]:
    """The partitions of ``key`` the run materialized."""
    found = []
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization  # type: ignore[union-attr]
        if materialization.asset_key == dg.AssetKey(list(key)):
            found.append(str(materialization.partition))
    return found


def latest_metadata(instance: dg.DagsterInstance, key: tuple[str, str], partition: str) -> Any:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(list(key)), asset_partitions=[partition]), limit=1
    ).records
    return records[0].event_log_entry.asset_materialization


@pytest.fixture
def real_settings(make_settings: Callable[..., Settings], fixtures: Path) -> Settings:
    """No BREEDS files: WordNet and the shipped calibration, which is the release's hierarchy."""
    return make_settings()


# Built at 2fcd5d1 (before issue 40) and after it: the same ids.
IMAGENET1K_VERSIONS = {
    "entity13": "3574f8943da8fd76", "entity13-good": "e284b6747af2ee09", "entity13-bad": "e2024c6ecd0ea227",
    "entity13-nosplit": "db52002a9d7e2797", "entity30": "44bfd1cd128a8b6f", "entity30-good": "e33d4fe4b8f3fffb",
    "entity30-bad": "498f8f884f692a59", "entity30-nosplit": "1ab5243f461eed96", "living17": "31a12fd1e8f944a5",
    "living17-good": "8d61b0d744f1d932", "living17-bad": "3edce5c5357a9947", "living17-nosplit": "2be2adef5aea850e",
    "nonliving26": "1c09c14bf4a0c669", "nonliving26-good": "c94dc1885cad8764", "nonliving26-bad": "86e3b867ec0fe7f6",
    "nonliving26-nosplit": "96b83fe273781b18",
}  # fmt: skip


def _failing_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every contract check reports a broken rule (a version that must never be published)."""
    import shiftbench.warehouse.publishing as publishing
    from shiftbench.store.contracts import RuleResult

    def broken(tables: Any, only: Any = None) -> dict[str, list[RuleResult]]:
        return {t: [RuleResult(t, "forced_failure", False, 1, "0")] for t in tables}

    monkeypatch.setattr(publishing, "check_tables", broken)


@pytest.mark.slow
@pytest.mark.parametrize("kind_name", sorted(KINDS))
def test_materializing_only_the_publish_asset_after_failed_checks_publishes_nothing(
    make_settings: Callable[..., Settings],
    instance: dg.DagsterInstance,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    kind_name: str,
) -> None:
    settings = make_settings(
        SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(BREEDS_FIXTURE), SHIFTBENCH_SPRITES_PER_COMBINATION="40"
    )
    loc = location(monkeypatch, settings)
    sync(instance, settings)
    kind = KINDS[kind_name]
    benchmark = kind.example
    with monkeypatch.context() as patch:
        _failing_checks(patch)
        staged_run = run_kind(loc, instance, kind, [benchmark])
    assert not staged_run.success
    assert published(staged_run, kind.staged_key) == [benchmark]
    assert published(staged_run, kind.publish_key) == []
    assert {c.passed for c in staged_run.get_asset_check_evaluations()} == {False}

    # What "Materialize selected" on the publish asset does in the UI: it must publish nothing.
    only_publish = run_kind(loc, instance, kind, [benchmark], assets=[dg.AssetKey(list(kind.publish_key))])
    assert not only_publish.success
    assert published(only_publish, kind.publish_key) == []
    assert Store(settings.store_dir).log.latest(benchmark) is None
    errors = [str(e.event_specific_data.error.message) for e in only_publish.all_events if e.is_step_failure]  # type: ignore[union-attr]
    assert any("failed its contract checks" in e and "forced_failure" in e for e in errors), errors

    # The same build with working contracts (on the inputs the first run built).
    healthy = run_kind(loc, instance, kind, [benchmark], assets=without_inputs(kind))
    assert healthy.success and published(healthy, kind.publish_key) == [benchmark]


@pytest.mark.slow
def test_a_broken_table_blocks_publication_and_the_previous_version_stays(
    real_settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    import polars as pl

    from shiftbench.breeds import staging as breeds_family  # where a BREEDS version is staged

    loc = location(monkeypatch, real_settings)
    sync(instance, real_settings)
    kind = registry.family("breeds").kind("benchmark")
    assert run_kind(loc, instance, kind, ["living17"]).success
    good = Store(real_settings.store_dir).log.latest("living17")
    original = breeds_family.build_tables

    def broken(*args: Any, **kwargs: Any) -> dict[str, pl.DataFrame]:
        tables = original(*args, **kwargs)
        sub = tables["breeds_subpopulations"]  # one subclass in both domains
        extra = sub.filter(pl.col("domain") == "source").head(1).with_columns(pl.lit("target").alias("domain"))
        tables["breeds_subpopulations"] = pl.concat([sub, extra])
        return tables

    monkeypatch.setattr(breeds_family, "build_tables", broken)
    result = run_kind(loc, instance, kind, ["living17"], assets=without_inputs(kind))
    assert not result.success
    failed = {c.check_name for c in result.get_asset_check_evaluations() if not c.passed}
    assert "contract_breeds_subpopulations" in failed
    assert published(result, kind.publish_key) == []
    assert Store(real_settings.store_dir).log.latest("living17") == good


@pytest.mark.slow
def test_launchpad_overrides_need_a_new_name_and_build_it_as_its_own_partition(
    real_settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc = location(monkeypatch, real_settings)
    sync(instance, real_settings)
    kind = registry.family("breeds").kind("benchmark")
    refused = run_kind(loc, instance, kind, ["living17"], config={"seed": 3})
    assert not refused.success
    assert Store(real_settings.store_dir).log.latest("living17") is None
    variant = run_kind(
        loc, instance, kind, ["living17"], assets=without_inputs(kind), config={"seed": 3, "publish_as": "living17-s3"}
    )
    assert variant.success
    assert published(variant, kind.publish_key) == ["living17-s3"]  # recorded under its own name
    assert "living17-s3" in instance.get_dynamic_partitions(kind.qualified)
    assert Store(real_settings.store_dir).log.latest("living17") is None  # the paper's name untouched
    with duckdb.connect(str(real_settings.catalog_path), read_only=True) as con:
        row = con.execute("SELECT spec, params->>'seed' FROM benchmarks WHERE benchmark = 'living17-s3'").fetchone()
    assert row == ("living17", "3")


# -- automation ------------------------------------------------------------------------------------------
def evaluate_automation(*, defs: dg.Definitions, instance: dg.DagsterInstance, **kwargs: Any) -> Any:
    """``dg.evaluate_automation_conditions`` with each kind's dynamic partitions read once: they cannot change during
    an evaluation, and Dagster's tester reads them from the storage again for every partitioned subset it writes
    into the cursor (8,500 reads in the three-nights test)."""
    read = instance.get_dynamic_partitions
    seen: dict[str, Any] = {}

    def once(partitions_def_name: str) -> Any:
        if partitions_def_name not in seen:
            seen[partitions_def_name] = read(partitions_def_name)
        return seen[partitions_def_name]

    instance.get_dynamic_partitions = once  # type: ignore[method-assign]
    try:
        return dg.evaluate_automation_conditions(defs=defs, instance=instance, **kwargs)
    finally:
        del instance.get_dynamic_partitions  # type: ignore[method-assign]


def requested(result: Any) -> dict[str, list[str] | None]:
    found: dict[str, list[str] | None] = {}
    for item in result.results:
        if isinstance(item.key, dg.AssetKey) and item.true_subset.size:
            subset = item.true_subset
            found[item.key.to_user_string()] = (
                sorted(str(k) for k in subset.expensively_compute_partition_keys()) if subset.is_partitioned else None
            )
    return found


def execute(
    definitions: dg.Definitions, instance: dg.DagsterInstance, wanted: dict[str, list[str] | None]
) -> list[dg.ExecuteInProcessResult]:
    """Run what the automation requested, the way the daemon groups it (one run per kind's range); their results."""
    from dagster._core.definitions.observe import observe  # not exported in 1.13

    outcomes = []
    graph = definitions.resolve_asset_graph()
    sources = [k for k in wanted if not graph.get(dg.AssetKey.from_user_string(k)).is_materializable]
    if sources:
        observed = [
            a
            for a in definitions.assets or []
            if isinstance(a, dg.AssetsDefinition) and a.is_observable and a.key.to_user_string() in sources
        ]
        outcomes.append(observe(observed, instance=instance, resources=definitions.resources))
    inputs = [k for k in wanted if k not in sources and wanted[k] is None and not k.startswith("erm/")]
    for family in registry.families().values():
        mine = [k for k in inputs if any(k == i.name for i in family.inputs)]
        if mine:
            job = definitions.resolve_job_def(f"{family.name}_inputs")
            keys = [dg.AssetKey.from_user_string(k) for k in mine]
            run = job.execute_in_process(
                instance=instance, asset_selection=keys, run_config=QUIET, raise_on_error=False
            )
            outcomes.append(run)
    for kind in registry.kinds():
        keys = [k for k in ("/".join(kind.staged_key), "/".join(kind.publish_key)) if k in wanted]
        names = sorted({n for k in keys for n in wanted[k] or []})
        order = instance.get_dynamic_partitions(kind.qualified)
        from shiftbench.pipelines.runs import contiguous_blocks

        for block in contiguous_blocks(names, order) if names else []:
            selection = [dg.AssetKey.from_user_string(k) for k in keys]
            outcomes.append(run_kind(definitions, instance, kind, block, assets=selection))
    return outcomes


def test_an_empty_launchpad_value_is_refused_and_max_epochs_is_a_training_parameter() -> None:
    """Launchpad text that is empty read as null, the default (``classes: ""`` built every class): refused, as
    ``--set classes=`` is; ``null`` still clears. The ERM config takes ``max_epochs`` (issue 48)."""
    from shiftbench.assets.factory import config_overrides, overrides_config
    from shiftbench.errors import InputError

    kind = registry.family("metashift").kind("collection")
    with pytest.raises(InputError, match="parameter 'classes': has no value: give one, or null for none"):
        config_overrides(kind, overrides_config(kind)(classes=" "))
    assert config_overrides(kind, overrides_config(kind)(classes="null")) == {"classes": None}
    with pytest.raises(InputError, match="parameter 'init_checkpoint': has no value"):
        erm_assets.training_overrides(erm_assets.BaselineConfig(init_checkpoint=""))
    config = erm_assets.BaselineConfig(max_epochs=3, lr_drop_epochs=[1, 2], max_iters=None)
    assert erm_assets.training_overrides(config) == {"max_epochs": 3, "lr_drop_epochs": [1, 2]}


@pytest.mark.slow
def test_three_nights_without_celeba_request_nothing_that_fails_and_one_run_publishes_every_breeds_benchmark(
    real_settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The automation over every partition the real settings have (no CelebA folder): three nights request nothing
    that fails, the first builds every kind's partitions in one run per kind, and the BREEDS run publishes every
    benchmark with its results per partition (then checked as :func:`_every_breeds_benchmark_published` says)."""
    loc = location(monkeypatch, real_settings)
    start = datetime(2030, 1, 1, 2, 0)
    cursor = sync(instance, real_settings)
    assert not any(name.startswith("celeba") for name in instance.get_dynamic_partitions("conds_cases")), (
        "CelebA without its folder has no partitions"
    )
    evaluation = evaluate_automation(defs=loc, instance=instance, evaluation_time=start)
    assert evaluation.total_requested == 0  # nothing before the first nightly tick
    runs: list[dg.ExecuteInProcessResult] = []
    built: set[str] = set()
    for night in range(3):
        tick = start + timedelta(days=night, hours=1, minutes=1)
        for step in range(4 if night == 0 else 2):  # the tick, then the evaluations after each round of runs
            cursor = sync(instance, real_settings, cursor)
            evaluation = evaluate_automation(
                defs=loc, instance=instance, evaluation_time=tick + timedelta(minutes=step), cursor=evaluation.cursor
            )
            wanted = requested(evaluation)
            assert not any("celeba" in str(v) for v in wanted.values())
            if night > 0:  # later nights only observe the unchanged sources
                assert all(key.startswith("raw/") for key in wanted), wanted
            built |= set(wanted)
            runs += execute(loc, instance, wanted)
    assert runs and all(run.success for run in runs), "a run the automation requested failed"
    for kind in registry.kinds():
        assert "/".join(kind.publish_key) in built
    assert not [k for k in built if k.startswith("erm/")]  # baselines are never started by automation
    _every_breeds_benchmark_published(loc, instance, real_settings, runs)


def _every_breeds_benchmark_published(
    loc: dg.Definitions, instance: dg.DagsterInstance, settings: Settings, runs: list[dg.ExecuteInProcessResult]
) -> None:
    """Every BREEDS partition in one run with its checks per partition; the papers' splits and version ids; an
    unchanged rebuild; a range of only ImageNet-21k partitions, as the UI launches it."""
    kind = registry.family("breeds").kind("benchmark")
    partitions = instance.get_dynamic_partitions(kind.qualified)
    beyond = [name for name in partitions if "@" in name]  # ImageNet-21k and CIFAR-100 (issue 40): after the 16
    assert len(partitions) == 16 + 9 and partitions[16:] == beyond
    (result,) = [run for run in runs if run.job_def.name == kind.qualified]  # N partitions = one run
    assert sorted(published(result, kind.publish_key)) == sorted(partitions)
    checks = result.get_asset_check_evaluations()
    assert all(c.passed for c in checks) and {c.partition for c in checks} == set(partitions)
    assert len([c for c in checks if c.partition in partitions[:16]]) == 16 * 5  # five contract tables per benchmark
    living17 = latest_metadata(instance, kind.publish_key, "living17")
    meta = living17.metadata
    assert meta["became_latest"].value is True and meta["dagster/row_count"].value == 17 * 4 * 50
    assert "data:image/png;base64," in meta["subclasses_per_superclass"].value
    assert len(meta["subclasses_per_domain"].value.records) == 17
    assert living17.tags["dagster/data_version"] == meta["version"].value

    assert meta["card"].value.startswith("# living17\n") and "subclass_distance_mean" in meta["card"].value
    published_splits = json.loads(PUBLISHED_SPLITS.read_text())["benchmarks"]
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        for name, expected in published_splits.items():
            rows = con.execute(
                "SELECT y, domain, list(subclass_wnid ORDER BY rank) FROM breeds_subpopulations "
                "WHERE benchmark = ? GROUP BY ALL ORDER BY y, domain",
                [name],
            ).fetchall()
            assert rows == [(s["label"], d, s[d]) for s in expected["superclasses"] for d in ("source", "target")]

        # The ImageNet-1k benchmarks keep the version ids they had before ImageNet-21k (issue 40).
        versions = dict(con.execute("SELECT benchmark, version FROM benchmarks").fetchall())
    assert {name: versions.get(name) for name in partitions[:16]} == IMAGENET1K_VERSIONS

    assert run_kind(loc, instance, kind, ["living17"], assets=without_inputs(kind)).success  # unchanged: same version
    again = latest_metadata(instance, kind.publish_key, "living17").metadata
    assert again["version"].value == meta["version"].value and again["became_latest"].value is False

    # A 21k and the novel partition in one run (the job with its inputs), as the UI's range selection launches them.
    in21k = [name for name in beyond if name.endswith("@in21k")][-2:]
    assert in21k[-1] == "living17-novel@in21k" and run_kind(loc, instance, kind, in21k).success
    novel = latest_metadata(instance, kind.publish_key, "living17-novel@in21k").metadata
    assert "ImageNet-21k classes outside the 1k" in novel["card"].value
    assert "Images: none listed" in novel["card"].value


@pytest.mark.slow
def test_a_changed_spec_requests_exactly_its_benchmark_and_the_results_trained_on_it(
    make_settings: Callable[..., Settings],
    instance: dg.DagsterInstance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec_file = tmp_path / "mine.yaml"  # the birds of Living-17's level: 2 superclasses, 400 examples
    spec_file.write_text(
        "family: breeds\nbenchmarks:\n  mine:\n    level: 5\n    ancestor: n01503061\n    n_subclasses: 4\n"
    )
    from shiftbench.sources.imagenet import imagenet_classes

    imagenet = tmp_path / "imagenet"  # an ImageNet-style root: train/<wnid>/ listed, never opened
    for wnid in imagenet_classes()["wnid"].to_list():
        (imagenet / "train" / wnid).mkdir(parents=True)
        (imagenet / "train" / wnid / f"{wnid}_0.JPEG").touch()
    settings = make_settings(
        SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(BREEDS_FIXTURE),
        SHIFTBENCH_BREEDS_SPECS=str(spec_file),
        SHIFTBENCH_IMAGENET_DIR=str(imagenet),
    )
    loc = location(monkeypatch, settings)
    cursor = sync(instance, settings)
    kind = registry.family("breeds").kind("benchmark")
    # Mine, and a shipped benchmark built beside it: the changed spec must request mine and not living17.
    assert run_kind(loc, instance, kind, ["living17"]).success  # the inputs, then living17
    assert run_kind(loc, instance, kind, ["mine"], assets=without_inputs(kind)).success

    # A baseline trained on the split (stand-in images, a few iterations); its asset exists here
    # because SHIFTBENCH_IMAGENET_DIR is set.
    staged_erm, publish_erm = erm_assets.baseline_keys(kind)
    job = loc.resolve_job_def(erm_assets.baseline_job_name(kind))
    config = {"image_root": "standin", "preset": "smoke", "max_iters": 6, "eval_every": 3, "in_process": True}
    partition = dg.MultiPartitionKey({"benchmark": "mine", "seed": "0"})
    trained = job.execute_in_process(
        instance=instance,
        partition_key=partition,
        asset_selection=[staged_erm],
        run_config={**QUIET, "ops": {"erm__breeds_benchmark_baseline": {"config": config}}},
    )
    assert trained.success
    # Publish-only with no config (what the automation and a click in the UI launch) publishes exactly
    # the results the staged asset recorded: a 6-iteration smoke run, named apart from the preset's.
    recorded = trained.asset_materializations_for_node("erm__breeds_benchmark_baseline")[0].metadata
    run, version = str(recorded["run"].value), str(recorded["version"].value)
    assert run.startswith("mine.smoke-")
    published = job.execute_in_process(instance=instance, partition_key=partition, asset_selection=[publish_erm])
    assert published.success
    latest = Store(settings.store_dir).log.latest(run)
    assert latest is not None and latest.version == version
    with_erm = loc
    evaluation = evaluate_automation(defs=with_erm, instance=instance, evaluation_time=datetime(2030, 1, 1, 12))
    assert requested(evaluation) == {}

    spec_file.write_text(spec_file.read_text().replace("n_subclasses: 4", "n_subclasses: 4\n    seed: 3"))
    cursor = sync(instance, settings, cursor)
    evaluation = evaluate_automation(
        defs=with_erm, instance=instance, evaluation_time=datetime(2030, 1, 1, 12, 1), cursor=evaluation.cursor
    )
    assert requested(evaluation) == {"breeds/staged_benchmark": ["mine"], "breeds/benchmark": ["mine"]}
    assert all(run.success for run in execute(loc, instance, requested(evaluation)))
    evaluation = evaluate_automation(
        defs=with_erm, instance=instance, evaluation_time=datetime(2030, 1, 1, 12, 2), cursor=evaluation.cursor
    )
    key = str(dg.MultiPartitionKey({"benchmark": "mine", "seed": "0"}))
    # The split's new version makes its results stale: retrain them, and refresh the analysis that reads them
    # (again once the retrained results publish).
    assert requested(evaluation) == {
        staged_erm.to_user_string(): [key],
        publish_erm.to_user_string(): [key],
        "analysis/breeds_source_vs_target": None,
        "analysis/breeds_architectures": None,
        "analysis/breeds_interventions": None,
    }
    # The retrain the automation launches has no config: it reuses the last run's settings (stand-in
    # images, the smoke preset, 6 iterations), so it succeeds and publishes under the same run name.
    retrained = job.execute_in_process(instance=instance, partition_key=partition, raise_on_error=False)
    assert retrained.success
    again = retrained.asset_materializations_for_node("erm__breeds_benchmark_baseline")[0].metadata
    assert str(again["run"].value) == run and str(again["version"].value) != version  # a new split, new results


@pytest.mark.slow
def test_starting_the_automation_after_a_build_requests_nothing(
    real_settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build records the spec and source versions it read, so the sensor's first observations of
    them (when `dagster dev` starts) are no change: nothing is rebuilt for nothing."""
    loc = location(monkeypatch, real_settings)
    kind = registry.family("breeds").kind("benchmark")
    instance.add_dynamic_partitions(kind.qualified, ["living17"])
    assert run_kind(loc, instance, kind, ["living17"]).success
    evaluation = evaluate_automation(defs=loc, instance=instance, evaluation_time=datetime(2030, 1, 1, 9))
    cursor = sync(instance, real_settings)  # the partition sensor's first tick observes every spec
    for minute in (1, 2):
        evaluation = evaluate_automation(
            defs=loc, instance=instance, evaluation_time=datetime(2030, 1, 1, 9, minute), cursor=evaluation.cursor
        )
        assert requested(evaluation) == {}
        cursor = sync(instance, real_settings, cursor)


def test_observing_a_spec_partition_reports_the_sensors_data_version(
    real_settings: Settings, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagster._core.definitions.observe import observe  # not exported in 1.13

    loc = location(monkeypatch, real_settings)
    sync(instance, real_settings)
    kind = registry.family("breeds").kind("benchmark")
    key = spec_source_key(kind)
    by_sensor = instance.get_latest_data_version_record(key, partition_key="living17")
    assert by_sensor is not None
    source = next(a for a in loc.assets or [] if isinstance(a, dg.AssetsDefinition) and key in a.keys)
    result = observe([source], instance=instance, resources=loc.resources, partition_key="living17")
    assert result.success
    tags = result.asset_observations_for_node(source.op.name)[0].tags
    assert tags["dagster/data_version"] == by_sensor.asset_observation.tags["dagster/data_version"]  # type: ignore[union-attr]


# -- what the UI shows, and failures that keep their evidence -------------------------------------------------
UI_ASSETS = """{ assetNodes { assetKey { path } isPartitioned partitionKeys staleStatus
  staleCauses { key { path } reason dependency { path } }
  assetMaterializations(limit: 1) { metadataEntries { label ... on TextMetadataEntry { text }
    ... on IntMetadataEntry { intValue } ... on MarkdownMetadataEntry { mdStr } } } } }"""
UI_PARTITIONS = """query ($key: AssetKeyInput!, $partitions: [String!]!) { assetNodeOrError(assetKey: $key) {
  ... on AssetNode { staleStatusByPartition(partitions: $partitions)
    staleCausesByPartition(partitions: $partitions) { key { path } reason dependency { path } } } } }"""


@contextmanager
def ui(instance: dg.DagsterInstance) -> Iterator[Callable[..., Any]]:
    """Queries answered as the UI's own GraphQL endpoint answers them, over the code location as `dagster dev`
    loads it (location ``shiftbench``, built for the current environment)."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster_graphql.test.utils import execute_dagster_graphql

    target = LoadableTargetOrigin(
        module_name="shiftbench.pipelines.definitions", attribute="build_definitions", working_directory=str(PROJECT)
    )
    origin = InProcessCodeLocationOrigin(target, location_name="shiftbench")
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as process:

        def query(text: str, variables: dict[str, Any] | None = None) -> Any:
            return execute_dagster_graphql(process.create_request_context(), text, variables).data

        yield query


def ui_stale(instance: dg.DagsterInstance) -> dict[str, list[tuple[str, str]]]:
    """Every asset (and partition) the UI shows as stale, with its causes (what, why)."""
    found: dict[str, list[tuple[str, str]]] = {}
    with ui(instance) as query:
        for node in query(UI_ASSETS)["assetNodes"]:
            name = "/".join(node["assetKey"]["path"])
            if node["staleStatus"] == "STALE":
                found[name] = [("/".join(c["key"]["path"]), c["reason"]) for c in node["staleCauses"]]
            if not (node["isPartitioned"] and node["partitionKeys"]):
                continue
            answer = query(UI_PARTITIONS, {"key": node["assetKey"], "partitions": node["partitionKeys"]})
            by_partition = answer["assetNodeOrError"]
            statuses = zip(node["partitionKeys"], by_partition["staleStatusByPartition"], strict=True)
            for (partition, status), why in zip(statuses, by_partition["staleCausesByPartition"], strict=True):
                if status == "STALE":
                    found[f"{name}[{partition}]"] = [("/".join(c["key"]["path"]), c["reason"]) for c in why]
    return found


def _score_every_example(settings: Settings, benchmark: str, path: Path) -> None:
    """A predictions file right on every example of the benchmark's latest version (results outside Dagster)."""
    import polars as pl

    store = Store(settings.store_dir)
    latest = store.log.latest(benchmark)
    assert latest is not None
    examples = pl.read_parquet(store.layout.staged("conds", benchmark, latest.version).table_path("examples"))
    examples.select("example_id", pl.col("y").alias("y_pred")).write_parquet(path)


@pytest.mark.slow
def test_after_a_fresh_cli_build_the_ui_shows_the_published_analyses_and_nothing_stale(
    cli_env: Callable[..., Settings],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from shiftbench.pipelines import runs
    from shiftbench.pipelines.cli import main

    settings = cli_env(SHIFTBENCH_SPRITES_PER_COMBINATION="40")
    assert main(["build", "conds", "--benchmark", "sprites-uniform"]) == 0  # inputs, stage, check, publish
    _score_every_example(settings, "sprites-uniform", tmp_path / "predictions.parquet")
    assert main(["eval", "sprites-uniform", str(tmp_path / "predictions.parquet"), "--method", "oracle"]) == 0
    capsys.readouterr()
    assert main(["analyse"]) == 0
    out = capsys.readouterr().out
    instance = dg.DagsterInstance.get()  # the CLI's instance, which `dagster dev` shows

    with ui(instance) as query:
        nodes = {"/".join(n["assetKey"]["path"]): n for n in query(UI_ASSETS)["assetNodes"]}
    store, shown = Store(settings.store_dir), 0
    for name, analysis in registry.analyses().items():
        node = nodes["analysis/" + name.replace("-", "_")]
        latest = store.log.latest(name) if store.layout.benchmark_dir("analysis", name).is_dir() else None
        if latest is None:  # nothing published: "Never materialized" is the truth
            assert node["assetMaterializations"] == [] and node["staleStatus"] == "MISSING"
            assert f"{name}: no results yet" in out
            continue
        assert node["assetMaterializations"], f"{name} published {latest.version}; the UI says never materialized"
        entries = {e["label"]: e for e in node["assetMaterializations"][0]["metadataEntries"]}
        assert entries["version"]["text"] == latest.version  # what the store published, as the asset records it
        assert entries["rows"]["intValue"] > 0 and f"{name}: version {latest.version}" in out
        assert entries["plot"]["mdStr"].startswith(f"![{analysis.title}](data:image/png;base64,")
        assert {"table", "duckdb_query", "path"} <= set(entries)
        shown += 1
    assert shown == 2  # the two ConDS analyses have results (the BREEDS and MetaShift ones have none)
    assert ui_stale(instance) == {}  # nothing stale right after the build (the inputs' sources were)

    # A raw source that really changed shows: other sprites (a new generator seed), observed as at the nightly
    # tick or by "Observe sources", make the input built from the old ones stale, and only it.
    monkeypatch.setenv("SHIFTBENCH_SPRITES_SEED", "1")
    assert runs.run_job(instance, "observe_sources").is_success
    assert ui_stale(instance) == {"conds/attribute_tables": [("raw/conds_attribute_sources", "has a new data version")]}


def _run_log(instance: dg.DagsterInstance) -> tuple[list[str], dict[str, str], str]:
    """The last run's logged messages, the metadata of its step failure (as text) and its error with the stack."""
    run = instance.get_runs(limit=1)[0]
    entries = instance.all_logs(run.run_id)
    failures = [
        e.dagster_event.step_failure_data for e in entries if e.dagster_event and e.dagster_event.is_step_failure
    ]
    metadata = {
        k: str(v.value) for f in failures if f.user_failure_data for k, v in f.user_failure_data.metadata.items()
    }
    errors = "\n".join(f.error.to_string() for f in failures if f.error is not None)
    return [e.user_message for e in entries], metadata, errors


@pytest.mark.slow
def test_a_bug_keeps_its_traceback_in_the_runs_log_and_on_the_terminal(
    cli_env: Callable[..., Settings],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The CLI's rule (pipelines/cli/app.py): a failure of shiftbench itself is one line for the user, and its
    traceback is kept for the report, in the run's log and on the terminal: inside one benchmark's build (the
    others still publish), in an analysis and in a training run."""
    from shiftbench.conds import build as conds_build
    from shiftbench.pipelines.cli import main

    settings = cli_env(SHIFTBENCH_SPRITES_PER_COMBINATION="40")
    original = conds_build.case_tables

    def case_tables_with_a_bug(case: Any, *args: Any) -> Any:
        if case.name == "sprites-sc-object_color":
            return {}["a key a builder forgot"]
        return original(case, *args)

    monkeypatch.setattr(conds_build, "case_tables", case_tables_with_a_bug)
    assert main(["build", "conds", "--benchmark", "sprites-uniform", "--benchmark", "sprites-sc-object_color"]) == 1
    out, err = capfd.readouterr()
    assert "[2/2] sprites-sc-object_color: error: KeyError: 'a key a builder forgot'; nothing published" in err
    assert "[1/2] sprites-uniform: version" in out and "1 of 2 published" in out  # the others go on
    traceback = err[err.index("Traceback (most recent call last)") : err.index("[2/2] sprites-sc-object_color")]
    assert "case_tables_with_a_bug" in traceback and traceback.rstrip().endswith("KeyError: 'a key a builder forgot'")
    messages, failure, _ = _run_log(dg.DagsterInstance.get())
    assert any("case_tables_with_a_bug" in m and "sprites-sc-object_color" in m for m in messages)  # the run's log
    assert "case_tables_with_a_bug" in failure["traceback sprites-sc-object_color"]  # on the run's failure, in the UI

    # An analysis whose code fails: the run fails, the terminal shows the traceback and one line.
    import shiftbench.assets.analysis

    def publish_with_a_bug(*args: Any) -> Any:
        raise ZeroDivisionError("an analysis divided by zero")

    monkeypatch.setattr(shiftbench.assets.analysis, "publish_analysis", publish_with_a_bug)
    assert main(["analyse", "conds-accuracy-by-shift"]) == 1
    err = capfd.readouterr().err
    assert "conds-accuracy-by-shift: error: ZeroDivisionError: an analysis divided by zero; nothing published" in err
    assert "Traceback" in err and "publish_with_a_bug" in err
    _, _, error = _run_log(dg.DagsterInstance.get())
    assert "publish_with_a_bug" in error and "ZeroDivisionError" in error  # Dagster keeps the stack in the run's log
    assert Store(settings.store_dir).layout.benchmark_dir("analysis", "conds-accuracy-by-shift").is_dir() is False

    # A training run (in process here; through Pipes the job's own process prints its traceback).
    import shiftbench.erm.job

    def training_with_a_bug(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the training loop")

    monkeypatch.setattr(shiftbench.erm.job, "run_job", training_with_a_bug)
    assert main(["train", "sprites-uniform", "--preset", "smoke", "--in-process"]) == 1
    err = capfd.readouterr().err
    assert "error: RuntimeError: a bug in the training loop; nothing was published" in err
    assert "training_with_a_bug" in err[: err.index("error: RuntimeError")]  # the traceback, then the line
    assert "training_with_a_bug" in _run_log(dg.DagsterInstance.get())[2]

    # Through Pipes (the default): a bug in the training job's own process. Its process prints the traceback and
    # Pipes records it in the run's log; the CLI's line is what the job raised, not "External execution ... failed".
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import shiftbench.erm.train as t\n"
        "def train_with_a_bug(*args, **kwargs):\n    raise RuntimeError('a bug in the training job')\n"
        "t.train = train_with_a_bug\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))  # read by the job's process only
    assert main(["train", "sprites-uniform", "--preset", "smoke"]) == 1
    err = capfd.readouterr().err
    assert "error: RuntimeError: a bug in the training job; nothing was published" in err
    assert "External execution" not in err
    assert "train_with_a_bug" in err[: err.index("error: RuntimeError")]  # printed by the job's process
    instance = dg.DagsterInstance.get()
    run = instance.get_runs(limit=1)[0]
    recorded = [e.dagster_event.engine_event_data.error for e in instance.all_logs(run.run_id) if e.dagster_event
                and e.dagster_event.is_engine_event and e.dagster_event.engine_event_data.error]  # fmt: skip
    assert any("train_with_a_bug" in "".join(error.stack) for error in recorded)  # kept by Pipes in the run's log


def test_a_bad_setting_keeps_every_asset_and_fails_the_runs_that_read_it(
    make_settings: Callable[..., Settings], instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad value is not an unset one: the code location offers the same graph (every family's ERM assets where
    their images are configured, the same jobs), and each run that reads the settings fails with its one line."""
    settings = make_settings(SHIFTBENCH_IMAGENET_DIR="/srv/imagenet")  # BREEDS trains here: its ERM asset exists
    good = location(monkeypatch, settings)
    for variable, value in [("SHIFTBENCH_SPRITES_PER_COMBINATION", "many"), ("SHIFTBENCH_OFFLINE", "maybe")]:
        monkeypatch.setenv(variable, value)
        bad = build_definitions()
        assert graph_summary(bad) == graph_summary(good)
        assert {"erm/breeds_benchmark_baseline", "erm/conds_case_baseline"} <= set(graph_summary(bad)["assets"])
        expected = f"parameter '{variable}': must be a valid"
        job = bad.resolve_job_def("conds_inputs")
        result = job.execute_in_process(instance=instance, run_config=QUIET, raise_on_error=False)
        assert not result.success
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        error = failure.event_specific_data.error  # type: ignore[union-attr]
        while error.cause is not None:
            error = error.cause
        assert error.cls_name == "InputError" and error.message.startswith(f"shiftbench.errors.InputError: {expected}")
        monkeypatch.delenv(variable)
    assert not instance.get_latest_materialization_event(dg.AssetKey(["conds", "attribute_tables"]))


@pytest.mark.slow
def test_a_staged_benchmark_goes_stale_on_a_changed_spec_not_on_an_input_rebuilt_the_same(
    cli_env: Callable[..., Settings], tmp_path: Path
) -> None:
    """Staged versions record what they were built from as Dagster's provenance: building another benchmark
    materializes the inputs again (same content) and leaves the first fresh; a changed spec, observed by the
    partition sensor, makes exactly its benchmark stale."""
    from shiftbench.pipelines.cli import main

    spec_file = tmp_path / "mine.yaml"
    spec = "family: breeds\nbenchmarks:\n  {name}:\n    level: 5\n    ancestor: n01503061\n    n_subclasses: 4\n"
    spec_file.write_text(spec.format(name="mine") + spec.format(name="yours").split("benchmarks:\n")[1])
    settings = cli_env(SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(BREEDS_FIXTURE), SHIFTBENCH_BREEDS_SPECS=str(spec_file))
    assert main(["build", "breeds", "--benchmark", "mine"]) == 0
    assert main(["build", "breeds", "--benchmark", "yours"]) == 0  # the inputs again, after mine was staged
    instance = dg.DagsterInstance.get()
    cursor = sync(instance, settings)  # the partition sensor's first tick (`dagster dev` starting)
    assert ui_stale(instance) == {}

    spec_file.write_text(spec_file.read_text().replace("n_subclasses: 4\n", "n_subclasses: 4\n    seed: 3\n", 1))
    sync(instance, settings, cursor)
    assert ui_stale(instance) == {
        "breeds/staged_benchmark[mine]": [("raw/breeds_benchmark_specs", "has a new data version")]
    }
