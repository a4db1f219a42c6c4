"""The CLI: builds through the Dagster jobs, and every bad input gives one clear error and
publishes nothing (the previous version stays latest)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipelines.cli import main
from shiftbench.settings import Settings
from shiftbench.store import Store

from .conftest import BREEDS_FIXTURE, IMAGENET_WORDNET_FIXTURE, ToyDir

Env = Callable[..., Settings]


@pytest.fixture
def cli_env(make_settings: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., Settings]:
    def apply(**env: str) -> Settings:
        settings = make_settings(**env)
        for key in list(os.environ):
            if key.startswith("SHIFTBENCH_"):
                monkeypatch.delenv(key)
        monkeypatch.setenv("SHIFTBENCH_HOME", str(settings.home))
        monkeypatch.setenv("SHIFTBENCH_OFFLINE", "1")
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return settings

    return apply


@pytest.mark.slow
def test_build_sql_versions_and_check(cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str]) -> None:
    cli_env(SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(BREEDS_FIXTURE))
    assert main(["build", "breeds", "--benchmark", "living17", "--benchmark", "nonliving26-bad"]) == 0
    out = capsys.readouterr().out
    assert "[2/2] nonliving26-bad: nonliving26-bad version" in out
    assert "hierarchy: breeds-published" in out
    assert main(["sql", "SELECT benchmark, n_examples FROM benchmarks ORDER BY 1", "--csv"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "benchmark,n_examples",
        "living17,3400",
        "nonliving26-bad,5200",
    ]
    assert main(["versions", "living17"]) == 0
    assert "breeds-published" in capsys.readouterr().out
    assert main(["check"]) == 0
    assert "living17" in capsys.readouterr().out
    assert main(["build", "--benchmark", "living17", "--set", "seed=3", "--set", "split=good", "--name", "l17g"]) == 0
    capsys.readouterr()
    assert main(["sql", "SELECT params->'overrides' FROM benchmarks WHERE benchmark = 'l17g'", "--csv"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[1].strip('"').replace('""', '"')) == {
        "seed": 3,
        "split": "good",
    }
    assert main(["sql", "SELECT nope FROM benchmarks"]) == 2


def _toy_cycle(d: Path) -> None:
    with (d / "class_hierarchy.txt").open("a") as handle:
        handle.write("n01440764 dummy1\n")


def _toy_rootless(d: Path) -> None:
    for name in ("class_hierarchy.txt", "node_names.txt"):
        (d / name).write_text((d / name).read_text().replace("n00001740", "dummy0"))


CASES: list[tuple[str, dict[str, str], Callable[[Path], None] | None, list[str], str]] = [
    # (case, files to write into the BREEDS dir, mutation, extra CLI args, expected message)
    ("malformed line", {"class_hierarchy.txt": "n00001740 dummy1 dummy2\n"}, None, [],
     "class_hierarchy.txt:1: expected"),
    ("unknown id", {"class_hierarchy.txt": "n00001740 dummy1\ndummy1 n0404040\n"}, None, [],
     "class_hierarchy.txt:2: unknown id n0404040"),
    ("cycle", {}, _toy_cycle, [], "cycle"),
    ("missing root", {}, _toy_rootless, [], "root n00001740 is missing"),
    ("truncated json", {"dataset_class_info.json": '[[0, "n01440764", "tench"],\n[1, "n014'}, None, [],
     "dataset_class_info.json:2: invalid JSON"),
    ("no superclass at level", {}, None, ["--set", "level=9"], "parameter 'level': no node at level 9"),
    ("N too large", {}, None, ["--set", "n_subclasses=50"], "parameter 'n_subclasses': N=50 exceeds"),
    ("unknown ancestor", {}, None, ["--set", "ancestor=n42424242"], "parameter 'ancestor': unknown node"),
    ("unknown parameter", {}, None, ["--set", "sead=3"], "parameter 'sead'"),
    ("bad value", {}, None, ["--set", "seed=three"], "parameter 'seed': must be an integer"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("case", "files", "mutate", "args", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_error_and_publishes_nothing(
    cli_env: Callable[..., Settings],
    toy_breeds_dir: ToyDir,
    capsys: pytest.CaptureFixture[str],
    case: str,
    files: dict[str, str],
    mutate: Callable[[Path], None] | None,
    args: list[str],
    message: str,
) -> None:
    # A toy spec file so the good build is fast: level 1, N=4.
    directory = toy_breeds_dir("good")
    spec_file = directory.parent / "toy_specs.yaml"
    spec_file.write_text("family: breeds\nbenchmarks:\n  toy:\n    level: 1\n    n_subclasses: 4\n")
    settings = cli_env(SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(directory), SHIFTBENCH_BREEDS_SPECS=str(spec_file))
    _reload_partitions()
    assert main(["build", "--benchmark", "toy"]) == 0
    store = Store(settings.store_dir)
    good = store.latest("toy")
    assert good is not None
    capsys.readouterr()

    for name, text in files.items():
        (directory / name).write_text(text)
    if mutate is not None:
        mutate(directory)
    code = main(["build", "--benchmark", "toy", *args])
    err = capsys.readouterr().err
    assert code != 0
    assert message in err, err
    assert "Traceback" not in err
    latest = store.latest("toy")
    assert latest is not None and latest.version == good.version
    assert [v.version for v in store.versions("toy")] == [good.version]


def _reload_partitions() -> None:
    """Spec files are read when the code location loads; reload it like `dagster dev` would."""
    import importlib

    import assets.breeds
    import pipelines.definitions

    importlib.reload(assets.breeds)
    importlib.reload(pipelines.definitions)


@pytest.fixture(autouse=True)
def _restore_code_location() -> Iterator[None]:
    yield
    import assets.breeds

    if "toy" in assets.breeds.SPECS:  # a test loaded the toy spec file: back to the shipped specs
        os.environ.pop("SHIFTBENCH_BREEDS_SPECS", None)
        _reload_partitions()


@pytest.mark.slow
def test_a_bad_imagenet_hierarchy_dir_and_edit_file(
    cli_env: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "imagenet"
    bad.mkdir()
    (bad / "words.txt").write_text((IMAGENET_WORDNET_FIXTURE / "words.txt").read_text())
    (bad / "wordnet.is_a.txt").write_text("n00001740 n00001930\nn00001930\n")
    cli_env(SHIFTBENCH_IMAGENET_HIERARCHY_DIR=str(bad))
    assert main(["build", "--benchmark", "living17"]) == 2
    assert "wordnet.is_a.txt:2: expected 'parent child'" in capsys.readouterr().err
    edits = tmp_path / "edits.txt"
    edits.write_text("collapse_node n00001930\nsplit_node n00002684\n")
    cli_env(SHIFTBENCH_BREEDS_CALIBRATION=str(edits))
    assert main(["build", "--benchmark", "living17"]) == 2
    assert "edits.txt:2: unknown operation 'split_node'" in capsys.readouterr().err
