"""Random hyperparameter search, DomainBed's way: per-method distributions as data, draws seeded by name.

A search of N draws x K trials is N x K ordinary runs: draw i of a method sets the values of
``specs/search.yaml``'s space for it (draw 0: the preset's own, as DomainBed's hparams_seed 0 is its defaults),
trial t is seed t. Each run records ``search`` (the space) and ``search_draw`` in its config, so the local sweep,
Slurm arrays, pods and resume treat it like any other run, and a selection method (:mod:`shiftbench.scoring.selection`)
can pick among the draws of one trial afterwards.

Draw i of a method is the same everywhere (on every backend, benchmark and trial, in every process): each parameter
is drawn from numpy's legacy ``RandomState`` (whose stream numpy keeps fixed across releases) seeded by a hash of
(space, method, draw, parameter), the way DomainBed seeds one stream per parameter. DomainBed also folds the trial
into the draw's seed; here the trials of a draw share its values and differ by seed only, so the spread over trials
is the spread over seeds.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from shiftbench.config.located_yaml import parse_yaml
from shiftbench.errors import InputError

SPEC = "shiftbench/specs/search.yaml"
SEARCH_KEYS = frozenset({"search", "search_draw"})  # a run's place in a search (TrainConfig), never pinned values
Form = Literal["log_uniform", "log_uniform_int", "log2_uniform_int", "uniform", "choice", "value"]


class Distribution(BaseModel):
    """One parameter's distribution: exactly one of the forms."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    log_uniform: tuple[float, float] | None = None
    log_uniform_int: tuple[float, float] | None = None
    log2_uniform_int: tuple[float, float] | None = None
    uniform: tuple[float, float] | None = None
    choice: tuple[float | int | str, ...] | None = None
    value: float | int | str | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Distribution:
        given = [name for name in self.model_fields_set if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of log_uniform, log_uniform_int, log2_uniform_int, uniform, choice, value"
            )
        bounds = getattr(self, given[0])
        if given[0] not in {"choice", "value"} and not bounds[0] <= bounds[1]:
            raise ValueError(f"{given[0]}: the lower bound must not exceed the upper")
        return self

    @property
    def form(self) -> Form:
        name = next(name for name in self.model_fields_set if getattr(self, name) is not None)
        return cast(Form, name)

    def draw(self, state: np.random.RandomState) -> Any:
        """One value from ``state`` (DomainBed's ``10**r.uniform(a, b)``, ``int(2**r.uniform(a, b))``, ...)."""
        form = self.form
        if form == "value":
            return self.value
        if form == "choice":
            assert self.choice is not None
            return self.choice[int(state.randint(len(self.choice)))]
        low, high = getattr(self, form)
        u = float(state.uniform(low, high))
        if form == "log_uniform":
            return 10.0**u
        if form == "uniform":
            return u
        return int((2.0 if form == "log2_uniform_int" else 10.0) ** u)

    def holds(self, value: Any) -> bool:
        """Whether ``value`` lies in the distribution's support (a pinned value must)."""
        form = self.form
        if form == "value":
            return bool(value == self.value)
        if form == "choice":
            assert self.choice is not None
            return value in self.choice
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        low, high = getattr(self, form)
        if form == "uniform":
            return bool(low <= value <= high)
        base = 2.0 if form == "log2_uniform_int" else 10.0
        lowest, highest = base**low, base**high
        if form == "log_uniform":
            return bool(lowest * (1 - 1e-12) <= value <= highest * (1 + 1e-12))
        return float(value).is_integer() and int(lowest) <= value <= int(highest)

    def describe(self) -> str:
        form = self.form
        if form in {"value", "choice"}:
            return repr(self.value) if form == "value" else f"one of {list(self.choice or ())}"
        low, high = getattr(self, form)
        text = {"log_uniform": "10**U({}, {})", "log_uniform_int": "int(10**U({}, {}))"}.get(form)
        text = text or {"log2_uniform_int": "int(2**U({}, {}))", "uniform": "U({}, {})"}[form]
        return text.format(low, high)


