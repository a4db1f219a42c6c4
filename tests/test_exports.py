"""Exports for algorithm zoos: WILDS' metadata.csv, DomainBed's environment folders and Hugging Face's
Parquet layout, each read back the way its library reads it (`datasets` itself for the last)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from pipelines.cli import main
from shiftbench.erm.export import WILDS_SPLITS
from shiftbench.settings import Settings
from shiftbench.store import Store

CASE = "sprites-sc-object_color"


@pytest.fixture
def published(cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str]) -> tuple[Settings, pl.DataFrame]:
    settings = cli_env()
    assert main(["build", "conds", "--benchmark", CASE]) == 0
    capsys.readouterr()
    store = Store(settings.store_dir)
    latest = store.latest(CASE)
    assert latest is not None
    return settings, pl.read_parquet(store.staged("conds", CASE, latest.version).table_path("examples"))


@pytest.mark.slow
def test_wilds_metadata_csv(published: tuple[Settings, pl.DataFrame], tmp_path: Path) -> None:
    _, examples = published
    target = tmp_path / "wilds"
    assert main(["export", CASE, str(target), "--layout", "wilds"]) == 0
    # As a WILDSDataset subclass reads it: metadata.csv, its split codes, its metadata fields.
    metadata = pl.read_csv(target / "metadata.csv")
    split_dict = json.loads((target / "split_dict.json").read_text())
    fields = json.loads((target / "metadata_fields.json").read_text())
    assert split_dict == {name: WILDS_SPLITS[name] for name in ("train", "test", "id_val")}
    assert fields == ["y", "group", "shape", "object_color", "background_color", "size"]
    assert metadata.height == examples.height
    joined = metadata.join(examples, on="example_id", suffix="_published")
    assert (joined["split"] == joined["split_published"].replace_strict(split_dict)).all()
    assert (joined["y"] == joined["y_published"]).all() and (joined["group"] == joined["group_published"]).all()
    assert all((target / p).resolve().is_file() for p in metadata["path"])


@pytest.mark.slow
def test_domainbed_environments(published: tuple[Settings, pl.DataFrame], tmp_path: Path) -> None:
    _, examples = published
    target = tmp_path / "domainbed"
    assert main(["export", CASE, str(target), "--layout", "domainbed", "--environment", "object_color"]) == 0
    # MultipleEnvironmentImageFolder: environments are the sorted subfolders, each an ImageFolder whose
    # classes (sorted subfolders) are the same everywhere.
    environments = sorted(p.name for p in target.iterdir() if p.is_dir())
    assert environments == ["blue", "red", "yellow"]
    # environments.json names each folder's group as the Grouper (and `shiftbench eval --group-by`) does
    groups = json.loads((target / "environments.json").read_text())
    assert groups == {env: f"object_color={env}" for env in environments}
    classes = [sorted(p.name for p in (target / env).iterdir()) for env in environments]
    assert classes[0] == ["000_square", "001_ellipse", "002_heart"] and all(c == classes[0] for c in classes)
    images = list(target.rglob("*.png"))
    assert len(images) == examples.height and all(p.resolve().is_file() for p in images)


@pytest.mark.slow
def test_domainbed_environments_of_several_fields(published: tuple[Settings, pl.DataFrame], tmp_path: Path) -> None:
    from shiftbench import load_split

    settings, _ = published
    target = tmp_path / "domainbed"
    assert main(["export", CASE, str(target), "--layout", "domainbed", "--environment", "y,object_color"]) == 0
    groups = json.loads((target / "environments.json").read_text())
    examples = load_split(CASE, home=settings.home).examples
    expected = {f"{y}_{c}": f"y={y},object_color={c}" for y, c in examples.select("y", "object_color").unique().rows()}
    assert groups == expected
    counts = {env: len(list((target / env).rglob("*.png"))) for env in groups}
    per_pair = examples.group_by("y", "object_color").len().rows()
    assert counts == {f"{y}_{c}": n for y, c, n in per_pair}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="Hugging Face datasets is not installed")
def test_hugging_face_layout_loads_with_datasets(
    published: tuple[Settings, pl.DataFrame], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, examples = published
    target = tmp_path / "hf"
    assert main(["export", CASE, str(target), "--layout", "hf"]) == 0
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    loaded = datasets.load_dataset(str(target), cache_dir=str(tmp_path / "hf_cache"))
    counts = dict(examples.group_by("split").len().iter_rows())
    assert {name: loaded[name].num_rows for name in loaded} == counts
    assert loaded["test"].features["label"].names == ["square", "ellipse", "heart"]
    row = loaded["test"][0]
    assert Path(row["image_path"]).is_file() and row["object_color"] in ("red", "yellow", "blue")


def test_export_refusals(
    published: tuple[Settings, pl.DataFrame], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").touch()
    for args, message in (
        (["--layout", "wilds", str(full)], "target directory is not empty"),
        (["--layout", "domainbed", "--environment", "colour", str(tmp_path / "d")], "'colour' is not a field"),
        (["--layout", "domainbed", "--environment", "y,colour", str(tmp_path / "e")], "'colour' is not a field"),
        (["--layout", "wilds", "--environment", "group", str(tmp_path / "w")], "--environment is for --layout"),
    ):
        target = args.pop()
        assert main(["export", CASE, target, *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
