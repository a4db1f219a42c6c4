"""Training on Slurm (``shiftbench train ... --backend slurm``) against a real cluster: scripts/slurm_local.sh's
single node on this machine (CPU). A sweep is one job array whose runs publish what the same runs publish trained
locally; a cancelled task is one line and publishes nothing while the others publish; a bad settings file or a bad
flag is refused before any Slurm command runs (so those checks need no cluster); a requeued task (preempted, or
warned before its time limit) resumes from its checkpoint and the manifest tells which it was; killing the submitter
loses nothing (the same command publishes what finished and follows the rest); a requeue that makes no progress
stops after the cap."""

# long: one subject (the Slurm backend) whose tests share one warehouse, the locally trained runs they compare with
# (trained once per session) and the submitter helper; split, each file would need them again.

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pytest
from filelock import FileLock

from shiftbench.config.settings import Settings
from shiftbench.erm.interrupt import TEST_HOOK, TEST_SIGNAL, TEST_TARGET
from shiftbench.erm.launch import train_in_process
from shiftbench.erm.sweep import plan_sweep
from shiftbench.pipelines.cli import main
from shiftbench.store import Store

from .conftest import PROJECT, copied_home, small_sprites_home, terminal_ctrl_c

CASE = "sprites-uniform"
# The smoke preset, shortened: long enough to interrupt mid-training, short enough for CI.
SHORT = {"max_iters": 150, "eval_every": 25}
TRAIN = ["--preset", "smoke", "--device", "cpu", *(f"--set={k}={v}" for k, v in SHORT.items())]


@pytest.fixture(scope="module")
def split_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse with the sprites split published (copied by each test that trains)."""
    home = tmp_path_factory.mktemp("slurm") / "base"
    small_sprites_home(home, CASE)
    return home


LocalRuns = Callable[..., dict[str, tuple[str, str]]]


@pytest.fixture(scope="module")
def local_runs(split_home: Path, tmp_path_factory: pytest.TempPathFactory) -> LocalRuns:
    """``local_runs(0, 1)``: those seeds trained locally (the library path, one CPU thread each), run -> (version,
    weights_sha256). Each seed is trained once per test session, by the first xdist worker that asks for it (under a
    lock the workers share), and read back by the others: the runs are deterministic, so a second training would
    only repeat the first."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "slurm_local_runs"
    root.mkdir(exist_ok=True)

    def trained(*seeds: int) -> dict[str, tuple[str, str]]:
        found = {}
        for seed in seeds:
            result = root / f"seed{seed}.json"
            with FileLock(f"{result}.lock"):
                if not result.is_file():
                    partial = result.with_suffix(".tmp")
                    partial.write_text(json.dumps(_train_locally(split_home, root / f"seed{seed}", seed)))
                    partial.rename(result)
            found.update(
                {run: (version, weights) for run, (version, weights) in json.loads(result.read_text()).items()}
            )
        return found

    return trained


def _train_locally(split_home: Path, home: Path, seed: int) -> dict[str, tuple[str, str]]:
    shutil.rmtree(home, ignore_errors=True)  # a worker that died training it
    shutil.copytree(split_home, home, symlinks=True)
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(home), "SHIFTBENCH_SPRITES_PER_COMBINATION": "40"})
    overrides = {**SHORT, "device": "cpu", "threads": 1}
    (plan,) = plan_sweep(settings, [CASE], [seed], preset="smoke", overrides=overrides)
    outcome, summary = train_in_process(settings, plan, settings.runs_dir / plan.run / "local", log=lambda _: None)
    return {plan.run: (outcome.staged.version, summary["weights"]["sha256"])}


@pytest.fixture
def home(split_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm_cluster: str) -> Path:
    """This test's warehouse (a copy of the split's), set in the environment as the CLI reads it."""
    return copied_home(split_home, tmp_path, monkeypatch)


SLURM_COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scontrol", "scancel", "sinfo", "sacct")