class Space(BaseModel):
    """A named set of distributions: the ones every method draws, and each method's own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    about: str
    common: dict[str, Distribution]
    methods: dict[str, dict[str, Distribution]]

    def parameters(self, method: str) -> dict[str, Distribution]:
        return {**self.common, **self.methods.get(method, {})}


class SearchSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    spaces: dict[str, Space]
    defaults: dict[str, str]


@cache
def spec() -> SearchSpec:
    """The shipped spaces, checked against the training parameters they name."""
    from shiftbench.erm.config import TrainConfig
    from shiftbench.scoring.method_names import METHODS

    data = parse_yaml(resources.files("shiftbench").joinpath("specs/search.yaml").read_text("utf-8"), SPEC)
    try:
        loaded = SearchSpec.model_validate(data)
    except ValidationError as error:
        raise InputError(f"invalid search spaces: {error.errors()[0]['msg']}", path=SPEC) from None
    known = set(TrainConfig.__dataclass_fields__)
    for name, space in loaded.spaces.items():
        unknown = sorted(set(space.common).union(*space.methods.values()) - known)
        methods = sorted(set(space.methods) - set(METHODS))
        if unknown or methods:
            raise InputError(f"space {name}: unknown parameter or method {(unknown + methods)[0]!r}", path=SPEC)
    return loaded


def space_for(name: str, model: str) -> tuple[str, Space]:
    """The space named (``auto``: the default for ``model``), or one line naming the known ones."""
    spaces = spec().spaces
    if name == "auto":
        name = spec().defaults.get(model, spec().defaults["*"])
    if name not in spaces:
        raise InputError(f"unknown search space {name!r}; known: {', '.join(sorted(spaces))}", parameter="search")
    return name, spaces[name]


def _seed(*parts: object) -> int:
    """A 31-bit seed from the parts' text (DomainBed's seed_hash, with sha256)."""
    return int(hashlib.sha256(repr(parts).encode("utf-8")).hexdigest(), 16) % (2**31)


def draw_values(space_name: str, space: Space, method: str, draw: int) -> dict[str, Any]:
    """Draw ``draw`` of ``method`` in ``space``: ``{}`` for draw 0 (the preset's values), else one value per
    parameter, each from its own stream."""
    if draw == 0:
        return {}
    return {
        name: distribution.draw(np.random.RandomState(_seed(space_name, method, draw, name)))
        for name, distribution in sorted(space.parameters(method).items())
    }


def searched_config(
    values: Mapping[str, Any], pinned: Mapping[str, Any], n_train: int
) -> tuple[dict[str, Any], set[str]]:
    """A run's values with its draw applied: ``values`` (preset and the user's ``pinned`` overrides, with ``search``
    and ``search_draw``) gain the draw's values for every parameter the user did not pin. A pinned searched parameter
    must lie in its distribution's support (one line naming it otherwise); a drawn batch larger than the ``n_train``
    training examples trains on all of them, as a preset's does. Returns the values and the drawn names."""
    name = str(values.get("search") or "")
    if not name:
        return dict(values), set()
    method = str(values.get("method", "erm"))
    name, space = space_for(name, str(values.get("model", "small_cnn")))
    distributions = space.parameters(method)
    for parameter, value in pinned.items():
        if parameter in distributions and not distributions[parameter].holds(_number(value)):
            raise InputError(
                f"{value!r} lies outside its distribution in search space {name} "
                f"({distributions[parameter].describe()}): pin a value inside it or leave it to the search",
                parameter=parameter,
            )
    draw = int(values.get("search_draw", 0))
    drawn = {k: v for k, v in draw_values(name, space, method, draw).items() if k not in pinned}
    if "batch_size" in drawn:
        drawn["batch_size"] = min(int(drawn["batch_size"]), n_train)
    return {**values, **drawn, "search": name}, set(drawn)


def _number(value: Any) -> Any:
    """A ``--set`` value as the number it spells (``1e-4`` arrives as text)."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
    return value
