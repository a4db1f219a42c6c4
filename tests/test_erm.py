"""ERM baselines: metrics against hand-computed values, models, the spurious-correlation phenomenon on
the generated sprites (and its absence under the uniform case), determinism, the Dagster Pipes path,
the CLI, the ImageFolder export, stand-in images, and clear errors that publish nothing."""

# long: one subject (the ERM baseline end to end) whose tests share one published sprites warehouse (warehouse)

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import polars as pl
import pytest
import torch

from shiftbench.conds.specs import load_specs
from shiftbench.config.settings import Settings
from shiftbench.erm import launch
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.models import build_model, load_checkpoint
from shiftbench.erm.train import resolve_device
from shiftbench.errors import InputError
from shiftbench.scoring.metrics import gap_metrics, split_metrics
from shiftbench.splits import published as splits
from shiftbench.splits.split_table import read_split
from shiftbench.store import Store
from shiftbench.store.contracts import failures
from shiftbench.warehouse.publishing import check_version, publish_staged

from .conftest import small_sprites_home, stage_one

SPECS = load_specs()
CASES = ("sprites-uniform", "sprites-sc-object_color")
# One torch thread: a run's default (every core) oversubscribes the workers of a parallel test run. How a run
# executes, not what it learns: the run keeps its name (shiftbench.erm.config.EXECUTION_ONLY).
ONE_THREAD, ONE_THREAD_ARGS = {"threads": 1}, ["--set", "threads=1"]
FAST = {"max_iters": 20, "eval_every": 10, **ONE_THREAD}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Two published sprites cases (40 images per combination, 432 train + id_val examples)."""
    return small_sprites_home(tmp_path_factory.mktemp("erm_home"), *CASES, own_images=True)  # one is moved below


def _metrics(outcome: launch.PublishOutcome) -> dict[tuple[str, str], float | None]:
    frame = pl.read_parquet(outcome.staged.table_path("erm_results"))
    return {(r["eval_split"], r["metric"]): r["value"] for r in frame.iter_rows(named=True)}


def test_metrics_match_hand_computed_values_with_an_empty_group() -> None:
    groups = ["a", "b", "c"]  # c has no example in this split
    y_true = np.array([0, 0, 1, 1, 1])
    y_pred = np.array([0, 1, 1, 1, 0])
    losses = np.array([0.1, 2.0, 0.2, 0.3, 1.5])
    group = np.array([0, 0, 1, 1, 1])
    got = {(m.metric, m.group): m.value for m in split_metrics("test", y_true, y_pred, losses, group, groups)}
    assert got[("count", None)] == 5
    assert got[("acc_avg", None)] == pytest.approx(3 / 5)
    assert got[("loss_avg", None)] == pytest.approx(4.1 / 5)
    assert got[("acc_group:a", "a")] == pytest.approx(1 / 2) and got[("count_group:a", "a")] == 2
    assert got[("acc_group:b", "b")] == pytest.approx(2 / 3) and got[("count_group:b", "b")] == 3
    assert got[("acc_group:c", "c")] is None and got[("count_group:c", "c")] == 0
    assert got[("acc_wg", "a")] == pytest.approx(1 / 2)  # the empty group is never the worst
    empty = {m.metric: m.value for m in split_metrics("val", *(np.zeros(0, int),) * 4, groups)}
    assert empty["count"] == 0 and empty["acc_avg"] is None and empty["acc_wg"] is None
    with_id = split_metrics("id_test", y_true, y_true, losses, group, groups)  # ID accuracy 1.0
    ood = split_metrics("test", y_true, y_pred, losses, group, groups)
    gaps = {(m.eval_split, m.metric): m.value for m in gap_metrics([*with_id, *ood])}
    assert gaps[("test", "acc_gap:id_test")] == pytest.approx(1 - 3 / 5)
    assert gaps[("test", "acc_relative:id_test")] == pytest.approx(3 / 5)
    id_val = split_metrics("id_val", y_true, y_true, losses, group, groups)
    assert ("test", "acc_gap:id_val") in {(m.eval_split, m.metric) for m in gap_metrics([*id_val, *ood])}


def test_models_have_torchvision_names_and_load_user_checkpoints(tmp_path: Path) -> None:
    x = torch.zeros(2, 3, 64, 64)
    for name, size in (("resnet18", 64), ("resnet50", 64), ("small_cnn", 64), ("mlp", 64)):
        model = build_model(name, 5, size).eval()
        assert model(x).shape == (2, 5), name
    resnet = build_model("resnet18", 5, 64)
    names = set(resnet.state_dict())
    assert {"conv1.weight", "layer1.0.conv1.weight", "layer4.1.bn2.running_var", "fc.weight"} <= names
    assert sum(p.numel() for p in resnet.parameters()) == 11_179_077  # torchvision resnet18 at 5 classes
    other = build_model("resnet18", 1000, 64)
    checkpoint = tmp_path / "pretrained.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in other.state_dict().items()}}, checkpoint)
    report = load_checkpoint(resnet, checkpoint, keep_head=False)
    assert report.left_at_init == ["fc.bias", "fc.weight"] and not report.ignored
    assert torch.equal(resnet.state_dict()["layer1.0.conv1.weight"], other.state_dict()["layer1.0.conv1.weight"])
    with pytest.raises(InputError, match=r"shape mismatch for fc\.weight.*init_partial=true"):
        load_checkpoint(resnet, checkpoint, keep_head=True)
    # Partial loading, when asked for: the 1000-class head is left at init and recorded.
    report = load_checkpoint(resnet, checkpoint, keep_head=True, partial=True)
    assert report.left_at_init == ["fc.bias", "fc.weight"] and report.ignored == ["fc.bias", "fc.weight"]
    # A checkpoint that does not cover the model is refused; one that sets nothing is refused even when partial.
    torch.save({"conv1.weight": other.state_dict()["conv1.weight"]}, tmp_path / "part.pt")
    with pytest.raises(InputError, match=r"covers 1 of \d+ entries of the model, e\.g\. not bn1\.weight"):
        load_checkpoint(resnet, tmp_path / "part.pt", keep_head=True)
    assert load_checkpoint(resnet, tmp_path / "part.pt", keep_head=True, partial=True).loaded == ["conv1.weight"]
    torch.save({}, tmp_path / "empty.pt")
    for partial in (False, True):
        with pytest.raises(InputError, match=r"covers 0 of|sets none of the model's parameters"):
            load_checkpoint(resnet, tmp_path / "empty.pt", keep_head=True, partial=partial)
    torch.save({**resnet.state_dict(), "extra.weight": torch.zeros(1)}, tmp_path / "extra.pt")
    with pytest.raises(InputError, match=r"1 parameters do not belong to this model, e\.g\. extra\.weight"):
        load_checkpoint(resnet, tmp_path / "extra.pt", keep_head=True)
    with pytest.raises(InputError, match="unknown model 'vit'"):
        build_model("vit", 5, 64)


def test_training_parameters_are_checked_by_name() -> None:
    with pytest.raises(InputError, match="parameter 'learning_rate'"):
        TrainConfig.from_mapping({"learning_rate": 0.1})
    with pytest.raises(InputError, match="parameter 'lr'"):
        TrainConfig.from_mapping({"lr": "fast"})
    with pytest.raises(InputError, match="parameter 'loader'"):
        TrainConfig.from_mapping({"loader": "weighted"})
    assert TrainConfig.from_mapping({"lr": "5e-5", "lr_milestones": "10,20"}).lr_milestones == (10, 20)
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="a GPU was requested"):
            resolve_device("cuda")


def test_spurious_correlation_breaks_ood_accuracy_and_uniform_training_does_not(warehouse: Settings) -> None:
    """The papers' phenomenon on a CPU: with colour aligned to shape in 99% of training images, the model
    is right in distribution and at chance on the uniform test set; trained uniformly, it is not."""
    result = {}
    for name in CASES:
        # Half the smoke preset's 300 iterations: the same selected iterate on the SC case (id_val 0.95, test 0.34).
        plan = launch.plan_run(warehouse, name, preset="smoke", seed=0, overrides={"max_iters": 150, **ONE_THREAD})
        outcome, summary = launch.train_in_process(warehouse, plan, launch.scratch_dir(warehouse, plan), log=print)
        result[name] = _metrics(outcome)
        assert summary["selection_split"] == "id_val"
    sc, uniform = result["sprites-sc-object_color"], result["sprites-uniform"]
    assert sc[("id_val", "acc_avg")] >= 0.9
    assert sc[("test", "acc_avg")] <= sc[("id_val", "acc_avg")] - 0.4
    assert sc[("test", "acc_wg")] <= 0.1  # a cell whose colour points to another shape
    assert sc[("test", "acc_gap:id_val")] >= 0.4
    assert abs(uniform[("test", "acc_gap:id_val")]) <= 0.15  # same distribution: no gap beyond noise
    assert uniform[("test", "acc_avg")] >= sc[("test", "acc_avg")] - 0.05


def test_a_seed_gives_the_same_results_version_on_cpu(warehouse: Settings) -> None:
    plan = launch.plan_run(warehouse, "sprites-uniform", preset="smoke", seed=3, overrides=FAST)
    first, _ = launch.train_in_process(warehouse, plan, launch.scratch_dir(warehouse, plan), log=print)
    again, _ = launch.train_in_process(warehouse, plan, launch.scratch_dir(warehouse, plan), log=print)
    assert first.staged.version == again.staged.version and not again.staged.created
    other = launch.plan_run(warehouse, "sprites-uniform", preset="smoke", seed=4, overrides=FAST)
    assert first.staged.benchmark == plan.run and other.run != plan.run  # another seed, another run key and version
    manifest = first.staged.manifest()
    weights = first.staged.path / manifest["weights"]["file"]
    assert weights.is_file() and manifest["attachments"]["model.pt"]["sha256"] == manifest["weights"]["sha256"]
    assert manifest["split"]["version"] == plan.split_version and manifest["images"]["source"] == "sprites"


def test_a_run_that_departs_from_its_preset_is_named_apart(warehouse: Settings) -> None:
    def name(**overrides: object) -> str:
        return launch.plan_run(warehouse, "sprites-uniform", preset="smoke", seed=1, overrides=overrides).run

    assert name() == "sprites-uniform.smoke.mlp.seed1"
    assert name(device="cpu", eval_batch_size=64, decode_workers=1) == name()  # how it runs, not what it learns
    assert name(model="small_cnn") == "sprites-uniform.smoke.small_cnn.seed1"  # the model is in the name
    changed = name(lr=0.5)
    assert re.fullmatch(r"sprites-uniform\.smoke-[0-9a-f]{8}\.mlp\.seed1", changed)
    assert name(lr=0.5) == changed and name(lr=0.25) != changed  # the same changes, the same name
    smoke_iters = launch.plan_run(warehouse, "sprites-uniform", preset="smoke").config["max_iters"]
    assert name(max_iters=smoke_iters) == name()  # setting the preset's own value changes nothing


def test_the_split_is_read_as_wilds_metadata(warehouse: Settings) -> None:
    split = splits.published_split(warehouse, "sprites-sc-object_color")
    table = read_split(split.path)
    assert table.metadata_fields[:2] == ["group", "y"]
    assert set(table.metadata_fields[2:]) == {"shape", "object_color", "background_color", "size"}
    assert table.metadata.shape == (len(table.example_ids), 6) and table.metadata.dtype == np.int64
    assert table.num_classes == 3 and table.class_names == ["square", "ellipse", "heart"]
    assert len(table.group_names) == 81 and set(table.split_names) == {"train", "id_val", "test"}


# long: four materializations in one Dagster instance, each checked against the store the one before left
def test_the_dagster_asset_trains_through_pipes_and_bad_inputs_publish_nothing(
    warehouse: Settings, tmp_path: Path
) -> None:
    from shiftbench.assets import erm
    from shiftbench.assets.resources import resource_class
    from shiftbench.conds.family import CASE, CONDS

    baseline, _ = erm.baseline_assets(CONDS, CASE)
    staged_key, publish_key = erm.baseline_keys(CASE)
    resources = {
        "settings": resource_class()(home=str(warehouse.home)),
        "erm_pipes_client": dg.PipesSubprocessClient(),
    }
    key = dg.MultiPartitionKey({"benchmark": "sprites-sc-object_color", "seed": "1"})
    config = {"preset": "smoke", "max_iters": 20, "eval_every": 10, "threads": 1}
    run_config = {"ops": {"erm__conds_case_baseline": {"config": config}}}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(CASE.qualified, list(CASES))
        result = dg.materialize(
            [baseline], resources=resources, partition_key=key, run_config=run_config, instance=instance
        )
        assert result.success
        events = result.asset_materializations_for_node("erm__conds_case_baseline")
        assert [e.asset_key for e in events] == [staged_key, publish_key]
        meta = events[1].metadata
        assert re.fullmatch(r"sprites-sc-object_color\.smoke-[0-9a-f]{8}\.mlp\.seed1", meta["run"].value)
        assert 0 <= meta["test/acc_avg"].value <= 1 and "test/acc_wg" in meta
        assert meta["learning_curve"].value.startswith("![learning curve](data:image/png;base64,")
        assert all(check.passed for check in result.get_asset_check_evaluations())
        logs = [e.message for e in instance.all_logs(result.run_id) if e.user_message]
        assert any("iteration 20/20" in str(m) for m in logs), "the job's log lines reach the run's event log"

        before = Store(warehouse.store_dir).log.versions()
        image = next((warehouse.cache_dir / "sprites").glob("*/images/sprite_000000.png"))
        image.rename(image.with_suffix(".moved"))
        try:
            failed = dg.materialize(
                [baseline],
                resources=resources,
                partition_key=dg.MultiPartitionKey({"benchmark": "sprites-sc-object_color", "seed": "2"}),
                run_config=run_config,
                instance=instance,
                raise_on_error=False,
            )
        finally:
            image.with_suffix(".moved").rename(image)
        assert not failed.success
        error = next(e for e in failed.all_events if e.is_step_failure).event_specific_data.error  # type: ignore[union-attr]
        while error.cause is not None:
            error = error.cause
        n = splits.published_split(warehouse, "sprites-sc-object_color").examples.height
        assert f"1 of {n:,} images are missing" in error.message and "sprite_000000.png" in error.message
        assert error.cls_name == "InputError"
        assert Store(warehouse.store_dir).log.versions() == before

        # Results take the guarded path too: failed checks block publishing, and so does a later
        # run that materializes only the publish asset (what "Materialize selected" does).
        import shiftbench.warehouse.publishing as publishing
        from shiftbench.store.contracts import RuleResult

        third = dg.MultiPartitionKey({"benchmark": "sprites-sc-object_color", "seed": "3"})
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                publishing,
                "check_tables",
                lambda tables, only=None: {t: [RuleResult(t, "forced", False, 1, "0")] for t in tables},
            )
            blocked = dg.materialize(
                [baseline], resources=resources, partition_key=third, run_config=run_config, instance=instance,
                raise_on_error=False,
            )  # fmt: skip
        assert not blocked.success
        assert [e.asset_key for e in blocked.asset_materializations_for_node("erm__conds_case_baseline")] == [
            staged_key
        ]
        checks = {c.check_name: c for c in blocked.get_asset_check_evaluations()}
        absent = checks.pop("contract_erm_training_conflicts")  # a run without track_conflicts has no such table
        assert (
            absent.passed and absent.description == "no erm_training_conflicts table in this version: nothing to check"
        )
        assert {c.passed for c in checks.values()} == {False}
        publish_only = dg.materialize(
            [baseline], resources=resources, partition_key=third, run_config=run_config, instance=instance,
            selection=[publish_key], raise_on_error=False,
        )  # fmt: skip
        assert not publish_only.success
        assert publish_only.asset_materializations_for_node("erm__conds_case_baseline") == []
        assert Store(warehouse.store_dir).log.latest("sprites-sc-object_color.smoke.mlp.seed3") is None


def test_cli_trains_with_progress_and_exports_an_imagefolder(
    warehouse: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shiftbench.pipelines.cli import main

    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    args = ["train", "sprites-uniform", "--preset", "smoke", "--seed", "5", "--set", "max_iters=40", *ONE_THREAD_ARGS]
    assert main([*args, "--set", "eval_every=20", "--in-process"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    run = re.search(r"(sprites-uniform\.smoke-[0-9a-f]{8}\.mlp\.seed5) version", out)
    assert run is not None and "test/acc_avg" in out  # 40 iterations are not the smoke preset's: a name of its own
    assert main(["sql", "SELECT count(DISTINCT run) FROM erm_runs WHERE seed = 5", "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "1"

    if not torch.cuda.is_available():  # checked by the job, where the GPU would be: nothing published
        assert main(["train", "sprites-uniform", "--preset", "smoke", "--device", "cuda", "--in-process"]) == 2
        err = capsys.readouterr().err
        assert "error: parameter 'device': a GPU was requested" in err and "nothing was published" in err
        assert err.count("\n") == 1 and "Stack Trace" not in err and "Traceback" not in err
    assert main(["train", "sprites-unifrom"]) == 2
    assert "unknown benchmark 'sprites-unifrom'; did you mean sprites-uniform" in capsys.readouterr().err

    target = tmp_path / "export"
    assert main(["export", "sprites-sc-object_color", str(target), "--layout", "imagefolder"]) == 0
    assert "imagefolder layout, 1,242 sprites images" in capsys.readouterr().out  # 432 train + id_val, 810 test
    counts = {p.name: len(list(p.rglob("*.png"))) for p in target.iterdir()}
    split = splits.published_split(warehouse, "sprites-sc-object_color")
    expected = dict(split.examples.group_by("split").len().iter_rows())
    assert counts == expected
    image = next((target / "test" / "000_square").iterdir())
    assert image.is_file() and not image.is_symlink()  # a hard link (the default --images link), not a symlink
    assert main(["export", "sprites-sc-object_color", str(target)]) == 2  # never mixes two exports


def test_standin_images_train_any_split_and_are_labelled_as_such(warehouse: Settings) -> None:
    plan = launch.plan_run(warehouse, "sprites-uniform", preset="smoke", seed=6, overrides=FAST, image_root="standin")
    assert plan.images.kind == "standin" and plan.images.template == "{}.png"
    assert plan.run.endswith(".mlp.seed6@standin")  # never the name of the run on the split's images
    assert len(list(plan.images.root.glob("*.png"))) == len(
        splits.published_split(warehouse, "sprites-uniform").examples
    )
    outcome, _ = launch.train_in_process(warehouse, plan, launch.scratch_dir(warehouse, plan), log=print)
    runs = pl.read_parquet(outcome.staged.table_path("erm_runs"))
    assert runs["image_source"].to_list() == ["standin"]
    assert outcome.staged.manifest()["images"]["generator"] == "standin-1"
    config = json.loads(runs["config"][0])
    assert config["model"] == "mlp" and config["seed"] == 6 and not math.isnan(config["lr"])
    assert plan.images.root.name.startswith("sprites-uniform-")


@pytest.mark.slow
def test_breeds_and_metashift_splits_train_on_standins_and_the_linear_probe_retrains_only_the_head(
    tmp_path: Path,
) -> None:
    """BREEDS with an ImageNet-style root (train/<wnid>/ listed, never opened; here empty files), and a
    MetaShift task on the generated scene sample: both train on stand-in images end to end."""
    from shiftbench.sources.imagenet import imagenet_classes

    from .conftest import BREEDS_FIXTURE, IMAGENET_WORDNET_FIXTURE

    root = tmp_path / "imagenet"
    for wnid in imagenet_classes()["wnid"].to_list():
        (root / "train" / wnid).mkdir(parents=True)
        for k in range(3):
            (root / "train" / wnid / f"{wnid}_{k}.JPEG").touch()
    settings = Settings.from_env(
        {
            "SHIFTBENCH_HOME": str(tmp_path / "home"),
            "SHIFTBENCH_OFFLINE": "1",
            "SHIFTBENCH_IMAGENET_DIR": str(root),
            "SHIFTBENCH_BREEDS_HIERARCHY_DIR": str(BREEDS_FIXTURE),
            "SHIFTBENCH_IMAGENET_HIERARCHY_DIR": str(IMAGENET_WORDNET_FIXTURE),
        }
    )
    staged = stage_one(settings, "breeds/benchmark", "living17")
    assert not failures(check_version(Store(settings.store_dir), staged))
    publish_staged(settings, staged)
    assert staged.manifest()["images"] == {
        "source": "imagenet",
        "template": "{}",
        "root": str(root),
        "root_setting": "imagenet_dir",
    }
    plan = launch.plan_run(settings.model_copy(update={"imagenet_dir": None}), "living17")
    assert plan.images.root == root  # the manifest's root: one owner of example id -> image path
    plan = launch.plan_run(settings, "living17", preset="smoke", overrides=FAST)
    with pytest.raises(InputError, match=r"3,400 of 3,604 images are missing \(template '\{\}'\)"):
        launch.train_in_process(settings, plan, launch.scratch_dir(settings, plan), log=print)

    plan = launch.plan_run(settings, "living17", preset="smoke", overrides=FAST, image_root="standin")
    assert plan.n_train == 34 * 3 and plan.images.kind == "standin"
    source, summary = launch.train_in_process(settings, plan, launch.scratch_dir(settings, plan), log=print)
    got = _metrics(source)
    assert summary["selection_split"] is None  # BREEDS has no validation split: the last iterate
    assert {"train", "ood_train", "id_test", "test"} <= {split for split, _ in got}
    assert ("test", "acc_relative:id_test") in got and ("test", "acc_gap:id_test") in got

    weights = source.staged.path / "files" / "model.pt"
    probe_overrides = {"max_iters": 2, "model": "mlp", "image_size": 32, "init_checkpoint": str(weights), **ONE_THREAD}
    probe = launch.plan_run(
        settings, "living17", preset="breeds_linear_probe", overrides=probe_overrides, image_root="standin"
    )
    assert probe.config["train_split"] == "ood_train" and probe.n_train == 34 * 3
    outcome, probed = launch.train_in_process(settings, probe, launch.scratch_dir(settings, probe), log=print)
    # The paper's 13 learning rates, the best on the target test split: a test-set choice, recorded as one.
    assert len(probed["lr_grid_scores"]) == 13 and probed["selection_split"] == "test"
    assert launch.selection_label(probed["selection_split"]).startswith("test (test_oracle: a test-set choice")
    before = torch.load(weights, weights_only=True)
    after = torch.load(outcome.staged.path / "files" / "model.pt", weights_only=True)
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed == ["fc.bias", "fc.weight"]

    task = stage_one(settings, "metashift/task", "cat-dog-dg-cabinet-bed@generated")
    check_version(Store(settings.store_dir), task)
    publish_staged(settings, task)
    shift = launch.plan_run(
        settings, "cat-dog-dg-cabinet-bed@generated", preset="smoke", overrides=FAST, image_root="standin"
    )
    result, _ = launch.train_in_process(settings, shift, launch.scratch_dir(settings, shift), log=print)
    runs = pl.read_parquet(result.staged.table_path("erm_runs"))
    assert runs.select("family", "image_source", "selection_split").row(0) == ("metashift", "standin", "val")


@pytest.mark.slow
def test_a_named_variant_trains_and_its_results_go_stale_when_the_split_is_republished(
    make_settings: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shiftbench.pipelines.cli import main

    settings = make_settings()
    monkeypatch.setenv("SHIFTBENCH_HOME", str(settings.home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("SHIFTBENCH_SPRITES_PER_COMBINATION", "20")
    assert main(["build", "--benchmark", "sprites-uniform", "--set", "train_size=150", "--name", "u150"]) == 0
    capsys.readouterr()
    train = ["train", "u150", "--preset", "smoke", "--set", "max_iters=20", "--set", "eval_every=10", *ONE_THREAD_ARGS]
    assert main([*train, "--set", "init_checkpoint=null"]) == 0, capsys.readouterr().err  # null means null
    assert re.search(r"u150\.smoke-[0-9a-f]{8}\.mlp\.seed0 version", capsys.readouterr().out)
    count = "SELECT count(*) FROM erm_results WHERE benchmark = 'u150'"
    assert main(["sql", count, "--csv"]) == 0
    assert int(capsys.readouterr().out.splitlines()[1]) > 0

    monkeypatch.setenv("SHIFTBENCH_SPRITES_SEED", "1")  # other images: the split gets a new version
    assert main(["build", "--benchmark", "u150"]) == 0
    assert "now latest" in capsys.readouterr().out
    assert main(["sql", count, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "0"  # results of the old split are not current
    history = "SELECT DISTINCT is_current FROM erm_results_history WHERE benchmark = 'u150'"
    assert main(["sql", history, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["false"]


@pytest.mark.slow
def test_metashift_tasks_train_on_real_layout_gqa_images(make_settings: Any, tmp_path: Path) -> None:
    """Example ids already carry ``.jpg``: the image is ``<root>/<example_id>`` (never ``.jpg.jpg``)."""
    from PIL import Image

    from .conftest import FIXTURES

    scenes = FIXTURES / "metashift" / "gqa_scene_graphs_from_attributes.json"
    images = tmp_path / "gqa_images"
    images.mkdir()
    settings = make_settings(SHIFTBENCH_GQA_SCENE_GRAPHS=str(scenes), SHIFTBENCH_GQA_IMAGES_DIR=str(images))
    task = "cat-dog-dg-cabinet-bed@gqa-files"  # the fixture is in GQA's format, not GQA's files
    staged = stage_one(settings, "metashift/task", task, {"allow_scale_down": True})
    check_version(Store(settings.store_dir), staged)
    publish_staged(settings, staged)
    assert staged.manifest()["images"] == {
        "source": "gqa",
        "template": "{}",
        "root": str(images),
        "root_setting": "gqa_images_dir",
    }
    ids = pl.read_parquet(staged.table_path("examples"))["example_id"].to_list()
    assert all(i.endswith(".jpg") and not i.endswith(".jpg.jpg") for i in ids)
    for example_id in ids:  # the layout of Visual Genome's image folders: <image_id>.jpg
        Image.new("RGB", (8, 8), (len(example_id) * 9 % 255, 90, 160)).save(images / example_id)
    plan = launch.plan_run(settings, task, preset="smoke", overrides=FAST)
    assert plan.images.kind == "gqa" and plan.images.root == images
    outcome, _ = launch.train_in_process(settings, plan, launch.scratch_dir(settings, plan), log=print)
    runs = pl.read_parquet(outcome.staged.table_path("erm_runs"))
    assert runs["image_source"].to_list() == ["gqa"]


def test_flip_rot90_augmentation_is_lossless_seeded_and_covers_the_square_symmetries() -> None:
    from shiftbench.erm.augment import augment

    batch = torch.arange(64 * 3 * 4 * 4, dtype=torch.int64).reshape(64, 3, 4, 4).to(torch.uint8)
    first = augment(batch, "flip_rot90", torch.Generator().manual_seed(0))
    again = augment(batch, "flip_rot90", torch.Generator().manual_seed(0))
    assert torch.equal(first, again)  # a seed gives the same run
    assert torch.equal(augment(batch, "none", torch.Generator()), batch)
    seen = set()
    for original, moved in zip(batch, first, strict=True):
        # Every output is one of the 8 symmetries of the square applied to its own input, pixels unchanged.
        candidates = [torch.rot90(img, k, dims=(-2, -1)) for img in (original, original.flip(-1)) for k in range(4)]
        matches = [k for k, c in enumerate(candidates) if torch.equal(c, moved)]
        assert matches
        seen.add(matches[0])
    assert len(seen) == 8  # 64 draws reach all of them


def test_pairwise_accuracy_is_breeds_average_case_binary_task_by_hand() -> None:
    """BREEDS A.7.2: on the images of a pair, the class of the two with the higher probability; every pair once."""
    from shiftbench.scoring.metrics import pairwise_accuracy

    probabilities = np.array(
        [
            [0.6, 0.3, 0.1],  # class 0: beats 1 and 2
            [0.2, 0.5, 0.3],  # class 0: loses to 1 and 2
            [0.1, 0.7, 0.2],  # class 1: beats 0 and 2
            [0.3, 0.3, 0.4],  # class 2: beats 0 and 1
            [0.5, 0.25, 0.25],  # class 2: loses to 0, ties 1 (a tie is wrong)
        ]
    )
    y = np.array([0, 0, 1, 2, 2])
    # pair (0, 1): images 0, 1, 2 -> right, wrong, right = 2/3; (0, 2): images 0, 1, 3, 4 -> 1, 0, 1, 0 = 1/2;
    # (1, 2): images 2, 3, 4 -> 1, 1, 0 = 2/3. Mean: (2/3 + 1/2 + 2/3) / 3.
    metric = pairwise_accuracy("test", y, probabilities)
    assert (metric.metric, metric.group) == ("acc_pairwise", None)
    assert metric.value == pytest.approx((2 / 3 + 1 / 2 + 2 / 3) / 3)
    assert pairwise_accuracy("test", np.array([0, 0]), probabilities[:2, :1]).value is None  # one class: no pair
    # One image of class 0: pair (0, 1) right, (0, 2) wrong, (1, 2) has no images and does not count.
    assert pairwise_accuracy("test", np.array([0]), np.array([[0.5, 0.4, 0.6]])).value == pytest.approx(0.5)


def test_the_relative_accuracy_interval_is_the_bootstrap_over_examples() -> None:
    """BREEDS reports relative accuracy with 95 % bootstrap intervals. Drawing each split's correct count from
    Binomial(n, accuracy) is resampling its examples with replacement: checked against that resampling itself."""
    from shiftbench.scoring.metrics import Metric, relative_accuracy_interval

    low, high = relative_accuracy_interval(1000, 0.9, 800, 0.6)
    assert low is not None and high is not None and low < 0.6 / 0.9 < high
    rng = np.random.default_rng(7)
    source = np.r_[np.ones(900), np.zeros(100)]
    target = np.r_[np.ones(480), np.zeros(320)]
    ratios = [rng.choice(target, 800).mean() / rng.choice(source, 1000).mean() for _ in range(4000)]
    by_examples = np.percentile(ratios, [2.5, 97.5])
    assert abs(low - by_examples[0]) < 0.01 and abs(high - by_examples[1]) < 0.01
    narrower = relative_accuracy_interval(100_000, 0.9, 80_000, 0.6)
    assert narrower[1] - narrower[0] < (high - low) / 5  # sqrt(100) = 10 times narrower, give or take
    assert relative_accuracy_interval(0, 0.9, 800, 0.6) == (None, None)
    metrics = [Metric("id_test", "acc_avg", None, 0.9), Metric("id_test", "count", None, 1000.0),
               Metric("test", "acc_avg", None, 0.6), Metric("test", "count", None, 800.0)]  # fmt: skip
    got = {m.metric: m.value for m in gap_metrics(metrics)}
    assert (got["acc_relative_low:id_test"], got["acc_relative_high:id_test"]) == (low, high)  # seeded: same bytes
