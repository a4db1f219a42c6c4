"""Several shiftbench processes at once on one home, and a full disk: every command either does its
work or says in one line why not, and the store stays intact (a stress test bounded in time)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shiftbench.config.settings import Settings
from shiftbench.store import Store

from .conftest import PROJECT, ToyDir, missing

TOY_SPECS = "family: breeds\nbenchmarks:\n" + "".join(
    f"  toy{seed}:\n    level: 1\n    n_subclasses: 4\n    seed: {seed}\n" for seed in range(4)
)
LIMIT_S = 240  # each command; the test fails rather than hangs
_QUERIES = """
import contextlib, io, pathlib
from shiftbench.pipelines.cli import main
n = 0
while not pathlib.Path({stop!r}).exists():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["sql", "SELECT count(*) AS n FROM benchmarks", "--csv"])
    assert code == 0 and out.getvalue().startswith("n\\n"), (code, out.getvalue())
    n += 1
print("queries", n)
"""


def _env(settings: Settings, directory: Path, specs: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIFTBENCH_", "DAGSTER_"))}
    env.update(
        SHIFTBENCH_HOME=str(settings.home),
        DAGSTER_HOME=str(settings.home / "dagster_home"),
        SHIFTBENCH_OFFLINE="1",
        SHIFTBENCH_BREEDS_HIERARCHY_DIR=str(directory),
        SHIFTBENCH_BREEDS_SPECS=str(specs),
    )
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "shiftbench.pipelines.cli", *args]
    return subprocess.Popen(command, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=LIMIT_S)
    return process.returncode, out, err


@pytest.mark.slow
def test_four_simultaneous_first_builds_in_a_new_home(
    make_settings: Callable[..., Settings], toy_breeds_dir: ToyDir
) -> None:
    """Dagster creates its SQLite storages on first use; four processes doing so at once used to race."""
    settings = make_settings()
    directory = toy_breeds_dir()
    specs = directory.parent / "specs.yaml"
    specs.write_text(TOY_SPECS)
    env = _env(settings, directory, specs)
    names = ["toy0", "toy1", "toy2", "toy0"]  # two processes build the same benchmark too
    stop = settings.home.parent / "stop"
    reader = subprocess.Popen(  # `shiftbench sql` over and over while the builds refresh the catalog
        [sys.executable, "-c", _QUERIES.format(stop=str(stop))],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results = [_finish(p) for p in [_cli(env, "build", "--benchmark", name) for name in names]]
    stop.touch()
    code, out, err = _finish(reader)
    assert code == 0 and int(out.split()[-1]) > 0, out + err
    for code, _out, err in results:
        assert code == 0, err
        assert "Traceback" not in err and "alembic" not in err
    store = Store(settings.store_dir)
    versions = {name: store.log.latest(name) for name in set(names)}
    assert all(v is not None for v in versions.values())
    assert len(store.log.versions("toy0")) == 1  # built twice at once: one version, same id
    code, out, err = _finish(_cli(env, "build", "--benchmark", "toy3"))  # the home is usable afterwards
    assert code == 0, err
    code, out, err = _finish(_cli(env, "check"))
    assert code == 0 and out.count("files match their checksums") == 4, out + err
    code, out, err = _finish(_cli(env, "sql", "SELECT count(*) AS n FROM benchmarks", "--csv"))
    assert (code, out) == (0, "n\n4\n"), err


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs to fill up (needs root, as on the project's machines and CI)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        why = done.stderr.decode().strip()
        missing(f"cannot mount a small tmpfs here ({why}): run as root", "SHIFTBENCH_REQUIRE_MOUNT")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, leave_kib: int) -> Path:
    filler = disk / "filler"
    free_kib = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize // 1024
    with filler.open("wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, max(free_kib - leave_kib, 0) * 1024)
    return filler


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_never_a_partial_version(
    make_settings: Callable[..., Settings], toy_breeds_dir: ToyDir, small_disk: Path
) -> None:
    home = small_disk / "home"
    settings = make_settings(SHIFTBENCH_HOME=str(home))
    directory = toy_breeds_dir()
    specs = directory.parent / "specs.yaml"
    specs.write_text(TOY_SPECS)
    env = _env(settings, directory, specs)
    code, _, err = _finish(_cli(env, "build", "--benchmark", "toy0"))
    assert code == 0, err
    store = Store(settings.store_dir)
    first = store.log.latest("toy0")
    for leave_kib in (0, 150, 400, 650):  # the disk fills up at different points of a build
        filler = _fill(small_disk, leave_kib)
        code, out, err = _finish(_cli(env, "build", "--benchmark", "toy1", "--benchmark", "toy2"))
        filler.unlink()
        lines = err.splitlines()
        assert code == 1 if leave_kib == 0 else code in (0, 1), err
        # The exit code follows what was published: a build whose benchmarks all became latest exits 0 (with a
        # warning when the disk filled after them), one that published only part of them exits 1.
        assert (code == 0) == (out.count("now latest") + out.count("already latest") == 2), out + err
        assert all(line.startswith(("error:", "warning:", "[")) for line in lines), err
        for noise in ("Traceback", "sqlalche", "OperationalError: (sqlite3"):
            assert noise not in err, err
        if code == 1:
            assert "disk" in err and "full" in err, err
        assert store.log.latest("toy0") == first  # the previous version is untouched
        code, out, err = _finish(_cli(env, "check"))  # whatever was published is whole
        assert code == 0, out + err
    code, out, err = _finish(_cli(env, "build", "--benchmark", "toy1", "--benchmark", "toy2"))
    assert code == 0, err  # with space again, the same build succeeds
    code, out, err = _finish(_cli(env, "sql", "SELECT benchmark FROM benchmarks ORDER BY 1", "--csv"))
    assert out.split() == ["benchmark", "toy0", "toy1", "toy2"], err
