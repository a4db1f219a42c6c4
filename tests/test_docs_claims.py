"""Claims that match the checks, where it can be mechanical: a duration in README.md, docs/ or a message of the
setup scripts is a measurement, and measurements live in BENCHMARKS.md with their machine and command. A
paragraph may quote one beside its link to BENCHMARKS.md; a limit or an interval the code sets ("waits more than
120 s", "every 30 s") is not a timing claim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import PROJECT

GENERATED = {"settings.md", "tables.md"}  # written by scripts/generate_docs.py from the code
DURATION = re.compile(
    r"(?<![\w.])\d[\d,.]*(?:\s?[-\u2013]\s?\d[\d,.]*)?\s?(?:ms|s|secs?|seconds?|mins?|minutes?|h|hours?)\b"
    r"|\b(?:a|one|a few|several|half an?|an)\s(?:CPU\s)?(?:second|minute|hour)s?\b",
    re.IGNORECASE,
)
# The words before a duration that make it a limit or an interval the code sets, not how long something took.
LIMIT = re.compile(
    r"(?:every|more than|younger than|older than|bounded to|timeout|default|at most|wait|interval)\W*(?:\w+\W+){0,2}$",
    re.IGNORECASE,
)


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of every paragraph, table row and heading, outside fenced code blocks."""
    found: list[tuple[int, str]] = []
    block: list[tuple[int, str]] = []
    fenced = False

    def close() -> None:
        if block:
            found.append((block[0][0], " ".join(line for _, line in block)))
            block.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith("```"):
            close()
            fenced = not fenced
        elif fenced:
            continue
        elif not line.strip() or line.lstrip().startswith(("|", "#")):
            close()
            if line.strip():
                found.append((number, line))
        else:
            block.append((number, line))
    close()
    return found


def timing_claims(text: str) -> list[tuple[int, str]]:
    """(line, phrase) of every duration that is neither beside a BENCHMARKS.md link nor a limit."""
    claims = []
    for number, paragraph in paragraphs(text):
        if "BENCHMARKS.md" in paragraph:
            continue
        for match in DURATION.finditer(paragraph):
            if not LIMIT.search(paragraph[: match.start()]):
                claims.append((number, match.group(0)))
    return claims


def _messages(script: Path) -> str:
    """What a shell script prints: its ``echo`` lines, one paragraph each."""
    lines = script.read_text("utf-8").splitlines()
    return "\n\n".join(line.strip() for line in lines if line.strip().startswith("echo"))


def test_no_timing_outside_benchmarks_in_the_readme_the_docs_and_the_setup_messages() -> None:
    pages = [PROJECT / "README.md", *(p for p in sorted((PROJECT / "docs").glob("*.md")) if p.name not in GENERATED)]
    found = [
        f"{page.relative_to(PROJECT)}:{line}: {phrase!r}"
        for page in pages
        for line, phrase in timing_claims(page.read_text("utf-8"))
    ]
    found += [
        f"{script.relative_to(PROJECT)}: {phrase!r}"
        for script in sorted((PROJECT / "scripts").glob("*.sh"))
        for _, phrase in timing_claims(_messages(script))
    ]
    assert not found, "timings belong in BENCHMARKS.md (link to the measurement instead):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "claims"),
    [
        ("The first takes about 6 minutes on 2 cores,\nthe install included.", ["6 minutes"]),
        ("Quick ERM baselines on CPU, about a minute each.", ["a minute"]),
        ('echo "dev tools; 1-2 minutes in a new .venv"', ["1-2 minutes"]),
        ("One case took 134\u2013149 s with the eager step.", ["134\u2013149 s"]),  # an en dash
        ("The first takes about 6 minutes ([BENCHMARKS.md](BENCHMARKS.md#the-two-commands)).", []),
        ("a writer that waits more than 120 s gives up", []),
        ("The partition sensor (running by default, every 30 s) keeps them equal", []),
        ("```\nsleep 5s  # 3 minutes\n```", []),
        ("| a | 5 min |\n\nthe 5 s of [BENCHMARKS.md](BENCHMARKS.md)", ["5 min"]),
    ],
)
def test_the_check_finds_timings_and_leaves_limits_and_linked_measurements(text: str, claims: list[str]) -> None:
    assert [phrase for _, phrase in timing_claims(text)] == claims


def test_the_readme_is_a_front_page_of_at_most_200_lines() -> None:
    """The README stays a front page (issue 50): the detail lives in docs/, linked from its table."""
    lines = (PROJECT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail into docs/"
