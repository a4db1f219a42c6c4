"""Where a build's settings come from: the process environment, or exactly the values given."""

from pathlib import Path

import pytest

from shiftbench.config.settings import Settings


def test_given_values_are_the_whole_configuration_and_the_environment_is_read_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``parse`` and ``from_env(mapping)`` never mix in the process's SHIFTBENCH_* variables (a shared field
    such as the home and a family's field alike); ``from_env()`` reads them."""
    monkeypatch.setenv("SHIFTBENCH_HOME", str(tmp_path / "from-the-process"))
    monkeypatch.setenv("SHIFTBENCH_SPRITES_PER_COMBINATION", "7")
    monkeypatch.chdir(tmp_path)

    given = Settings.from_env({"SHIFTBENCH_HOME": str(tmp_path / "given")})
    assert given.home == tmp_path / "given"
    assert given.value("sprites_per_combination") == 100  # the default, not the process's 7
    assert Settings.parse({}).home == tmp_path / "warehouse"  # the default home, relative to the working folder

    process = Settings.from_env()
    assert process.home == tmp_path / "from-the-process"
    assert process.value("sprites_per_combination") == 7
