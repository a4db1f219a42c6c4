"""MetaShift's ten-class domain generalization task (paper Appendix B.2.1, Table 3): task 1 with eight animal classes
added, trained on whole classes (``bear(*)``), named ``animals10-dg-<variant>@whole-class`` for what it chose; built
on the generated sample with the eight classes added as made-up images (it has only cats and dogs) and on the
released annotations of the ten classes (attribute subjects only: scaled down); the spec rules it needed; and the
analysis of Table 3 by hand."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import duckdb
import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.errors import ContractViolation, InputError
from shiftbench.families.analysis import FAMILY, provenance
from shiftbench.families.registry import analyses
from shiftbench.metashift import build
from shiftbench.metashift.annotations import NAME_TAGS, task_specs, task_unavailable
from shiftbench.metashift.figures import multiclass_table
from shiftbench.metashift.specs import TaskSpec, load_specs, parse_specs
from shiftbench.metashift.task_rules import RESERVED_TAGS
from shiftbench.metashift.tasks import TaskData
from shiftbench.scoring.provenance import STANDIN
from shiftbench.sources import gqa_release
from shiftbench.sources.generated_scenes import generate_scene_tables
from shiftbench.sources.scene_graphs import read_gqa_scene_graphs
from shiftbench.store.contracts import contracts, failures
from shiftbench.warehouse.publishing import check_staged, stage_check_publish

from .conftest import FIXTURES, stage_one

SCENES = FIXTURES / "metashift" / "gqa_scene_graphs_from_attributes.json"
PNG = b"\x89PNG\r\n\x1a\n"
SPECS = load_specs()
VARIANTS = ("cabinet-bed", "bag-box", "bench-bike", "boat-surfboard")
ADDED = ("bear", "bird", "cow", "elephant", "horse", "sheep", "giraffe", "zebra")
TEN = "animals10-dg-{}@whole-class"


def _ten(variant: str) -> TaskSpec:
    return SPECS.tasks[TEN.format(variant)]


def _by_split_and_class(examples: pl.DataFrame) -> dict[tuple[str, str], set[str]]:
    groups = examples.group_by("split", "y_name").agg(pl.col("example_id"))
    return {(s, c): set(ids) for s, c, ids in groups.iter_rows()}


def test_the_ten_class_tasks_are_task_1_with_eight_whole_classes_added() -> None:
    for variant in VARIANTS:
        ten, two = _ten(variant), SPECS.tasks[f"cat-dog-dg-{variant}"]
        assert ten.classes == ("cat", "dog", *ADDED) and ten.base == "animals10-dg@whole-class"
        assert (ten.kind, ten.distance_class, ten.paper_distance) == (two.kind, two.distance_class, two.paper_distance)
        assert ten.exclude_images_in == two.exclude_images_in and ten.train_size == 10 * two.train_size // 2
        # cat and dog: task 1's communities, roles and members; each added class: one whole-class training community
        assert [c for c in ten.communities if c.class_name in ("cat", "dog")] == list(two.communities)
        added = [c for c in ten.communities if c.class_name not in ("cat", "dog")]
        assert [(c.name, c.role, c.members) for c in added] == [(f"{a}(*)", "train", (f"{a}(*)",)) for a in ADDED]
    assert [_ten(variant).paper_distance for variant in VARIANTS] == [0.44, 0.71, 1.12, 1.43]
    assert not {"animals10-dg", "animals10-dg-cabinet-bed"} & set(SPECS.tasks)  # no paper name for our reading


def _generated_with_added_classes() -> tuple[dict[str, TaskData], dict[str, TaskData]]:
    """Task data on the generated sample for task 1 and the ten-class task; the eight added classes are 300 stand-in
    images each (ids no scene shows), so no image of theirs shows a cat or a dog."""
    objects, images, _ = generate_scene_tables()
    two, ten = {}, {}
    for variant in VARIANTS:
        two[variant] = build.task_data(objects, images, SPECS.tasks[f"cat-dog-dg-{variant}"], SPECS.general_contexts)
        data = build.task_data(objects, images, _ten(variant), SPECS.general_contexts)
        added = {a: frozenset(f"standin-{a}-{k:03d}" for k in range(300)) for a in ADDED}
        ten[variant] = TaskData(data.subset_images, {**data.class_images, **added})
    return two, ten


def test_on_the_generated_sample_only_the_dogs_training_data_changes_and_d_is_task_1s() -> None:
    two_data, ten_data = _generated_with_added_classes()
    splits, distances = {}, {}
    for variant in VARIANTS:
        tables = build.task_tables(_ten(variant), ten_data[variant], "generated-scenes", "{}.jpg", {})
        task_1 = build.task_tables(
            SPECS.tasks[f"cat-dog-dg-{variant}"], two_data[variant], "generated-scenes", "{}.jpg", {}
        )
        examples = tables["examples"]
        train = examples.filter(pl.col("split") == "train")
        assert train.group_by("y_name").len().sort("y_name").rows() == [
            (c, 200) for c in sorted(("cat", "dog", *ADDED))
        ]
        assert train.filter(pl.col("y_name") == "dog").group_by("group").len()["len"].to_list() == [100, 100]
        assert not set(train["example_id"]) & set(examples.filter(pl.col("split") != "train")["example_id"])
        assert examples["y"].max() == 9 and dict(examples.select("y_name", "y").unique().rows())["zebra"] == 9
        # Evaluation is task 1's, image for image: test (cat(shelf), dog(shelf)) and val; the added classes untested.
        for split in ("test", "val"):
            ours = examples.filter(pl.col("split") == split).select("example_id", "y_name", "group").sort("example_id")
            theirs = task_1["examples"].filter(pl.col("split") == split).select("example_id", "y_name", "group")
            assert ours.equals(theirs.sort("example_id")), split
        # d: the dog communities' distance to dog(shelf), as in task 1 (no added image shows a dog)
        summary, task_1_summary = (
            tables["metashift_tasks"].row(0, named=True),
            task_1["metashift_tasks"].row(0, named=True),
        )
        assert summary["distance_status"] == "ok" and summary["distance"] == task_1_summary["distance"]
        communities = tables["metashift_task_communities"]
        assert set(communities.filter(pl.col("class").is_in(ADDED))["distance_status"]) == {"not_applicable"}
        splits[variant], distances[variant] = _by_split_and_class(examples), summary["distance"]
    for a, b in itertools.combinations(VARIANTS, 2):
        assert splits[a][("train", "dog")] != splits[b][("train", "dog")]
        for cls in ("cat", *ADDED):  # every other class trains on the same images in every variant
            assert splits[a][("train", cls)] == splits[b][("train", cls)], (a, b, cls)
    assert all(d is not None for d in distances.values())


@pytest.fixture(scope="module")
def fixture_tables() -> tuple[pl.DataFrame, pl.DataFrame]:
    tables = read_gqa_scene_graphs([SCENES])
    return tables.objects, tables.images


def test_the_released_annotations_of_the_ten_classes_build_it_scaled_down(
    fixture_tables: tuple[pl.DataFrame, pl.DataFrame],
) -> None:
    """The fixture holds the ten classes' attribute subjects, not GQA's object contexts: several of task 1's member
    subsets are missing, so the task builds only scaled down; whole classes come from every image of the class."""
    objects, images = fixture_tables
    trains = {}
    for variant in ("cabinet-bed", "boat-surfboard"):
        spec = _ten(variant)
        data = build.task_data(objects, images, spec, SPECS.general_contexts)
        with pytest.raises(InputError, match=r"community dog\(\w+\) names subset\(s\) that do not exist"):
            build.task_tables(spec, data, "visual-genome", "{}.jpg", {})
        tables = build.task_tables(spec.with_overrides({"allow_scale_down": True}), data, "visual-genome", "{}", {})
        examples = tables["examples"]
        by_class = _by_split_and_class(examples)
        assert {c for s, c in by_class if s == "train"} == {"cat", "dog", *ADDED}
        assert {c for s, c in by_class if s != "train"} == {"cat", "dog"}  # the added classes are not tested
        shown_twice = {
            i for a, b in itertools.combinations(spec.classes, 2) for i in data.class_images[a] & data.class_images[b]
        }
        assert shown_twice and not shown_twice & set(examples["example_id"])  # e.g. a dog with a horse
        for cls in ADDED:
            assert by_class[("train", cls)] <= data.class_images[cls] - shown_twice
        assert tables["metashift_tasks"]["scaled_down"][0]
        trains[variant] = by_class
    # Scaled by another factor per variant, an added class's sample is the same draw: the smaller one its prefix.
    small, large = sorted(trains.values(), key=lambda t: len(t[("train", "bear")]))
    assert small[("train", "bear")] < large[("train", "bear")]


def test_names_carry_the_tasks_own_tag_and_then_the_sources(
    make_settings: Callable[..., Settings], fixture_tables: tuple[pl.DataFrame, pl.DataFrame]
) -> None:
    generated = make_settings()
    names = task_specs(generated)
    # Not buildable on the generated sample (cats and dogs only): listed under its own name, with the reason.
    assert TEN.format("cabinet-bed") in names and "cat-dog-dg-cabinet-bed@generated" in names
    why = task_unavailable(generated, names[TEN.format("cabinet-bed")])
    assert why is not None and "no bear/bird/cow/elephant/horse/sheep/giraffe/zebra images" in why
    gqa = make_settings(SHIFTBENCH_GQA_SCENE_GRAPHS=str(SCENES))
    name = f"{TEN.format('cabinet-bed')}-{gqa_release.TAG}"  # one '@': animals10-dg-cabinet-bed@whole-class-gqa-files
    assert name in task_specs(gqa) and name.count("@") == 1
    staged = stage_one(gqa, "metashift/task", name, {"allow_scale_down": True})
    assert staged.benchmark == name and not failures(check_staged(staged))
    assert set(pl.read_parquet(staged.table_path("examples"))["y_name"]) == {"cat", "dog", *ADDED}


TASK = """family: metashift
tasks:
  {key}:
    kind: domain_generalization
    classes: [cat, dog, bear]
    distance_class: {distance_class}
    exclude_images_in: [{exclude}]
    test: {{dog: {{dog(shelf): [dog(shelf)]}}}}
    train: {{cat: {{cat(sofa): [cat(sofa)]}}, dog: {{dog(bed): [dog(bed)]}}, bear: {bear}}}
