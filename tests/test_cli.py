"""The CLI: builds through the Dagster jobs (one run per kind), and every bad input, before or inside a
run, is one line naming the file, line or parameter, exit code 2, and publishes nothing."""

# long: the command's table of bad inputs and its end-to-end runs share the toy home built once here (built_once)

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.pipelines.cli import main
from shiftbench.store import Store

from .conftest import BREEDS_FIXTURE, IMAGENET_WORDNET_FIXTURE, PROJECT, TOY_CLASSES, ToyDir

Env = Callable[..., Settings]


TOY_SPECS = (
    "family: breeds\nbenchmarks:\n  toy:\n    level: 1\n    n_subclasses: 4\n"
    "  toy2:\n    level: 1\n    n_subclasses: 4\n    seed: 1\n"
)


@pytest.fixture
def toy_cli(cli_env: Callable[..., Settings], toy_breeds_dir: ToyDir) -> tuple[Settings, Path]:
    """The CLI on the toy hierarchy with two fast specs of a user's file, toy and toy2: (settings, hierarchy dir)."""
    directory = toy_breeds_dir("good")
    spec_file = directory.parent / "toy_specs.yaml"
    spec_file.write_text(TOY_SPECS)
    return cli_env(SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(directory), SHIFTBENCH_BREEDS_SPECS=str(spec_file)), directory


def built_once(stash: Path, tmp_path: Path, parts: tuple[str, ...], build: Callable[[], object]) -> None:
    """The folders ``parts`` of ``tmp_path`` as ``build`` leaves them, built once per ``stash`` (a module fixture's
    folder: once per module and xdist worker) and copied into every later test's ``tmp_path`` (its own to change;
    copies keep their symbolic links, as the homes' links to the shared test cache). A copy's files are new to the
    home's catalog: its next refresh verifies them against their checksums, as for any copied home."""
    if (stash / "done").exists():
        for part in parts:
            shutil.rmtree(tmp_path / part, ignore_errors=True)
            shutil.copytree(stash / part, tmp_path / part, symlinks=True)
        return
    build()
    for part in parts:
        shutil.copytree(tmp_path / part, stash / part, symlinks=True)
    (stash / "done").touch()


@pytest.fixture(scope="module")
def _toy_published_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("toy_published")


@pytest.fixture
def toy_published(toy_cli: tuple[Settings, Path], _toy_published_once: Path, tmp_path: Path) -> tuple[Settings, Path]:
    """``toy_cli`` with toy built through the CLI and published: built once per module and worker, then each test
    gets its own copy of the home and the Dagster home (the hierarchy dir is its own, the same files)."""

    def build() -> None:
        assert main(["build", "--benchmark", "toy"]) == 0

    built_once(_toy_published_once, tmp_path, ("home", "dagster_home"), build)
    return toy_cli


TOY_HIERARCHY_WARNING = "differ from the BREEDS release; benchmarks record hierarchy=breeds-files"


def assert_one_line(err: str, message: str) -> None:
    """What the terminal shows for a user error: exactly one line, ours, never Dagster's trace (the toy
    hierarchy's own warning, that it is not the BREEDS release, may come before it)."""
    err = "".join(line for line in err.splitlines(keepends=True) if TOY_HIERARCHY_WARNING not in line)
    assert message in err, err
    assert err.count("\n") == 1, err
    for noise in ("Traceback", "Stack Trace", "dagster._core", "DagsterExecutionStepExecutionError"):
        assert noise not in err, err


