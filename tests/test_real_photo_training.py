"""A BREEDS-shaped split whose images are real photographs, trained end to end through ``shiftbench train`` with the
``breeds`` preset: the robustness library's transforms on the photographs as they are on disk (no square first),
the BREEDS datasets' mean and std; a bad photograph in the folder stops the run with one line naming it.

The photographs: tests/real_photos.py (sample photographs of installed wheels), laid out as ImageNet is
(``train/<wnid>/<wnid>_<n>.JPEG`` and ``val/ILSVRC2012_val_<n>.JPEG`` for the packaged validation labels) for a
two-superclass task of the user's (turtle, lizard; one source and one target subpopulation each).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.store import Store

from .real_photos import make_photos, write_variants

pytestmark = [pytest.mark.slow, pytest.mark.clients]
SPEC = "family: breeds\nbenchmarks:\n  photos-mini:\n    superclasses: [n01662784, n01674464]\n    n_subclasses: 2\n"
TRAIN_PER_CLASS = 6


def _lay_out(root: Path, photos: list[Path], example_ids: list[str], wnids: list[str]) -> None:
    """ImageNet's layout from the photographs: each file a different crop (and every other one flipped) of one."""
    targets = [root / e for e in example_ids]
    targets += [root / "train" / w / f"{w}_{n}.JPEG" for w in wnids for n in range(TRAIN_PER_CLASS)]
    write_variants(photos, targets, quality=85)


@pytest.fixture(scope="module")
def photo_home(tmp_path_factory: pytest.TempPathFactory, clients_python: Path) -> Path:
    """A warehouse with photos-mini built over an ImageNet folder of real photographs."""
    from shiftbench.pipelines.cli import main

    base = tmp_path_factory.mktemp("photo_home")
    spec, imagenet = base / "spec.yaml", base / "imagenet"
    spec.write_text(SPEC)
    home = base / "home"
    env = {"SHIFTBENCH_HOME": str(home), "DAGSTER_HOME": str(base / "dagster"), "SHIFTBENCH_BREEDS_SPECS": str(spec)}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        assert main(["build", "breeds", "--benchmark", "photos-mini"]) == 0  # the validation images it lists
        store = Store(Settings.from_env({"SHIFTBENCH_HOME": str(home)}).store_dir)
        latest = store.log.latest("photos-mini")
        assert latest is not None
        examples = pl.read_parquet(store.layout.staged("breeds", "photos-mini", latest.version).table_path("examples"))
        photos = make_photos(clients_python, base / "photos")
        _lay_out(imagenet, photos, examples["example_id"].to_list(), sorted(set(examples["group"])))
        patch.setenv("SHIFTBENCH_IMAGENET_DIR", str(imagenet))
        assert main(["build", "breeds", "--benchmark", "photos-mini"]) == 0  # now with its train images
    (base / "env.json").write_text(json.dumps({**env, "SHIFTBENCH_IMAGENET_DIR": str(imagenet)}))
    return base


TRAIN = ["train", "photos-mini", "--set", "max_iters=2", "--set", "batch_size=4", "--device", "cpu"]


