"""Exports beside their clients (tests/test_export_clients.py loads each with its client): what is refused before
anything is written, what a failure leaves (nothing), names that cannot collide, the same bytes twice, and the
default DomainBed environments holding every class for every family."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.exports import LAYOUTS, ExportOptions, export, placing
from shiftbench.exports.folders import INDEX, distinct_folders, domainbed
from shiftbench.exports.table import ExportTable, file_names
from shiftbench.families import registry
from shiftbench.pipelines.cli import export as cli_export
from shiftbench.pipelines.cli import main
from shiftbench.splits.published import PublishedSplit, published_split, split_images

from .conftest import TEST_CACHE, ToyDir, publish_all, toy_tables

CASE = "sprites-sc-object_color"
SPRITES = {"SHIFTBENCH_SPRITES_PER_COMBINATION": "20"}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A warehouse with ``sc``: sprites-sc-object_color at 20 images per combination and 150 training examples."""
    root = tmp_path_factory.mktemp("exports")
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(root / "home"), "SHIFTBENCH_OFFLINE": "1", **SPRITES})
    settings.cache_dir.mkdir(parents=True)
    (TEST_CACHE / "sprites").mkdir(parents=True, exist_ok=True)
    (settings.cache_dir / "sprites").symlink_to(TEST_CACHE / "sprites")
    registry.register_variant(settings, registry.family("conds").kind("case"), "sc", CASE, {"train_size": 150})
    publish_all(settings, "conds/case", ["sc"])
    return settings


