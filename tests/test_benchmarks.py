"""BENCHMARKS.md and its records (bench/figures/*.json): every record parses and says what, how, when, where and at
which commit; every row of a table above the log names a record whose figure it quotes and whose date it gives;
the links and quoted section names that point into BENCHMARKS.md lead to a heading; the bench scripts behind the
current figures record their runs with bench/records.py. Nothing here runs a benchmark.

Each check is a function over text, unit-tested on a planted fault, so a check that stopped seeing faults fails.
"""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .conftest import PROJECT

BENCHMARKS = PROJECT / "BENCHMARKS.md"
RECORDS = PROJECT / "bench" / "figures"
COLUMNS = ("what", "figure", "goal", "machine", "command", "date", "record")
REQUIRED = ("what", "command", "date", "commit", "machine", "figures")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
RECORD_LINK = re.compile(r"\[([\w.@-]+)#([^\]\s]+)\]\(bench/figures/([\w.@-]+)\.json\)")
# The scripts behind the current figures (issue 38): each takes --record PATH and writes its runs with records.py.
RECORDING_SCRIPTS = (
    "bench_load_split", "bench_busy", "bench_checkpoint", "bench_slurm", "bench_erm", "bench_catalog",
    "bench_conds_grid", "bench_conflicts", "bench_breeds21k",
)  # fmt: skip


def _medians(where: str, value: Any) -> list[str]:
    """Every ``median`` beside its ``runs`` (at any depth) is their median: the figure can be re-derived."""
    problems = []
    if isinstance(value, dict):
        runs, median = value.get("runs"), value.get("median")
        derived = statistics.median(runs) if isinstance(runs, list) and runs else None
        if derived is not None and isinstance(median, int | float) and abs(derived - median) > 1e-9 * max(1, median):
            problems.append(f"{where}: median {median} is not the median of its runs {runs}")
        for key, inner in value.items():
            problems += _medians(f"{where}.{key}", inner)
    return problems


def record_problems(name: str, text: str) -> list[str]:
    """What is wrong with one record (nothing: an empty list)."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return [f"{name}: not JSON ({exc})"]
    missing = [f"{name}: no {key!r}" for key in REQUIRED if not record.get(key)]
    if missing:
        return missing
    problems = []
    if not DATE.match(str(record["date"])):
        problems.append(f"{name}: date {record['date']!r} is not YYYY-MM-DD")
    if not COMMIT.match(str(record["commit"])):
        problems.append(f"{name}: commit {record['commit']!r} is not a commit (fill it in where git was not there)")
    if not isinstance(record["machine"], dict) or not record["machine"].get("description"):
        problems.append(f"{name}: the machine has no description")
    for key, figure in record["figures"].items():
        if not isinstance(figure, dict) or not isinstance(figure.get("figure"), str) or not figure["figure"]:
            problems.append(f"{name}#{key}: no figure text")
            continue
        if "commit" in figure and not COMMIT.match(str(figure["commit"])):
            problems.append(f"{name}#{key}: commit {figure['commit']!r} is not a commit")
        if "date" in figure and not DATE.match(str(figure["date"])):
            problems.append(f"{name}#{key}: date {figure['date']!r} is not YYYY-MM-DD")
        problems += _medians(f"{name}#{key}", figure)
    return problems


def tables(text: str) -> list[tuple[int, list[str], list[tuple[int, list[str]]]]]:
    """(line, header cells, [(line, cells)]) of every table above the log (``## Log``)."""
    lines = text.split("\n## Log", 1)[0].splitlines()
    found: list[tuple[int, list[str], list[tuple[int, list[str]]]]] = []

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    k = 0
    while k < len(lines):
        if lines[k].startswith("|") and k + 1 < len(lines) and re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", lines[k + 1]):
            header, rows, k = cells(lines[k]), [], k + 2
            while k < len(lines) and lines[k].startswith("|"):
                rows.append((k + 1, cells(lines[k])))
                k += 1
            found.append((k - len(rows) - 1, header, rows))
        else:
            k += 1
    return found


def _row_problems(line: int, row: dict[str, str], records: dict[str, dict[str, Any]]) -> list[str]:
    links = RECORD_LINK.findall(row["record"])
    if row["figure"].startswith("not measured"):
        return [f"line {line}: not measured, yet names a record"] if links else []
    if not links:
        return [f"line {line}: names no record (`[NAME#FIGURE](bench/figures/NAME.json)`)"]
    problems = []
    for name, key, file in links:
        record = records.get(file)
        if name != file or record is None:
            problems.append(f"line {line}: no record bench/figures/{file}.json (or the link says {name})")
            continue
        figure = record["figures"].get(key)
        if figure is None:
            problems.append(f"line {line}: {file}.json has no figure {key!r}")
            continue
        if figure["figure"] not in row["figure"]:
            problems.append(f"line {line}: the figure cell does not quote {file}#{key}: {figure['figure']!r}")
        date = figure.get("date", record["date"])
        if row["date"] != date:
            problems.append(f"line {line}: date {row['date']} but {file}#{key} was measured on {date}")
    return problems


def row_problems(text: str, records: dict[str, dict[str, Any]]) -> list[str]:
    """Every table above the log has the columns ``COLUMNS``; every row names its record(s) (unless "not measured"),
    quotes each record's figure text in its figure cell and gives its date."""
    problems = []
    for line, header, rows in tables(text):
        if tuple(cell.lower() for cell in header) != COLUMNS:
            problems.append(f"line {line}: a table without the columns {' | '.join(COLUMNS)}")
            continue
        for row_line, cells in rows:
            if len(cells) != len(COLUMNS):
                problems.append(f"line {row_line}: {len(cells)} cells, not {len(COLUMNS)}")
                continue
            problems += _row_problems(row_line, dict(zip(COLUMNS, cells, strict=True)), records)
    return problems


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"^#{1,6} ", line)]