def _env(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in json.loads((base / "env.json").read_text()).items():
        monkeypatch.setenv(key, value)


def test_a_breeds_shaped_split_of_real_photographs_trains_with_the_papers_transforms(
    photo_home: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from shiftbench.pipelines.cli import main

    _env(photo_home, monkeypatch)
    assert main([*TRAIN, "--set", "threads=1"]) == 0
    out, err = capfd.readouterr()
    assert "under robustness_imagenet (training crops per batch, evaluation images cached on cpu)" in err, err
    home = Settings.from_env({"SHIFTBENCH_HOME": str(photo_home / "home")})
    runs = [v for v in Store(home.store_dir).log.versions() if v.family == "erm"]
    assert len(runs) == 1 and runs[0].benchmark.startswith("photos-mini.breeds-"), runs
    staged = Store(home.store_dir).layout.staged("erm", runs[0].benchmark, runs[0].version)
    row = pl.read_parquet(staged.table_path("erm_runs")).row(0, named=True)
    config = json.loads(row["config"])
    assert (config["transforms"], config["normalization"], config["image_size"]) == (
        "robustness_imagenet",
        "robustness_custom_imagenet",
        224,
    )
    assert row["image_source"] == "imagenet" and row["n_train"] == 2 * TRAIN_PER_CLASS
    splits = set(pl.read_parquet(staged.table_path("erm_results"))["eval_split"])
    assert splits == {"train", "id_test", "test", "ood_train"}, splits
    assert f"version {runs[0].version} (now latest" in out
    assert "selection on none (the last iterate), best iteration 2" in out  # BREEDS has no validation split


def test_a_truncated_photograph_stops_the_run_in_one_line_naming_it(
    photo_home: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from shiftbench.pipelines.cli import main

    _env(photo_home, monkeypatch)
    victim = sorted((photo_home / "imagenet" / "val").iterdir())[0]
    whole = victim.read_bytes()
    victim.write_bytes(whole[: len(whole) // 2])
    try:
        assert main([*TRAIN, "--set", "threads=1", "--set", "lr=0.05"]) == 2
    finally:
        victim.write_bytes(whole)
    err = capfd.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {victim}: cannot decode image: image file is truncated; nothing was published"] or (
        len(errors) == 1 and errors[0].startswith(f"error: {victim}: cannot decode image: image file is truncated")
    ), err


def _plan(photo_home: Path, **overrides: object) -> tuple[Settings, object]:
    from shiftbench.erm import launch

    env = json.loads((photo_home / "env.json").read_text())
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("SHIFTBENCH_")})
    small = {"model": "small_cnn", "image_size": 32, "batch_size": 4, "max_iters": 6, "eval_every": 3, "threads": 1}
    return settings, launch.plan_run(settings, "photos-mini", seed=0, overrides={**small, **overrides})


def _outputs(out_dir: Path) -> tuple[str, list[dict[str, object]]]:
    summary = json.loads((out_dir / "run.json").read_text())
    return summary["weights"]["sha256"], pl.read_parquet(out_dir / "metrics.parquet").to_dicts()


def test_the_prepared_copy_gives_the_same_run_and_is_rebuilt_only_when_a_file_changes(
    photo_home: Path, tmp_path: Path
) -> None:
    """``decode: prepared`` at the photographs' own resolution cuts the pixels decoding the files cuts: the same
    weights and metrics; one worker or two, the same (the draws are the main process's). The copy is made once and
    kept in the warehouse's cache; a changed file makes another."""
    from shiftbench.erm.job import run_job

    settings, plan = _plan(photo_home, decode_workers=1)
    run_job(plan.job(tmp_path / "files"), log=lambda _: None)  # type: ignore[attr-defined]
    _, prepared_plan = _plan(photo_home, decode="prepared", decode_workers=2)
    lines: list[str] = []
    run_job(prepared_plan.job(tmp_path / "prepared"), log=lines.append)  # type: ignore[attr-defined]
    assert _outputs(tmp_path / "files") == _outputs(tmp_path / "prepared")
    made = [line for line in lines if line.startswith("prepared 12 training images")]
    assert len(made) == 1, lines
    copies = sorted((settings.cache_dir / "prepared").iterdir())
    assert len(copies) == 1 and (copies[0] / "pixels.u8").is_file()
    again: list[str] = []
    run_job(prepared_plan.job(tmp_path / "again"), log=again.append)  # type: ignore[attr-defined]
    assert not [line for line in again if line.startswith("prepared ")]  # reused
    train_file = next((photo_home / "imagenet" / "train").rglob("*.JPEG"))
    train_file.touch()
    run_job(prepared_plan.job(tmp_path / "touched"), log=lambda _: None)  # type: ignore[attr-defined]
    assert len(list((settings.cache_dir / "prepared").iterdir())) == 2


def test_a_protocol_run_stopped_and_resumed_gives_the_uninterrupted_result(
    photo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crops are drawn from the run's augmentation generator, which every checkpoint keeps: a run stopped mid-way
    (the test hook's SIGINT after iteration 4) and resumed gives the uninterrupted run's weights and metrics."""
    from shiftbench.erm.interrupt import TEST_HOOK, Interrupted
    from shiftbench.erm.job import run_job

    _, plan = _plan(photo_home)
    run_job(plan.job(tmp_path / "plain"), log=lambda _: None)  # type: ignore[attr-defined]
    monkeypatch.setenv(TEST_HOOK, "4")
    with pytest.raises(Interrupted):
        run_job(plan.job(tmp_path / "stopped"), log=lambda _: None)  # type: ignore[attr-defined]
    monkeypatch.delenv(TEST_HOOK)
    run_job(plan.job(tmp_path / "stopped"), log=lambda _: None)  # type: ignore[attr-defined]
    assert _outputs(tmp_path / "stopped") == _outputs(tmp_path / "plain")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"transforms": "imagenet"}, "parameter 'transforms': must be one of square, robustness_imagenet, domainbed"),
        ({"augment": "flip_rot90"}, "parameter 'augment': the robustness_imagenet protocol has its own training"),
        ({"normalization": "symmetric"}, "parameter 'normalization': the robustness_imagenet protocol feeds pixels"),
        ({"transforms": "square", "decode": "prepared"}, "parameter 'decode': prepared copies are a protocol's"),
        ({"prepared_side": 256}, "parameter 'prepared_side': applies to a prepared copy: set decode=prepared too"),
        ({"decode": "prepared", "prepared_side": 16}, "parameter 'prepared_side': must be at least image_size (32)"),
        ({"decode": "disk"}, "parameter 'decode': must be files or prepared"),
    ],
    ids=["unknown", "augment", "symmetric", "square-prepared", "side-alone", "side-small", "decode"],
)
def test_a_protocol_setting_that_cannot_hold_is_one_line(
    photo_home: Path, overrides: dict[str, object], message: str
) -> None:
    from shiftbench.errors import InputError

    with pytest.raises(InputError) as refused:
        _plan(photo_home, **overrides)
    assert str(refused.value).startswith(message), str(refused.value)


def test_the_static_step_takes_a_protocols_batches_as_the_eager_step_does(photo_home: Path, tmp_path: Path) -> None:
    """The step a CUDA graph captures copies each protocol batch and its lighting draws into its static inputs; on
    CPU it runs uncaptured and trains as the eager step (within the fused optimizer's rounding)."""
    import torch

    from shiftbench.erm.job import run_job

    for step in ("eager", "graph"):
        _, plan = _plan(photo_home, step=step)
        run_job(plan.job(tmp_path / step), log=lambda _: None)  # type: ignore[attr-defined]
    eager, graph = (torch.load(tmp_path / step / "model.pt") for step in ("eager", "graph"))
    assert eager.keys() == graph.keys()
    for key in eager:
        assert torch.allclose(eager[key].float(), graph[key].float(), atol=1e-5, rtol=1e-4), key
    assert json.loads((tmp_path / "graph" / "run.json").read_text())["step"] == "static"  # uncaptured on CPU
