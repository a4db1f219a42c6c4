"""Training objectives beside ERM (reweighting, GroupDRO, IRM, CORAL), their loaders and the
paper-faithful input options: losses against hand-computed values, then every method trained on the
generated sprites through the CLI into the `results` view, and a learning-rate grid selected on id_val."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
import torch

from shiftbench.config.settings import Settings
from shiftbench.erm import checkpoints, launch
from shiftbench.erm.augment import augment
from shiftbench.erm.config import TrainConfig
from shiftbench.erm.data import MEAN, STD, group_batches, normalize, training_groups
from shiftbench.erm.methods import METHODS, build_method
from shiftbench.erm.models import build_model
from shiftbench.errors import InputError
from shiftbench.pipelines.cli import main
from shiftbench.splits import published as splits
from shiftbench.splits.split_table import SplitTable

from .conftest import small_sprites_home

CASE = "sprites-sc-object_color"
CPU = torch.device("cpu")
PARAMS = {"groupdro_eta": 0.5, "irm_lambda": 100.0, "irm_anneal_iters": 2, "coral_lambda": 1.0}
# One torch thread: a run's default (every core) oversubscribes the workers of a parallel test run. How a run
# executes, not what it learns: the run keeps its name (shiftbench.erm.config.EXECUTION_ONLY).
ONE_THREAD = {"threads": 1}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return small_sprites_home(tmp_path_factory.mktemp("methods_home"), CASE)


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -torch.log_softmax(logits, 1).gather(1, y.view(-1, 1)).flatten()


def test_reweighting_gives_every_training_group_the_same_total_weight() -> None:
    train_groups = np.array([0, 0, 0, 1, 2, 2])  # group 3 never trains: weight 0
    method = build_method("reweight", train_groups, 4, PARAMS, CPU)
    # n / (G n_g) with n = 6, G = 3 present groups: 2/3, 2, 1.
    assert torch.allclose(method.weights, torch.tensor([2 / 3, 2.0, 1.0, 0.0]))  # type: ignore[attr-defined]
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y, g = torch.tensor([0, 0, 1]), torch.tensor([0, 1, 2])
    expected = (_ce(logits, y) * torch.tensor([2 / 3, 2.0, 1.0])).sum() / (2 / 3 + 2 + 1)
    assert torch.allclose(method.loss(logits, None, y, g, 1), expected)


def test_groupdro_moves_weight_to_the_worst_group_by_exponentiated_losses() -> None:
    method = build_method("groupdro", np.array([0, 1, 1, 2]), 4, PARAMS, CPU)
    assert torch.allclose(method.q, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0]))  # type: ignore[attr-defined]
    logits = torch.tensor([[3.0, 0.0], [0.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    y, g = torch.tensor([0, 0, 0, 1]), torch.tensor([0, 1, 1, 2])
    ce = _ce(logits, y)
    group_loss = torch.stack([ce[0], (ce[1] + ce[2]) / 2, ce[3], torch.tensor(0.0)])
    q = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0]) * torch.exp(0.5 * group_loss)
    q = q / q.sum()
    assert torch.allclose(method.loss(logits, None, y, g, 1), (q * group_loss).sum())
    assert torch.allclose(method.q, q)  # type: ignore[attr-defined]
    assert int(method.q.argmax()) == 1  # type: ignore[attr-defined]  # the hardest group gains weight


def test_irm_penalty_is_the_product_of_the_two_half_batch_scale_gradients() -> None:
    logits = torch.tensor([[1.0, 0.0], [0.5, 1.5], [2.0, -1.0], [0.0, 0.3]])
    y, g = torch.tensor([0, 1, 1, 0]), torch.tensor([5, 5, 7, 7])
    method = build_method("irm", np.array([5, 7]), 8, PARAMS, CPU)

    def scale_gradient(row: int) -> torch.Tensor:  # d/ds CE(s z, y) at s = 1 = sum_k p_k z_k - z_y
        z = logits[row]
        return (z.softmax(0) * z).sum() - z[y[row]]

    penalty = (scale_gradient(0) * scale_gradient(1) + scale_gradient(2) * scale_gradient(3)) / 2
    nll = _ce(logits, y).mean()
    assert torch.allclose(method.loss(logits, None, y, g, 1), nll + penalty)  # weight 1 while annealing
    assert torch.allclose(method.loss(logits, None, y, g, 3), (nll + 100 * penalty) / 100)
    assert not method.reset_optimizer(2) and method.reset_optimizer(3)  # Adam restarts with the new objective


def test_coral_penalty_matches_feature_means_and_covariances_per_pair() -> None:
    features = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0], [2.0, 2.0], [4.0, 0.0]])
    logits = torch.zeros(5, 3)
    y, g = torch.tensor([0, 1, 2, 0, 1]), torch.tensor([0, 0, 1, 1, 1])
    method = build_method("coral", np.array([0, 1]), 2, PARAMS, CPU)
    a, b = features[:2].numpy(), features[2:].numpy()
    mean_term = ((a.mean(0) - b.mean(0)) ** 2).mean()
    cov_term = ((np.cov(a, rowvar=False) - np.cov(b, rowvar=False)) ** 2).mean()
    expected = math.log(3) + mean_term + cov_term
    assert math.isclose(float(method.loss(logits, features, y, g, 1)), expected, rel_tol=1e-6)
    same = torch.cat([features[:2], features[:2]])
    zero = method.loss(torch.zeros(4, 3), same, torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 1, 1]), 1)
    assert math.isclose(float(zero), math.log(3), rel_tol=1e-6)  # identical groups: no penalty


def test_unknown_methods_and_fields_are_named() -> None:
    with pytest.raises(InputError, match="unknown method 'dro'"):
        TrainConfig.from_mapping({"method": "dro"})
    with pytest.raises(InputError, match="lr_grid"):
        TrainConfig.from_mapping({"lr_grid": "1e-3,-1"})
    assert TrainConfig.from_mapping({"lr_grid": "1e-2,1e-3"}).lr_grid == (1e-2, 1e-3)
    assert set(METHODS) == {
        "erm", "reweight", "groupdro", "irm", "coral", "cdann", "causirl_coral", "causirl_mmd", "mixup", "sagnet"
    }  # fmt: skip


def _table(metadata: np.ndarray, fields: list[str]) -> SplitTable:
    n = metadata.shape[0]
    return SplitTable(
        "t", "v", [str(i) for i in range(n)], np.array(["train"] * n), metadata[:, 1], metadata[:, 0],
        ["g0", "g1"], ["a", "b"], metadata, fields,
    )  # fmt: skip


def test_training_groups_are_the_distinct_values_of_the_named_fields() -> None:
    table = _table(np.array([[0, 0, 2], [1, 1, 2], [0, 1, 2], [1, 0, 5]]), ["group", "y", "colour"])
    codes, labels = training_groups(table, "y,colour")
    assert labels == ["y=0,colour=2", "y=0,colour=5", "y=1,colour=2"]  # shiftbench.scoring.grouper: as eval names them
    assert codes.tolist() == [0, 2, 2, 1]
    assert training_groups(table, "group")[0].tolist() == [0, 1, 0, 1]
    with pytest.raises(InputError, match=r"unknown metadata field 'shape'.*group, y, colour"):
        training_groups(table, "y,shape")


def test_group_batches_hold_n_distinct_groups_in_equal_shares() -> None:
    groups = np.repeat([0, 1, 2, 3], [50, 3, 10, 1])
    stream = group_batches(np.arange(groups.size), groups, 12, 3, torch.Generator().manual_seed(0))
    seen = set()
    for _ in range(40):
        batch = next(stream).numpy()
        counts = np.bincount(groups[batch], minlength=4)
        assert sorted(counts[counts > 0].tolist()) == [4, 4, 4]
        seen |= set(np.flatnonzero(counts).tolist())
    assert seen == {0, 1, 2, 3}  # the single-example group is drawn like the others


def test_domainbed_augmentation_is_seeded_per_image_and_normalisation_is_exact() -> None:
    torch.manual_seed(0)
    batch = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    batch[:, :, :, :16] = 0  # a left half that flips and crops move
    first = augment(batch, "domainbed", torch.Generator().manual_seed(1))
    again = augment(batch, "domainbed", torch.Generator().manual_seed(1))
    assert first.dtype == torch.uint8 and first.shape == batch.shape
    assert torch.equal(first, again)
    assert not torch.equal(first, augment(batch, "domainbed", torch.Generator().manual_seed(2)))
    grey = (first[:, 0] == first[:, 1]).all((1, 2)) & (first[:, 1] == first[:, 2]).all((1, 2))
    assert 0 < int(grey.sum()) < 20  # about 1 in 10 turned grey, not all
    left_dark = first[:, :, :, :8].float().mean((1, 2, 3)) < first[:, :, :, -8:].float().mean((1, 2, 3))
    assert 10 < int(left_dark.sum()) < 54  # each image flipped (or not) on its own draw
    x = normalize(torch.tensor([0, 255], dtype=torch.uint8).view(1, 1, 1, 2).expand(1, 3, 1, 2), channels_last=False,
                  kind="symmetric")  # fmt: skip
    assert x.flatten().tolist() == [-1.0, 1.0] * 3
    pixels = torch.tensor([0, 128, 255], dtype=torch.uint8).view(1, 1, 1, 3).expand(2, 3, 1, 3)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    for _ in range(2):  # the constants are made once per device, the values the same every step
        assert torch.equal(normalize(pixels, channels_last=False), (pixels.float() / 255.0 - mean) / std)


def test_every_method_trains_through_the_cli_into_the_results_view(
    warehouse: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    monkeypatch.setenv("SHIFTBENCH_SPRITES_PER_COMBINATION", "40")
    fast = ["--set", "max_iters=10", "--set", "eval_every=5", "--set", "group_by=y,object_color", "--set", "threads=1"]
    runs = {}
    for method in ("reweight", "groupdro", "irm", "coral"):
        args = ["train", CASE, "--preset", "smoke", "--seed", "0", "--set", f"method={method}", *fast, "--in-process"]
        assert main(args) == 0
        found = re.search(
            rf"({re.escape(CASE)}\.smoke-[0-9a-f]{{8}}\.mlp\.{method}\.seed0) version", capsys.readouterr().out
        )
        assert found is not None
        runs[method] = found.group(1)
    with duckdb.connect(str(warehouse.catalog_path), read_only=True) as con:
        rows = con.execute(
            "SELECT method, run, value FROM results WHERE eval_split = 'test' AND metric = 'acc_avg' ORDER BY 1"
        ).fetchall()
        recorded = dict(con.execute("SELECT method, json_extract_string(config, '$.method') FROM erm_runs").fetchall())
    assert {m: r for m, r, _ in rows} == runs
    assert all(0 <= v <= 1 for _, _, v in rows)
    assert recorded == {m: m for m in runs}


def test_a_learning_rate_grid_keeps_the_best_on_the_selection_split(warehouse: Settings) -> None:
    overrides = {"max_iters": 10, "eval_every": 5, "lr_grid": [1e-1, 1e-3], "normalization": "symmetric", **ONE_THREAD}
    plan = launch.plan_run(warehouse, CASE, preset="smoke", seed=2, overrides=overrides)
    outcome, summary = launch.train_in_process(warehouse, plan, launch.scratch_dir(warehouse, plan), log=print)
    scores = summary["lr_grid_scores"]
    assert set(scores) == {"0.1", "0.001"}
    best = max(scores, key=lambda k: scores[k])
    curve = outcome.staged.table_path("erm_curves")
    assert curve.is_file()
    selected = pl.read_parquet(curve).filter((pl.col("split") == "id_val") & (pl.col("metric") == "acc_avg"))
    assert math.isclose(selected["value"].max(), scores[best])  # the kept curve is the chosen rate's
    assert outcome.staged.manifest()["training"]["lr_grid_scores"] == scores  # recorded with the results
    bad = launch.plan_run(warehouse, CASE, preset="smoke", overrides={**overrides, "selection": "last"})
    with pytest.raises(InputError, match="needs a selection split"):
        launch.train_in_process(warehouse, bad, launch.scratch_dir(warehouse, bad), log=print)


def test_registered_checkpoints_are_found_verified_or_named_with_their_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    with pytest.raises(InputError, match=r"download https://download\.pytorch\.org/models/resnet18-f37072fd\.pth into"):
        checkpoints.resolve("imagenet:resnet18", "resnet18", tmp_path / "weights")
    with pytest.raises(InputError, match="holds resnet50 weights, the run trains resnet18"):
        checkpoints.resolve("imagenet:resnet50", "resnet18", None)
    with pytest.raises(InputError, match="unknown registered checkpoint 'imagenet:vit'"):
        checkpoints.resolve("imagenet:vit", "resnet18", None)
    # A file in torchvision's cache is found there; its hash prefix decides.
    cache = tmp_path / "torch_home" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    weights = cache / "resnet18-f37072fd.pth"
    torch.save(build_model("resnet18", 1000, 32).state_dict(), weights)
    with pytest.raises(InputError, match="does not match imagenet:resnet18"):
        checkpoints.resolve("imagenet:resnet18", "resnet18", None)
    entry = checkpoints.REGISTRY["imagenet:resnet18"]
    prefix = hashlib.sha256(weights.read_bytes()).hexdigest()[:8]
    monkeypatch.setitem(checkpoints.REGISTRY, "imagenet:resnet18", dataclasses.replace(entry, sha256_prefix=prefix))
    assert checkpoints.resolve("imagenet:resnet18", "resnet18", tmp_path / "weights") == weights
    user = tmp_path / "mine.pt"
    torch.save({}, user)
    assert checkpoints.resolve(str(user), "resnet18", None) == user


def test_the_papers_presets_are_chosen_by_family_dataset_or_split_parameter(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no weights file on this machine
    split = splits.published_split(warehouse, CASE)

    def preset_for(family: str, dataset: str, params: dict[str, object]) -> str:
        fake = splits.PublishedSplit(family, "b", "v", split.path, dataset, {"params": params}, split.examples)
        return launch._preset_for(warehouse, fake, None)[0]

    assert preset_for("breeds", "breeds", {"level": 5, "n_subclasses": 4}) == "breeds_450"  # Living-17, Non-living-26
    assert preset_for("breeds", "breeds", {"level": 3, "n_subclasses": 20}) == "breeds"  # Entity-13
    assert preset_for("conds", "sprites", {}) == "conds_controlled"
    assert preset_for("conds", "celeba", {}) == "conds_real"
    assert preset_for("metashift", "metashift", {}) == "domainbed"
    presets, _ = launch.load_presets()
    assert presets["conds_controlled"]["lr_grid"] == [1e-2, 1e-3, 1e-4]
    assert presets["conds_controlled"]["normalization"] == "symmetric"
    # Each paper's protocol on the photographs (shiftbench.erm.protocols), with its dataset's normalisation.
    assert all(presets[name]["transforms"] == "domainbed" for name in ("domainbed", "domainbed_scratch"))
    assert "augment" not in presets["domainbed"] and "normalization" not in presets["domainbed"]  # imagenet's
    for name in ("breeds", "breeds_450", "breeds_linear_probe"):
        assert (presets[name]["transforms"], presets[name]["normalization"]) == (
            "robustness_imagenet",
            "robustness_custom_imagenet",
        )
    assert presets["domainbed"]["init_checkpoint"] == "imagenet:resnet18"
    assert presets["breeds_450"]["max_epochs"] == 450
    with pytest.raises(InputError, match=r"imagenet:resnet18 is not on this machine"):
        launch.plan_run(warehouse, CASE, preset="domainbed")  # checked before anything trains


def _mlp_checkpoint(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    torch.save(build_model("mlp", 3, 32).state_dict(), path)
    return path


def _flip_a_byte_of_the_largest_tensor(path: Path) -> None:
    """One byte in the middle of the largest member's data: torch.load still loads the file."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    offset = member.header_offset + 30 + len(member.filename.encode()) + len(member.extra) + member.file_size // 2
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    assert len(torch.load(path, weights_only=True)) > 0  # what the run loaded before: no error from torch


