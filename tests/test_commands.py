"""Every command as trustworthy as `build`: a table of bad inputs per command, each one line naming the parameter
or file, exit code 2, and a store left exactly as it was; `--help` of every command; and what the commands
guarantee beside (variants of tagged benchmarks, duplicates, names of the papers' data, the publication log)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.families import registry
from shiftbench.pipelines.cli import build_parser, main
from shiftbench.store import Store

from .conftest import FIXTURES, TEST_CACHE, missing, publish_all

CASE = "spr"  # a sprites case small enough to build once for the module (20 images per combination)
SPRITES = {"SHIFTBENCH_SPRITES_PER_COMBINATION": "20"}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    root = tmp_path_factory.mktemp("commands")
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(root / "home"), "SHIFTBENCH_OFFLINE": "1", **SPRITES})
    settings.cache_dir.mkdir(parents=True)
    (TEST_CACHE / "sprites").mkdir(parents=True, exist_ok=True)
    (settings.cache_dir / "sprites").symlink_to(TEST_CACHE / "sprites")
    kind = registry.family("conds").kind("case")
    registry.register_variant(settings, kind, CASE, "sprites-uniform", {"train_size": 150})
    publish_all(settings, "conds/case", [CASE])
    return settings


@pytest.fixture
def cli(home: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key in list(os.environ):
        if key.startswith("SHIFTBENCH_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(home.home))
    monkeypatch.setenv("SHIFTBENCH_OFFLINE", "1")
    monkeypatch.setenv("DAGSTER_HOME", str(home.home / "dagster_home"))
    for key, value in SPRITES.items():
        monkeypatch.setenv(key, value)
    return home


def store_state(settings: Settings) -> list[tuple[str, int, int]]:
    """Every file of the store with its size and modification time: equal before and after = untouched."""
    root = settings.store_dir
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    )


def run_refused(settings: Settings, argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> str:
    """``argv`` exits 2 with one line holding ``fragment``, no traceback, and the store unchanged."""
    before = store_state(settings)
    code = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (argv, code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error:"), (argv, err)
    assert fragment in lines[0], (argv, err)
    assert "Traceback" not in out + err
    assert store_state(settings) == before, argv
    return lines[0]


def _test_ids(settings: Settings) -> list[str]:
    store = Store(settings.store_dir)
    latest = store.log.latest(CASE)
    assert latest is not None
    examples = pl.read_parquet(store.layout.staged("conds", CASE, latest.version).table_path("examples"))
    return sorted(examples.filter(pl.col("split") == "test")["example_id"].to_list())


# -- help ---------------------------------------------------------------------------------------------------
def _commands() -> list[list[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    commands = [[name] for name in sub.choices]  # type: ignore[union-attr]
    return [[], *commands, ["generate", "metashift-dg"]]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c) or "shiftbench")
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: shiftbench") and "Traceback" not in out


# -- one table of bad inputs per command ----------------------------------------------------------------------
SQL = [
    (["sql", "SELECT 1", "--max-rows", "-1"], "parameter '--max-rows': must be at least 1"),
    (["sql", "SELECT 1", "--max-rows", "x"], "argument --max-rows: invalid int value"),
    (["sql", "SELEC nothing"], "syntax error"),
    (["sql"], "the following arguments are required: query"),
]
LEADERBOARD = [
    (["leaderboard", "nope"], "no published benchmark 'nope'"),
    (["leaderboard", "--metrics", "acc_avgx"], "parameter '--metrics': unknown metric 'acc_avgx'"),
    (["leaderboard", "--metrics", "acc_avg' OR 1=1 --"], "unknown metric"),
    (["leaderboard", "--splits", "tset"], "parameter '--splits': unknown split 'tset'"),
    (["leaderboard", "--splits", ","], "name at least one split"),
    (["leaderboard", "--format", "html"], "invalid choice: 'html'"),
    (["leaderboard", "--include-standin=yes"], "argument --include-standin: ignored explicit argument 'yes'"),
    (["leaderboard", "nope", "--include-standin"], "no published benchmark 'nope'"),
]
EXPORT = [
    (["export", CASE, "{file}"], "exists and is not a directory"),
    (["export", CASE, "{file}/under"], "is not a directory"),
    (["export", CASE, "{full}"], "target directory is not empty"),
    (["export", CASE, "{new}", "--path-template", "images/{"], "parameter '--path-template': invalid template"),
    (["export", CASE, "{new}", "--path-template", "{x}"], "must hold exactly one {}"),
    (["export", CASE, "{new}", "--path-template", "{}/{}"], "must hold exactly one {}"),
    (["export", CASE, "{new}", "--layout", "wilds", "--environment", "group"], "--environment is for --layout"),
    (["export", "nope", "{new}"], "nope"),
    (["export", CASE, "{new}", "--layout", "tar"], "invalid choice: 'tar'"),
    (["export", CASE, "{new}", "--layout", "domainbed", "--environment", ""], "parameter '--environment': ''"),
    (["export", CASE, "{new}", "--layout", "domainbed", "--environment", " , "], "names an empty field"),
    (["export", CASE, "{new}", "--layout", "domainbed", "--environment", "y,object_color"],
     "parameter '--environment': environment 'y=0,object_color=blue' of spr has no image of class 1 (ellipse)"),
    (["export", CASE, "{new}", "--layout", "domainbed", "--environment", "group"], "has no image of class"),
    (["export", CASE, "{new}", "--layout", "hf", "--images", "link"], "parameter '--images'"),
    (["export", CASE, "{new}", "--images", "hardlink"], "argument --images: invalid choice: 'hardlink'"),
    (["export", CASE, "{new}", "--layout", "imagefolder", "--val-split", "id_val"], "parameter '--val-split'"),
    (["export", CASE, "{new}", "--layout", "wilds", "--val-split", "train"], "'train' cannot serve as the valid"),
    (["export", CASE, "{new}", "--layout", "hf", "--val-split", "val"], "spr has no split 'val'"),
]  # fmt: skip
EVAL = [
    (["eval", CASE, "{preds}", "--method", "erm"], "names the ERM job's trained runs"),
    (["eval", CASE, "{preds}", "--method", "groupdro"], "names the ERM job's trained runs"),
    (["eval", CASE, "{preds}", "--method", "mine", "--seed", "-1"], "parameter '--seed': must be an integer in 0.."),
    (["eval", CASE, "{preds}", "--method", "mine", "--seed", "99999999999999"], "parameter '--seed'"),
    (["eval", CASE, "{floats}", "--method", "mine"], "y_pred must hold integer class indices, the column is Float64"),
    (["eval", CASE, "{bools}", "--method", "mine"], "the column is Boolean"),
    (["eval", CASE, "{csv_float}", "--method", "mine"], "y_pred '1.0' is not a class"),
    (["eval", CASE, "{tmp}/missing.csv", "--method", "mine"], "predictions file not found"),
    (["eval", CASE, "{preds}", "--method", "Mine!"], "parameter '--method'"),
    (["eval", CASE, "{tmp}", "--method", "mine"], "parameter 'PREDICTIONS': is a directory, not a predictions file"),
    (["eval", CASE, "{blank_csv}", "--method", "mine"], "blank.csv:3: blank line: no example_id, no y_pred"),
    (["eval", CASE, "{twice_csv}", "--method", "mine"], "twice.csv:4: example 'a': predicted twice (first at line 2)"),
]
TRAIN = [
    (["train", CASE, "--set", "decode_workers=-4"], "parameter 'decode_workers'"),
    (["train", CASE, "--set", "weight_decay=.inf"], "parameter 'weight_decay'"),
    (["train", CASE, "--set", "momentum=.nan"], "parameter 'momentum'"),
    (["train", CASE, "--set", "batch_size=100000"], "parameter 'batch_size': 100,000 is larger than the 120"),
    (["train", CASE, "--set", "batch_size=zero"], "parameter 'batch_size'"),
    (["train", CASE, "--path-template", "images/{"], "parameter '--path-template': invalid template"),
    (["train", CASE, "--image-root", "{tmp}", "--path-template", "{x}"], "must hold exactly one {}"),
    (["train", CASE, "--seed", "12"], "parameter '--seed'"),
    (["train", CASE, "--set", "init_checkpoint={tmp}/nothing.pt"], "checkpoint not found"),
    (["train", CASE, "--set", "init_checkpoint={torn}"], "torn.pt, parameter 'init_checkpoint': torn or corrupt"),
    (["train", CASE, "--seeds", "0,x"], "parameter '--seeds': 'x' is not a seed or a range like 0-2"),
    (["train", CASE, "--seeds", "3-1"], "parameter '--seeds': seeds are partitions 0..9, got '3-1'"),
    (["train", CASE, "--seeds", "0-12"], "parameter '--seeds': seeds are partitions 0..9"),
    (["train", CASE, "--seeds", "0,1,0"], "seed 0 is named twice"),
    (["train", CASE, CASE, "--seeds", "0"], f"parameter 'benchmarks': {CASE} is named twice"),
    (["train", CASE, "nope", "--seeds", "0"], "nope"),
    (["train", CASE, "--seeds", "0", "--parallel", "0"], "parameter '--parallel': must be at least 1"),
    (["train", CASE, "--seed", "1", "--seeds", "0,1"], "give --seed or --seeds, not both"),
    (["train", CASE, "--seeds", "0", "--set", "seed=3"], "set the seed with --seed"),
    (["train", CASE, "--seeds", "0", "--set", "lr=-1"], "parameter 'lr'"),
    (["train", CASE, "--seeds", "0", "--set", "step=fast"], "parameter 'step'"),
    (["train", CASE, "--set", "threads=-1"], "parameter 'threads'"),
    # a schedule in epochs: whole epochs, in one unit (issue 48)
    (["train", CASE, "--set", "max_epochs=0"], "parameter 'max_epochs': must be whole epochs >= 1, got 0"),
    (["train", CASE, "--seeds", "0", "--set", "max_epochs=x"], "parameter 'max_epochs': expected int, got 'x'"),
    (["train", CASE, "--set", "max_epochs=2", "--set", "max_iters=5"], "give max_epochs or max_iters, not both"),
    (
        ["train", CASE, "--seeds", "0", "--set", "lr_drop_epochs=1", "--set", "lr_milestones=5,9"],
        "parameter 'lr_drop_epochs': give lr_drop_epochs or lr_milestones, not both",
    ),
    (["train", CASE, "--set", "lr_drop_epochs=2,-1"], "parameter 'lr_drop_epochs': must be whole epochs >= 1"),
    (["train", CASE, "--set", "max_iters="], "parameter 'max_iters': has no value: give one, or null for none"),
    (["train", CASE, "--backend", "pbs"], "argument --backend: invalid choice: 'pbs'"),
    (
        ["train", CASE, "--slurm-settings", "{tmp}/cluster.yaml"],
        "parameter '--slurm-settings': only with --backend slurm",
    ),
    (["train", CASE, "--backend", "slurm", "--in-process"], "parameter '--in-process': a Slurm job trains on a node"),
    (["train", CASE, "--backend", "slurm", "--slurm-settings", "{tmp}/none.yaml"], "Slurm settings file not found"),
]
GENERATE = [
    (["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--name", "cat-dog-dg-bag-box"],
     "'cat-dog-dg-bag-box' is already a metashift task spec"),
    (["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--name", "metashift"],
     "'metashift' is already a metashift collection spec"),
    (["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--name", "x@gqa"],
     "parameter '--name': '@' is reserved"),
    (["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--name", "Bad Name"],
     "invalid benchmark name"),
    (["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--out", "{tmp}"],
     "parameter '--out': is a directory"),
    (["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--out", "{tmp}/no/such/x.yaml"],
     "does not exist"),
    (["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--out", "{file}/x.yaml"],
     "is not a directory"),
    (["generate", "metashift-dg", "--classes", "cat", "--test", "dog(shelf)"], "expected two classes A,B"),
    (["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--n", "0"], "must be at least 1"),
]  # fmt: skip
BUILD = [
    (["build", "metashift", "--benchmark", "metashift@generated", "--set", "edge_threshold=0.3", "--name", "x@gqa"],
     "metashift@generated carries the tag @generated, so the variant is named x@generated"),
    (["build", "metashift", "--benchmark", "metashift@generated", "--set", "edge_threshold=0.3", "--name",
      "metashift@generated"], "is already a benchmark spec (a metashift collection spec)"),
    (["build", "--benchmark", "spr", "--set", "seed=1"], "needs --name NEW"),
    (["build", "--nonsense"], "unrecognized arguments: --nonsense"),
    (["build", "metashift", "--benchmark", "metashift-attributes", "--units", "99999999999999999999"],
     "parameter '--units': must be in 1..2,147,483,647"),  # not an OverflowError from deep in the plan
    (["build", "metashift", "--benchmark", "metashift-attributes", "--units", "2147483648"],
     "parameter '--units': must be in 1..2,147,483,647"),
    (["build", "metashift", "--benchmark", "metashift-attributes", "--units", "0"], "parameter '--units'"),
    # an empty classes built every class; a class named twice inline was folded (a classes_file refuses it)
    (["build", "metashift", "--benchmark", "metashift@generated", "--set", "classes=", "--name", "x"],
     "parameter 'classes': has no value: give one, or null for none"),
    (["build", "metashift", "--benchmark", "metashift@generated", "--set", "classes=cat,cat,dog", "--name", "x"],
     "parameter 'classes': class 'cat' is listed twice"),
]  # fmt: skip
OTHERS = [
    (["gc", "--keep", "0"], "parameter 'keep'"),
    (["check", "nope"], "'nope' has no published version"),
    (["versions", "--x"], "unrecognized arguments"),
    (["analyse", "nope"], "unknown analysis 'nope'"),
]
TABLE = [
    pytest.param(argv, fragment, id=" ".join(argv)[:70])
    for argv, fragment in SQL + LEADERBOARD + EXPORT + EVAL + TRAIN + GENERATE + BUILD + OTHERS
]


@pytest.fixture
def places(cli: Settings, tmp_path: Path) -> dict[str, str]:
    """The paths the table's arguments name: a plain file, a non-empty folder, predictions of every kind."""
    file = tmp_path / "a-file"
    file.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").touch()
    ids = _test_ids(cli)
    predictions = pl.DataFrame({"example_id": ids, "y_pred": [0] * len(ids)})
    predictions.write_parquet(tmp_path / "preds.parquet")
    predictions.with_columns(pl.col("y_pred").cast(pl.Float64)).write_parquet(tmp_path / "floats.parquet")
    predictions.with_columns(pl.col("y_pred").cast(pl.Boolean)).write_parquet(tmp_path / "bools.parquet")
    (tmp_path / "float.csv").write_text("example_id,y_pred\n" + "".join(f"{i},1.0\n" for i in ids))
    (tmp_path / "blank.csv").write_text(f"example_id,y_pred\n{ids[0]},0\n\n{ids[1]},0\n")
    (tmp_path / "twice.csv").write_text("example_id,y_pred\na,0\nb,0\na,1\n")
    (tmp_path / "torn.pt").write_bytes(b"PK\x03\x04" + bytes(60))  # the start of torch.save's zip, cut short
    return {
        "tmp": str(tmp_path),
        "file": str(file),
        "full": str(full),
        "new": str(tmp_path / "new"),
        "preds": str(tmp_path / "preds.parquet"),
        "floats": str(tmp_path / "floats.parquet"),
        "bools": str(tmp_path / "bools.parquet"),
        "csv_float": str(tmp_path / "float.csv"),
        "blank_csv": str(tmp_path / "blank.csv"),
        "twice_csv": str(tmp_path / "twice.csv"),
        "torn": str(tmp_path / "torn.pt"),
    }


