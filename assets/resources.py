"""Dagster resources: the ``SHIFTBENCH_*`` settings as one configurable resource.

:class:`ShiftbenchSettings` is the resource the assets, ops and sensors take: :meth:`ShiftbenchSettings.get` makes
the run's :class:`~shiftbench.config.settings.Settings`. Its fields are one per setting, made from the settings models
themselves (one definition of the settings, never two) by :func:`resource_class`: those of the shared model and of
each family the registry holds, so a family registered later (the test family) brings its own. Each field is bound
at load time to ``EnvVar("SHIFTBENCH_X")`` when that variable is set, so the UI's resource page shows where each
value comes from; a field left unset falls back to the process environment, then to the default.
"""

import functools
import os
from typing import Any

import dagster as dg
from pydantic import BaseModel, Field, create_model

from shiftbench.config.family_registry import REGISTRY, Registry
from shiftbench.config.settings import Settings, variable

_DOC = "Every SHIFTBENCH_* setting (see docs/settings.md); unset fields fall back to the environment."


class ShiftbenchSettings(dg.ConfigurableResource):
    """Every SHIFTBENCH_* setting (see docs/settings.md); unset fields fall back to the environment.

    The fields (one per setting, text as the environment gives it) are those of the class
    :func:`resource_class` makes from the settings models; this class holds what every such class does."""

    def get(self) -> Settings:
        """The settings of this run: the resource's fields over the process environment."""
        names = list(type(self).model_fields)
        values: dict[str, Any] = {
            name: os.environ[variable(name)] for name in names if os.environ.get(variable(name), "").strip()
        }
        values.update({name: value for name in names if (value := getattr(self, name)) is not None})
        return Settings.parse(values)


def resource_class(registry: Registry = REGISTRY) -> type[ShiftbenchSettings]:
    """The resource with a field per setting: the shared ones, then each of ``registry``'s families' own."""
    return _with_fields(tuple(registry.settings_models()))


@functools.cache
def _with_fields(models: tuple[type[BaseModel], ...]) -> type[ShiftbenchSettings]:
    described: dict[str, str] = {}
    every: list[type[BaseModel]] = [Settings, *models]
    for model in every:
        described.update({name: field.description or "" for name, field in model.model_fields.items()})
    fields: dict[str, Any] = {
        name: (str | None, Field(None, description=f"{variable(name)}: {text}")) for name, text in described.items()
    }
    made: type[ShiftbenchSettings] = create_model(  # type: ignore[call-overload]
        "ShiftbenchSettings", __base__=ShiftbenchSettings, __doc__=_DOC, **fields
    )
    return made


def settings_from_environment(registry: Registry = REGISTRY) -> ShiftbenchSettings:
    """The resource with an ``EnvVar`` for every ``SHIFTBENCH_*`` variable set now."""
    resource = resource_class(registry)
    bound = {
        name: dg.EnvVar(variable(name)) for name in resource.model_fields if os.environ.get(variable(name), "").strip()
    }
    return resource(**bound)