CHECKPOINT_RUN = {"max_iters": 4, "eval_every": 2, "model": "mlp", "image_size": 32, **ONE_THREAD}


def test_a_run_records_the_sha256_and_size_of_the_checkpoint_it_loaded(warehouse: Settings, tmp_path: Path) -> None:
    weights = _mlp_checkpoint(tmp_path / "mine.pt", 1)
    overrides = {**CHECKPOINT_RUN, "init_checkpoint": str(weights)}
    plan = launch.plan_run(warehouse, CASE, preset="smoke", seed=3, overrides=overrides)
    outcome, summary = launch.train_in_process(warehouse, plan, launch.scratch_dir(warehouse, plan), log=print)
    recorded = json.loads(pl.read_parquet(outcome.staged.table_path("erm_runs"))["config"][0])["init"]
    assert recorded["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest() == summary["init"]["sha256"]
    assert recorded["bytes"] == weights.stat().st_size and recorded["loaded"] > 0


def test_a_checkpoint_with_a_flipped_byte_is_refused_naming_the_file(warehouse: Settings, tmp_path: Path) -> None:
    """torch does not check the CRC-32s of its zip members; the launcher (before anything trains) and the job (what
    it loads) do."""
    weights = _mlp_checkpoint(tmp_path / "flipped.pt", 1)
    _flip_a_byte_of_the_largest_tensor(weights)
    overrides = {**CHECKPOINT_RUN, "init_checkpoint": str(weights)}
    message = f"{weights}, parameter 'init_checkpoint': corrupt checkpoint: "
    with pytest.raises(InputError, match=re.escape(message)):
        launch.plan_run(warehouse, CASE, preset="smoke", overrides=overrides)
    from shiftbench.erm.models import load_checkpoint

    with pytest.raises(InputError, match="does not match its CRC-32"):
        load_checkpoint(build_model("mlp", 3, 32), weights, keep_head=True)
    torn = tmp_path / "torn.pt"
    torn.write_bytes(_mlp_checkpoint(tmp_path / "whole.pt", 1).read_bytes()[:5000])
    with pytest.raises(InputError, match=re.escape(f"{torn}, parameter 'init_checkpoint': torn or corrupt")):
        launch.plan_run(warehouse, CASE, preset="smoke", overrides={**overrides, "init_checkpoint": str(torn)})


def test_a_registered_checkpoint_is_verified_again_when_the_job_loads_it(
    warehouse: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher finds the file with its name's SHA-256 prefix; the job loads other bytes (the file was replaced
    by another valid checkpoint since): refused naming the file, nothing published."""
    folder = tmp_path / "weights"
    folder.mkdir()
    weights = _mlp_checkpoint(folder / "mlp-test.pt", 1)
    prefix = hashlib.sha256(weights.read_bytes()).hexdigest()[:8]
    entry = checkpoints.RegisteredCheckpoint(
        model="mlp", file="mlp-test.pt", url="https://example.org/mlp-test.pt", sha256_prefix=prefix, source="test"
    )
    monkeypatch.setitem(checkpoints.REGISTRY, "test:mlp", entry)
    settings = warehouse.model_copy(update={"checkpoint_dir": folder})
    overrides = {**CHECKPOINT_RUN, "init_checkpoint": "test:mlp"}
    plan = launch.plan_run(settings, CASE, preset="smoke", seed=4, overrides=overrides)
    assert plan.checkpoint == weights
    _mlp_checkpoint(weights, 2)  # other weights, a valid file
    before = sorted(p.name for p in (settings.store_dir / "erm").glob("*"))
    with pytest.raises(InputError, match=re.escape(f"{weights}, parameter 'init_checkpoint': SHA-256 ")):
        launch.train_in_process(settings, plan, launch.scratch_dir(settings, plan), log=print)
    assert sorted(p.name for p in (settings.store_dir / "erm").glob("*")) == before
