"""The raw runs behind a figure of BENCHMARKS.md, kept as a small JSON record under ``bench/figures/`` so the figure
can be re-derived from its runs and compared with the next run (``git diff`` of the record).

A bench script starts a recording when it starts (the date, the load average and the command are taken then), adds
each run as it is measured, and saves the record with its figures at the end::

    recording = records.start(args.record)           # args.record: the script's --record PATH, or None
    recording.run(benchmark="sprites-uniform", load_s=0.51)
    recording.save("what the script measures", {"sprites-uniform.load": records.median_figure(times, "s", 2)})

A record holds: what was measured, the command (the environment variables it read included), the date, the commit
(and whether the checkout had changes), the machine, the load average at the start and the end, every run, and the
figures, each with the text BENCHMARKS.md quotes (``figure``) and, where it is a median, the runs it is the median
of. ``tests/test_benchmarks.py`` checks that every record parses and that every row of BENCHMARKS.md names one.

Only the standard library: the scripts run on a GPU machine whose Python has torch and little else.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
PROJECT = Path(__file__).resolve().parents[1]
FIGURES = PROJECT / "bench" / "figures"
# The environment variables a bench command reads (where the warehouse is, how many threads), kept with it.
ENV_PREFIXES = ("SHIFTBENCH_", "OMP_", "KMP_", "SLURM_CONF", "CUDA_VISIBLE_DEVICES")


def add_argument(parser: Any) -> None:
    """The ``--record PATH`` option every bench script behind a current figure has."""
    parser.add_argument(
        "--record",
        type=Path,
        metavar="PATH",
        help="also write the runs, machine, command, date and commit as JSON (bench/figures/NAME.json)",
    )


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(PROJECT), *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def commit() -> dict[str, Any]:
    """The checkout's commit and whether its tracked files had changes ("unknown" outside a git checkout, e.g. a
    copy on a GPU machine: fill it in before committing the record; the test asks for a commit)."""
    head = _git("rev-parse", "HEAD")
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head or "unknown", "changes": bool(changed) if changed is not None else None}


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch() -> dict[str, Any]:
    """torch's version and GPU, when the script imported torch (never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    found: dict[str, Any] = {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
    return found


def machine() -> dict[str, Any]:
    """The machine, with a one-line description for BENCHMARKS.md's machine column."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    found: dict[str, Any] = {
        "processor": _processor(),
        "architecture": platform.machine(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **_torch(),
    }
    gpu = f", {found['gpu']}" if "gpu" in found else ", no GPU"
    torch = f", torch {found['torch']}" if "torch" in found else ""
    found["description"] = (
        f"{found['architecture']} ({found['processor']}), {usable} cores, {found['memory_gib']} GiB, "
        f"Python {found['python']}{torch}{gpu}"
    )
    return found


def command_line(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> str:
    """The command as it was run: the environment variables it reads, the Python (relative to the project when
    inside it) and the arguments."""
    argv = list(sys.argv if argv is None else argv)
    env = dict(os.environ if env is None else env)
    python = Path(sys.executable)
    shown = str(python.relative_to(PROJECT)) if python.is_relative_to(PROJECT) else python.name
    assignments = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)]
    return " ".join([*assignments, shown, shlex.join(argv)])


def median_figure(runs: Sequence[float], unit: str, digits: int, what: str = "") -> dict[str, Any]:
    """A figure that is the median of ``runs``, as BENCHMARKS.md quotes it (``digits`` after the point)."""
    median = statistics.median(runs)
    return {
        "what": what,
        "figure": f"{median:.{digits}f} {unit}".strip(),
        "median": median,
        "runs": list(runs),
        "unit": unit,
    }


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class Recording:
    """A bench script's runs as they are measured; :meth:`save` writes them with the figures (nothing without a
    path: the script was run without ``--record``)."""

    path: Path | None
    started: datetime.datetime = field(default_factory=_now)
    load_at_start: tuple[float, ...] = field(default_factory=lambda: tuple(os.getloadavg()))
    command: str = field(default_factory=command_line)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def run(self, **values: Any) -> None:
        self.runs.append(values)

    def record(self, what: str, figures: dict[str, dict[str, Any]], notes: str = "") -> dict[str, Any]:
        finished = _now()
        return {
            "format": FORMAT,
            "what": what,
            "command": self.command,
            "date": self.started.date().isoformat(),
            "started": self.started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            **commit(),
            "machine": machine(),
            "load_average": {"start": list(self.load_at_start), "end": list(os.getloadavg())},
            "source": "written by bench/records.py",
            "notes": notes,
            "figures": figures,
            "runs": self.runs,
        }

    def save(self, what: str, figures: dict[str, dict[str, Any]], notes: str = "") -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.record(what, figures, notes), indent=1, ensure_ascii=False)
        self.path.write_text(text + "\n", "utf-8")
        print(f"record: {self.path}", file=sys.stderr, flush=True)


def start(path: Path | None) -> Recording:
    """Start recording (call it when the script starts: the date, load and command are taken now)."""
    return Recording(path)
