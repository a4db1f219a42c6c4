"""Content addressing end to end: the same inputs give the same version and the same bytes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shiftbench.breeds.family import BENCHMARK, BREEDS
from shiftbench.config.settings import Settings
from shiftbench.families import benchmark_builds, variants

from .conftest import BREEDS_FIXTURE, IMAGENET_WORDNET_FIXTURE


def _build(settings: Settings, benchmark: str, kind: str = "breeds-published") -> tuple[str, dict[str, bytes]]:
    inputs = benchmark_builds.build_inputs(settings, BREEDS)
    assert inputs["breeds/calibrated_hierarchy"].meta["kind"] == kind
    staged = BENCHMARK.stage(settings, variants.resolve(settings, BENCHMARK, benchmark), inputs)
    return staged.version, {t: staged.table_path(t).read_bytes() for t in staged.tables}


@pytest.mark.slow
def test_two_routes_to_wordnet_two_homes_one_version(
    make_settings: Callable[..., Settings], tmp_path: Path, fixtures: Path
) -> None:
    """nltk over Debian's WordNet and ImageNet's own files hold the same hierarchy; with the shipped
    calibration both are the BREEDS release's hierarchy, read from its files in a third route."""
    via_nltk = _build(make_settings(), "entity30-good")
    files_home = Settings.from_env(
        {
            "SHIFTBENCH_HOME": str(tmp_path / "other"),
            "SHIFTBENCH_OFFLINE": "1",
            "SHIFTBENCH_IMAGENET_HIERARCHY_DIR": str(IMAGENET_WORDNET_FIXTURE),
        }
    )
    via_files = _build(files_home, "entity30-good")
    assert via_nltk[0] == via_files[0]
    assert via_nltk[1] == via_files[1]
    release_home = Settings.from_env(
        {"SHIFTBENCH_HOME": str(tmp_path / "release"), "SHIFTBENCH_BREEDS_HIERARCHY_DIR": str(BREEDS_FIXTURE)}
    )
    assert _build(release_home, "entity30-good") == via_nltk
    # The project's own calibration, on request, is another hierarchy under another name.
    fallback = make_settings(SHIFTBENCH_BREEDS_HIERARCHY_SOURCE="wordnet-default")
    own = _build(fallback, "entity30-good@wordnet-default", "wordnet-default-calibration")
    assert own[0] != via_nltk[0]
