"""MetaShift task kind conflicts (paper Section 4.3, Appendix B.3): the shipped spec's sizes on the generated sample,
one subset and one split per image, the manifest's subsets descriptor, determinism, bad specs, and the other kinds'
recorded params left as they were."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.errors import InputError
from shiftbench.metashift import build
from shiftbench.metashift.conflicts import ROLES, Sizes, id_eval_images
from shiftbench.metashift.specs import load_specs
from shiftbench.metashift.tasks import TaskData, excluded_images
from shiftbench.sources.generated_scenes import generate_scene_tables
from shiftbench.store.contracts import failures
from shiftbench.tables.fingerprint import sha256_file
from shiftbench.warehouse.publishing import check_staged

from .conftest import stage_one
from .test_cards import croissant_report

SPECS = load_specs()
SPEC = SPECS.tasks["metashift-conflicts"]


@pytest.fixture(scope="module")
def built() -> tuple[dict[str, pl.DataFrame], dict[str, object], TaskData]:
    objects, images, _ = generate_scene_tables()
    data = build.task_data(objects, images, SPEC, SPECS.general_contexts)
    tables, extra = build.task_version(SPEC, data, "generated-scenes", "{}", {})
    return tables, extra, data


def test_the_shipped_spec_builds_the_paper_setup_on_the_generated_sample(
    built: tuple[dict[str, pl.DataFrame], dict[str, object], TaskData],
) -> None:
    tables, _, data = built
    examples = tables["examples"]
    per_group = examples.group_by("group", "y_name", "split").len()
    train = per_group.filter(pl.col("split") == "train")
    id_val = per_group.filter(pl.col("split") == "id_val")
    test = per_group.filter(pl.col("split") == "test")
    # 26 training subsets (13 per class) of 50 training and 13 in-domain evaluation images; 22 OOD subsets of 13.
    assert train.height == 26 and set(train["len"]) == {50}
    assert train.group_by("y_name").len().sort("y_name")["len"].to_list() == [13, 13]
    assert sorted(id_val["group"]) == sorted(train["group"]) and set(id_val["len"]) == {13}
    assert test.height == 22 and set(test["len"]) == {13}
    assert test.group_by("y_name").len().sort("y_name")["len"].to_list() == [11, 11]
    assert not set(test["group"]) & set(train["group"])
    # An image is in one subset and one split; it is an image of the subset it is published under; nothing excluded.
    assert examples["example_id"].n_unique() == examples.height == 26 * 63 + 22 * 13
    for group, ids in examples.group_by("group").agg("example_id").iter_rows():
        assert set(ids) <= data.subset_images[group], group
    excluded = excluded_images(SPEC, data)
    assert data.subset_images["cat(dog)"] <= excluded and data.class_images["cat"] & data.class_images["dog"]
    assert not excluded & set(examples["example_id"])
    summary = tables["metashift_tasks"].row(0, named=True)
    assert (summary["task_kind"], summary["n_train"], summary["n_id_val"], summary["n_test"]) == (
        "conflicts",
        1300,
        338,
        286,
    )
    communities = tables["metashift_task_communities"]
    assert communities.height == 48 and set(communities["role"]) == {"train", "ood"}
    assert (communities["n_available"] >= SPEC.min_subset_size).all()
    assert communities.filter(pl.col("role") == "train")["split"].unique().to_list() == ["train+id_val"]
    params = json.loads(tables["benchmarks"]["params"][0])
    assert params["id_eval_images_per_subset"] == 13 and params["ood_images_per_subset_used"] == 13
    assert params["candidate_subsets"] == {"cat": 74, "dog": 93}  # 75 and 94 subsets, less cat(dog) and dog(cat)
    assert "train_size" not in params and "communities" not in params  # other kinds' parameters are not recorded


def test_the_manifest_descriptor_lists_every_subset_in_heatmap_order(
    built: tuple[dict[str, pl.DataFrame], dict[str, object], TaskData],
) -> None:
    tables, extra, _ = built
    subsets = extra["subsets"]
    assert isinstance(subsets, dict)
    assert subsets["column"] == "group" and subsets["train_split"] == "train"
    assert subsets["evaluation_splits"] == {"id_val": "in_domain", "test": "out_of_domain"}
    order = subsets["order"]
    examples = tables["examples"]
    splits = {g: set(s) for g, s in examples.group_by("group").agg("split").iter_rows()}
    assert [o["subset"] for o in order if o["subset"] in splits] == [o["subset"] for o in order]
    assert {o["subset"] for o in order} == set(splits) and len(order) == 48
    for entry in order:
        expected = {"train", "id_val"} if entry["role"] == "train" else {"test"}
        assert splits[entry["subset"]] == expected, entry
        assert entry["subset"].startswith(f"{entry['class']}(") and isinstance(entry["community"], int)
    keys = [(SPEC.classes.index(o["class"]), ROLES.index(o["role"]), o["community"], o["subset"]) for o in order]
    assert keys == sorted(keys)
    assert len({o["community"] for o in order if o["class"] == "dog"}) > 1  # communities, not one block


def test_two_builds_in_separate_homes_are_one_version_pass_the_contracts_and_croissant(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    staged = [
        stage_one(settings, "metashift/task", "metashift-conflicts@generated")
        for settings in (make_settings(), make_settings(SHIFTBENCH_HOME=str(tmp_path / "other")))
    ]
    assert staged[0].version == staged[1].version
    assert sha256_file(staged[0].table_path("examples")) == sha256_file(staged[1].table_path("examples"))
    manifests = [s.manifest() for s in staged]
    assert manifests[0]["subsets"] == manifests[1]["subsets"] and len(manifests[0]["subsets"]["order"]) == 48
    assert not failures(check_staged(staged[0]))
    assert "Training conflicts" in (staged[0].path / "files" / "card.md").read_text()
    # the Croissant file, read by mlcroissant itself: valid, with every example and the three splits
    checked = croissant_report([staged[0].path / "files" / "croissant.json"])
    report = next(iter(checked.values()))
    assert report["errors"] == [] and report["warnings"] == [], report
    assert report["examples"] == 26 * 63 + 22 * 13 and report["splits"] == ["id_val", "test", "train"]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("train_subsets=0", r"train_subsets.*must be an integer >= 2, got 0"),
        ("images_per_subset=0", r"images_per_subset.*must be an integer >= 1, got 0"),
        ("id_eval_share=1.0", r"id_eval_share.*must be a number in \(0, 1\), got 1.0"),
        ("id_eval_share=-0.1", r"id_eval_share.*must be a number in \(0, 1\), got -0.1"),
        ("ood_subsets=-2", r"ood_subsets.*must be an integer >= 0, got -2"),
        ("allow_scale_down=true", r"allow_scale_down.*does not scale down"),
        ("train_size=10", r"train_size.*not a parameter of a task of kind conflicts"),
        # 74 cat candidates of >= 25 images; 100 training subsets per class of 63 images cannot be found
        ("train_subsets=200", r"train_subsets.*class cat has \d+ candidate subset\(s\) that can supply 63 images"),
        (
            "ood_subsets=200",
            r"ood_subsets.*class cat has \d+ candidate subset\(s\) more .* 13 images .* asks 100 per class",
        ),
    ],
)
def test_bad_conflicts_settings_are_one_line_exit_2_and_publish_nothing(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str], setting: str, message: str
) -> None:
    from shiftbench.pipelines.cli import main

    settings = cli_env()
    args = ["build", "metashift", "--benchmark", "metashift-conflicts@generated", "--set", setting, "--name", "bad"]
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and re.search(message, lines[0]), lines
    assert not list(settings.store_dir.glob("metashift/bad*/publications/*.json"))
    assert not list(settings.store_dir.glob("metashift/bad*/versions/*/manifest.json"))


def test_a_user_spec_with_one_class_is_one_line_naming_classes(
    cli_env: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shiftbench.pipelines.cli import main

    specs = tmp_path / "specs.yaml"
    specs.write_text(
        "family: metashift\ntasks:\n  lonely-conflicts:\n    kind: conflicts\n    classes: [cat]\n"
        "    train_subsets: 4\n    ood_subsets: 2\n    images_per_subset: 10\n    id_eval_share: 0.2\n"
    )
    cli_env(SHIFTBENCH_METASHIFT_SPECS=str(specs))
    assert main(["build", "metashift", "--benchmark", "lonely-conflicts"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and "classes" in lines[0] and "at least two distinct classes" in lines[0], lines


def test_the_other_kinds_record_the_params_they_recorded_before() -> None:
    before = {
        "context_kinds", "community_embedding", "embedding", "edge_threshold", "embedding_dim", "min_subset_size",
        "seed", "id_val_fraction", "allow_scale_down", "train_size", "test_size", "minority_fraction", "kind", "task",
        "classes", "exclude_images_in", "distance_class", "paper_distance", "communities",
    }  # fmt: skip
    for name in ("cat-dog-dg-cabinet-bed", "cat-dog-indoor-outdoor-p12"):
        assert set(SPECS.tasks[name].params()) == before
        with pytest.raises(InputError, match="train_subsets"):
            SPECS.tasks[name].with_overrides({"train_subsets": 3})


def test_in_domain_evaluation_images_round_halves_up_on_the_share_as_written() -> None:
    # 50 * 0.2 / 0.8 = 12.5 exactly: 13 (binary floats give 12.499999999999998 or 12.500000000000002)
    assert id_eval_images(50, 0.2) == 13
    assert id_eval_images(10, 0.25) == 3  # 3.33
    assert id_eval_images(1, 0.2) == 0  # 0.25
    assert id_eval_images(3, 0.25) == 1  # 1.0
    assert id_eval_images(40, 0.5) == 40
    assert Sizes.of(SPEC) == Sizes(train=50, id_eval=13, ood=13)
    assert Sizes.of(SPEC.with_overrides({"ood_images_per_subset": 7})).ood == 7
    with pytest.raises(InputError, match=r"id_eval_share=0.2 holds out no image of a training subset of 1"):
        Sizes.of(SPEC.with_overrides({"images_per_subset": 1}))  # 0.25 rounds to 0
