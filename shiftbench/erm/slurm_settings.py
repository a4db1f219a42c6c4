"""The Slurm jobs' settings: one typed model read from a YAML file, checked before anything is submitted.

``sbatch`` accepts a misspelt option or a bad time only to fail later, or silently drops what it does not know
in a ``#SBATCH`` line; a sweep would then wait for jobs that never run. So the settings (``--slurm-settings``,
``SHIFTBENCH_SLURM_SETTINGS``) are validated here first: one bad value is one :class:`InputError` naming the
file, the line and the key (:func:`shiftbench.config.located_yaml.validation_error`), exit 2, nothing submitted.

Pure library: no Slurm command runs here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from shiftbench.config.located_yaml import parse_yaml, validation_error
from shiftbench.config.textio import read_text
from shiftbench.errors import InputError, shown

SETTING = "SHIFTBENCH_SLURM_SETTINGS"
PARAMETER = "--slurm-settings"
# sbatch's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
_TIME = re.compile(r"(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+))?(?::(\d+))?)")
_MEMORY = re.compile(r"\d+[KMGT]?")
_GRES = re.compile(r"[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?(:\d+)?(,[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?(:\d+)?)*")
# Options this backend sets itself (or that would stop it following its jobs): given again in `sbatch_options` they
# would silently change how it works. sbatch takes any unambiguous prefix of a long option (getopt_long: `--arr` is
# `--array`) and a short option's value glued to it (`-a0-9`), so a prefix of one of these is refused too.
MANAGED_LONG = (
    "--array", "--output", "--error", "--input", "--open-mode", "--requeue", "--no-requeue", "--signal", "--parsable",
    "--job-name", "--wrap", "--cpus-per-task", "--time", "--partition", "--account", "--qos", "--gres", "--mem",
    "--constraint", "--wait", "--test-only", "--chdir",
)  # fmt: skip
MANAGED_SHORT = "aoeiJctpAqCWD"  # -a --array, -o --output, ... -W --wait, -D --chdir
MANAGED_OPTIONS = (*MANAGED_LONG, *(f"-{letter}" for letter in MANAGED_SHORT))
MAX_TIME_S = 365 * 24 * 3600  # a year: beyond it a limit is a typo
MAX_SIGNAL_S = 65535  # sbatch --signal's largest warning time (its manual)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OPTION = re.compile(r"(--[A-Za-z][A-Za-z0-9-]*)(=.*)?|-([A-Za-z])(.*)")
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.:*&|,()\[\]-]+")
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, pattern=r"^[^\s,'\"]+$")]


def time_seconds(text: str) -> int:
    """sbatch's ``--time`` as seconds; a value sbatch would refuse raises ValueError."""
    match = _TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    days, d_hours, d_minutes, d_seconds, first, second, third = match.groups()
    if days is not None:
        return ((int(days) * 24 + int(d_hours)) * 60 + int(d_minutes or 0)) * 60 + int(d_seconds or 0)
    if third is not None:  # hours:minutes:seconds
        return (int(first) * 60 + int(second)) * 60 + int(third)
    return int(first) * 60 + int(second or 0)  # minutes[:seconds]


