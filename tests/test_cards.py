"""Every published version says what shifts and how much: ``shift_magnitudes`` rows, ``files/card.md``
and a Croissant file that ``mlcroissant`` validates and loads; paper names only for paper content."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import polars as pl
import pytest

from shiftbench.breeds import calibrated as cal
from shiftbench.breeds.build import magnitudes
from shiftbench.breeds.specs import load_specs
from shiftbench.breeds.tasks import build_task
from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli import main
from shiftbench.sources.breeds_hierarchy import read_breeds_hierarchy_dir
from shiftbench.sources.hierarchy import Hierarchy
from shiftbench.store import Store
from shiftbench.warehouse.magnitudes import vocabulary

from .conftest import BREEDS_FIXTURE

# mlcroissant (a dev dependency: scripts/setup.sh installs it) runs in a child process: its absl logging and
# progress bars hold on to the stderr they first saw, which pytest's capture closes under them.
CROISSANT_CHECK = """
import json, sys
import mlcroissant as mlc
out = {}
for path in sys.argv[1:]:
    dataset = mlc.Dataset(jsonld=path)
    issues = dataset.metadata.ctx.issues
    names = [r.name for r in dataset.metadata.record_sets]
    out[path] = {
        "errors": sorted(map(str, issues.errors)),
        "warnings": sorted(map(str, issues.warnings)),
        "examples": sum(1 for _ in dataset.records("examples")) if "examples" in names else None,
        "splits": sorted(r["splits/name"] for r in dataset.records("splits")) if "splits" in names else None,
    }
