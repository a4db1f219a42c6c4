"""One-line errors stay short (issue 48): a value echoed in an error (a line of a file, a setting's value, a YAML
alias bomb's value) is cut to about 120 characters with an ellipsis and its length, and whatever the CLI prints
after ``error:`` is at most 1,000 characters. Each case: exit 2, one line under 500 characters, fast."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError, one_line, shown
from shiftbench.pipelines.cli import main

LONG = 200_000


def _bomb(levels: int = 9) -> str:
    """A billion laughs: each alias names the list before it nine times (9**9 strings once expanded)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _one_short_line(err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1, err[:2000]
    assert len(lines[0]) < 500 and all(needle in lines[0] for needle in needles), lines[0][:2000]
    return lines[0]


def _slurm_bomb(folder: Path) -> dict[str, str]:
    (folder / "bomb.yaml").write_text(_bomb() + "partition: *a8\n")
    return {}


def _spec_bomb(folder: Path) -> dict[str, str]:
    """The bomb inside a setting's value (a spec file has no room for other top-level keys)."""
    nested = ", ".join(line.split(": ", 1)[1] for line in _bomb().splitlines())
    specs = folder / "specs.yaml"
    specs.write_text(f"family: breeds\nbenchmarks:\n  mine:\n    level: [{nested}]\n    n_subclasses: 4\n")
    return {"SHIFTBENCH_BREEDS_SPECS": str(specs)}


def _long_classes_line(folder: Path) -> dict[str, str]:
    (folder / "wnids.txt").write_text("n02084071\n" + "n" * LONG + "\n")
    specs = folder / "specs.yaml"
    specs.write_text(
        "family: breeds\nbenchmarks:\n  mine:\n    classes: wnids.txt\n    level: 5\n    n_subclasses: 4\n"
    )
    return {"SHIFTBENCH_BREEDS_SPECS": str(specs)}


def _long_setting(folder: Path) -> dict[str, str]:
    return {"SHIFTBENCH_SPRITES_PER_COMBINATION": "x" * LONG}


def _nothing(folder: Path) -> dict[str, str]:
    return {}


CASES: dict[str, tuple[Callable[[Path], dict[str, str]], list[str], list[str]]] = {
    # (write the inputs and give the environment, the command, what its line says)
    "an alias bomb in a Slurm settings file": (
        _slurm_bomb,
        ["train", "sprites-uniform", "--backend", "slurm", "--slurm-settings", "{dir}/bomb.yaml"],
        ["bomb.yaml:10, parameter 'partition': must be a valid string, got [[[[", "… (9 items)"],
    ),
    "an alias bomb in a spec file": (
        _spec_bomb,
        ["build", "breeds", "--list"],
        ["specs.yaml:4, parameter 'level': must be a valid integer, got [[", "… (9 items)"],
    ),
    "a 200,000-character line of a classes file": (
        _long_classes_line,
        ["build", "breeds", "--benchmark", "mine@wnids"],
        ["wnids.txt:2: not a WordNet id (n and 8 digits): 'nnnn", "… (200,000 characters)"],
    ),
    "a 200,000-character setting": (
        _long_setting,
        ["versions"],
        ["parameter 'SHIFTBENCH_SPRITES_PER_COMBINATION': must be a valid integer", "… (200,000 characters)"],
    ),
    "a 200,000-character --set": (
        _nothing,
        ["build", "breeds", "--benchmark", "living17", "--name", "x", "--set", "k" * LONG],
        ["expected KEY=VALUE, got 'kkkk", "… (200,000 characters)"],
    ),
    "a 200,000-character option value (argparse's own message)": (
        _nothing,
        ["sql", "SELECT 1", "--timeout", "9" * 10 + "x" * LONG],
        ["argument --timeout: invalid float value", "characters in all)"],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_an_echoed_value_is_cut_and_the_line_stays_short(
    cli_env: Callable[..., Settings],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    write, argv, needles = CASES[case]
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    settings = cli_env()
    for key, value in write(inputs).items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    code = main([arg.format(dir=inputs) for arg in argv])
    seconds = time.monotonic() - started
    _, err = capsys.readouterr()
    assert code == 2, err[:2000]
    _one_short_line(err, *needles)
    assert seconds < 60, seconds
    assert not list(settings.store_dir.glob("*/*/publications/*.json"))


def test_shown_cuts_texts_and_structures() -> None:
    assert shown("n01440764") == "'n01440764'"
    long = shown("n" * LONG)
    assert long.startswith("'nnn") and long.endswith("… (200,000 characters)") and len(long) < 160
    assert shown([1, 2]) == "[1, 2]" and shown(list(range(100))) == "[0, 1, 2, 3, 4, 5, ...] (100 items)"
    nested: object = ["x"] * 9
    for _ in range(30):  # 9**31 strings were it walked: only its first items are
        nested = [nested] * 9
    started = time.monotonic()
    text = shown(nested)
    assert time.monotonic() - started < 1 and len(text) < 160 and text.endswith("… (9 items)"), text


def test_one_line_is_a_safety_cap() -> None:
    assert one_line("short") == "short"
    capped = one_line("e" * 5000)
    assert capped == "e" * 1000 + "… (5,000 characters in all)"


def test_the_library_cuts_what_it_echoes(tmp_path: Path) -> None:
    """load_split and the wnid reader raise the same bounded line to a Python caller."""
    import shiftbench
    from shiftbench.sources.imagenet21k import read_wnid_list

    (tmp_path / "wnids.txt").write_text("n" * LONG + "\n")
    with pytest.raises(InputError) as err:
        read_wnid_list(tmp_path / "wnids.txt")
    assert len(str(err.value)) < 500 and str(err.value).endswith("… (200,000 characters)")
    with pytest.raises(InputError) as err:
        shiftbench.load_split(["x"] * LONG, home=tmp_path)  # type: ignore[arg-type]
    assert (
        str(err.value) == "parameter 'name': must be a string, got ['x', 'x', 'x', 'x', 'x', 'x', ...] (200,000 items)"
    )