@pytest.mark.parametrize(("argv", "fragment"), TABLE)
def test_bad_input_is_one_line_exit_2_and_the_store_unchanged(
    cli: Settings,
    places: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    fragment: str,
) -> None:
    filled = [arg.format(**places) if "{" in arg and "}" in arg and arg.split("{")[1].split("}")[0] in places else arg
              for arg in argv]  # fmt: skip
    run_refused(cli, filled, fragment, capsys)
    assert not Path(places["new"]).exists()  # nothing written where a refused command would have written


def test_a_read_only_target_is_one_line(
    cli: Settings, places: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Root may write anywhere, so read-only means a read-only mount here."""
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(frozen)], capture_output=True)
    if done.returncode != 0:
        why = done.stderr.decode().strip()
        missing(f"cannot mount a read-only tmpfs here ({why}): run as root", "SHIFTBENCH_REQUIRE_MOUNT")
    try:
        run_refused(cli, ["export", CASE, str(frozen / "out")], "is not writable", capsys)
        generate = ["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)"]
        run_refused(cli, [*generate, "--out", str(frozen / "x.yaml")], "is not writable", capsys)
    finally:
        subprocess.run(["umount", "-l", str(frozen)], check=False)


@pytest.mark.slow
def test_a_checkpoint_that_does_not_cover_the_model_is_refused_in_one_line(
    cli: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused inside the training job (it knows the model): one line, before anything trains or is logged."""
    import torch

    torch.save({}, tmp_path / "empty.pt")
    train = ["train", CASE, "--preset", "smoke", "--set", "max_iters=4", "--set", "eval_every=2"]
    line = run_refused(cli, [*train, "--set", f"init_checkpoint={tmp_path / 'empty.pt'}"], "covers 0 of", capsys)
    assert "init_partial=true" in line


# -- the tag follows the data, names of the papers' data ---------------------------------------------------------
def test_a_variant_of_a_tagged_benchmark_keeps_the_tag(cli: Settings) -> None:
    kind = registry.family("metashift").kind("collection")
    variant = registry.register_variant(cli, kind, "wider", "metashift@generated", {"edge_threshold": 0.3})
    assert variant.name == "wider@generated" and variant.base == "metashift@generated"
    again = registry.register_variant(cli, kind, "wider@generated", "metashift@generated", {"edge_threshold": 0.3})
    assert again == variant


def test_duplicate_keys_in_a_spec_file_name_both_lines(
    cli: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = tmp_path / "specs.yaml"
    specs.write_text("family: breeds\nbenchmarks:\n  mine:\n    level: 1\n    level: 2\n    n_subclasses: 4\n")
    monkeypatch.setenv("SHIFTBENCH_BREEDS_SPECS", str(specs))
    run_refused(
        cli, ["build", "--list"], f"{specs}:5: invalid YAML: key 'level' is given twice (lines 4 and 5)", capsys
    )


def test_check_names_a_removed_newest_publication(
    cli: Settings, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publication log is a chain: removing the newest event would make an older version latest again."""
    copy = tmp_path / "home"
    shutil.copytree(cli.home, copy, symlinks=True)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(copy))
    events = sorted((copy / "store" / "conds" / CASE / "publications").glob("*.json"))
    assert main(["check", CASE]) == 0
    capsys.readouterr()
    events[-1].unlink()
    assert main(["check"]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED: {events[-1]}: missing: the log's head names it" in out, out


def _scene_file(path: Path, n_images: int, first: int) -> Path:
    path.write_text(json.dumps({str(first + k): {"objects": {"1": {"name": "cat"}}} for k in range(n_images)}))
    return path


def test_gqa_files_get_the_papers_names_only_with_the_releases_image_counts(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    from shiftbench.metashift import annotations as metashift
    from shiftbench.sources.gqa_release import RELEASE_IMAGE_COUNTS

    train = _scene_file(tmp_path / "train_sceneGraphs.json", RELEASE_IMAGE_COUNTS[0], 0)
    val = _scene_file(tmp_path / "val_sceneGraphs.json", RELEASE_IMAGE_COUNTS[1], 10**6)
    both = make_settings(SHIFTBENCH_GQA_SCENE_GRAPHS=f"{train},{val}")
    assert {"metashift", "metashift-attributes"} <= set(metashift.collection_specs(both))
    assert "cat-dog-dg-bag-box" in metashift.task_specs(both)
    for files in (str(train), f"{train},{_scene_file(tmp_path / 'other.json', 600, 2 * 10**6)}"):
        crafted = make_settings(SHIFTBENCH_GQA_SCENE_GRAPHS=files)
        names = set(metashift.collection_specs(crafted))
        assert "metashift@gqa-files" in names and "metashift" not in names
    # What a version records decides its name later (a paper's name with other data is retired).
    assert metashift.recorded_tag({"sources": {"scenes": "gqa-scene-graphs", "gqa_release": False}}) == "gqa-files"
    assert metashift.recorded_tag({"sources": {"scenes": "gqa-scene-graphs", "gqa_release": True}}) is None


def test_celeba_gets_the_papers_names_only_for_the_released_file(
    make_settings: Callable[..., Settings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shiftbench.conds import family as conds
    from shiftbench.sources import celeba

    first = (FIXTURES / "celeba" / "list_attr_celeba_first20000.txt").read_text().splitlines()
    folder = tmp_path / "celeba"
    folder.mkdir()
    (folder / celeba.ATTRIBUTE_FILE).write_text("\n".join(first) + "\n")
    settings = make_settings(SHIFTBENCH_CELEBA_DIR=str(folder))
    assert "celeba-sc-black_hair-uds-smiling@partial" in conds.case_specs(settings)
    # The first 20,000 rows repeated (with new image names) to CelebA's 202,599 rows: the right count, not the file.
    rows = first[2:]
    crafted = [f"{k + 1:06d}.jpg {rows[k % len(rows)].split(maxsplit=1)[1]}" for k in range(celeba.CELEBA_IMAGES)]
    path = folder / celeba.ATTRIBUTE_FILE
    path.write_text("\n".join([str(celeba.CELEBA_IMAGES), first[1], *crafted]) + "\n")
    names = set(conds.case_specs(settings))
    assert "celeba-sc-black_hair-uds-smiling@celeba-files" in names
    assert "celeba-sc-black_hair-uds-smiling" not in names
    monkeypatch.setattr(celeba, "RELEASE_MD5", celeba.file_md5(path))  # as if it were the release's bytes
    assert "celeba-sc-black_hair-uds-smiling" in conds.case_specs(settings)
    origin = {"header_count": celeba.CELEBA_IMAGES, "partial": False, "attributes_md5": "0" * 32}
    assert conds.recorded_tag({"origin": origin}) == "celeba-files"
    assert conds.recorded_tag({"origin": {**origin, "header_count": 20_000}}) == "partial"


def test_export_values_that_would_be_paths_stay_inside_the_target(cli: Settings, tmp_path: Path) -> None:
    """Environment values become folders: '.', '..' and 'a/b' must not write beside or above the target, and two
    values that clean to the same text must not share a folder."""
    import dataclasses

    from shiftbench.exports import ExportOptions, export
    from shiftbench.splits.published import published_split, split_images

    split = published_split(cli, CASE)
    values = pl.Series([".", "..", "a/b", "a_b", "", ".hidden"])
    group = values.gather(pl.int_range(split.examples.height, eager=True) % len(values))
    split = dataclasses.replace(split, examples=split.examples.with_columns(group.alias("group")))
    images = split_images(cli, split)
    target = tmp_path / "out" / "dir"
    counts = export(split, images, target, ExportOptions("domainbed", "group")).counts
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["dir"] and not (tmp_path / "dir").exists()
    folders = sorted(p.name for p in target.iterdir() if p.is_dir())
    assert len(folders) == len(values) == len(counts) and not {".", "..", ""} & set(folders)
    index = json.loads((target / "environments.json").read_text())["environments"]
    assert [e["folder"] for e in index] == folders and sorted(e["environment"] for e in index) == sorted(values)
    assert all(not name.startswith(".") and "/" not in name for name in folders), folders
    for link in target.rglob("*"):
        assert link.absolute().is_relative_to(target.absolute())


# -- a paper's name refused for other data: why, and the name to use, on every command that resolves names --------
GQA_FIXTURE = FIXTURES / "metashift" / "gqa_scene_graphs_from_attributes.json"
PAPER_NAMES = [
    pytest.param({"SHIFTBENCH_BREEDS_HIERARCHY_SOURCE": "wordnet-default"}, "breeds", "living17",
                 "living17@wordnet-default", "the project's own calibration of WordNet", id="breeds-wordnet-default"),
    pytest.param({}, "metashift", "metashift", "metashift@generated",
                 "the generated scene sample, not of Visual Genome", id="metashift-generated"),
    pytest.param({"SHIFTBENCH_GQA_SCENE_GRAPHS": str(GQA_FIXTURE)}, "metashift", "cat-dog-dg-cabinet-bed",
                 "cat-dog-dg-cabinet-bed@gqa-files", "not GQA's two released scene-graph files",
                 id="metashift-gqa-files"),
    pytest.param({"SHIFTBENCH_CELEBA_DIR": "{celeba}"}, "conds", "celeba-uniform", "celeba-uniform@partial",
                 "lists fewer than CelebA's 202,599 images", id="conds-partial"),
]  # fmt: skip


def _partial_celeba(folder: Path) -> Path:
    from shiftbench.sources import celeba

    folder.mkdir(exist_ok=True)
    shutil.copy(FIXTURES / "celeba" / "list_attr_celeba_first20000.txt", folder / celeba.ATTRIBUTE_FILE)
    return folder


@pytest.mark.parametrize("command", ["build", "train"])
@pytest.mark.parametrize(("env", "family", "paper", "tagged", "why"), PAPER_NAMES)
def test_a_paper_s_name_refused_for_other_data_says_why_and_which_name_to_use(
    cli: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    env: dict[str, str],
    family: str,
    paper: str,
    tagged: str,
    why: str,
) -> None:
    """Never 'unknown benchmark ...; did you mean ... {paper} ...?': the name is known, and refused for this data."""
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(celeba=_partial_celeba(tmp_path / "celeba")))
    argv = ["build", family, "--benchmark", paper] if command == "build" else ["train", paper]
    line = run_refused(cli, argv, f"'{paper}' is the paper's name, given only to the paper's own data", capsys)
    assert line.endswith(f"use {tagged}") and why in line and "did you mean" not in line, line


def test_a_paper_s_name_published_only_with_its_tag_says_so_on_every_command_that_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """celeba-uniform built from 20,000 of CelebA's rows is published as celeba-uniform@partial; asked for by the
    paper's name (the CelebA folder no longer set), train, eval, export and load_split say why and what to use."""
    import shiftbench
    from shiftbench.errors import InputError

    folder = _partial_celeba(tmp_path / "celeba")
    env = {"SHIFTBENCH_HOME": str(tmp_path / "home"), "SHIFTBENCH_OFFLINE": "1", "SHIFTBENCH_CELEBA_DIR": str(folder)}
    settings = Settings.from_env(env)
    publish_all(settings, "conds/case", ["celeba-uniform@partial"])
    for key in [k for k in os.environ if k.startswith("SHIFTBENCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(settings.home))
    monkeypatch.setenv("DAGSTER_HOME", str(settings.home / "dagster_home"))
    (tmp_path / "p.csv").write_text("example_id,y_pred\n")
    said = "'celeba-uniform' is the paper's name, given only to the paper's own data; it is published here from other"
    for argv in (
        ["train", "celeba-uniform"],
        ["eval", "celeba-uniform", str(tmp_path / "p.csv"), "--method", "mine"],
        ["export", "celeba-uniform", str(tmp_path / "out")],
    ):
        line = run_refused(settings, argv, said, capsys)
        assert line.endswith("use celeba-uniform@partial") and "202,599" in line, line
    with pytest.raises(InputError, match=re.escape(said)):
        shiftbench.load_split("celeba-uniform")