print(json.dumps(out))
"""


def croissant_report(paths: list[Path]) -> dict[str, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", CROISSANT_CHECK, *map(str, paths)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, dict[str, object]] = json.loads(done.stdout.splitlines()[-1])
    return report


Release = tuple[cal.CalibratedHierarchy, list[str], Hierarchy]


@pytest.fixture(scope="module")
def breeds_release() -> Release:
    """The BREEDS release's calibrated hierarchy, its classes and the hierarchy restricted to their ancestors: read
    once for the four benchmarks, which only read them."""
    calibrated = cal.from_published(read_breeds_hierarchy_dir(BREEDS_FIXTURE))
    classes = calibrated.classes_in_hierarchy
    return calibrated, classes, calibrated.hierarchy.restrict_to_ancestors(classes)


@pytest.mark.parametrize("name", ["entity13", "entity30", "living17", "nonliving26"])
def test_breeds_bad_splits_measure_larger_than_good_ones(name: str, breeds_release: Release) -> None:
    calibrated, classes, hierarchy = breeds_release
    specs = load_specs()
    mean = {}
    for split in ("good", "rand", "bad", "nosplit"):
        spec = specs[f"{name}-{split}" if split != "rand" else name]
        table = magnitudes(build_task(calibrated.hierarchy, classes, spec.task_params()), hierarchy)
        overall = dict(table.filter(pl.col("scope") == "all").select("measure", "value").iter_rows())
        mean[split] = overall["subclass_distance_mean"]
        assert overall["subclass_distance_max"] >= overall["subclass_distance_mean"]
    assert mean["good"] < mean["bad"] and mean["nosplit"] == 0.0
    assert mean["good"] <= mean["rand"] <= mean["bad"]


@pytest.mark.slow
def test_every_version_has_magnitudes_a_card_and_a_valid_croissant(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = cli_env()
    assert main(["build", "breeds", "--benchmark", "living17-good", "--benchmark", "living17-bad"]) == 0
    assert main(["build", "metashift", "--benchmark", "metashift-attributes"]) == 0
    assert main(["build", "metashift", "--benchmark", "cat-dog-dg-cabinet-bed@generated"]) == 0
    assert main(["build", "conds", "--benchmark", "sprites-sc-object_color"]) == 0
    fast = ["--set", "max_iters=4", "--set", "eval_every=2"]  # a results version: what it learnt is not read here
    assert main(["train", "sprites-sc-object_color", "--preset", "smoke", *fast]) == 0
    capsys.readouterr()

    store = Store(settings.store_dir)
    versions = store.log.versions()
    assert {v.family for v in versions} == {"breeds", "metashift", "conds", "erm"}
    staged = [store.layout.staged(v.family, v.benchmark, v.version) for v in versions]
    report = croissant_report([s.path / "files" / "croissant.json" for s in staged])
    for info, version in zip(versions, staged, strict=True):
        card = (version.path / "files" / "card.md").read_text()
        assert card.startswith(f"# {info.benchmark}\n") and info.version in card and "## Licences" in card
        checked = report[str(version.path / "files" / "croissant.json")]
        assert checked["errors"] == [] and checked["warnings"] == [], checked
        document = json.loads((version.path / "files" / "croissant.json").read_text())
        assert document["conformsTo"] == "http://mlcommons.org/croissant/1.1"
        assert document["prov:wasGeneratedBy"]["@type"] == "prov:Activity"
        sources = version.manifest().get("sources", {})
        checksums = {v for k, v in sources.items() if k.endswith("_sha256")}
        derived = document["prov:wasDerivedFrom"]
        assert {d["sha256"] for d in derived if "sha256" in d} == checksums  # every source, by its checksum
        if info.family == "erm":  # a results version derives from its split's version
            assert any(version.manifest()["split"]["version"] in d["name"] for d in derived)
        else:
            assert checksums, info.benchmark
        assert {d["sha256"] for d in document["distribution"]} == {
            entry["sha256"] for entry in version.manifest()["tables"].values()
        }
        if "examples" in version.tables:
            examples = pl.read_parquet(version.table_path("examples"))
            assert checked["examples"] == examples.height
            assert checked["splits"] == sorted(examples["split"].unique())
        if info.family != "erm":  # results versions show their split's magnitudes on the card
            assert "shift_magnitudes" in version.tables
        else:
            assert "## How much" in card and "tv_distance" in card
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        measured = dict(
            con.execute(
                "SELECT benchmark, value FROM shift_magnitudes WHERE measure IN "
                "('subclass_distance_mean', 'spectral_distance', 'tv_distance', 'subset_distance_mean') "
                "AND scope = 'all'"
            ).fetchall()
        )
        assert set(measured) == {
            "living17-good", "living17-bad", "metashift-attributes", "cat-dog-dg-cabinet-bed@generated",
            "sprites-sc-object_color",
        }  # fmt: skip
        assert measured["living17-bad"] > measured["living17-good"]
        task_d = con.execute("SELECT distance FROM metashift_tasks").fetchone()
        assert task_d is not None and measured["cat-dog-dg-cabinet-bed@generated"] == task_d[0]
        tv = con.execute("SELECT tv_distance FROM conds_cases").fetchone()
        assert tv is not None and measured["sprites-sc-object_color"] == tv[0]
        used = {r[0] for r in con.execute("SELECT DISTINCT measure FROM shift_magnitudes").fetchall()}
        assert used <= set(vocabulary())
        # A paper's name never carries generated content: the generated task is named so.
        names = {r[0] for r in con.execute("SELECT benchmark FROM benchmarks").fetchall()}
        assert "cat-dog-dg-cabinet-bed" not in names and "cat-dog-dg-cabinet-bed@generated" in names
        sources = con.execute(
            "SELECT sources->>'dataset' FROM benchmarks WHERE benchmark = 'cat-dog-dg-cabinet-bed@generated'"
        ).fetchone()
        assert sources == ("generated-scenes",)


def test_a_paper_name_is_reserved_while_its_spec_is_tagged(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cli_env()
    assert main(["build", "metashift", "--benchmark", "cat-dog-dg-cabinet-bed"]) == 2
    err = capsys.readouterr().err
    assert "is the paper's name" in err and "use cat-dog-dg-cabinet-bed@generated" in err
    assert len(err.strip().splitlines()) == 1
    args = ["build", "--benchmark", "living17", "--set", "seed=4", "--name", "cat-dog-dg-cabinet-bed"]
    assert main(args) == 2
    assert "already a benchmark spec" in capsys.readouterr().err
    assert main(["build", "--benchmark", "living17", "--set", "seed=4", "--name", "mine@generated"]) == 2
    assert "'@' is reserved" in capsys.readouterr().err
    spec = tmp_path / "mine.yaml"
    spec.write_text("family: breeds\nbenchmarks:\n  living17@mine:\n    level: 5\n    n_subclasses: 4\n")
    cli_env(SHIFTBENCH_BREEDS_SPECS=str(spec))
    assert main(["build", "--list"]) == 2
    assert "'@' is reserved" in capsys.readouterr().err
    cli_env(SHIFTBENCH_BREEDS_HIERARCHY_SOURCE="wordnet-default")
    assert main(["build", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "living17@wordnet-default" in listed and "\nliving17\n" not in listed


def test_an_older_paper_named_version_of_other_content_is_retired(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    """What an older shiftbench published offline (generated scenes under the paper's task name) is moved
    aside by the next build, so no view shows it under the paper's name; real paper content stays."""
    from shiftbench.warehouse.publishing import check_version

    settings = cli_env()
    assert main(["build", "metashift", "--benchmark", "cat-dog-dg-cabinet-bed@generated"]) == 0
    assert main(["build", "breeds", "--benchmark", "living17"]) == 0
    store = Store(settings.store_dir)
    tagged = store.log.latest("cat-dog-dg-cabinet-bed@generated")
    assert tagged is not None
    source = store.layout.staged("metashift", tagged.benchmark, tagged.version)
    tables = {t: pl.read_parquet(source.table_path(t)).drop("benchmark", "version") for t in source.tables}
    recorded = {k: v for k, v in source.manifest().items() if k in ("spec", "params", "sources", "origin")}
    old = store.writer.stage("metashift", "cat-dog-dg-cabinet-bed", tables, manifest_extra=recorded)
    check_version(store, old)
    store.log.publish(old)
    capsys.readouterr()
    # The migration runs once per store: this one was checked by the builds above, an older shiftbench's was not.
    assert main(["build", "metashift", "--benchmark", "metashift-attributes"]) == 0
    assert "non-paper sources" not in capsys.readouterr().err and store.log.latest("cat-dog-dg-cabinet-bed") is not None
    for marker in (settings.store_dir / ".migrations").iterdir():
        marker.unlink()

    assert main(["build", "metashift", "--benchmark", "metashift-attributes"]) == 0
    err = capsys.readouterr().err
    assert "warning: cat-dog-dg-cabinet-bed: its versions were built from non-paper sources (generated)" in err
    assert "it builds as cat-dog-dg-cabinet-bed@generated" in err
    assert store.log.latest("cat-dog-dg-cabinet-bed") is None
    assert len(list((settings.store_dir / ".retired" / "metashift").glob("cat-dog-dg-cabinet-bed-*"))) == 1
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        names = {r[0] for r in con.execute("SELECT benchmark FROM benchmarks_history").fetchall()}
    assert "cat-dog-dg-cabinet-bed" not in names
    assert {"living17", "cat-dog-dg-cabinet-bed@generated", "metashift-attributes"} <= names