"""


def _parse(key: str = "pets", distance_class: str = "dog", exclude: str = "cat(dog)", bear: str = "") -> TaskSpec:
    bear = bear or "{bear(*): [bear(*)]}"
    text = TASK.format(key=key, distance_class=distance_class, exclude=exclude, bear=bear)
    return next(iter(parse_specs(text, "mine.yaml").tasks.values()))


def test_a_class_trained_on_and_never_tested_and_the_rules_around_it() -> None:
    spec = _parse()  # cat and bear have no test community: trained on, never tested on
    assert spec.name == "pets" and spec.by_role("test")[0].class_name == "dog"
    assert _parse("pets@mine").name == "pets@mine"  # a user's spec may say what it chose, too
    refused = [
        ({"distance_class": "cat"}, r"class cat \(distance_class\) has no test community"),
        ({"bear": "{}"}, r"class bear has no train community"),
        ({"bear": "{bear(*): [cat(*)]}"}, r"community bear\(\*\) of class bear lists cat\(\*\)"),
        ({"exclude": "cat(*)"}, r"cat\(\*\) is a whole class, not a subset"),
        ({"key": "pets@a@b"}, r"write NAME or NAME@TAG"),
        *(({"key": f"pets@{tag}"}, f"@{tag} is a tag shiftbench gives") for tag in sorted(RESERVED_TAGS)),
    ]
    for change, message in refused:
        with pytest.raises(InputError, match=message):
            _parse(**change)
    untested = TASK.replace("test: {{dog: {{dog(shelf): [dog(shelf)]}}}}", "")
    text = untested.format(key="pets", distance_class="null", exclude="cat(dog)", bear="{bear(*): [bear(*)]}")
    with pytest.raises(InputError, match="no class has a test community"):
        parse_specs(text, "mine.yaml")


def test_the_reserved_tags_are_every_tag_shiftbench_gives() -> None:
    given = {*NAME_TAGS.values(), gqa_release.TAG, STANDIN}
    assert given == RESERVED_TAGS


def test_a_whole_class_member_of_a_class_with_no_images_is_missing_like_any_subset() -> None:
    spec = _parse()
    data = TaskData({"dog(shelf)": frozenset({"a"}), "cat(sofa)": frozenset({"b"}), "dog(bed)": frozenset({"c"})},
                    {"cat": frozenset({"b"}), "dog": frozenset({"a", "c"})})  # fmt: skip
    with pytest.raises(
        InputError, match=r"community bear\(\*\) names subset\(s\) that do not exist in this data: bear"
    ):
        build.task_tables(spec.with_overrides({"train_size": 3}), data, "d", "{}", {})


# -- the analysis: Table 3 ------------------------------------------------------------------------------------------
def _leaderboard(rows: list[tuple[str, str, str | None, str, str, str, float]]) -> pl.DataFrame:
    """Rows of ``leaderboard_with_standins`` (benchmark, method, setting, image source, eval split, metric, mean) with
    the split's own grouping; ``data_tag`` is the name's @TAG, as the view computes it."""
    return pl.DataFrame(
        [
            {"benchmark": b, "data_tag": b.partition("@")[2] or None, "split_version": "v1", "method": m,
             "setting": s, "grouping": "group", "image_source": i, "eval_split": e, "metric": metric, "n_seeds": 3,
             "mean": mean, "std": 0.01}
            for b, m, s, i, e, metric, mean in rows
        ],
        schema_overrides={"setting": pl.String, "data_tag": pl.String},
    )  # fmt: skip


def _table_3(tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    con = duckdb.connect()
    for name, frame in tables.items():
        con.register(name, frame.to_arrow())
    return con.sql(analyses()["metashift-multiclass-table"].sql()).pl()


def test_table_3_puts_each_learner_beside_the_papers_cell_labelled_with_its_data(
    make_settings: Callable[..., Settings],
) -> None:
    """Ours (test acc_avg, and acc_class:dog: dog(shelf) alone) joined to the paper's Table 3 by method and dog
    training set, with our measured d; the paper's cells with no run keep their rows, a method the paper did not run
    gets NULL paper columns, stand-in runs are rows of their own, and nothing is published without a run."""
    cabinet, boat = TEN.format("cabinet-bed"), TEN.format("boat-surfboard")
    board = _leaderboard(
        [
            (cabinet, "erm", "domainbed.resnet18", "gqa", "test", "acc_avg", 0.7),
            (cabinet, "erm", "domainbed.resnet18", "gqa", "test", "acc_class:dog", 0.6),
            (cabinet, "erm", "domainbed.resnet18", "gqa", "test", "acc_wg", 0.1),  # not Table 3's metric
            (cabinet, "erm", "domainbed.resnet18", "gqa", "id_val", "acc_avg", 0.9),  # not the test split
            (boat, "erm", "domainbed.resnet18", "gqa", "test", "acc_avg", 0.3),
            (boat, "erm", "domainbed.resnet18", "gqa", "test", "acc_class:dog", 0.2),
            (boat, "erm", "smoke.mlp", "standin", "test", "acc_avg", 0.5),  # stand-in images: a row of its own
            (boat, "mine", None, "gqa", "test", "acc_avg", 0.4),
            ("cat-dog-dg-boat-surfboard", "erm", "domainbed.resnet18", "gqa", "test", "acc_avg", 0.9),  # task 1
        ]
    )
    other_grouping = board.head(1).with_columns(grouping=pl.lit("by-object"), mean=pl.lit(0.0))  # left out
    tasks = pl.DataFrame({"benchmark": [cabinet, boat], "version": ["v1", "v1"], "distance": [0.5, None]})
    got = _table_3({"leaderboard_with_standins": pl.concat([board, other_grouping]), "metashift_tasks": tasks})
    rows = {(r["dog_training"], r["method"], r["setting"], r["image_source"]): r for r in got.iter_rows(named=True)}
    erm = rows[("dog(cabinet + bed)", "erm", "domainbed.resnet18", "gqa")]
    assert (erm["acc_ood"], erm["acc_dog_shelf"], erm["paper_acc_ood"]) == pytest.approx((0.7, 0.6, 0.762))
    assert (erm["paper_distance"], erm["distance"], erm["task"], erm["data_tag"]) == (0.44, 0.5, cabinet, "whole-class")
    assert erm["n_seeds"] == 3 and "Visual Genome" in erm["paper_data"]
    far = rows[("dog(boat + surfboard)", "erm", "domainbed.resnet18", "gqa")]
    assert (far["acc_ood"], far["acc_dog_shelf"], far["paper_acc_ood"], far["distance"]) == pytest.approx(
        (0.3, 0.2, 0.265, None)
    )
    standin = rows[("dog(boat + surfboard)", "erm", "smoke.mlp", "standin")]
    assert standin["acc_ood"] == pytest.approx(0.5) and standin["acc_dog_shelf"] is None
    assert standin["paper_acc_ood"] == pytest.approx(0.265)  # the paper's cell beside each learner of its method
    mine = rows[("dog(boat + surfboard)", "mine", "", "gqa")]
    assert mine["paper_acc_ood"] is None and mine["acc_ood"] == pytest.approx(0.4)
    cdann = rows[("dog(bag + box)", "cdann", "", "")]  # the paper's, no run here
    assert cdann["acc_ood"] is None and cdann["paper_acc_ood"] == pytest.approx(0.647)
    assert (cdann["task"], cdann["paper_distance"]) == (TEN.format("bag-box"), 0.71)
    assert len(got) == 20 + 1 + 1  # the paper's 20 cells (erm's two filled by runs), the stand-in learner, mine
    assert multiclass_table(got, "t")[:8] == PNG
    note = provenance(got)
    assert "[stand-in images]" in note and "@whole-class" in note
    assert _table_3({"leaderboard_with_standins": board.tail(1), "metashift_tasks": tasks}).is_empty()  # no run
    # Its contract holds, and catches two rows of one learner
    columns = [c for c in contracts()["analysis_metashift_multiclass"].columns if c not in ("benchmark", "version")]
    settings = make_settings()
    assert stage_check_publish(settings, FAMILY, "table-3", {"analysis_metashift_multiclass": got.select(columns)}, {})
    twice = pl.concat([got, got.head(1)]).select(columns)
    with pytest.raises(ContractViolation, match="one_row_per_learner"):
        stage_check_publish(settings, FAMILY, "table-3-twice", {"analysis_metashift_multiclass": twice}, {})
