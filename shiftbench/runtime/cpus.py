"""How many CPUs this process may really use, and threads that yield when they wait.

torch sizes its thread pool from the machine's cores, not from what the process is given: in a Slurm
allocation of 4 CPUs on a 64-core node, in a container with a CPU quota, or under ``taskset``, it starts a
thread per core and the threads fight over the few CPUs they share. OpenMP's waiting threads also spin
(GNU OpenMP's default), so a second CPU-bound process beside a training run slows it far more than the
share of CPU it takes. :func:`available_cpus` is the smallest of what the scheduler, the CPU affinity and
the cgroup quota allow; :func:`yielding_waits` asks OpenMP to let waiting threads sleep. Measured in
BENCHMARKS.md ("Training on CPU"). No torch here: the waits must be set before torch loads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")

# GNU OpenMP (torch's CPU wheels) and Intel's OpenMP: waiting threads sleep instead of spinning.
YIELDING_WAITS = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}


def _slurm_cpus(env: Mapping[str, str]) -> int | None:
    """The CPUs of this Slurm task (``--cpus-per-task``), when the process runs in an allocation."""
    text = env.get("SLURM_CPUS_PER_TASK", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):  # not Linux
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text("utf-8").strip()
    except OSError:
        return None


def cgroup_quota(cpu_max: Path = CGROUP_V2_CPU_MAX) -> int | None:
    """The cgroup's CPU quota in whole CPUs (rounded up), or None when unlimited or unknown."""
    text = _read(cpu_max)
    if text is not None:  # cgroup v2: "<quota> <period>" or "max <period>"
        quota, _, period = text.partition(" ")
        if quota.isdigit() and period.isdigit() and int(period) > 0:
            return max(1, math.ceil(int(quota) / int(period)))
        return None
    v1_quota, v1_period = _read(CGROUP_V1_QUOTA), _read(CGROUP_V1_PERIOD)  # cgroup v1: -1 is unlimited
    if v1_quota and v1_period and v1_quota.isdigit() and v1_period.isdigit() and int(v1_period) > 0:
        return max(1, math.ceil(int(v1_quota) / int(v1_period)))
    return None


def available_cpus(env: Mapping[str, str] | None = None) -> int:
    """The CPUs this process may use: the smallest of the Slurm allocation, the affinity mask and the cgroup
    quota (the machine's count when none says less)."""
    env = os.environ if env is None else env
    limits = [n for n in (_slurm_cpus(env), _affinity(), cgroup_quota()) if n is not None]
    return min(limits) if limits else (os.cpu_count() or 1)


def yielding_waits(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set (unless the user set them) the variables that make OpenMP's waiting threads sleep; in ``env``, or
    in this process's environment, where it only takes effect if torch has not been imported yet."""
    target = os.environ if env is None else env
    for name, value in YIELDING_WAITS.items():
        target.setdefault(name, value)
    return {name: target[name] for name in YIELDING_WAITS}