def pointer_problems(where: str, text: str, benchmarks: str) -> list[str]:
    """Links (``BENCHMARKS.md#anchor``) and quoted section names (``BENCHMARKS.md, "Name"``) leading nowhere."""
    titles = headings(benchmarks)
    anchors = {slug(title) for title in titles}
    problems = [
        f"{where}: BENCHMARKS.md#{anchor} is no heading"
        for anchor in re.findall(r"BENCHMARKS\.md#([\w.-]+)", text)
        if anchor not in anchors
    ]
    for name in re.findall(r"BENCHMARKS\.md[,:]?\s*\(?\"([^\"]+)\"", text):
        if not any(title.lower().startswith(name.lower()) for title in titles):
            problems.append(f'{where}: BENCHMARKS.md, "{name}" is no heading')
    return problems


def load_records(folder: Path) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text("utf-8")) for path in sorted(folder.glob("*.json"))}


def records_module() -> ModuleType:
    """bench/records.py (bench/ is no package: the scripts import it from their own folder)."""
    spec = importlib.util.spec_from_file_location("bench_records", PROJECT / "bench" / "records.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is made
    spec.loader.exec_module(module)
    return module


# --- the checks on this project ------------------------------------------------------------------------------------


def test_every_record_parses_and_names_its_command_date_commit_and_machine() -> None:
    paths = sorted(RECORDS.glob("*.json"))
    assert paths, "no record in bench/figures"
    problems = [problem for path in paths for problem in record_problems(path.name, path.read_text("utf-8"))]
    assert not problems, "\n".join(problems)


def test_every_current_figure_names_a_record_it_quotes() -> None:
    text = BENCHMARKS.read_text("utf-8")
    assert len(tables(text)) >= 8  # one per area: a parser that found no table could not pass
    problems = row_problems(text, load_records(RECORDS))
    assert not problems, "BENCHMARKS.md against bench/figures:\n" + "\n".join(problems)


def test_links_and_quoted_section_names_lead_to_a_heading_of_benchmarks() -> None:
    benchmarks = BENCHMARKS.read_text("utf-8")
    pages = [PROJECT / "README.md", PROJECT / "pyproject.toml", *sorted((PROJECT / "docs").glob("*.md"))]
    for folder in ("shiftbench", "assets", "pipelines", "bench", "scripts"):
        pages += sorted(p for p in (PROJECT / folder).rglob("*") if p.suffix in {".py", ".sh", ".md"})
    problems = [
        problem
        for page in pages
        for problem in pointer_problems(str(page.relative_to(PROJECT)), page.read_text("utf-8"), benchmarks)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("script", RECORDING_SCRIPTS)
def test_the_scripts_behind_current_figures_record_their_runs(script: str) -> None:
    source = (PROJECT / "bench" / f"{script}.py").read_text("utf-8")
    assert re.search(r"records\.add_argument\(\w+\)", source), f"{script}.py has no --record option"
    assert re.search(r"\.save\(", source), f"{script}.py never saves its record"


def test_a_record_written_by_the_helper_passes_the_check(tmp_path: Path) -> None:
    records = records_module()
    recording = records.start(tmp_path / "figures" / "x.json")
    for seconds in (0.52, 0.48, 0.50):
        recording.run(seconds=seconds)
    recording.save("a test", {"x.load": records.median_figure([0.52, 0.48, 0.50], "s", 2, "load")})
    text = (tmp_path / "figures" / "x.json").read_text("utf-8")
    assert record_problems("x.json", text) == []
    record = json.loads(text)
    head = subprocess.run(["git", "-C", str(PROJECT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert record["commit"] == (head.stdout.strip() if head.returncode == 0 else "unknown")
    assert record["figures"]["x.load"]["figure"] == "0.50 s"
    assert [run["seconds"] for run in record["runs"]] == [0.52, 0.48, 0.50]
    assert record["machine"]["cpus"] and record["machine"]["description"]
    records.start(None).save("nothing", {})  # without --record: no file, no error


def test_the_command_keeps_the_environment_it_reads() -> None:
    records = records_module()
    line = records.command_line(["bench/x.py", "--runs", "3"], {"SHIFTBENCH_HOME": "a b", "PATH": "/bin"})
    assert line.startswith("SHIFTBENCH_HOME='a b' ")
    assert line.endswith(" bench/x.py --runs 3")
    assert "PATH" not in line


# --- the checks catch what they are for ----------------------------------------------------------------------------


def _record(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "what": "w", "command": "c", "date": "2026-11-27", "commit": "abc1234", "machine": {"description": "m"},
        "figures": {"t": {"figure": "0.50 s", "median": 0.5, "runs": [0.4, 0.5, 0.6]}},
    }  # fmt: skip
    record.update(changes)
    return record


def test_the_record_check_finds_each_fault() -> None:
    assert record_problems("ok.json", json.dumps(_record())) == []
    assert record_problems("a.json", "{") == ["a.json: not JSON (Expecting property name enclosed in double quotes: "
                                              "line 1 column 2 (char 1))"]  # fmt: skip
    assert record_problems("b.json", json.dumps(_record(commit=""))) == ["b.json: no 'commit'"]
    bad = _record(date="27 Nov", commit="unknown", machine={"cpus": 2})
    bad["figures"] = {
        "t": {"figure": "0.50 s", "median": 0.5, "runs": [0.4, 0.6, 0.7]},
        "u": {"figure": ""},
        "v": {"figure": "1.2x", "cli": {"median": 3.0, "runs": [1.0, 2.0]}, "commit": "HEAD"},
    }
    assert record_problems("c.json", json.dumps(bad)) == [
        "c.json: date '27 Nov' is not YYYY-MM-DD",
        "c.json: commit 'unknown' is not a commit (fill it in where git was not there)",
        "c.json: the machine has no description",
        "c.json#t: median 0.5 is not the median of its runs [0.4, 0.6, 0.7]",
        "c.json#u: no figure text",
        "c.json#v: commit 'HEAD' is not a commit",
        "c.json#v.cli: median 3.0 is not the median of its runs [1.0, 2.0]",
    ]


def test_the_row_check_finds_each_fault() -> None:
    header = (
        "| what | figure | goal | machine | command | date | record |\n| --- | --- | --- | --- | --- | --- | --- |\n"
    )
    link = "[r#t](bench/figures/r.json)"
    text = (
        "# B\n\n## Area\n\n" + header
        + f"| good | 0.50 s | - | m | c | 2026-11-27 | {link} |\n"  # line 7
        + "| no record | 0.50 s | - | m | c | 2026-11-27 | - |\n"
        + "| no file | 0.50 s | - | m | c | 2026-11-27 | [q#t](bench/figures/q.json) |\n"
        + "| no figure | 0.50 s | - | m | c | 2026-11-27 | [r#z](bench/figures/r.json) |\n"  # line 10
        + f"| not quoted | 0.51 s | - | m | c | 2026-11-27 | {link} |\n"
        + f"| other date | 0.50 s | - | m | c | 2026-11-26 | {link} |\n"
        + "| gpu | not measured | - | m | c | - | - |\n"
        + f"| gpu | not measured | - | m | c | - | {link} |\n"
        + "| short | 0.50 s |\n"  # line 15
        + "\n| what | figure |\n| --- | --- |\n| x | 1 s |\n"  # line 17: no record column
        + "\n## Log\n\n" + header + "| old | 9 s | - | m | c | 2020-01-01 | - |\n"  # the log is free
    )  # fmt: skip
    assert row_problems(text, {"r": _record()}) == [
        "line 8: names no record (`[NAME#FIGURE](bench/figures/NAME.json)`)",
        "line 9: no record bench/figures/q.json (or the link says q)",
        "line 10: r.json has no figure 'z'",
        "line 11: the figure cell does not quote r#t: '0.50 s'",
        "line 12: date 2026-11-26 but r#t was measured on 2026-11-27",
        "line 14: not measured, yet names a record",
        "line 15: 2 cells, not 7",
        "line 17: a table without the columns what | figure | goal | machine | command | date | record",
    ]


def test_pointers_into_benchmarks_lead_to_a_heading() -> None:
    benchmarks = "# Benchmarks\n\n## Training on CPU\n\n## `shiftbench.load_split` (2026-11-25, issue 29)\n"
    text = (
        "[a](BENCHMARKS.md#training-on-cpu) [b](../BENCHMARKS.md#shiftbenchload_split-2026-11-25-issue-29)\n"
        '[c](BENCHMARKS.md#training-on-a-gpu) (BENCHMARKS.md, "Training on CPU") BENCHMARKS.md ("training")\n'
        'see BENCHMARKS.md ("Training on a busy machine")\n'
    )
    assert pointer_problems("p.md", text, benchmarks) == [
        "p.md: BENCHMARKS.md#training-on-a-gpu is no heading",
        'p.md: BENCHMARKS.md, "Training on a busy machine" is no heading',
    ]
    assert slug("MetaShift at any scale: embeddings stored (2026-11-25, issue 27)") == (
        "metashift-at-any-scale-embeddings-stored-2026-11-25-issue-27"
    )
    assert slug("The store, the catalog and the shell") == "the-store-the-catalog-and-the-shell"
