"""Dagster resources: the ``SHIFTBENCH_*`` settings as one configurable resource.

Its fields are generated from :class:`shiftbench.settings.Settings` (one definition of the
settings, never two): every setting is a field, bound at load time to ``EnvVar("SHIFTBENCH_X")``
when that variable is set, so the UI's resource page shows where each value comes from. A field
left unset falls back to the process environment, then to the default.
"""

import os
from typing import Any

import dagster as dg
from pydantic import Field, create_model

from shiftbench.settings import Settings, variable


def _get(self: Any) -> Settings:
    """The settings of this run: the resource's fields over the process environment."""
    values: dict[str, Any] = {
        name: os.environ[variable(name)] for name in Settings.model_fields if os.environ.get(variable(name), "").strip()
    }
    values.update({name: getattr(self, name) for name in Settings.model_fields if getattr(self, name) is not None})
    return Settings.parse(values)


ShiftbenchSettings: Any = create_model(  # type: ignore[call-overload]
    "ShiftbenchSettings",
    __base__=dg.ConfigurableResource,
    __doc__="Every SHIFTBENCH_* setting (see the README); unset fields fall back to the environment.",
    **{
        name: (str | None, Field(None, description=f"{variable(name)}: {field.description}"))
        for name, field in Settings.model_fields.items()
    },
)
ShiftbenchSettings.get = _get


def settings_from_environment() -> Any:
    """The resource with an ``EnvVar`` for every ``SHIFTBENCH_*`` variable set now."""
    bound = {
        name: dg.EnvVar(variable(name)) for name in Settings.model_fields if os.environ.get(variable(name), "").strip()
    }
    return ShiftbenchSettings(**bound)
