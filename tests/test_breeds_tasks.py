"""BREEDS task builder: the published benchmarks exactly, and every split strategy by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shiftbench.breeds.specs import load_specs
from shiftbench.breeds.tasks import TaskParams, build_task
from shiftbench.errors import InputError
from shiftbench.sources.breeds_hierarchy import read_breeds_hierarchy_dir
from shiftbench.sources.hierarchy import Hierarchy

from .conftest import BREEDS_FIXTURE, PUBLISHED_SPLITS, TOY_CLASSES, toy_edges

C = TOY_CLASSES


@pytest.fixture(scope="module")
def published() -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads(PUBLISHED_SPLITS.read_text())["benchmarks"]
    return data


@pytest.mark.parametrize("name", ["entity13", "entity30", "living17", "nonliving26"])
def test_published_benchmarks_are_reproduced_exactly(fixtures: Path, published: dict, name: str) -> None:
    files = read_breeds_hierarchy_dir(BREEDS_FIXTURE)
    classes = [wnid for _, wnid, _ in files.dataset_classes if wnid in files.hierarchy.graph]
    spec = load_specs()[name]
    expected = published[name]
    assert spec.params() | {"balanced": True} == expected["params"] | {"n_subclasses": spec.n_subclasses}
    task = build_task(files.hierarchy, classes, spec.task_params())
    got = [
        {
            "label": s.label,
            "superclass_wnid": s.superclass,
            "superclass_name": files.hierarchy.name(s.superclass),
            "source": list(s.source),
            "target": list(s.target),
        }
        for s in task
    ]
    assert got == expected["superclasses"]


def toy() -> Hierarchy:
    return Hierarchy.from_edges(toy_edges(), {})


def test_superclasses_are_sorted_nodes_at_the_level() -> None:
    task = build_task(toy(), C, TaskParams(level=1, n_subclasses=4, split="rand", seed=0))
    assert [s.superclass for s in task] == ["dummy1", "dummy2"]
    assert [s.label for s in task] == [0, 1]
    for s in task:
        assert len(s.source) == len(s.target) == 2
        assert not set(s.source) & set(s.target)


def test_bad_split_keeps_similar_subclasses_on_one_side() -> None:
    # dummy1's groups, largest first: [c0 c1 c2], [c3 c4], [c5]
    task = build_task(toy(), C, TaskParams(level=1, n_subclasses=4, split="bad"))
    assert (task[0].source, task[0].target) == ((C[0], C[1]), (C[3], C[4]))
    # dummy2 walks down its single child to dummy20: groups [c6 c7 c8], [c9 c10 c11] (tie: id order)
    assert (task[1].source, task[1].target) == ((C[6], C[7]), (C[9], C[10]))


def test_bad_split_fills_a_short_side_from_the_spare_list() -> None:
    task = build_task(toy(), C, TaskParams(level=1, n_subclasses=6, split="bad"))
    # source takes c0 c1 c2, target c3 c4 and the spare list is empty, then c5 goes to target
    assert (task[0].source, task[0].target) == ((C[0], C[1], C[2]), (C[3], C[4], C[5]))


def test_good_split_spreads_similar_subclasses_across_sides() -> None:
    task = build_task(toy(), C, TaskParams(level=1, n_subclasses=4, split="good"))
    assert (task[0].source, task[0].target) == ((C[0], C[3]), (C[1], C[2]))
    assert (task[1].source, task[1].target) == ((C[6], C[9]), (C[7], C[8]))


def test_nosplit_samples_n_subclasses_with_one_shared_random_state() -> None:
    a = build_task(toy(), C, TaskParams(level=1, n_subclasses=3, split="none", seed=5))
    b = build_task(toy(), C, TaskParams(level=1, n_subclasses=3, split="none", seed=5))
    assert a == b
    assert all(len(s.source) == 3 and s.target == () for s in a)
    seeds = {build_task(toy(), C, TaskParams(1, 3, "none", seed))[0].source for seed in range(8)}
    assert len(seeds) > 1


def test_ancestor_restricts_superclasses() -> None:
    task = build_task(toy(), C, TaskParams(level=2, n_subclasses=2, split="rand", ancestor="dummy2"))
    assert [s.superclass for s in task] == ["dummy20"]


@pytest.mark.parametrize(
    ("params", "parameter", "message"),
    [
        (TaskParams(level=9, n_subclasses=2), "level", "no node at level 9"),
        (TaskParams(level=1, n_subclasses=2, ancestor="n99999999"), "ancestor", "unknown node"),
        (TaskParams(level=1, n_subclasses=7), "n_subclasses", "N=7 exceeds"),
        (TaskParams(level=1, n_subclasses=2, split="random"), "split", "unknown split"),
        (TaskParams(level=1, n_subclasses=1, split="rand"), "n_subclasses", "needs N >= 2"),
        (TaskParams(level=1, n_subclasses=3, split="bad"), "n_subclasses", "must be even: split 'bad' puts N/2"),
    ],
)
def test_impossible_tasks_name_the_parameter(params: TaskParams, parameter: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        build_task(toy(), C, params)
    assert info.value.parameter == parameter


def test_specs_cover_all_sixteen_variants() -> None:
    specs = load_specs()
    imagenet1k = [name for name, spec in specs.items() if spec.is_imagenet1k]
    assert len(imagenet1k) == 16 and all("@" not in name for name in imagenet1k)
    assert sorted(set(specs) - set(imagenet1k)) == sorted(  # beyond ImageNet-1k: always NAME@TAG (issue 40)
        [f"living17{v}@in21k" for v in ("", "-good", "-bad", "-nosplit", "-novel")]
        + [f"superclasses{v}@cifar100" for v in ("", "-good", "-bad", "-nosplit")]
    )
    assert specs["living17-nosplit"].split == "none"
    assert specs["nonliving26-good"].ancestor == "n00021939"
    with pytest.raises(InputError, match="unknown parameter"):
        specs["entity13"].with_overrides({"sead": 3})
    with pytest.raises(InputError, match="must be one of"):
        specs["entity13"].with_overrides({"split": "random"})
