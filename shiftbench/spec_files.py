"""Reading benchmark spec files (YAML) and checking their parameters, for every family.

Each family ships ``shiftbench/specs/<family>.yaml`` and accepts one extra file of the same
format through an environment variable; errors name the file and line or the parameter.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from shiftbench.errors import InputError


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"invalid YAML: {exc}", path=source, line=mark.line + 1 if mark else None) from None


def spec_texts(family: str, env_var: str, extra: Path | None = None) -> list[tuple[str, str]]:
    """(text, source) of the shipped spec file, then of ``extra`` or ``$env_var`` when given."""
    shipped = f"specs/{family}.yaml"
    texts = [(resources.files("shiftbench").joinpath(shipped).read_text("utf-8"), f"shiftbench/{shipped}")]
    env = os.environ.get(env_var)
    extra_path = extra or (Path(env) if env else None)
    if extra_path is not None:
        try:
            texts.append((extra_path.read_text("utf-8"), str(extra_path)))
        except FileNotFoundError:
            raise InputError("spec file not found", path=extra_path, parameter=env_var) from None
    return texts


def check_int(value: Any, parameter: str, minimum: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"must be an integer >= {minimum}, got {value!r} (in {where})", parameter=parameter)
    return value


def check_fraction(value: Any, parameter: str, where: str, *, low_open: bool = False, high_open: bool = False) -> float:
    """A number in [0, 1], either end open on request."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    number = float(value) if ok else float("nan")
    inside = ok and (number > 0.0 if low_open else number >= 0.0) and (number < 1.0 if high_open else number <= 1.0)
    if not inside:
        bounds = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise InputError(f"must be a number in {bounds}, got {value!r} (in {where})", parameter=parameter)
    return number


def check_bool(value: Any, parameter: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"must be true or false, got {value!r} (in {where})", parameter=parameter)
    return value
