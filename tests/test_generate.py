"""Distance-controlled MetaShift tasks: `shiftbench generate metashift-dg` picks training subsets whose
distance d increases strictly, under the paper's size and leakage rules; the built tasks measure exactly
that d. The paper's other pairs (bus/truck, elephant/horse, bowl/cup) build with paper_distance next to d."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from shiftbench.config.settings import Settings
from shiftbench.metashift.specs import parse_specs
from shiftbench.pipelines.cli import main


def _generate(out: Path, *extra: str) -> int:
    return main(["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(shelf)", "--out", str(out), *extra])


@pytest.mark.slow
def test_generated_variants_have_strictly_increasing_d_and_no_leakage(
    cli_env: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env()
    spec_file = tmp_path / "dg.yaml"
    assert _generate(spec_file, "--n", "4") == 0
    err = capsys.readouterr().err
    specs = parse_specs(spec_file.read_text(), str(spec_file)).tasks
    names = list(specs)
    assert len(names) == 4 and all(n.startswith("cat-dog-shelf-dg-") for n in names)
    chosen = [float(line.split("d=")[1]) for line in err.splitlines() if "d=" in line]
    assert chosen == sorted(chosen) and len(set(chosen)) == 4

    settings = cli_env(SHIFTBENCH_METASHIFT_SPECS=str(spec_file))
    build = ["build", "metashift"] + [arg for name in names for arg in ("--benchmark", name)]
    assert main(build) == 0, capsys.readouterr().err
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        rows = con.execute(
            "SELECT benchmark, distance, distance_status, n_train, scaled_down FROM metashift_tasks"
        ).fetchall()
        measured = {name: (d, status, n, scaled) for name, d, status, n, scaled in rows}
        # Leakage: no image is in two splits of a task, and none shows both classes.
        leaks = con.execute(
            "SELECT count(*) FROM (SELECT benchmark, example_id FROM examples GROUP BY ALL "
            "HAVING count(DISTINCT split) > 1)"
        ).fetchone()
        both = con.execute(
            "SELECT count(*) FROM (SELECT benchmark, example_id FROM examples GROUP BY ALL "
            "HAVING count(DISTINCT y) > 1)"
        ).fetchone()
        trained_on = con.execute(
            'SELECT benchmark, list(DISTINCT "group" ORDER BY "group") FROM examples '
            "WHERE split = 'train' AND y_name = 'dog' GROUP BY ALL"
        ).fetchall()
    assert leaks == (0,) and both == (0,)
    d = [measured[name][0] for name in names]
    assert all(measured[name][1:] == ("ok", 400, False) for name in names)
    assert d == pytest.approx(chosen, abs=1e-4) and all(a < b for a, b in itertools.pairwise(d))
    for name, groups in trained_on:  # each variant trains its dogs on the one subset it was given
        assert groups == [next(iter(specs[name].by_role("train")[1].members))], name


def test_quantiles_and_bad_requests(
    cli_env: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_env()
    out = tmp_path / "q.yaml"
    assert _generate(out, "--n", "2", "--quantiles", "0.1,0.9", "--name", "low-high") == 0
    assert sorted(parse_specs(out.read_text(), str(out)).tasks)[0].startswith("low-high-")
    capsys.readouterr()
    for extra, message in (
        (["--n", "2", "--quantiles", "0.9,0.1"], "parameter '--quantiles': must increase strictly"),
        (["--n", "3", "--quantiles", "0.1,0.9"], "2 quantiles for --n 3"),
        (["--n", "200"], "parameter '--n': only"),
        (["--quantiles", "a,b", "--n", "2"], "expected numbers"),
        (["--name", "Bad Name"], "invalid benchmark name"),
    ):
        assert _generate(tmp_path / "x.yaml", *extra) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert main(["generate", "metashift-dg", "--classes", "cat,dog", "--test", "cat(shelf)"]) == 2
    assert "must be of the second class 'dog'" in capsys.readouterr().err
    assert main(["generate", "metashift-dg", "--classes", "cat,dog", "--test", "dog(moon)"]) == 2
    err = capsys.readouterr().err
    assert "no subset dog(moon) in these annotations (dog's subsets: dog(" in err and ", and " in err, err
    assert main(["generate", "metashift-dg", "--classes", "cat,unicorn", "--test", "unicorn(shelf)"]) == 2
    err = capsys.readouterr().err  # once "(some there: )"
    assert (
        err
        == "error: parameter '--test': no subset unicorn(shelf) in these annotations (unicorn has no subset in them)\n"
    )
    assert not (tmp_path / "x.yaml").exists()


def _scene_graphs(path: Path) -> None:
    """GQA-layout scenes with the bus/truck pair's contexts, chained so the meta-graph is connected."""
    graphs: dict[str, dict[str, object]] = {}

    def image(objects: list[str]) -> None:
        graphs[str(len(graphs) + 1)] = {
            "objects": {str(k): {"name": name, "attributes": []} for k, name in enumerate(objects)}
        }

    for group in (["cone", "fence"], ["bike", "mirror"], ["flag", "tower"], ["traffic light", "dog"]):
        for k in range(230):
            image(["truck", group[k % 2], *(group if k % 3 == 0 else [])])
    for left, right in (("fence", "bike"), ("mirror", "flag"), ("tower", "traffic light"), ("dog", "airplane")):
        for _ in range(40):
            image(["truck", left, right])
    for _ in range(60):
        image(["truck", "airplane"])
        image(["bus", "airplane"])
    for k in range(240):
        image(["bus", ("clock", "traffic light")[k % 2]])
    path.write_text(json.dumps(graphs))


@pytest.mark.slow
def test_the_papers_other_pairs_record_paper_distance_next_to_d(
    cli_env: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = cli_env()
    assert main(["build", "metashift", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "bus-truck-dg-cone-fence  (not here: the generated scene sample has no bus/truck images" in listed
    scenes = tmp_path / "scenes.json"
    _scene_graphs(scenes)
    settings = cli_env(SHIFTBENCH_GQA_SCENE_GRAPHS=str(scenes))
    variants = ("cone-fence", "bike-mirror", "flag-tower", "traffic-light-dog")
    # A crafted file in GQA's format is not GQA's release: the paper's tasks build as NAME@gqa-files.
    build = ["build", "metashift"] + [a for v in variants for a in ("--benchmark", f"bus-truck-dg-{v}@gqa-files")]
    assert main(build) == 0, capsys.readouterr().err
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        rows = con.execute(
            "SELECT t.benchmark, t.paper_distance, t.distance, t.distance_status, m.value FROM metashift_tasks t "
            "JOIN shift_magnitudes m ON m.benchmark = t.benchmark AND m.measure = 'spectral_distance' ORDER BY 2"
        ).fetchall()
    assert [r[1] for r in rows] == [0.81, 1.20, 1.42, 1.52]
    assert all(status == "ok" and d is not None and d == value for _, _, d, status, value in rows)