@pytest.fixture
def published(home: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key in list(os.environ):
        if key.startswith("SHIFTBENCH_"):
            monkeypatch.delenv(key)
    for key, value in {"SHIFTBENCH_HOME": str(home.home), "SHIFTBENCH_OFFLINE": "1", **SPRITES}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("DAGSTER_HOME", str(home.home / "dagster_home"))
    return home


def files_of(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the sha256 of its bytes (links resolved)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_refused_exports_are_one_line_and_write_nothing(
    published: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each refusal is decided before anything is written: exit 2, one line naming the parameter, no DIR."""
    for args, message in (
        (["--layout", "domainbed", "--environment", "y,object_color"], "environment 'y=0,object_color=blue'"),
        (["--layout", "domainbed", "--environment", "group"], "has no image of class"),
        (["--layout", "domainbed", "--environment", "colour"], "'colour' is not a field"),
        (["--layout", "domainbed", "--environment", ""], "parameter '--environment': '' names an empty field"),
        (["--layout", "domainbed", "--environment", "split,"], "names an empty field"),
        (["--layout", "hf", "--images", "copy"], "parameter '--images': --images is for imagefolder"),
        (["--layout", "domainbed", "--val-split", "id_val"], "parameter '--val-split'"),
        (["--layout", "wilds", "--val-split", "test"], "'test' cannot serve as the validation split"),
        (["--layout", "wilds", "--val-split", "id_test"], "has no split 'id_test'"),
    ):
        target = tmp_path / "out" / "dir"
        assert main(["export", "sc", str(target), *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (args, err)
        assert not (tmp_path / "out").exists(), args


@pytest.mark.slow
def test_a_refused_environment_names_the_class_it_lacks_and_the_fields_that_work(
    published: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "sc", str(tmp_path / "d"), "--layout", "domainbed", "--environment", "y,object_color"]) == 2
    err = capsys.readouterr().err
    assert "environment 'y=0,object_color=blue' of sc has no image of class 1 (ellipse), 2 (heart)" in err
    assert "fields whose environments all do: split, object_color, background_color, size" in err


@pytest.mark.slow
def test_a_failure_while_writing_leaves_no_partial_export(
    published: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error after some images were written (here the 100th copy) removes everything the export wrote: a DIR
    it created, or the contents of an empty DIR it was given; the error keeps its traceback (a bug, not input)."""
    copy = placing.shutil.copyfile
    calls = []

    def failing(source: Path, destination: Path) -> Path:
        calls.append(destination)
        if len(calls) == 100:
            raise RuntimeError("injected failure")
        return copy(source, destination)

    monkeypatch.setattr(placing.shutil, "copyfile", failing)
    given = tmp_path / "given"
    given.mkdir()
    for target in (tmp_path / "new" / "dir", given):
        calls.clear()
        with pytest.raises(RuntimeError, match="injected failure"):
            main(["export", "sc", str(target), "--layout", "domainbed", "--images", "copy"])
        assert len(calls) == 100
    assert not (tmp_path / "new").exists() and list(given.iterdir()) == []


@pytest.mark.slow
def test_an_environment_named_like_the_index_gets_a_folder_of_its_own(published: Settings, tmp_path: Path) -> None:
    """An attribute value ``environments.json`` once made a folder that the index file then could not be written
    over (a traceback after 367 images): such a folder name gets a short hash, the index stays a file."""
    split = published_split(published, "sc")
    values = pl.Series(["environments.json", "Environments.JSON", "blue"])
    group = values.gather(pl.int_range(split.examples.height, eager=True) % 3)
    split = dataclasses.replace(split, examples=split.examples.with_columns(group.alias("group")))
    target = tmp_path / "out"
    done = export(split, split_images(published, split), target, ExportOptions("domainbed", "group"))
    index = json.loads((target / INDEX).read_text())
    folders = {e["environment"]: e["folder"] for e in index["environments"]}
    assert folders["blue"] == "blue" and (target / INDEX).is_file()
    assert {folders["environments.json"][:18], folders["Environments.JSON"][:18]} == {
        "environments.json-",
        "Environments.JSON-",
    }
    assert sorted(p.name for p in target.iterdir() if p.is_dir()) == sorted(folders.values()) == sorted(done.counts)


@pytest.mark.slow
def test_the_same_split_exports_to_the_same_bytes(published: Settings, tmp_path: Path) -> None:
    for layout in LAYOUTS:
        first, second = tmp_path / f"{layout}-1", tmp_path / f"{layout}-2"
        for target in (first, second):
            assert main(["export", "sc", str(target), "--layout", layout]) == 0
        assert files_of(first) == files_of(second) != {}, layout


@pytest.mark.slow
def test_images_modes(published: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """link: the image files themselves (same inode) on one filesystem; copy: other inodes, same bytes;
    symlink: absolute links to the images."""
    for mode in placing.IMAGE_MODES:
        assert main(["export", "sc", str(tmp_path / mode), "--layout", "wilds", "--images", mode]) == 0
    out = capsys.readouterr().out
    assert "hard links" in out and "copies (" in out and "symlinks (they dangle if the images move)" in out
    name = sorted((tmp_path / "link" / "images").iterdir())[0].name
    linked, copied, symlinked = (tmp_path / mode / "images" / name for mode in ("link", "copy", "symlink"))
    source = symlinked.resolve()
    assert symlinked.is_symlink() and symlinked.readlink().is_absolute()
    assert linked.samefile(source) and not linked.is_symlink()
    assert not copied.samefile(source) and copied.read_bytes() == source.read_bytes()


def test_file_and_folder_names_never_collide() -> None:
    names = file_names(["a/b", "a__b", "IMG", "img", "x.png"], [".png"] * 5)
    assert len({n.casefold() for n in names}) == 5 and all(n.endswith(".png") for n in names)
    assert names[4] == "x.png"  # an id that already ends in its suffix keeps its name
    folders = distinct_folders(["blue", "Blue", "environments.json", "a b"], ["blue", "Blue", INDEX, "a b"], (INDEX,))
    assert len({f.casefold() for f in folders.values()}) == 4 and INDEX not in folders.values()
    assert folders["a b"].startswith("a_b-")


def test_the_cli_offers_every_layout_and_image_mode() -> None:
    assert cli_export.LAYOUTS == LAYOUTS and cli_export.IMAGE_MODES == placing.IMAGE_MODES


def test_the_default_environments_of_a_breeds_split_hold_every_class(toy_breeds_dir: ToyDir, tmp_path: Path) -> None:
    """DomainBed's default environments (the splits) on a BREEDS split: its source and target domains hold every
    superclass; its own groups (subclasses) hold one superclass each and are refused."""
    examples = toy_tables(toy_breeds_dir())["examples"]
    assert isinstance(examples, pl.DataFrame)
    rows = examples.select("example_id", "split", "y", "y_name", "group").sort("example_id")
    rows = rows.with_columns(pl.col("example_id").alias("source"), (pl.col("example_id") + ".JPEG").alias("file"))
    split = PublishedSplit("breeds", "toy", "v", tmp_path, "imagenet", {}, rows)
    classes = tuple(rows.select("y", "y_name").unique().sort("y")["y_name"])
    table = ExportTable(split, rows, classes, ("group",), "imagenet")
    plan = domainbed(table, None)
    assert sorted(plan.counts) == ["id_test", "test"] and sum(plan.counts.values()) == rows.height
    with pytest.raises(InputError, match=r"has no image of class .*fields whose environments all do: split"):
        domainbed(table, "group")
