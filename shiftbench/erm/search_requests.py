"""A search asked for in Dagster: the request as a file, planned in full when written, trained by a sensor.

The UI's job ``erm_search`` writes one request (its benchmarks, draws, trials, space, selection methods, preset and
parameters) under ``runs/searches/<id>.json`` after planning every run of it, so a bad benchmark, parameter or
selection method fails that job with one line and nothing is asked for. The sensor ``erm_search_runs`` then asks for
each planned run that is neither published nor under way: runs of the kind's ERM job like any other, which the daemon
queues, so resume, retries and the lineage are theirs. A request whose runs are all published is closed (renamed
``.done``); its selection is in the catalog (``search_selection``, the leaderboard's ``selection``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shiftbench.config.settings import Settings
from shiftbench.erm.launch import RunPlan
from shiftbench.erm.sweep import SEEDS, plan_sweep
from shiftbench.errors import InputError
from shiftbench.families.registry import unpublished_paper_name
from shiftbench.scoring.selection import SELECTIONS, check_selections, parse_selections
from shiftbench.splits.published import published_split
from shiftbench.tables.fingerprint import sha256_json


class SearchRequest(BaseModel):
    """What ``shiftbench train B... --search N --trials K`` says, as data."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    benchmarks: list[str] = Field(min_length=1)
    draws: int
    trials: int = 1
    search_space: str = "auto"
    select: str = ""
    preset: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)

    @property
    def id(self) -> str:
        return sha256_json(self.model_dump(mode="json"))[:12]


def plan_request(settings: Settings, request: SearchRequest) -> tuple[list[RunPlan], list[str]]:
    """Every run of the search and the selection methods it reports; any bad value is one line, before any run."""
    if request.draws < 1:
        raise InputError(f"draws must be at least 1, got {request.draws}", parameter="draws")
    if not 1 <= request.trials <= len(SEEDS):
        raise InputError(f"trials are seeds 0..{len(SEEDS) - 1}: 1 to {len(SEEDS)}", parameter="trials")
    plans = plan_sweep(
        settings, request.benchmarks, range(request.trials), preset=request.preset, overrides=request.overrides,
        search=(request.search_space, request.draws),
    )  # fmt: skip
    return plans, selections_for(settings, request.benchmarks, request.select or None)


def selections_for(
    settings: Settings, benchmarks: list[str], select: str | None, version: str | None = None
) -> list[str]:
    """The selection methods asked for, checked against every benchmark's split (the default: every method each
    benchmark's split allows)."""
    names = parse_selections(select)
    for benchmark in benchmarks:
        examples = published_split(settings, benchmark, version, refusal=unpublished_paper_name).examples
        splits = set(examples["split"].unique().to_list())
        if select is None:
            names = [n for n in names if n in SELECTIONS and SELECTIONS[n].eval_split in splits]
            continue
        train = examples.filter(examples["split"] == "train")
        check_selections(benchmark, names, splits, train["group"].n_unique() if "group" in train.columns else 1)
    return names


def searches_dir(settings: Settings) -> Path:
    return settings.runs_dir / "searches"


def save_request(settings: Settings, request: SearchRequest) -> Path:
    """The request planned, then written atomically (the same request twice is one file)."""
    plan_request(settings, request)
    folder = searches_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{request.id}.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(request.model_dump(mode="json"), indent=2, sort_keys=True), "utf-8")
    partial.replace(path)
    return path


def open_requests(settings: Settings) -> list[tuple[Path, SearchRequest]]:
    """The requests not yet closed, oldest first."""
    folder = searches_dir(settings)
    paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    return [(path, SearchRequest.model_validate_json(path.read_text("utf-8"))) for path in paths]


def close_request(path: Path) -> None:
    path.replace(path.with_suffix(".done"))
