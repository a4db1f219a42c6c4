"""The registry is an object families are registered into by a call: importing a module registers nothing, so the
settings, the contracts and the families answer the same whatever was imported before (each order in a fresh
process), and importing the registry, the settings or the front door imports no family."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shiftbench.config.family_registry import BUILT_IN, LazyFamily, Registry, built_in_registry
from shiftbench.config.package_files import CONTRACTS_DIR
from shiftbench.errors import InputError

from .toy_family import TOY

FAMILY_PACKAGES = ("shiftbench.breeds", "shiftbench.metashift", "shiftbench.conds")
HEAVY = ("numba", "scipy", "networkx", "pandas", "torch", "dagster")

# What a process sees after importing ``sys.argv[1:]`` in that order: the settings' family models and a family
# setting's value, whether a family's bad value is refused, the contracts found and the registry's families.
PROBE = r"""
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from shiftbench.store.contracts import contracts
from shiftbench.errors import InputError
from shiftbench.config.family_registry import REGISTRY
from shiftbench.config.settings import Settings
try:
    Settings.parse({"sprites_per_combination": "many"})
    refused = None
except InputError as exc:
    refused = exc.parameter
print(json.dumps({
    "models": [model.__name__ for model in REGISTRY.settings_models()],
    "value": Settings.parse({}).value("sprites_per_combination"),
    "refused": refused,
    "contracts": sorted(contracts()),
    "families": REGISTRY.names(),
}))
"""

ORDERS = [
    [],
    ["shiftbench.config.settings"],
    ["shiftbench.store.contracts", "shiftbench.config.settings"],
    ["shiftbench.families.registry"],
    ["shiftbench.conds.family", "shiftbench.api"],
    ["shiftbench.api", "shiftbench.results.scored_predictions", "shiftbench.breeds.family"],
    ["shiftbench.assets.resources", "shiftbench.metashift.family"],
]


def _run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_settings_contracts_and_families_are_the_same_whatever_was_imported_first() -> None:
    seen = {" then ".join(order) or "(nothing)": json.loads(_run(PROBE, *order)) for order in ORDERS}
    first = seen["(nothing)"]
    assert first["models"] == ["BreedsSettings", "MetaShiftSettings", "CondsSettings"]
    assert first["value"] == 100 and first["refused"] == "SHIFTBENCH_SPRITES_PER_COMBINATION"
    assert {"benchmarks", "examples", "conds_attributes", "metashift_subsets"} <= set(first["contracts"])
    assert first["families"] == ["breeds", "metashift", "conds"]
    assert {order: answer for order, answer in seen.items() if answer != first} == {}


def test_importing_the_front_door_the_settings_or_the_registry_imports_no_family() -> None:
    code = (
        "import sys, json\nimport shiftbench.api, shiftbench.config.settings, shiftbench.config.family_registry\n"
        "import shiftbench.store.contracts\nprint(json.dumps(sorted(sys.modules)))"
    )
    modules = json.loads(_run(code))
    families = [m for m in modules if m.startswith(FAMILY_PACKAGES)]
    assert families == []
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []
    assert [m for m in modules if m.startswith(("shiftbench.erm", "shiftbench.families.registry"))] == []


def test_a_built_in_family_is_imported_when_first_asked_for_and_matches_its_entry() -> None:
    registry = built_in_registry()
    assert registry.names() == ["breeds", "metashift", "conds"]
    assert [d.name for d in registry.contract_directories()] == ["breeds", "metashift", "conds"]
    assert registry.contract_directories() == [CONTRACTS_DIR / name for name in registry.names()]
    for entry in BUILT_IN:
        family = registry.get(entry.name)
        assert family is not None and family.name == entry.name
        assert family is registry.get(entry.name)  # imported once
    assert registry.get("nope") is None


def test_an_entry_that_does_not_match_its_family_is_a_bug_said_at_once() -> None:
    wrong = LazyFamily("conds", "shiftbench.conds.family:CONDS", "shiftbench.breeds.settings:BreedsSettings")
    with pytest.raises(TypeError, match="does not match its registry entry"):
        Registry([wrong]).get("conds")


def test_registering_is_a_call_on_one_registry_and_changes_only_it() -> None:
    registry, other = built_in_registry(), built_in_registry()
    registry.register(TOY)
    registry.register(TOY)  # the same family again: nothing changes
    assert registry.names() == ["breeds", "metashift", "conds", "toy"]
    assert registry.settings_models()[-1] is TOY.settings
    assert registry.contract_directories()[-1] == TOY.contracts_dir
    assert "toy" not in other.names() and TOY.settings not in other.settings_models()
    impostor = LazyFamily("toy", "tests.toy_family:TOY")
    with pytest.raises(InputError, match="a family named 'toy' is already registered"):
        Registry([impostor, impostor])
    conds = registry.get("conds")
    assert conds is not None
    registry.register(conds)  # a built-in registered by its object: the same family
    registry.unregister("toy")
    assert registry.names() == ["breeds", "metashift", "conds"]


def test_a_family_of_another_name_cannot_take_a_registered_one() -> None:
    from dataclasses import replace

    registry = built_in_registry()
    with pytest.raises(InputError, match="a family named 'conds' is already registered"):
        registry.register(replace(TOY, name="conds"))


def test_the_dagster_resource_is_typed_with_a_field_per_setting_of_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shiftbench.assets.resources import ShiftbenchSettings, resource_class, settings_from_environment
    from shiftbench.config.settings import Settings

    registry = built_in_registry()
    built_in = resource_class(registry)
    assert issubclass(built_in, ShiftbenchSettings) and built_in.__name__ == "ShiftbenchSettings"
    expected = set(Settings.model_fields) | {f for m in registry.settings_models() for f in m.model_fields}
    assert set(built_in.model_fields) == expected
    assert built_in.model_fields["home"].description == f"SHIFTBENCH_HOME: {Settings.model_fields['home'].description}"
    registry.register(TOY)
    with_toy = resource_class(registry)
    assert set(with_toy.model_fields) == expected | {"toy_per_cell"} and with_toy is resource_class(registry)
    monkeypatch.setenv("SHIFTBENCH_TOY_PER_CELL", "5")
    monkeypatch.setenv("SHIFTBENCH_HOME", str(Path("elsewhere").absolute()))
    bound = settings_from_environment(registry)
    assert isinstance(bound, ShiftbenchSettings)
    settings = with_toy(home="given").get()  # the field wins over the environment, which fills the rest
    assert settings.home == Path("given").absolute() and settings.of(TOY.settings).toy_per_cell == 5  # type: ignore[arg-type]


def test_a_shift_measure_means_the_same_whatever_was_imported_first() -> None:
    """A card describes its version's measures (an ERM run's card: its split's) in a process that may have imported
    no family: the meaning is found through the registry, importing that family only."""
    code = (
        "import sys\nfrom shiftbench.warehouse.magnitudes import meaning\nprint(meaning('conds', 'tv_distance'))\n"
        "print(sorted(m for m in sys.modules if m.endswith('.family') and m.startswith('shiftbench.')))"
    )
    text, imported = _run(code).splitlines()
    assert text.startswith("ConDS: total variation distance")
    assert imported == "['shiftbench.conds.family', 'shiftbench.families.family']"