class ClusterSettings(BaseModel):
    """Where and how the training jobs run; unknown keys are refused (a misspelt one would be ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    partition: Name | None = Field(default=None, description="the partition (default: the cluster's default partition)")
    account: Name | None = Field(default=None, description="the account jobs are charged to")
    qos: Name | None = Field(default=None, description="the quality of service")
    time: str = Field(default="1:00:00", description="each run's time limit, as sbatch takes it (HH:MM:SS, D-HH, ...)")
    gres: str | None = Field(default=None, description="generic resources per run, e.g. gpu:1 or gpu:a100:1")
    cpus_per_task: int = Field(
        default=1, ge=1, le=10_000, description="CPUs per run; on CPU, also the run's torch threads"
    )
    mem: str | None = Field(default=None, description="memory per node, as sbatch takes it: 16G, 4000M")
    constraint: str | None = Field(default=None, description="node features, as sbatch's --constraint takes them")
    python: str | None = Field(
        default=None, description="the nodes' python with shiftbench installed (default: this one's)"
    )
    setup: list[str] = Field(
        default_factory=list, description="shell lines run before each job, e.g. 'module load cuda/12.4'"
    )
    sbatch_options: list[str] = Field(default_factory=list, description="more sbatch options, e.g. --exclusive")
    array_parallelism: int | None = Field(
        default=None, ge=1, le=100_000, description="runs of a sweep at a time (the array's %K)"
    )
    warning_seconds: int = Field(
        default=120,
        ge=10,
        le=MAX_SIGNAL_S,
        description="the signal to checkpoint (USR1) this long before the time limit",
    )
    max_stalled_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="a run stopped this many times in a row (time limit, preemption) without a step of progress "
        "fails instead of being requeued again",
    )

    @field_validator(
        "partition", "account", "qos", "time", "gres", "mem", "constraint", "python", "setup", "sbatch_options",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _one_line(cls, value: Any) -> Any:
        """No value may hold a newline or another control character: each becomes part of one line of the batch
        script (an `#SBATCH` directive or a shell line), and a newline would start another."""
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and _CONTROL.search(item):
                raise ValueError(f"{shown(item)} holds a newline or another control character: one line each")
        return value

    @field_validator("time", mode="before")
    @classmethod
    def _minutes(cls, value: object) -> object:
        """``time: 30`` (YAML gives a number) is 30 minutes, as sbatch reads it."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        seconds = time_seconds(value)
        if seconds <= 0:
            raise ValueError("the time limit must be positive")
        if seconds > MAX_TIME_S:
            raise ValueError(f"{shown(value)} is more than a year")
        return value.strip()

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, value: str | None) -> str | None:
        if value is not None and not _CONSTRAINT.fullmatch(value):
            raise ValueError(
                f"{shown(value)} is not a node feature expression such as a100 or intel&gpu (letters, digits and "
                "_ . : * & | , ( ) [ ] -)"
            )
        return value

    @field_validator("gres")
    @classmethod
    def _gres(cls, value: str | None) -> str | None:
        if value is not None and not _GRES.fullmatch(value):
            raise ValueError(f"{value!r} is not a gres request such as gpu:1 or gpu:a100:2")
        return value

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None and not _MEMORY.fullmatch(value):
            raise ValueError(f"{value!r} is not a memory size such as 16G or 4000M")
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is not None and not PurePosixPath(value).is_absolute():
            raise ValueError(f"{value!r} must be an absolute path on the nodes")
        return value

    @field_validator("sbatch_options")
    @classmethod
    def _options(cls, values: list[str]) -> list[str]:
        for value in values:
            managed = managed_option(value)
            if managed is not None:
                raise ValueError(f"{shown(value)} is {managed}, set by shiftbench or by a key of this file: remove it")
        return values

    @field_validator("warning_seconds")
    @classmethod
    def _warning_before_limit(cls, value: int, info: ValidationInfo) -> int:
        limit = info.data.get("time")
        if limit is not None and value >= time_seconds(limit):
            raise ValueError(f"{value} s must be less than the time limit ({limit})")
        return value

    def sbatch_lines(self) -> list[str]:
        """The ``#SBATCH`` options these settings make (besides the array, log and requeue ones)."""
        options = [f"--time={self.time}", f"--cpus-per-task={self.cpus_per_task}"]
        for name in ("partition", "account", "qos", "gres", "mem", "constraint"):
            value = getattr(self, name)
            if value is not None:
                options.append(f"--{name}={value}")
        return options + [shlex.quote(option) for option in self.sbatch_options]


def managed_option(value: str) -> str | None:
    """The managed option an ``sbatch_options`` entry is (as sbatch would read it), or None; an entry that is not
    one sbatch option (``--name``, ``--name=value``, ``-x``, ``-xvalue``) raises ValueError."""
    match = _OPTION.fullmatch(value)
    if match is None or (match[2] is None and match[1] is not None and " " in value):
        raise ValueError(f"{shown(value)} is not one sbatch option: --name, --name=value, -x or -xvalue")
    long_name, letter = match[1], match[3]
    if long_name is not None:
        hits = [name for name in MANAGED_LONG if name.startswith(long_name)]
        return hits[0] if hits else None
    return f"-{letter}" if letter in MANAGED_SHORT else None


def load_cluster_settings(path: Path | None) -> ClusterSettings:
    """The settings of ``path``; none given: the defaults (the default partition, one CPU, one hour)."""
    if path is None:
        return ClusterSettings()
    data = parse_yaml(read_text(path, what="Slurm settings file", parameter=PARAMETER), path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError("expected a mapping of Slurm settings (partition, time, cpus_per_task, ...)", path=path)
    try:
        return ClusterSettings.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data, path) from None
