"""A BREEDS-shaped split whose images are real photographs, trained end to end through ``shiftbench train`` with the
``breeds`` preset: the robustness library's transforms on the photographs as they are on disk (no square first),
the BREEDS datasets' mean and std; a bad photograph in the folder stops the run with one line naming it.

The photographs: tests/real_photos.py (sample photographs of installed wheels), laid out as ImageNet is
(``train/<wnid>/<wnid>_<n>.JPEG`` and ``val/ILSVRC2012_val_<n>.JPEG`` for the packaged validation labels) for a
two-superclass task of the user's (turtle, lizard; one source and one target subpopulation each).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest
from PIL import Image

from shiftbench.settings import Settings
from shiftbench.store import Store

from .real_photos import make_photos

pytestmark = [pytest.mark.slow, pytest.mark.clients]
SPEC = "family: breeds\nbenchmarks:\n  photos-mini:\n    superclasses: [n01662784, n01674464]\n    n_subclasses: 2\n"
TRAIN_PER_CLASS = 6


def _lay_out(root: Path, photos: list[Path], example_ids: list[str], wnids: list[str]) -> None:
    """ImageNet's layout from the photographs: each file a different crop (and every other one flipped) of one."""
    rng = random.Random(0)
    targets = [root / e for e in example_ids]
    targets += [root / "train" / w / f"{w}_{n}.JPEG" for w in wnids for n in range(TRAIN_PER_CLASS)]
    for k, target in enumerate(targets):
        with Image.open(photos[k % len(photos)]) as opened:
            image = opened.convert("RGB")
        w, h = image.size
        box = (rng.randrange(w // 8), rng.randrange(h // 8), w - rng.randrange(w // 8), h - rng.randrange(h // 8))
        image = image.crop(box)
        if k % 2:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        target.parent.mkdir(parents=True, exist_ok=True)
        image.save(target, "JPEG", quality=85)


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
        "breeds",
        224,
    )
    assert row["image_source"] == "imagenet" and row["n_train"] == 2 * TRAIN_PER_CLASS
    splits = set(pl.read_parquet(staged.table_path("erm_results"))["eval_split"])
    assert splits == {"train", "id_test", "test", "ood_train"}, splits
    assert f"version {runs[0].version} (now latest" in out


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
