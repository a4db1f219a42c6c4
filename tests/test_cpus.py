"""The CPUs a training run uses: what the scheduler, the affinity mask and the cgroup give, never every core."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shiftbench.runtime import cpus


@pytest.mark.parametrize(
    ("text", "expected"),
    [("200000 100000", 2), ("150000 100000", 2), ("50000 100000", 1), ("max 100000", None), ("garbage", None)],
)
def test_the_cgroup_quota_in_whole_cpus(tmp_path: Path, text: str, expected: int | None) -> None:
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text(text + "\n")
    assert cpus.cgroup_quota(cpu_max) == expected


def test_the_smallest_limit_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus, "cgroup_quota", lambda: None)
    monkeypatch.setattr(cpus, "_affinity", lambda: 2)
    assert cpus.available_cpus({}) == 2
    assert cpus.available_cpus({"SLURM_CPUS_PER_TASK": "1"}) == 1  # a Slurm task of one CPU on a bigger node
    assert cpus.available_cpus({"SLURM_CPUS_PER_TASK": "64"}) == 2  # the mask says less than the allocation
    assert cpus.available_cpus({"SLURM_CPUS_PER_TASK": "zero"}) == 2
    monkeypatch.setattr(cpus, "cgroup_quota", lambda: 1)
    assert cpus.available_cpus({}) == 1


def test_a_training_process_uses_its_affinity_and_its_openmp_threads_sleep() -> None:
    """Under ``taskset`` of one CPU, the training job's torch pool has one thread (not the machine's count), and
    OpenMP was told, before torch loaded, to let waiting threads sleep; a user's own setting is kept."""
    probe = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "import shiftbench.erm.job; from shiftbench.erm.config import TrainConfig; "
        "from shiftbench.erm.train import cpu_threads; "
        "print(cpu_threads(TrainConfig()), cpu_threads(TrainConfig(threads=3)), "
        "os.environ['OMP_WAIT_POLICY'], os.environ['KMP_BLOCKTIME'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in cpus.YIELDING_WAITS}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "3", "PASSIVE", "0"]
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[2] == "ACTIVE"
