"""Shared fixtures: the real data in ../shared/fixtures and small generated hierarchies."""

from __future__ import annotations

import json
import os
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

# pytest-xdist runs a worker per core: torch's CPU ops then get one thread each (by default each worker takes every
# core, and the workers' OpenMP threads spin against each other: test_step 192 s -> 42 s on two busy cores). Set
# before torch is imported; the processes the tests start inherit it, so CPU results stay comparable between them.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from shiftbench.config.settings import Settings

PROJECT = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("SHIFTBENCH_FIXTURES", PROJECT.parent / "shared" / "fixtures"))
BREEDS_FIXTURE = FIXTURES / "breeds" / "modified"
IMAGENET_WORDNET_FIXTURE = FIXTURES / "breeds" / "imagenet_wordnet"
PUBLISHED_SPLITS = FIXTURES / "breeds" / "published_splits.json"
# One cache for the whole run: reading WordNet through nltk takes ~10 s, once.
TEST_CACHE = PROJECT / ".pytest_cache" / "shiftbench"

warnings.filterwarnings("ignore", message=".*is currently in beta.*")

# Twelve real ImageNet-1k classes (so the packaged validation images exist for them).
TOY_CLASSES = [
    "n01440764", "n01798484", "n02089867", "n02110063", "n02328150", "n02776631",
    "n03032252", "n03459775", "n03782006", "n04023962", "n04336792", "n04606251",
]  # fmt: skip


# The third-party clients (WILDS, torchvision as DomainBed calls it, DuckDB 1.x) live in an environment of their
# own (scripts/clients_env.sh); scripts/test.sh creates it and sets SHIFTBENCH_REQUIRE_CLIENTS, so CI runs them.
CLIENTS_PYTHON = PROJECT / ".venv-clients" / "bin" / "python"
# The timm wheel the shipped ImageNet-21k lists were made from (tests/test_imagenet21k.py): scripts/test_downloads.sh
# fetches it; scripts/test.sh runs that and sets SHIFTBENCH_REQUIRE_TIMM_WHEEL, so CI runs those tests.
TIMM_WHEEL = Path(os.environ.get("SHIFTBENCH_TIMM_WHEEL", PROJECT / ".downloads" / "timm-1.0.31-py3-none-any.whl"))


def missing(message: str, required_by: str) -> NoReturn:
    """A test's dependency is absent: ``message`` says what and how to get it. It fails where ``required_by`` (a
    SHIFTBENCH_REQUIRE_* variable scripts/test.sh sets) is 1, so CI never skips it silently; elsewhere it skips."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{message} ({required_by}=1)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def clients_python() -> Path:
    """The python of .venv-clients; without it the client tests fail where CI requires them, else skip."""
    if CLIENTS_PYTHON.is_file():
        return CLIENTS_PYTHON
    missing(f"no client environment at {CLIENTS_PYTHON}: run bash scripts/clients_env.sh", "SHIFTBENCH_REQUIRE_CLIENTS")


@pytest.fixture(scope="session")
def timm_wheel() -> Path:
    """timm 1.0.31's wheel; without it the tests that read it fail where CI requires them, else skip."""
    if TIMM_WHEEL.is_file():
        return TIMM_WHEEL
    message = f"no timm wheel at {TIMM_WHEEL}: run bash scripts/test_downloads.sh (or set SHIFTBENCH_TIMM_WHEEL)"
    missing(message, "SHIFTBENCH_REQUIRE_TIMM_WHEEL")


# A Slurm cluster the tests marked `slurm` submit to: scripts/slurm_local.sh brings up a real single-node one (its
# `start` prints the SLURM_CONF to export); scripts/test.sh starts it, sets SHIFTBENCH_REQUIRE_SLURM: CI runs them.
@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """The cluster's name; without a cluster that answers, the Slurm tests fail where CI requires them, else skip."""
    import shutil
    import subprocess

    message = "no Slurm commands on PATH (sbatch): bash scripts/slurm_local.sh start, then export its SLURM_CONF"
    if shutil.which("sbatch") is not None:
        try:
            done = subprocess.run(
                ["scontrol", "show", "config"], capture_output=True, text=True, timeout=20, check=False
            )
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess([], 1, "", "scontrol did not answer in 20 s")
        name = next((line.split("=", 1)[1].strip() for line in done.stdout.splitlines() if "ClusterName" in line), "")
        if done.returncode == 0 and name:
            return name
        reason = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        message = f"no Slurm cluster answers ({reason}): bash scripts/slurm_local.sh start, then export its SLURM_CONF"
    missing(message, "SHIFTBENCH_REQUIRE_SLURM")