@pytest.mark.slow
def test_build_sql_versions_check_and_named_variants(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = cli_env(SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(BREEDS_FIXTURE))
    assert main(["build", "breeds", "--benchmark", "living17", "--benchmark", "nonliving26-bad"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "[2/2] nonliving26-bad: version" in out
    assert "hierarchy: breeds-published" in out and "NOT the published" not in captured.err  # the release's bytes
    assert main(["sql", "SELECT benchmark, n_examples FROM benchmarks ORDER BY 1", "--csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["benchmark,n_examples", "living17,3400", "nonliving26-bad,5200"]
    assert main(["versions", "living17"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "breeds-published" in lines[1] and lines[0].index("version") == lines[1].index(lines[1].split()[2])
    assert main(["check"]) == 0
    assert "living17" in capsys.readouterr().out
    living17 = Store(settings.store_dir).log.latest("living17")
    assert living17 is not None

    # Overrides need a new name; the variant is a benchmark of its own and never touches living17.
    assert main(["build", "--benchmark", "living17", "--set", "seed=3"]) == 2
    assert_one_line(capsys.readouterr().err, "parameter '--set': overriding parameters of living17 needs --name NEW")
    args = ["build", "--benchmark", "living17", "--set", "seed=3", "--set", "split=good", "--name", "l17g"]
    assert main(args) == 0
    assert "[1/1] l17g: version" in capsys.readouterr().out
    assert main(["sql", "SELECT spec, params->'overrides' FROM benchmarks WHERE benchmark = 'l17g'", "--csv"]) == 0
    spec, overrides = capsys.readouterr().out.splitlines()[1].split(",", 1)
    assert spec == "living17"
    assert json.loads(overrides.strip('"').replace('""', '"')) == {"seed": 3, "split": "good"}
    assert Store(settings.store_dir).log.latest("living17") == living17
    for name, message in (
        ("entity13", "'entity13' is already a benchmark spec"),
        ("living17", "'living17' is already a benchmark spec"),
        ("cat-dog-dg-bag-box", "a metashift task spec"),
    ):
        assert main(["build", "--benchmark", "living17", "--set", "seed=4", "--name", name]) == 2
        assert_one_line(capsys.readouterr().err, message)
    assert main(["build", "--benchmark", "living17", "--set", "seed=4", "--name", "l17g"]) == 2
    assert_one_line(capsys.readouterr().err, "'l17g' already names living17 with")
    assert main(["build", "--benchmark", "l17g"]) == 0  # a variant rebuilds by its name alone
    assert "already latest" in capsys.readouterr().out
    assert main(["sql", "SELECT nope FROM benchmarks"]) == 2
    assert_one_line(capsys.readouterr().err, 'Referenced column "nope" not found')
    assert main(["build", "--benchmark", "living18"]) == 2
    assert_one_line(capsys.readouterr().err, "unknown benchmark 'living18'; did you mean living17")
    assert main(["gc", "--dry-run"]) == 0
    assert "nothing to delete" in capsys.readouterr().out


def _toy_cycle(d: Path) -> None:
    with (d / "class_hierarchy.txt").open("a") as handle:
        handle.write("n01440764 dummy1\n")


def _toy_rootless(d: Path) -> None:
    for name in ("class_hierarchy.txt", "node_names.txt"):
        (d / name).write_text((d / name).read_text().replace("n00001740", "dummy0"))


def _toy_latin1(d: Path) -> None:
    (d / "node_names.txt").write_bytes((d / "node_names.txt").read_bytes() + "n09999999\tcaf\xe9\n".encode("latin-1"))


def _toy_directory(d: Path) -> None:
    (d / "class_hierarchy.txt").unlink()
    (d / "class_hierarchy.txt").mkdir()


def _class_info(rows: list[tuple[int, str]]) -> str:
    return json.dumps([[i, w, f"class {w}"] for i, w in rows]).replace("], [", "],\n[")


_TOY = [(i, w) for i, w in enumerate(TOY_CLASSES)]

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
    ("no superclass at level", {}, None, ["--set", "level=9", "--name", "toy-l9"],
     "parameter 'level': no node at level 9"),
    ("N too large", {}, None, ["--set", "n_subclasses=50", "--name", "toy-n50"],
     "parameter 'n_subclasses': N=50 exceeds"),
    ("odd N", {}, None, ["--set", "n_subclasses=3", "--name", "toy-n3"],
     "parameter 'n_subclasses': must be even: split 'rand' puts N/2 subclasses in the source and N/2 in the target, "
     "got 3"),
    ("empty value", {}, None, ["--set", "ancestor=", "--name", "toy-a"],
     "parameter 'ancestor': has no value: give one, or null for none"),
    ("unknown ancestor", {}, None, ["--set", "ancestor=n42424242", "--name", "toy-a"],
     "parameter 'ancestor': unknown node"),
    ("unknown parameter", {}, None, ["--set", "sead=3", "--name", "toy-s"], "parameter 'sead'"),
    ("bad value", {}, None, ["--set", "seed=three", "--name", "toy-s"], "parameter 'seed': must be a valid integer"),
    ("sexagesimal value", {}, None, ["--set", "seed=1:20", "--name", "toy-s"], "got '1:20'"),
    ("float for an integer", {}, None, ["--set", "n_subclasses=2.5", "--name", "toy-s"],
     "parameter 'n_subclasses': must be a valid integer, got 2.5"),
    ("not UTF-8", {}, _toy_latin1, [], "node_names.txt:22: not UTF-8 text"),
    ("a directory", {}, _toy_directory, [], "class_hierarchy.txt: required BREEDS hierarchy file is missing"),
    ("unknown class", {"dataset_class_info.json": _class_info([*_TOY, (12, "n09999999")])}, None, [],
     "dataset_class_info.json:13: entry 12 (n09999999): not an ImageNet-1k class"),
    ("class twice", {"dataset_class_info.json": _class_info([*_TOY, (12, TOY_CLASSES[3])])}, None, [],
     "dataset_class_info.json:13: entry 12 (n02110063): the class is listed twice"),
    ("index twice", {"dataset_class_info.json": _class_info([*_TOY[:-1], (0, TOY_CLASSES[-1])])}, None, [],
     "index 0 is used twice"),
    ("empty name", {}, None, ["--set", "seed=1", "--name", ""], "parameter '--name': invalid benchmark name ''"),
    ("path in name", {}, None, ["--set", "seed=1", "--name", "../x"], "invalid benchmark name '../x'"),
    ("long name", {}, None, ["--set", "seed=1", "--name", "v" * 300], "at most 100 characters, got 300"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("case", "files", "mutate", "args", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_error_and_publishes_nothing(
    toy_published: tuple[Settings, Path],
    capsys: pytest.CaptureFixture[str],
    case: str,
    files: dict[str, str],
    mutate: Callable[[Path], None] | None,
    args: list[str],
    message: str,
) -> None:
    # Toy specs so the good build is fast: level 1, N=4 (a user's spec file: no code reload needed); the good
    # build is the fixture's, once per module, each case on its own copy of its home.
    settings, directory = toy_published
    store = Store(settings.store_dir)
    good = store.log.latest("toy")
    assert good is not None
    capsys.readouterr()

    for name, text in files.items():
        (directory / name).write_text(text)
    if mutate is not None:
        mutate(directory)
    code = main(["build", "--benchmark", "toy", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert_one_line(err, message)
    latest = store.log.latest("toy")
    assert latest is not None and latest.version == good.version
    assert [v.version for v in store.log.versions()] == [good.version]


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
    assert_one_line(capsys.readouterr().err, "wordnet.is_a.txt:2: expected 'parent child'")
    edits = tmp_path / "edits.txt"
    edits.write_text("collapse_node n00001930\nsplit_node n00002684\n")
    cli_env(SHIFTBENCH_BREEDS_CALIBRATION=str(edits))
    assert main(["build", "--benchmark", "living17@edits"]) == 2
    assert_one_line(capsys.readouterr().err, "edits.txt:2: unknown operation 'split_node'")


def test_bad_settings_and_spec_files_are_one_line(
    cli_env: Callable[..., Settings],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cli_env()
    monkeypatch.setenv("SHIFTBENCH_SPRITES_PER_COMBINATION", "soon")
    assert main(["build", "--benchmark", "living17"]) == 2
    assert_one_line(capsys.readouterr().err, "parameter 'SHIFTBENCH_SPRITES_PER_COMBINATION': must be a valid integer")
    monkeypatch.delenv("SHIFTBENCH_SPRITES_PER_COMBINATION")
    shadow = tmp_path / "mine.yaml"
    shadow.write_text("family: breeds\nbenchmarks:\n  living17:\n    level: 5\n    n_subclasses: 4\n")
    cli_env(SHIFTBENCH_BREEDS_SPECS=str(shadow))
    assert main(["build", "--list"]) == 2
    err = capsys.readouterr().err
    assert_one_line(err, "benchmark 'living17' is already defined in shiftbench/specs/breeds.yaml")
    assert str(shadow) in err
    shadow.write_text("family: breeds\nbenchmarks:\n  mine:\n    level: five\n    n_subclasses: 4\n")
    assert main(["build", "--list"]) == 2
    assert_one_line(capsys.readouterr().err, f"{shadow}:4, parameter 'level': must be a valid integer")
    for family, variable, text in (
        (
            "metashift",
            "SHIFTBENCH_METASHIFT_SPECS",
            "family: metashift\ncollections:\n  metashift:\n    context_kinds: [object]\n",
        ),
        ("conds", "SHIFTBENCH_CONDS_SPECS", (PROJECT / "shiftbench/specs/conds.yaml").read_text()),
    ):
        mine = tmp_path / f"{family}.yaml"
        mine.write_text(text)
        cli_env(**{variable: str(mine)})
        assert main(["build", family, "--list"]) == 2
        err = capsys.readouterr().err
        assert_one_line(err, f"is already defined in shiftbench/specs/{family}.yaml")
        assert str(mine) in err
    # Names are global: a user's BREEDS spec may not take a ConDS case's name.
    clash = tmp_path / "clash.yaml"
    clash.write_text("family: breeds\nbenchmarks:\n  sprites-uniform:\n    level: 2\n    n_subclasses: 4\n")
    cli_env(SHIFTBENCH_BREEDS_SPECS=str(clash))
    for args in (["build", "--list"], ["build", "--benchmark", "living17"], ["versions", "sprites-uniform"]):
        code = main(args)
        err = capsys.readouterr().err
        if args[0] == "versions":  # reading the store needs no specs: only that nothing is published
            assert code == 2 and "SHIFTBENCH_BREEDS_SPECS" not in err
            assert_one_line(
                err, "parameter 'BENCHMARK': no published versions of sprites-uniform: nothing is published"
            )
            continue
        assert code == 2
        assert_one_line(
            err,
            "parameter 'SHIFTBENCH_BREEDS_SPECS': benchmark name 'sprites-uniform' is both a breeds benchmark spec "
            "and a conds case spec",
        )
    presets = tmp_path / "presets.yaml"
    presets.write_text("presets:\n  smoke:\n    model: mlp\n")
    cli_env(SHIFTBENCH_ERM_PRESETS=str(presets))
    from shiftbench.erm.launch import load_presets

    with pytest.raises(Exception, match=r"preset 'smoke' is already defined in shiftbench/specs/erm\.yaml"):
        load_presets(Settings.from_env().erm_presets)
    # A preset name becomes part of a run's directory: one that could leave the store is refused.
    presets.write_text("presets:\n  ../../escape:\n    model: mlp\n")
    with pytest.raises(InputError, match=r"presets\.yaml: invalid preset name '\.\./\.\./escape'"):
        load_presets(Settings.from_env().erm_presets)


@pytest.mark.slow
def test_check_finds_tampered_and_truncated_files_and_a_damaged_version_takes_nothing_down(
    toy_published: tuple[Settings, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import polars as pl

    settings, _ = toy_published
    assert main(["build", "--benchmark", "toy2"]) == 0
    store = Store(settings.store_dir)
    toy, toy2 = store.log.latest("toy"), store.log.latest("toy2")
    assert toy is not None and toy2 is not None
    assert main(["check"]) == 0
    assert "files match their checksums" in capsys.readouterr().out
    version_dir = store.layout.version_dir("breeds", "toy", toy.version)

    # Tampered but valid Parquet of the same size: only the checksum can tell.
    examples = version_dir / "examples.parquet"
    size = examples.stat().st_size
    frame = pl.read_parquet(examples)
    frame.with_columns(pl.col("split").reverse()).write_parquet(examples)
    if examples.stat().st_size != size:  # keep the size: the cheap comparison must not be what finds it
        data = examples.read_bytes()
        examples.write_bytes(data[:size] if len(data) > size else data + b"\0" * (size - len(data)))
    assert main(["check"]) == 1
    out = capsys.readouterr().out
    assert f"toy {toy.version}: DAMAGED: {examples}: checksum mismatch" in out
    assert f"toy2 {toy2.version}: " in out and "rules hold" in out  # the other one is still checked

    # Rebuilding repairs it (the damaged copy is set aside), and check passes again.
    assert main(["build", "--benchmark", "toy"]) == 0
    capsys.readouterr()
    assert main(["check"]) == 0
    capsys.readouterr()

    # A truncated file, a truncated manifest, a truncated publication event: each is named, and
    # versions, sql and build keep working for the rest of the store.
    truncations = (
        version_dir / "breeds_subpopulations.parquet",
        version_dir / "manifest.json",
        sorted((store.layout.benchmark_dir("breeds", "toy") / "publications").glob("*.json"))[-1],
    )
    for path in truncations:
        original = path.read_bytes()
        path.write_bytes(original[: len(original) // 2])
        assert main(["check"]) == 1
        out = capsys.readouterr().out
        assert str(path) in out and "DAMAGED" in out, out
        assert main(["versions"]) == 0
        captured = capsys.readouterr()
        assert "toy2" in captured.out
        if path.suffix != ".parquet":
            assert str(path) in captured.err
        assert main(["catalog"]) == 0
        assert main(["sql", "SELECT benchmark FROM benchmarks ORDER BY 1", "--csv"]) == 0
        captured = capsys.readouterr()
        assert "toy2" in captured.out.splitlines()
        assert main(["build", "--benchmark", "toy2"]) == 0
        capsys.readouterr()
        path.write_bytes(original)
    assert main(["check"]) == 0


@pytest.mark.slow
def test_a_crash_in_one_benchmark_is_reported_and_the_others_publish(
    toy_cli: tuple[Settings, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shiftbench.breeds import staging as breeds_family  # where a BREEDS version is staged

    settings, _ = toy_cli
    real = breeds_family.build_tables

    def flaky(spec: Any, *args: Any, **kwargs: Any) -> Any:
        if spec.name == "toy":
            raise RuntimeError("simulated crash")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(breeds_family, "build_tables", flaky)
    assert main(["build", "--benchmark", "toy", "--benchmark", "toy2"]) == 1  # shiftbench's fault, not the input's
    captured = capsys.readouterr()
    assert "[1/2] toy: error: RuntimeError: simulated crash; nothing published" in captured.err
    assert "[2/2] toy2: version" in captured.out
    assert "1 of 2 published" in captured.out
    assert "warning: class_hierarchy.txt, node_names.txt, dataset_class_info.json in dir:" in captured.err
    assert f"{TOY_HIERARCHY_WARNING} and are named NAME@breeds-files, not the papers' benchmarks" in captured.err
    store = Store(settings.store_dir)
    assert store.log.latest("toy") is None and store.log.latest("toy2") is not None


@pytest.mark.slow
def test_a_catalog_that_could_not_be_refreshed_is_reported_as_it_is(
    toy_cli: tuple[Settings, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The version is published (the store is the truth); the derived catalog lags and the build says so."""
    from shiftbench.warehouse import catalog as catalog_module

    settings, _ = toy_cli
    real = catalog_module._write

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(catalog_module, "_write", full)
    assert main(["build", "--benchmark", "toy"]) == 0
    captured = capsys.readouterr()
    assert "[1/1] toy: version" in captured.out and "1 published" in captured.out
    assert "FAILED" not in captured.out + captured.err and "nothing published" not in captured.err
    assert_one_line(
        captured.err,
        f"warning: {settings.catalog_path} not refreshed: the disk is full; the versions are published "
        "(the store is the truth): run `shiftbench catalog`",
    )
    latest = Store(settings.store_dir).log.latest("toy")
    assert latest is not None
    monkeypatch.setattr(catalog_module, "_write", real)
    assert main(["catalog"]) == 0
    assert main(["sql", "SELECT version FROM benchmarks", "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == latest.version


SPEC_SHAPES = [
    # (family, file text, message): a misspelt or misshapen spec file is one line, never ignored
    ("breeds", "family: breeds\nbenchmarks: [living99]\n", "spec.yaml:2: section 'benchmarks' must be a mapping"),
    ("breeds", "family: breeds\nbenchmark:\n  mine: {level: 2}\n", "spec.yaml:2: unknown section 'benchmark'"),
    ("breeds", "family: breeds\nbenchmarks:\n  mine: 5\n", "spec.yaml:3: benchmark mine: expected a mapping"),
    ("breeds", "family: conds\n", "spec.yaml: expected a mapping with family: breeds"),
    ("metashift", "family: metashift\ncollections: [a]\n", "spec.yaml:2: section 'collections' must be a mapping"),
    ("metashift", "family: metashift\ntask:\n  t: {}\n", "spec.yaml:2: unknown section 'task'"),
    ("metashift", "family: metashift\ntasks:\n  t: [1]\n", "spec.yaml:3: task t: expected a mapping"),
    ("conds", "family: conds\ncases:\n  mine: {}\n", "spec.yaml:2: unknown section 'cases'"),
    ("conds", "family: conds\ndatasets: 3\n", "spec.yaml:2: section 'datasets' must be a mapping"),
    ("conds", "family: conds\ndatasets:\n  mine: 3\n", "dataset mine: expected a mapping"),
    ("conds", "family: conds\n\x01\n", "spec.yaml: invalid YAML: unacceptable character #x0001"),
]  # fmt: skip


@pytest.mark.parametrize(("family", "text", "message"), SPEC_SHAPES)
def test_misshapen_spec_files_are_one_line(
    cli_env: Callable[..., Settings],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    family: str,
    text: str,
    message: str,
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    cli_env(**{f"SHIFTBENCH_{family.upper()}_SPECS": str(spec)})
    assert main(["build", family, "--list"]) == 2
    assert_one_line(capsys.readouterr().err, message)


@pytest.mark.slow
def test_yaml_numbers_unreadable_files_and_a_broken_catalog(
    toy_cli: tuple[Settings, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, _ = toy_cli
    # YAML 1.2: 010 is ten (YAML 1.1 read it as octal 8), and what the variant records is what it built.
    assert main(["build", "--benchmark", "toy", "--set", "seed=010", "--name", "toy-s10"]) == 0
    capsys.readouterr()
    latest = Store(settings.store_dir).log.latest("toy-s10")
    assert latest is not None and latest.params["seed"] == 10 and latest.params["overrides"] == {"seed": 10}

    # An empty (or foreign) catalog file is not this store's catalog: sql rebuilds it, and says nothing false.
    settings.catalog_path.write_bytes(b"")
    assert main(["sql", "SELECT benchmark FROM benchmarks ORDER BY 1", "--csv"]) == 0
    assert capsys.readouterr().out.split() == ["benchmark", "toy-s10"]

    # A directory or a non-UTF-8 file where a user's file should be: one line naming it.
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    latin = tmp_path / "latin.txt"
    latin.write_bytes("collapse_node n00001930 # caf\xe9\n".encode("latin-1"))
    for variable, path, message in (
        ("SHIFTBENCH_BREEDS_SPECS", folder, "folder.yaml, parameter 'SHIFTBENCH_BREEDS_SPECS': is a directory"),
        (
            "SHIFTBENCH_BREEDS_CALIBRATION",
            folder,
            "parameter 'SHIFTBENCH_BREEDS_CALIBRATION': is a directory, not a file",
        ),
        ("SHIFTBENCH_BREEDS_CALIBRATION", latin, "latin.txt:1, parameter 'SHIFTBENCH_BREEDS_CALIBRATION': not UTF-8"),
    ):
        with monkeypatch.context() as patch:
            patch.setenv(variable, str(path))
            assert main(["build", "--benchmark", "toy2"]) == 2
        assert_one_line(capsys.readouterr().err, message)
    assert Store(settings.store_dir).log.latest("toy2") is None


@pytest.mark.slow
def test_a_locked_dagster_storage_is_one_line_and_publishes_nothing(
    toy_published: tuple[Settings, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another process holding Dagster's SQLite run storage (a stuck run, a `dagster dev` gone wrong), in a home
    whose storage exists: toy was built and published there."""
    import sqlite3

    settings, _ = toy_published
    holder = sqlite3.connect(tmp_path / "dagster_home" / "history" / "runs.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        capsys.readouterr()
        assert main(["build", "--benchmark", "toy2"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: Dagster's storage in ") and "is locked by another process" in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
    finally:
        holder.close()
    assert Store(settings.store_dir).log.latest("toy2") is None
    assert main(["build", "--benchmark", "toy2"]) == 0  # free again: the same command works


def test_a_bad_scene_graph_file_decoded_in_a_worker_is_one_line_and_exit_2(
    cli_env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two files are decoded in worker processes: the bad one is named in one line (not the worker's traceback,
    which the process pool chains to the error), exit 2, nothing published."""
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"1": {"objects": {"5": {"name": "cat", "attributes": ["black"]}}}}')
    bad.write_text('{"2": {"objects": {"6": {"name": 7}}}}')
    settings = cli_env(SHIFTBENCH_GQA_SCENE_GRAPHS=f"{good},{bad}")
    assert main(["build", "metashift", "--benchmark", "metashift-attributes@gqa-files"]) == 2
    err = capsys.readouterr().err
    assert_one_line(err, f"{bad}: image '2', object '6': object 'name' is not a string")
    assert "RemoteTraceback" not in err
    assert Store(settings.store_dir).log.versions() == []


def test_the_command_exits_without_teardown_but_after_exit_handlers(tmp_path: Path) -> None:
    """``entry``'s quick exit (no Python teardown): the exit code, all output, exit-time handlers and temporary
    directories as a normal exit leaves them; a thread still running gets the normal exit (and finishes)."""
    # Skipping the teardown saved 0.8 s of an 11 s GQA-scale build (BENCHMARKS.md).
    import subprocess
    import sys

    script = tmp_path / "leave.py"
    script.write_text(
        "import atexit, sys, tempfile, threading, time\n"
        "from pathlib import Path\n"
        "from shiftbench.pipelines.cli import leave\n"
        "out = Path(sys.argv[1])\n"
        "kept = tempfile.TemporaryDirectory()\n"
        "(out / 'tmpdir').write_text(kept.name)\n"
        "atexit.register(lambda: (out / 'atexit').write_text('ran'))\n"
        "class Probe:  # freed by Python's teardown only\n"
        "    def __del__(self, path=str(out / 'teardown'), open=open):\n"
        "        open(path, 'w').close()\n"
        "probe = Probe()\n"
        "if sys.argv[2] == 'thread':\n"
        "    threading.Thread(target=lambda: (time.sleep(0.5), (out / 'thread').write_text('done'))).start()\n"
        "sys.stdout.write('x' * 200_000)\n"
        "leave(3)\n"
    )
    for mode in ("plain", "thread"):
        out = tmp_path / mode
        out.mkdir()
        done = subprocess.run(
            [sys.executable, str(script), str(out), mode], cwd=PROJECT, capture_output=True, text=True, check=False
        )
        assert done.returncode == 3, done.stderr
        assert done.stdout == "x" * 200_000 and done.stderr == ""
        assert (out / "atexit").read_text() == "ran"
        assert not Path((out / "tmpdir").read_text()).exists()
        assert (out / "thread").exists() == (mode == "thread")
        assert (out / "teardown").exists() == (mode == "thread")  # skipped unless a thread was still running