@pytest.fixture
def slurm_calls(split_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """For a refusal that must come before anything reaches Slurm, so needs no cluster: a warehouse of its own (as
    ``home``), no SLURM_CONF, and every Slurm command on PATH replaced by one that writes its command line to the
    file returned and fails. The file never written: no Slurm command was run, so nothing was submitted."""
    copied_home(split_home, tmp_path, monkeypatch)
    commands, calls = tmp_path / "slurm-bin", tmp_path / "slurm-calls"
    commands.mkdir()
    for name in SLURM_COMMANDS:
        (commands / name).write_text(
            f'#!/bin/sh\necho "{name} $*" >> "{calls}"\necho "{name}: no cluster" >&2\nexit 1\n'
        )
        (commands / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{commands}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return calls


def published(home: Path) -> dict[str, tuple[str, str, dict[str, object]]]:
    """run -> (version, weights_sha256, manifest execution) of every published ERM run."""
    store = Store(home / "store")
    found = {}
    for version in store.log.versions():
        if version.family != "erm":
            continue
        staged = store.layout.staged("erm", version.benchmark, version.version)
        weights = pl.read_parquet(staged.table_path("erm_runs"))["weights_sha256"][0]
        found[version.benchmark] = (version.version, weights, staged.manifest()["execution"])
    return found


def job_ids() -> set[str]:
    """Every job the controller knows (queued, or finished within MinJobAge)."""
    done = subprocess.run(["scontrol", "-o", "show", "jobs"], capture_output=True, text=True, check=True)
    return set(re.findall(r"^JobId=(\d+)", done.stdout, re.MULTILINE))


@pytest.mark.slurm
def test_a_sweep_is_one_array_and_publishes_what_local_runs_publish(
    home: Path, local_runs: LocalRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three smoke runs as one array (two at a time, so one waits for a free slot): the same versions (so the same
    weights) as trained locally, each run's log lines streamed with its name, and each manifest saying where it ran."""
    assert main(["train", CASE, "--seeds", "0-2", "--parallel", "2", "--backend", "slurm", *TRAIN]) == 0
    out = capsys.readouterr().out
    array = re.search(r"^\[sweep\] 3 runs as Slurm job array (\d+), 2 at a time, 1 CPU each", out, re.MULTILINE)
    assert array is not None, out
    assert "3 published, 0 failed" in out
    script = next((home / "runs" / "slurm").glob("*/sweep.sbatch")).read_text()
    assert "#SBATCH --array=0-2%2" in script and "#SBATCH --requeue" in script and "--signal=B:USR1@120" in script
    runs = published(home)
    assert {run: (version, weights) for run, (version, weights, _) in runs.items()} == local_runs(0, 1, 2)
    for run, (_, _, execution) in runs.items():
        assert re.search(rf"^\[{re.escape(run)}\] \[train\] iteration 150/150", out, re.MULTILINE), out
        assert execution["backend"] == "slurm" and execution["node"] == socket.gethostname().split(".")[0]
        assert str(execution["job_id"]).startswith(f"{array[1]}_") and execution["restarts"] == 0
    assert not [p for p in (home / "runs").iterdir() if p.name != "slurm"]  # published runs leave no scratch


class Sweep:
    """``shiftbench train ... --backend slurm`` in a process of its own, its output read as it comes."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        command = [sys.executable, "-m", "shiftbench.pipelines.cli", "train", CASE, "--backend", "slurm", *TRAIN, *args]
        self.process = subprocess.Popen(
            command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=terminal_ctrl_c,  # Ctrl-C reaches it as a terminal's, however the suite was started
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 600) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            if self.process.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.2)
        pytest.fail(f"no line matching {pattern!r}:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 600) -> tuple[int, str]:
        code = self.process.wait(timeout)
        self.reader.join(10)
        return code, "\n".join(self.lines)


@pytest.fixture
def sweeps() -> Iterator[list[Sweep]]:
    started: list[Sweep] = []
    yield started
    for sweep in started:  # a failed test leaves no job running
        if sweep.process.poll() is None:
            sweep.process.kill()
        if array := [re.search(r"Slurm job array (\d+)", line) for line in sweep.lines]:
            for match in filter(None, array):
                subprocess.run(["scancel", match[1]], check=False)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("partition: debug\npartiton: gpu\n", ":2, parameter 'partiton': unknown setting"),
        ("cpus_per_task: two\n", ":1, parameter 'cpus_per_task': must be a valid integer, got 'two'"),
        ("time: 1h\n", ":1, parameter 'time': '1h' is not a Slurm time"),
        ("partition: debug\ncpus_per_task: -2\n", ":2, parameter 'cpus_per_task': must be greater than or equal to 1"),
        ("time: '10:00'\nwarning_seconds: 900\n", ":2, parameter 'warning_seconds': 900 s must be less than the time"),
        ("sbatch_options: [--array=0-9]\n", ":1, parameter 'sbatch_options': '--array=0-9' is --array, set by"),
        ("mem: 16 GB\n", ":1, parameter 'mem': '16 GB' is not a memory size"),
        ("gres: [gpu]\n", ":1, parameter 'gres': must be a valid string"),
        ("partition: [debug\n", ":2: invalid YAML"),
        ("- partition\n", ": expected a mapping of Slurm settings"),
        (None, ", parameter '--slurm-settings': Slurm settings file not found"),
    ],
    ids=[
        "unknown-key", "wrong-type", "bad-time", "negative-cpus", "warning-after-limit", "managed-option", "bad-mem",
        "list-for-text", "yaml-syntax", "not-a-mapping", "missing-file",
    ],
)  # fmt: skip
def test_a_bad_settings_file_is_refused_before_anything_is_submitted(
    slurm_calls: Path, tmp_path: Path, text: str | None, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cluster.yaml"
    if text is not None:
        path.write_text(text)
    code = main(["train", CASE, "--seeds", "0-1", "--backend", "slurm", "--slurm-settings", str(path), *TRAIN])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"error: {path}{where}") and "\n" not in err, err
    assert not slurm_calls.exists() and not (tmp_path / "home" / "runs").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--slurm-settings", "x.yaml"], "parameter '--slurm-settings': only with --backend slurm"),
        (["--backend", "slurm", "--in-process"], "parameter '--in-process': a Slurm job trains on a node"),
        (["--backend", "slurm", "--parallel", "0"], "parameter '--parallel': must be at least 1"),
        (["--backend", "slurm", "--seeds", "0-12"], "parameter '--seeds': seeds are partitions 0..9"),
        (["--backend", "slurm", "--seeds", "0", "--seed", "1"], "parameter '--seeds': give --seed or --seeds"),
    ],
)
def test_bad_backend_flags_are_one_line_and_submit_nothing(
    slurm_calls: Path, tmp_path: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", CASE, *TRAIN, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {message}" or err.startswith(f"error: {message}"), err
    assert not slurm_calls.exists() and not (tmp_path / "home" / "runs" / "slurm").exists()


@pytest.mark.slurm
def test_requeued_tasks_resume_to_the_uninterrupted_result_and_a_cancelled_one_is_one_line_publishing_nothing(
    home: Path, sweeps: list[Sweep], local_runs: LocalRuns
) -> None:
    """Three tasks of one array, each stopped mid-training its own way. Task 0 is requeued from outside (preemption's
    path: SIGTERM to the job), task 1 warned before its time limit (USR1 to the batch script, which passes it on and
    requeues the checkpointed job): each runs again, resumes from its checkpoint, publishes exactly the run trained
    without interruption, and its manifest tells which interruption it was. Task 2 is cancelled: one line, nothing
    published, while the others publish."""
    sweep = Sweep("--seeds", "0-2", "--parallel", "2")
    sweeps.append(sweep)
    array = sweep.wait_for(r"Slurm job array (\d+)")[1]
    # What --signal=B:USR1@<s> sends before the time limit: the batch script's USR1.
    stop = {"0": ["scontrol", "requeue"], "1": ["scancel", "--batch", "--signal=USR1"], "2": ["scancel"]}
    runs: dict[str, str] = {}
    while len(runs) < len(stop):  # each task as it reaches iteration 25, in whatever order the slots allow
        left = "".join(sorted(set(stop) - set(runs)))
        match = sweep.wait_for(rf"^\[(\S+seed([{left}]))\] \[train\] iteration 25/")
        runs[match[2]] = match[1]
        subprocess.run([*stop[match[2]], f"{array}_{match[2]}"], check=True)
    code, out = sweep.finish()
    errors = [line for line in out.splitlines() if line.startswith("error: ")]  # the requeued runs are no failures
    assert code == 1 and "2 published, 1 failed" in out and len(errors) == 1, out
    assert re.fullmatch(
        # The job checkpoints on scancel's SIGTERM and says so after Slurm's reason (a later run of the same command
        # resumes from it); one line either way.
        rf"error: {re.escape(runs['2'])}: Slurm job {array}_2 CANCELLED(, exit code \d+:\d+)? on \S+(: .*interrupted "
        r"at iteration \d+ of \d+ \(SIGTERM\), checkpoint kept in \S+; run the same command again to resume)?",
        errors[0],
    ), out
    found = published(home)
    assert runs["2"] not in found and Store(home / "store").log.latest(runs["2"]) is None
    local = local_runs(0, 1)
    # What stopped the attempt, told apart: a preemption (SIGTERM: scontrol requeue) or a time limit (USR1).
    for task, timeouts, preemptions, cause in [("0", 0, 1, "preemption or cancel"), ("1", 1, 0, "time limit")]:
        run = runs[task]
        assert re.search(rf"^\[{re.escape(run)}\] \[slurm\] .* attempt 2$", out, re.MULTILINE), out
        assert re.search(rf"^\[{re.escape(run)}\] .*resuming from iteration", out, re.MULTILINE), out
        version, weights, execution = found[run]
        assert (version, weights) == local[run] and execution["restarts"] == 1
        assert json.loads(json.dumps(execution))["backend"] == "slurm"
        assert (execution["timeouts"], execution["preemptions"]) == (timeouts, preemptions), execution
        (attempt,) = execution["attempts"]  # type: ignore[misc]
        assert attempt["cause"] == cause and attempt["progress"] > 0


@pytest.mark.slurm
def test_the_dagster_asset_trains_as_a_slurm_job_with_its_log_in_the_event_log(
    home: Path, tmp_path: Path, local_runs: LocalRuns
) -> None:
    """``SHIFTBENCH_TRAIN_BACKEND=slurm``: the ERM asset's partition trains as a Slurm job, the job's lines reach
    the Dagster run's event log, and the run published is the one trained locally, its manifest naming the job."""
    import dagster as dg

    from shiftbench.assets import erm
    from shiftbench.assets.resources import resource_class
    from shiftbench.conds.family import CASE as KIND
    from shiftbench.conds.family import CONDS

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("cpus_per_task: 1\ntime: '10:00'\n")
    baseline, _ = erm.baseline_assets(CONDS, KIND)
    resources = {
        "settings": resource_class()(home=str(home), train_backend="slurm", slurm_settings=str(cluster)),
        "erm_pipes_client": dg.PipesSubprocessClient(),
    }
    key = dg.MultiPartitionKey({"benchmark": CASE, "seed": "2"})
    config = {"preset": "smoke", "device": "cpu", "threads": 1, **SHORT}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(KIND.qualified, [CASE])
        result = dg.materialize(
            [baseline], resources=resources, partition_key=key, instance=instance,
            run_config={"ops": {"erm__conds_case_baseline": {"config": config}}},
        )  # fmt: skip
        assert result.success
        logs = [str(e.message) for e in instance.all_logs(result.run_id) if e.user_message]
    ((run, local),) = local_runs(2).items()
    assert any(re.search(rf"^{re.escape(run)}: submitted as Slurm job \d+_0", m) for m in logs), logs
    assert any("[train] iteration 150/150" in m for m in logs), "the job's lines reach the run's event log"
    version, weights, execution = published(home)[run]
    assert (version, weights) == local
    assert execution["backend"] == "slurm" and re.fullmatch(r"\d+_0", str(execution["job_id"]))


@pytest.mark.slurm
def test_a_refused_submission_is_one_line(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A partition the cluster does not have: sbatch's own reason in one line, exit 2, no job."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("partition: nosuchpartition\n")
    before = job_ids()
    assert main(["train", CASE, "--backend", "slurm", "--slurm-settings", str(cluster), *TRAIN]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r"error: \S+/sweep\.sbatch: sbatch refused the jobs: .*[Pp]artition.*", err), err
    assert job_ids() == before


@pytest.mark.slurm
def test_ctrl_c_in_the_submitter_cancels_the_array(home: Path, sweeps: list[Sweep]) -> None:
    sweep = Sweep("--seeds", "0-1", "--parallel", "1")
    sweeps.append(sweep)
    array = sweep.wait_for(r"Slurm job array (\d+)")[1]
    sweep.wait_for(r"\[train\] iteration 25/")
    sweep.process.send_signal(signal.SIGINT)
    code, out = sweep.finish()
    assert code == 130 and "interrupted: the jobs were cancelled" in out and "nothing more is published" in out, out
    deadline = time.monotonic() + 60
    while subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, "the array is still queued"
        time.sleep(0.2)
    assert not published(home)


def test_a_node_local_warehouse_is_refused_for_a_partition_of_several_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule (no cluster of several nodes here): runs under /tmp and a partition of 3 nodes is refused before
    submitting; one node (this machine's cluster) or a shared path is allowed."""
    from shiftbench.erm import backends, slurm
    from shiftbench.erm.slurm_settings import ClusterSettings
    from shiftbench.errors import InputError

    nodes = {"count": 3}
    monkeypatch.setattr(slurm, "partition_nodes", lambda partition: nodes["count"])
    under_tmp = Settings.from_env({"SHIFTBENCH_HOME": "/tmp/shiftbench-home"})
    with pytest.raises(InputError, match=r"under /tmp, local to each node, and partition gpu has 3 nodes"):
        backends.check_shared(under_tmp, ClusterSettings(partition="gpu"))
    backends.check_shared(Settings.from_env({"SHIFTBENCH_HOME": "/shared/lab/shiftbench"}), ClusterSettings())
    nodes["count"] = 1
    backends.check_shared(under_tmp, ClusterSettings(partition="gpu"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("5:30", 330), ("1:00:00", 3600), ("2-0", 172800), ("1-2:30", 95400), ("0-0:0:45", 45)],
)
def test_slurm_times_are_read_as_sbatch_reads_them(text: str, seconds: int) -> None:
    from shiftbench.erm.slurm_settings import time_seconds

    assert time_seconds(text) == seconds


def test_the_settings_become_the_array_scripts_options(tmp_path: Path) -> None:
    """Every key reaches the script as sbatch takes it, beside the array, log, requeue and warning options."""
    from shiftbench.erm import slurm
    from shiftbench.erm.slurm_settings import load_cluster_settings

    path = tmp_path / "cluster.yaml"
    path.write_text(
        "partition: gpu\naccount: lab\nqos: high\ntime: '2:00:00'\ngres: gpu:a100:1\ncpus_per_task: 8\nmem: 32G\n"
        "constraint: a100\nsetup: [module load cuda]\nsbatch_options: [--exclusive]\nwarning_seconds: 300\n"
    )
    cluster = load_cluster_settings(path)
    tasks = [
        slurm.Task(i, f"run{i}", tmp_path / f"job-{i}.json", tmp_path / f"out{i}", tmp_path / f"task-{i}.log")
        for i in range(5)
    ]
    script = slurm.batch_script(cluster, tasks, "/opt/py/bin/python", 3, "shiftbench-train")
    options = re.findall(r"^#SBATCH (\S+)$", script, re.MULTILINE)
    assert options == [
        "--job-name=shiftbench-train", "--array=0-4%3", f'--output="{tmp_path}/task-%a.log"', "--open-mode=append",
        "--requeue", "--signal=B:USR1@300", "--time=2:00:00", "--cpus-per-task=8", "--partition=gpu",
        "--account=lab", "--qos=high", "--gres=gpu:a100:1", "--mem=32G", "--constraint=a100", "--exclusive",
    ]  # fmt: skip
    assert "\nmodule load cuda\n" in script and "python=/opt/py/bin/python" in script
    bash = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
    assert bash.returncode == 0, bash.stderr
    # A warehouse whose path has a space is named whole (sbatch reads the quoted path); one with a quote or a newline
    # cannot be named in an #SBATCH line: one line naming SHIFTBENCH_HOME.
    spaced = [slurm.Task(0, "r", tmp_path / "j.json", tmp_path, tmp_path / "a b" / "task-0.log")]
    assert f'#SBATCH --output="{tmp_path}/a b/task-%a.log"\n' in slurm.batch_script(cluster, spaced, "/py", 1, "n")
    from shiftbench.errors import InputError

    for bad in ('a"b', "a\nb"):
        broken = [slurm.Task(0, "r", tmp_path / "j.json", tmp_path, tmp_path / bad / "task-0.log")]
        with pytest.raises(InputError, match="parameter 'SHIFTBENCH_HOME': the warehouse's path holds a double quote"):
            slurm.batch_script(cluster, broken, "/py", 1, "n")


@pytest.mark.slurm
@pytest.mark.parametrize("kill", ["SIGHUP", "SIGKILL"])
def test_a_killed_submitter_loses_nothing_the_same_command_publishes_without_retraining(
    home: Path, sweeps: list[Sweep], local_runs: LocalRuns, kill: str
) -> None:
    """The submitter dies mid-array of three runs, two at a time (an ssh drop's SIGHUP: one line, exit 75; or
    SIGKILL: nothing said) with one run finished and published, one finished and not yet published, the third
    training or pending. The jobs go on; the
    same command says where each run stands (one line each), publishes every run without training one twice, submits
    nothing new, and the versions are those trained locally."""
    first = Sweep("--seeds", "0-2", "--parallel", "2")
    sweeps.append(first)
    array = first.wait_for(r"Slurm job array (\d+)")[1]
    first.wait_for(r"^\[sweep 1/3\] \S+ version ", timeout=600)  # one run published by this submitter
    while not len(list(home.glob("runs/*/run.json"))):  # a second one finished, its publication under way
        time.sleep(0.05)
    if kill == "SIGHUP":
        first.process.send_signal(signal.SIGHUP)
        code, out = first.finish()
        assert code == 75 and "stopped by SIGHUP: the jobs go on in Slurm; run the same command again" in out, out
    else:
        first.process.kill()
        first.finish()
    again = Sweep("--seeds", "0-2", "--parallel", "2")
    sweeps.append(again)
    code, out = again.finish()
    assert code == 0 and "3 published, 0 failed" in out, out
    local = local_runs(0, 1, 2)
    assert "Slurm job array" not in out, out  # nothing submitted anew
    said = {m[1]: m[2] for m in re.finditer(r"^\[sweep\] (\S+): (.*)$", out, re.MULTILINE) if m[1] in local}
    kinds = {re.sub(rf"{array}_\d", "J", re.sub(r"version \w+", "version V", line)) for line in said.values()}
    assert len(said) == 3 and "already published as version V: nothing to train (--restart trains it again)" in kinds
    assert kinds <= {
        "already published as version V: nothing to train (--restart trains it again)",
        "finished by job J: publishing it, nothing retrained",
        "job J still has it: following it",
    }, said
    assert kinds != {"already published as version V: nothing to train (--restart trains it again)"}, said
    runs = published(home)
    assert {run: (version, weights) for run, (version, weights, _) in runs.items()} == local
    logs = sorted((home / "runs" / "slurm").glob("*/task-*.log"))
    assert len(logs) == 3
    for log in logs:  # each run trained once: one attempt, one last iteration
        text = log.read_text()
        assert text.count("iteration 150/150") == 1 and "attempt 2" not in text, text


@pytest.mark.slurm
def test_a_requeue_that_makes_no_progress_stops_after_the_cap(home: Path, sweeps: list[Sweep], tmp_path: Path) -> None:
    """The livelock: every attempt is warned of its time limit right after resuming (the test hook sends USR1 to
    the batch script, as Slurm's --signal=B:USR1 does), checkpoints the same iteration and is requeued. With
    max_stalled_attempts 2 the third attempt gives up: one line naming the run, the job and the reason, exit 2,
    nothing published, the checkpoint kept."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("max_stalled_attempts: 2\n")
    hook = {TEST_HOOK: "25,resume", TEST_SIGNAL: str(int(signal.SIGUSR1)), TEST_TARGET: "parent"}
    sweep = Sweep("--slurm-settings", str(cluster), env=hook)
    sweeps.append(sweep)
    array = sweep.wait_for(r"Slurm job array (\d+)")[1]
    code, out = sweep.finish(timeout=900)
    assert code == 2, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out
    assert re.fullmatch(
        rf"error: {re.escape(CASE)}\S+seed0: Slurm job {array}_0 FAILED, exit code 2:0 on \S+: {re.escape(CASE)} "
        rf"seed 0: no progress in 2 attempts of job {array}_0 in a row \(each stopped at iteration 25 by time "
        r"limit\), the limit is 2: .*; the checkpoint is kept",
        errors[0],
    ), errors[0]
    assert len(re.findall(r"\[slurm\] .* attempt \d+$", out, re.MULTILINE)) == 3, out
    assert not published(home) and list(home.glob("runs/*/resume/state.json"))


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('sbatch_options: ["--arr=0-999", "--outp=elsewhere_%a"]\n', "'sbatch_options': '--arr=0-999' is --array"),
        ('sbatch_options: ["-a0-9"]\n', "'sbatch_options': '-a0-9' is -a, set by shiftbench"),
        ('sbatch_options: ["--array 0-9"]\n', "'sbatch_options': '--array 0-9' is not one sbatch option"),
        ('sbatch_options: ["--exclusive\\n#SBATCH --array=1"]\n', "'sbatch_options': '--exclusive\\n#SBATCH"),
        ('constraint: "a100\\n#SBATCH --array=0-999\\ntouch somefile"\n', "'constraint': 'a100\\n#SBATCH"),
        ('constraint: "a100;touch x"\n', "'constraint': 'a100;touch x' is not a node feature expression"),
        ('setup: ["module load x\\ntouch y"]\n', "'setup': 'module load x\\ntouch y' holds a newline"),
        ('python: "/opt/py\\n"\n', "'python': '/opt/py\\n' holds a newline"),
        (f"time: '{2**66}'\n", "'time': '73786976294838206464' is more than a year"),
        (f"array_parallelism: {10**23}\n", "'array_parallelism': must be less than or equal to 100000"),
        ("time: '30-0'\nwarning_seconds: 70000\n", "'warning_seconds': must be less than or equal to 65535"),
        ("cpus_per_task: 100000\n", "'cpus_per_task': must be less than or equal to 10000"),
        ("max_stalled_attempts: 0\n", "'max_stalled_attempts': must be greater than or equal to 1"),
    ],
    ids=[
        "option-prefix", "short-option-glued", "option-with-space", "newline-in-option", "constraint-injection",
        "constraint-shell", "newline-in-setup", "newline-in-python", "huge-time", "huge-parallelism",
        "huge-warning", "huge-cpus", "no-stalls-allowed",
    ],
)  # fmt: skip
def test_a_settings_value_that_would_reach_the_batch_script_unchecked_is_refused(
    split_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], text: str,
    where: str,
) -> None:  # fmt: skip
    """Every value reaches the batch script as what it is: no newline, no prefix of an option shiftbench sets, bounded
    numbers. Refused while reading the file, so no cluster is needed: one line naming the file, the line and the key,
    exit 2, no runs folder."""
    home = tmp_path / "home"
    shutil.copytree(split_home, home, symlinks=True)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    code = main(["train", CASE, "--seeds", "0-1", "--backend", "slurm", "--slurm-settings", str(path), *TRAIN])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith(f"error: {path}:"), err
    assert where in err, err
    assert not (home / "runs").exists()


def test_sacct_is_read_with_restarts_and_without_where_a_slurm_lacks_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster with accounting answers for a task the controller forgot: sacct's record (state, exit code, node,
    reason, restarts) in scontrol's names, read by a fake sacct on PATH that checks how it is asked; a Slurm whose
    sacct has no Restarts field is asked again without it; no accounting is None."""
    from shiftbench.erm import slurm

    fake = tmp_path / "sacct"
    fake.write_text(
        "#!/bin/bash\n"
        'echo "$@" >> "$(dirname "$0")/calls"\n'
        'case "$*" in\n'
        '  "-n -P -X -j 41_3 -o State,ExitCode,NodeList,Reason,Restarts") '
        'printf "REQUEUED|0:0|node7|None|1\\nTIMEOUT|0:15|node7|TimeLimit|2\\n" ;;\n'
        '  *"-j 41_4 -o State,ExitCode,NodeList,Reason,Restarts") echo "sacct: error: Invalid field requested: '
        '\\"Restarts\\"" >&2; exit 1 ;;\n'
        '  *"-j 41_4 -o State,ExitCode,NodeList,Reason") echo "COMPLETED|0:0|node2|None" ;;\n'
        '  *) echo "Slurm accounting storage is disabled" >&2; exit 1 ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert slurm._sacct("41_3") == {
        "JobState": "TIMEOUT", "ExitCode": "0:15", "NodeList": "node7", "Reason": "TimeLimit", "Restarts": "2"
    }  # fmt: skip
    assert slurm._sacct("41_4") == {"JobState": "COMPLETED", "ExitCode": "0:0", "NodeList": "node2", "Reason": "None"}
    assert slurm._sacct("41_5") is None
    assert (tmp_path / "calls").read_text().count("-j 41_4") == 2


def test_the_queue_is_asked_less_often_while_nothing_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher tails logs every second but asks squeue every 1, 2, 4, ... up to 30 s while no task ends, and at
    once when a task's log says its attempt ended (the batch script's last line); a clock that only ``wait``
    advances makes this exact."""
    from shiftbench.erm import slurm

    clock = {"now": 0.0}
    monkeypatch.setattr(slurm.time, "monotonic", lambda: clock["now"])
    asked: list[float] = []
    log = tmp_path / "task-0.log"
    log.write_text("")

    def queued(arrays: set[str]) -> set[str]:
        asked.append(clock["now"])
        return set() if clock["now"] >= 300 else {"9_0"}

    def wait(seconds: float) -> None:
        clock["now"] += seconds
        if clock["now"] == 200:
            log.write_text("[slurm] r: attempt 1 ended with exit code 75\n")

    monkeypatch.setattr(slurm, "_queued", queued)
    monkeypatch.setattr(slurm, "_final", lambda task, state: slurm.TaskEnd(task, task.job_id, "COMPLETED"))
    task = slurm.Task(0, "r", tmp_path / "job.json", tmp_path, log, "9")
    ends = slurm.watch([task], lambda _t, _l: None, lambda _e: None, wait=wait)  # type: ignore[arg-type]
    assert [e.state for e in ends] == ["COMPLETED"]
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert gaps[:6] == [1, 2, 4, 8, 16, 30] and max(gaps) == 30, gaps
    assert 200 in asked  # the attempt's last line: asked at once
    assert len(asked) < 25  # 300 s of polling: every second would be 300 queries