def run_client(python: Path, code: str, *args: str, cwd: Path | None = None) -> str:
    """Run ``code`` with a client environment's python, outside the checkout and without any SHIFTBENCH_* or
    PYTHON* variable (nothing of the project is importable); its stdout, or a test failure with its stderr."""
    import subprocess
    import tempfile

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTBENCH_", "PYTHON"))}
    done = subprocess.run(
        [str(python), "-c", code, *args], cwd=cwd or tempfile.gettempdir(), env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"client exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


@pytest.fixture(scope="session")
def fixtures() -> Path:
    if not BREEDS_FIXTURE.is_dir():
        pytest.fail(f"real-data fixtures not found at {FIXTURES} (expected ../shared/fixtures beside the project)")
    return FIXTURES


def toy_edges() -> list[tuple[str, str]]:
    """entity -> {dummy1 (6 classes in 3 groups), dummy2 (6 classes, one chain node)}."""
    c = TOY_CLASSES
    return [
        ("n00001740", "dummy1"),
        ("n00001740", "dummy2"),
        ("dummy1", "dummy11"),
        ("dummy1", "dummy12"),
        ("dummy1", "dummy13"),
        ("dummy11", c[0]),
        ("dummy11", c[1]),
        ("dummy11", c[2]),
        ("dummy12", c[3]),
        ("dummy12", c[4]),
        ("dummy13", c[5]),
        ("dummy2", "dummy20"),  # single child: the split walks down to dummy20
        ("dummy20", "dummy21"),
        ("dummy20", "dummy22"),
        ("dummy21", c[6]),
        ("dummy21", c[7]),
        ("dummy21", c[8]),
        ("dummy22", c[9]),
        ("dummy22", c[10]),
        ("dummy22", c[11]),
    ]


ToyDir = Callable[..., Path]


@pytest.fixture
def toy_breeds_dir(tmp_path: Path) -> ToyDir:
    """Write a BREEDS-format hierarchy dir; keyword overrides replace a file's text."""

    def make(name: str = "toy_breeds", **texts: str) -> Path:
        directory = tmp_path / name
        directory.mkdir(parents=True, exist_ok=True)
        edges = toy_edges()
        nodes = sorted({n for edge in edges for n in edge})
        files = {
            "class_hierarchy.txt": "".join(f"{p} {c}\n" for p, c in edges),
            "node_names.txt": "".join(f"{n}\tname of {n}\n" for n in nodes),
            "dataset_class_info.json": json.dumps([[i, w, f"class {w}"] for i, w in enumerate(TOY_CLASSES)]),
        }
        files.update({k.replace("__", "."): v for k, v in texts.items()})
        for file_name, text in files.items():
            (directory / file_name).write_text(text, encoding="utf-8")
        return directory

    return make


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    def make(**env: str) -> Settings:
        values = {"SHIFTBENCH_HOME": str(tmp_path / "home"), "SHIFTBENCH_OFFLINE": "1", **env}
        settings = Settings.from_env(values)
        # Share the WordNet cache and the generated sprites (content-addressed) between tests.
        TEST_CACHE.mkdir(parents=True, exist_ok=True)
        cache = settings.cache_dir
        cache.mkdir(parents=True, exist_ok=True)
        for name in ("wordnet", "nltk_data", "sprites"):
            link = cache / name
            if not link.exists():
                (TEST_CACHE / name).mkdir(parents=True, exist_ok=True)
                link.symlink_to(TEST_CACHE / name)
        return settings

    return make


def toy_tables(directory: Path, split: str = "rand", seed: int = 0, n_subclasses: int = 4) -> dict[str, object]:
    """The four BREEDS tables of a small benchmark over the toy hierarchy (real val images)."""
    from shiftbench.breeds.build import build_tables
    from shiftbench.breeds.calibrated import from_published
    from shiftbench.breeds.specs import BreedsSpec
    from shiftbench.sources.breeds_hierarchy import read_breeds_hierarchy_dir
    from shiftbench.sources.imagenet import load_imagenet_images

    calibrated = from_published(read_breeds_hierarchy_dir(directory))
    images = load_imagenet_images(None)
    spec = BreedsSpec(name="toy", level=1, n_subclasses=n_subclasses, split=split, seed=seed)
    sources = {"images": "imagenet-val-package", "images_sha256": images.fingerprint}
    return dict(build_tables(spec, calibrated, images.images, sources))


def stage_one(settings: Settings, kind_name: str, benchmark: str, overrides: dict[str, object] | None = None) -> Any:
    """Stage one benchmark through the library (inputs, spec or variant, stage); not checked."""
    from shiftbench.families import benchmark_builds, registry, variants
    from shiftbench.families.family import Target

    family_name, _, kind = kind_name.partition("/")
    family = registry.family(family_name)
    chosen = family.kind(kind)
    inputs = benchmark_builds.build_inputs(settings, family, chosen.inputs)
    target = variants.resolve(settings, chosen, benchmark)
    if overrides:
        target = Target(benchmark, target.spec.with_overrides(overrides), overrides)
    return chosen.stage(settings, target, inputs)


def sprites_split(home: Path, case: str) -> tuple[Any, list[Path], dict[str, Any]]:
    """A published sprites case's split table, its image paths and the smoke preset's config: what ``train`` takes,
    for the tests that call the training loop without the launcher."""
    from shiftbench.erm import launch
    from shiftbench.erm.job import image_paths
    from shiftbench.splits.split_table import read_split

    settings = small_sprites_home(home, case)
    plan = launch.plan_run(settings, case, preset="smoke", seed=0)
    job = plan.job(home / "job")
    table = read_split(Path(job["split_dir"]))
    return table, image_paths(table.example_ids, Path(job["image_root"]), job["path_template"]), plan.config


def assert_resumes_bit_for_bit(plan: Any, out: Path, monkeypatch: Any, stop_after: int) -> None:
    """A run stopped after iteration ``stop_after`` (the test hook's SIGINT) and resumed gives the uninterrupted run's
    weights and metrics. The run must select its last iterate: the weights compared are then those the resumed
    iterations made (a best iteration before the stop would hide a resume that restored nothing)."""
    import json

    import polars as pl

    from shiftbench.erm.interrupt import TEST_HOOK, Interrupted
    from shiftbench.erm.job import run_job

    def outputs(folder: Path) -> tuple[str, list[dict[str, Any]]]:
        summary = json.loads((folder / "run.json").read_text())
        return summary["weights"]["sha256"], pl.read_parquet(folder / "metrics.parquet").to_dicts()

    assert plan.config["selection"] == "last" and plan.config["max_iters"] > stop_after
    run_job(plan.job(out / "whole"), log=lambda _: None)
    monkeypatch.setenv(TEST_HOOK, str(stop_after))
    with pytest.raises(Interrupted):
        run_job(plan.job(out / "stopped"), log=lambda _: None)
    monkeypatch.delenv(TEST_HOOK)
    run_job(plan.job(out / "stopped"), log=lambda _: None)
    assert outputs(out / "stopped") == outputs(out / "whole")


def copied_home(split_home: Path, tmp_path: Path, monkeypatch: Any) -> Path:
    """A test's own warehouse, a copy of ``split_home``, set in the environment (and nothing else of SHIFTBENCH_*) as
    the CLI reads it, with a Dagster home of its own."""
    import os
    import shutil

    target = tmp_path / "home"
    shutil.copytree(split_home, target, symlinks=True)
    for key in [k for k in os.environ if k.startswith("SHIFTBENCH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(target))
    monkeypatch.setenv("SHIFTBENCH_SPRITES_PER_COMBINATION", "40")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    return target


def group_method_plan(tmp_path: Path, method: str) -> Any:
    """A six-iteration run of ``method`` over the (label, colour) groups of the sprites SC case, one thread, selecting
    its last iterate (what :func:`assert_resumes_bit_for_bit` needs): the plan the methods' job tests train."""
    from shiftbench.erm import launch

    settings = small_sprites_home(tmp_path / "home", "sprites-sc-object_color")
    overrides = {"method": method, "group_by": "y,object_color", "model": "small_cnn", "image_size": 32,
                 "batch_size": 16, "max_iters": 6, "eval_every": 3, "threads": 1, "selection": "last"}  # fmt: skip
    return launch.plan_run(settings, "sprites-sc-object_color", preset="smoke", overrides=overrides)


# A folder the xdist workers of one run share (the run's base temp; the base temp itself without xdist): homes built
# once per run are copied from here (tests/test_moved_warehouse.py shows a copied warehouse works where it is).
_SHARED_ROOT: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.getbasetemp()
    _SHARED_ROOT[:] = [base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base]


def small_sprites_home(home: Path, *cases: str, own_images: bool = False) -> Settings:
    """A warehouse at ``home`` with ConDS sprites ``cases`` checked and published (40 images per combination,
    432 train + id_val examples): the ERM tests' data. The sprites are generated once per run and shared (a
    symlink, as ``make_settings`` does); ``own_images`` gives the home its own links to them instead, for a test
    that moves an image. Built once per run for each list of cases (under a lock the workers share) and copied:
    a copy is the home built in place, catalog and cache records included (they are relative to the warehouse)."""
    import shutil

    from filelock import FileLock

    if own_images or (home.exists() and any(home.iterdir())) or not _SHARED_ROOT:
        return _build_sprites_home(home, *cases, own_images=own_images)
    built = _SHARED_ROOT[0] / "sprites_homes" / "-".join(cases)
    built.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{built}.lock"):
        if not built.is_dir():
            partial = built.with_name(f".{built.name}.tmp")
            shutil.rmtree(partial, ignore_errors=True)  # a worker that died building it
            _build_sprites_home(partial, *cases)
            partial.rename(built)
    if home.exists():
        home.rmdir()  # an empty folder given (tmp_path_factory.mktemp)
    shutil.copytree(built, home, symlinks=True)
    return Settings.from_env({"SHIFTBENCH_HOME": str(home), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"})


def _build_sprites_home(home: Path, *cases: str, own_images: bool = False) -> Settings:
    from shiftbench.store import Store
    from shiftbench.store.contracts import failures
    from shiftbench.warehouse.publishing import check_version, publish_staged

    settings = Settings.from_env({"SHIFTBENCH_HOME": str(home), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"})
    sprites = _sprites_key(40, 0)
    (TEST_CACHE / "sprites").mkdir(parents=True, exist_ok=True)
    if own_images:
        _link_tree(TEST_CACHE / "sprites" / sprites, settings.cache_dir / "sprites" / sprites)
    elif not (settings.cache_dir / "sprites").exists():  # test_provenance links it itself
        settings.cache_dir.mkdir(parents=True, exist_ok=True)
        (settings.cache_dir / "sprites").symlink_to(TEST_CACHE / "sprites")
    for case in cases:
        staged = stage_one(settings, "conds/case", case, {"train_size": 432})
        assert not failures(check_version(Store(settings.store_dir), staged))
        publish_staged(settings, staged)
    if own_images:
        _link_tree(settings.cache_dir / "sprites" / sprites, TEST_CACHE / "sprites" / sprites)
    return settings


def _sprites_key(n_per_combination: int, seed: int) -> str:
    """The cache folder of generated sprites, named as shiftbench.conds.family names it (a mismatch only costs
    generating them again in the home that asked for its own images)."""
    from shiftbench.sources.sprites import GENERATOR_VERSION
    from shiftbench.tables.fingerprint import sha256_text

    return sha256_text(f"{GENERATOR_VERSION}|{n_per_combination}|{seed}")[:32]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system (a tmpfs /tmp): a copy
        import shutil

        shutil.copy2(source, target)


def _link_tree(source: Path, target: Path) -> None:
    """Hard-link the files of ``source`` into ``target`` unless one of them is missing (through a temporary sibling
    and a rename, so other workers never see half of it: shiftbench.runtime.cache.publish_cache_dir). Each home gets
    its own folder entries: a test that renames an image there (test_erm does) leaves the shared copy whole."""
    import shutil

    from shiftbench.runtime.cache import publish_cache_dir

    if source.is_dir():
        publish_cache_dir(
            target, lambda tmp: shutil.copytree(source, tmp, copy_function=_link_or_copy, dirs_exist_ok=True)
        )


def publish_all(settings: Settings, kind_name: str, benchmarks: list[str]) -> list[Any]:
    """Build, check and publish benchmarks through the library path; every one must pass."""
    from shiftbench.families import benchmark_builds, registry, variants

    family_name, _, kind = kind_name.partition("/")
    family = registry.family(family_name)
    chosen = family.kind(kind)
    found = variants.targets(settings, chosen)
    outcomes = benchmark_builds.build(settings, family, [(chosen, found[name]) for name in benchmarks])
    failed = [(o.benchmark, o.error, o.failed_rules) for o in outcomes if o.publication is None]
    assert not failed, failed
    return outcomes


@pytest.fixture
def cli_env(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Callable[..., Settings]:
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


@pytest.fixture(autouse=True)
def _ctrl_c_left_as_found() -> Iterator[None]:
    """Every test leaves Ctrl-C as it found it: SIGINT's handler and the main thread's signal mask. A test that
    left SIGINT blocked or ignored would make the later Ctrl-C tests of the same worker fail (a blocked or ignored
    signal is inherited by every process the worker starts); this names the test that did it, and puts it back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler, mask = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    now = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if now != (handler, mask):
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        changed = f"SIGINT handler {handler} -> {now[0]}, blocked {sorted(mask)} -> {sorted(now[1])}"
        pytest.fail(f"the test changed Ctrl-C: {changed}")


def terminal_ctrl_c() -> None:
    """``preexec_fn`` of a child a test sends Ctrl-C to: SIGINT as a terminal's foreground job has it (default and
    unblocked), also where the suite itself runs with SIGINT ignored (a background job of a script) or blocked."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """In this process, Ctrl-C raises KeyboardInterrupt in the main thread (Python's default), whatever the suite
    was started with; put back after the test."""
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, handler)
