"""Dagster resources: the ``SHIFTBENCH_*`` settings as one configurable resource.

Its fields are generated from :class:`shiftbench.settings.Settings` and the registered families' own
settings models (one definition of the settings, never two): every setting is a field, bound at load
time to ``EnvVar("SHIFTBENCH_X")`` when that variable is set, so the UI's resource page shows where
each value comes from. A field left unset falls back to the process environment, then to the default.
"""

import functools
import os
from typing import Any

import dagster as dg
from pydantic import Field, create_model

from shiftbench import registry
from shiftbench.settings import Settings, variable


def _get(self: Any) -> Settings:
    """The settings of this run: the resource's fields over the process environment."""
    names = [name for name in type(self).model_fields if name in _descriptions()]
    values: dict[str, Any] = {
        name: os.environ[variable(name)] for name in names if os.environ.get(variable(name), "").strip()
    }
    values.update({name: getattr(self, name) for name in names if getattr(self, name) is not None})
    return Settings.parse(values)


def _descriptions() -> dict[str, str]:
    """Every setting by field name: the shared ones, then each registered family's own."""
    found = {name: field.description or "" for name, field in Settings.model_fields.items()}
    for family in registry.FAMILIES.values():
        if family.settings is not None:
            found.update({name: field.description or "" for name, field in family.settings.model_fields.items()})
    return found


def _fields(names: list[str]) -> dict[str, Any]:
    described = _descriptions()
    return {name: (str | None, Field(None, description=f"{variable(name)}: {described[name]}")) for name in names}


ShiftbenchSettings: Any = create_model(  # type: ignore[call-overload]
    "ShiftbenchSettings",
    __base__=dg.ConfigurableResource,
    __doc__="Every SHIFTBENCH_* setting (see docs/settings.md); unset fields fall back to the environment.",
    **_fields(list(_descriptions())),  # the shared settings and those of the families registered at import
)
ShiftbenchSettings.get = _get


@functools.cache
def _with_family_fields(names: tuple[str, ...]) -> Any:
    """The resource class with the settings of families registered after import as fields too."""
    if not names:
        return ShiftbenchSettings
    return create_model("ShiftbenchSettings", __base__=ShiftbenchSettings, **_fields(list(names)))


def settings_from_environment() -> Any:
    """The resource with an ``EnvVar`` for every ``SHIFTBENCH_*`` variable set now."""
    names = list(_descriptions())
    resource = _with_family_fields(tuple(n for n in names if n not in ShiftbenchSettings.model_fields))
    bound = {name: dg.EnvVar(variable(name)) for name in names if os.environ.get(variable(name), "").strip()}
    return resource(**bound)
