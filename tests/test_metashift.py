"""MetaShift: exactness on the released subsets, networkx compatibility, distances on disconnected
graphs, leakage-free tasks at the paper's sizes, scaling down, and clear errors."""

# long: one family end to end (sources, subsets, meta-graphs, tasks, publishing, views, fanned-out builds), sharing
# the module's scene tables and its one-piece build, which split into files would each rebuild.

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from itertools import combinations
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import polars as pl
import pytest
import scipy.sparse as sp

from shiftbench.config.settings import Settings
from shiftbench.errors import ContractViolation, InputError
from shiftbench.metashift import build, collection
from shiftbench.metashift import embedding as em
from shiftbench.metashift import metagraph as mg
from shiftbench.metashift.settings import MetaShiftSettings
from shiftbench.metashift.specs import load_specs, parse_specs
from shiftbench.metashift.subsets import candidate_memberships, subset_table
from shiftbench.metashift.tasks import TaskData
from shiftbench.sources import scene_graphs
from shiftbench.sources.generated_scenes import generate_scene_tables
from shiftbench.sources.gqa_decode import decode_part
from shiftbench.sources.scene_graphs import read_gqa_scene_graph_file, read_gqa_scene_graphs, read_tags_table
from shiftbench.store.contracts import failures
from shiftbench.tables.fingerprint import sha256_files
from shiftbench.warehouse.publishing import check_staged, stage_check_publish

from .conftest import FIXTURES, PROJECT, stage_one

METASHIFT = FIXTURES / "metashift"
SCENES = METASHIFT / "gqa_scene_graphs_from_attributes.json"
SPECS = load_specs()


@pytest.fixture(scope="module")
def fixture_scenes() -> tuple[pl.DataFrame, pl.DataFrame]:
    tables = read_gqa_scene_graphs([SCENES])
    return tables.objects, tables.images


@pytest.fixture(scope="module")
def generated() -> tuple[pl.DataFrame, pl.DataFrame]:
    objects, images, _ = generate_scene_tables()
    return objects, images


@pytest.fixture(scope="module")
def generated_collection(generated: tuple[pl.DataFrame, pl.DataFrame]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shipped ``metashift`` collection built on the generated sample (tables and per-class results)."""
    tables, results, _ = collection.build_collection(
        SPECS.collections["metashift"], *generated, SPECS.general_contexts, {}
    )
    return tables, results


@pytest.fixture(scope="module")
def one_piece(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The version of ``metashift@generated`` staged in one piece, on this process's threads (the default: no
    buckets), in a home of its own: what the fanned-out, bucketed and Dagster builds must give."""
    home = tmp_path_factory.mktemp("one_piece") / "home"
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(home), "SHIFTBENCH_OFFLINE": "1"})
    assert settings.of(MetaShiftSettings).metashift_buckets == 0
    return str(stage_one(settings, "metashift/collection", "metashift@generated").version)


def _task_data(objects: pl.DataFrame, images: pl.DataFrame, name: str) -> TaskData:
    return build.task_data(objects, images, SPECS.tasks[name], SPECS.general_contexts)


# -- exactness --------------------------------------------------------------------------------
def test_released_attribute_subsets_are_reproduced_exactly(fixture_scenes: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    objects, images = fixture_scenes
    memberships = candidate_memberships(objects, images, ["attribute"], SPECS.general_contexts).frame()
    released = pl.read_parquet(METASHIFT / "attribute_subsets.parquet")
    assert memberships["subset"].n_unique() == released["subset"].n_unique() == 4962
    ours = set(zip(memberships["subset"], memberships["image_id"], strict=True))
    theirs = set(zip(released["subset"], released["image_id"], strict=True))
    assert ours == theirs


def test_shipped_task_specs_match_the_paper_tasks_fixture() -> None:
    paper = json.loads((METASHIFT / "paper_tasks.json").read_text())
    dg_paper = paper["domain_generalization"]["cat_vs_dog"]
    spec = SPECS.tasks["cat-dog-dg-cabinet-bed"]
    by_name = {c.name: set(c.members) for c in spec.communities}
    for cls, communities in {**dg_paper["test"]}.items():
        for name, members in communities.items():
            assert by_name[name] == set(members), (cls, name)
    for variant, communities in dg_paper["train_dog_variants"].items():
        for name, members in communities.items():
            assert by_name[name] == set(members), variant
    for communities in [dg_paper["train_cat"], *dg_paper["additional_test"].values()]:
        for name, members in communities.items():
            assert by_name[name] == set(members)
    distances = {s.paper_distance for n, s in SPECS.tasks.items() if n.startswith("cat-dog-dg-")}
    assert distances == set(dg_paper["paper_distances"].values())
    sub = paper["subpopulation_shift"]["cat_vs_dog_indoor_outdoor"]
    subpop = SPECS.tasks["cat-dog-indoor-outdoor-p12"]
    assert {c.name: set(c.members) for c in subpop.communities} == {k: set(v) for k, v in sub["groups"].items()}
    assert {c.name for c in subpop.by_role("minority")} == set(sub["minority_groups"])
    assert sorted(
        SPECS.tasks[f"cat-dog-indoor-outdoor-{p}"].minority_fraction or 0 for p in ("p01", "p06", "p12")
    ) == sorted(sub["minority_fraction_p"])
    assert (subpop.train_size, subpop.test_size) == (1700, 576)
    assert SPECS.general_contexts == paper["context_ontology"]["general"]


def test_sparse_overlaps_equal_pairwise_set_intersections(fixture_scenes: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    objects, images = fixture_scenes
    memberships = candidate_memberships(objects, images, ["attribute"], SPECS.general_contexts)
    nodes = mg.node_order(subset_table(memberships, 25, 6).filter(pl.col("selected")))
    edges = mg.overlap_edges(memberships, nodes, 0.0)
    sets = {k[0]: set(v["image_id"]) for k, v in memberships.frame().partition_by("subset", as_dict=True).items()}
    expected = {}
    for _, frame in nodes.partition_by("class", as_dict=True).items():
        for a, b in combinations(sorted(frame["subset"]), 2):
            shared = len(sets[a] & sets[b])
            if shared:
                expected[(a, b)] = shared / min(len(sets[a]), len(sets[b]))
    got = {(a, b): o for a, b, o in edges.select("subset_a", "subset_b", "overlap").iter_rows()}
    assert got.keys() == expected.keys()
    assert all(got[k] == pytest.approx(v, abs=1e-15) for k, v in expected.items())


def test_networkx_mode_is_bit_identical_to_spectral_layout(fixture_scenes: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    objects, images = fixture_scenes
    for kinds in (["attribute"], ["object", "general"]):
        memberships = candidate_memberships(objects, images, kinds, SPECS.general_contexts)
        nodes = mg.node_order(subset_table(memberships, 25, 6).filter(pl.col("selected")))
        graphs = mg.class_graphs(nodes, mg.overlap_edges(memberships, nodes, 0.2))
        compared = 0
        for graph in graphs.values():
            if len(graph.nodes) < 6:  # networkx itself fails for 3..dim nodes with dim=5
                continue
            reference = nx.spectral_layout(graph.to_networkx(), dim=5)
            ours = em.embed(graph.weights, 5, "networkx").coords
            assert np.array_equal(np.array([reference[n] for n in graph.nodes]), ours)
            compared += 1
        assert compared > 20


# -- distances on disconnected and degenerate graphs -------------------------------------------
def _weights(graph: nx.Graph) -> sp.csr_array:
    return sp.csr_array(nx.to_scipy_sparse_array(graph, weight="weight", dtype=float))


def test_distances_across_components_are_null() -> None:
    graph = nx.disjoint_union(nx.path_graph(8), nx.path_graph(7))
    for method in ("paper", "networkx"):
        emb = em.embed(_weights(graph), 3, method)
        pairs = em.pair_distances(emb)
        across = emb.component[pairs.i] != emb.component[pairs.j]
        assert across.any()
        assert (pairs.status[across] == "different_components").all()
        assert np.isnan(pairs.distance[across]).all()
    paper = em.pair_distances(em.embed(_weights(graph), 3, "paper"))
    within = ~np.isnan(paper.distance)
    assert within.sum() == 8 * 7 // 2 + 7 * 6 // 2  # paths have simple spectra: all defined


def test_mostly_null_distances_are_warned_about(fixture_scenes: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    objects, images = fixture_scenes
    released = {"embedding": "networkx", "edge_threshold": 0.2, "min_subsets_per_class": 6}
    expected = r"\(9\d%\) are NULL: (degenerate_eigenvalues|different_components) [\d,]+, "
    for overrides, expect in (({}, None), (released, expected)):
        spec = SPECS.collections["metashift-attributes"].with_overrides(overrides)
        _, _, distances = collection.build_collection(spec, objects, images, SPECS.general_contexts, {})
        warnings = build.distance_warnings(distances, spec.embedding)
        if expect is None:
            assert warnings == []
        else:
            assert len(warnings) == 1 and re.search(expect, warnings[0]) and "embedding=paper" in warnings[0]


def test_paper_embedding_matches_the_laplacian_eigenmap_of_each_component() -> None:
    graph = nx.path_graph(10)
    emb = em.embed(_weights(graph), 2, "paper")
    laplacian = nx.laplacian_matrix(graph).toarray().astype(float)
    values, vectors = np.linalg.eigh(laplacian)
    for k in range(2):
        assert abs(abs(vectors[:, k + 1] @ emb.coords[:, k]) - 1) < 1e-9
    assert emb.eigenvalues[0][:3] == pytest.approx(values[:3].tolist(), abs=1e-9)


def test_degenerate_eigenvalues_at_the_cut_are_flagged_not_published() -> None:
    cycle = nx.cycle_graph(8)  # eigenvalues come in pairs; dim 5 splits the third pair
    emb = em.embed(_weights(cycle), 5, "paper")
    pairs = em.pair_distances(emb)
    assert set(pairs.status) == {"degenerate_eigenvalues"}
    assert np.isnan(pairs.distance).all() and (pairs.raw > 0).all()
    assert set(em.pair_distances(em.embed(_weights(cycle), 4, "paper")).status) == {"ok"}


def test_two_node_graphs_follow_networkx_and_are_flagged() -> None:
    emb = em.embed(_weights(nx.path_graph(2)), 5, "networkx")
    assert not emb.coords.any()
    assert set(em.pair_distances(emb).status) == {"too_few_nodes"}


# -- tasks ----------------------------------------------------------------------------------
def test_canonical_tasks_on_the_generated_default_have_paper_sizes_and_no_leakage(
    generated: tuple[pl.DataFrame, pl.DataFrame],
) -> None:
    objects, images = generated
    trains_of_cat, tests = [], []
    for name in ("cat-dog-dg-cabinet-bed", "cat-dog-dg-boat-surfboard"):
        data = _task_data(objects, images, name)
        tables = build.task_tables(SPECS.tasks[name], data, "generated-scenes", "{}.jpg", {})
        examples = tables["examples"]
        assert examples.filter(pl.col("split") == "train").height == 400
        train = set(examples.filter(pl.col("split") == "train")["example_id"])
        held = set(examples.filter(pl.col("split") != "train")["example_id"])
        assert not train & held
        both = {f"{i}.jpg" for i in data.class_images["cat"] & data.class_images["dog"]}
        assert both and not both & set(examples["example_id"])
        trains_of_cat.append(
            set(examples.filter((pl.col("split") == "train") & (pl.col("y_name") == "cat"))["example_id"])
        )
        tests.append(set(examples.filter(pl.col("split") == "test")["example_id"]))
        assert tables["metashift_tasks"]["distance_status"][0] == "ok"
    assert trains_of_cat[0] == trains_of_cat[1] and tests[0] == tests[1]  # only the dog training set changes

    test_sets = []
    for p, minority in (("p12", 102), ("p06", 51), ("p01", 9)):
        name = f"cat-dog-indoor-outdoor-{p}"
        tables = build.task_tables(SPECS.tasks[name], _task_data(objects, images, name), "g", "{}", {})
        examples = tables["examples"]
        train = examples.filter(pl.col("split") == "train")
        assert train.height == 1700
        assert train.filter(pl.col("group").is_in(["cat(outdoor)", "dog(indoor)"])).height == 2 * minority
        test = examples.filter(pl.col("split") == "test")
        assert test.group_by("group").len()["len"].to_list() == [144] * 4
        test_sets.append(set(test["example_id"]))
        assert not set(train["example_id"]) & test_sets[-1]
    assert test_sets[0] == test_sets[1] == test_sets[2]


def test_fixture_tasks_need_scale_down_and_record_it(fixture_scenes: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    objects, images = fixture_scenes
    spec = SPECS.tasks["cat-dog-dg-cabinet-bed"]
    data = build.task_data(objects, images, spec, SPECS.general_contexts)
    with pytest.raises(InputError, match=r"community dog\(\w+\) names subset\(s\) that do not exist"):
        build.task_tables(spec, data, "visual-genome", "{}.jpg", {})
    scaled = spec.with_overrides({"allow_scale_down": True})
    tables = build.task_tables(scaled, data, "visual-genome", "{}.jpg", {})
    params = json.loads(tables["benchmarks"]["params"][0])
    assert params["allow_scale_down"] and params["missing_subsets"]
    assert tables["examples"].height > 0


def test_task_errors_name_the_task_and_the_community(generated: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    objects, images = generated
    text = (Path(__file__).parents[1] / "shiftbench" / "specs" / "metashift.yaml").read_text()
    bad = parse_specs(text.replace("cat(bed): [cat(bed),", "cat(bed): [cat(nothing),", 1), "test.yaml")
    spec = bad.tasks["cat-dog-dg-bag-box"]
    with pytest.raises(
        InputError, match=r"cat\(bed\) names subset\(s\) that do not exist in this data: cat\(nothing\)"
    ):
        build.task_tables(spec, _task_data(objects, images, "cat-dog-dg-bag-box"), "g", "{}", {})
    # A test community equal to the cat training community leaves nothing to train on.
    clash = parse_specs(
        text.replace(
            "cat(shelf): [cat(container), cat(shelf), cat(vase), cat(bowl)]",
            "cat(shelf): [cat(cup), cat(sofa), cat(chair)]",
            1,
        ),
        "test.yaml",
    )
    with pytest.raises(InputError, match=r"community cat\(sofa\) \(train\) has no image left after leakage removal"):
        build.task_tables(
            clash.tasks["cat-dog-dg-bag-box"], _task_data(objects, images, "cat-dog-dg-bag-box"), "g", "{}", {}
        )
    big = SPECS.tasks["cat-dog-dg-bag-box"].with_overrides({"train_size": 4000})
    with pytest.raises(InputError, match=r"task cat-dog-dg-bag-box: community cat\(sofa\) has \d+ training images"):
        build.task_tables(big, _task_data(objects, images, "cat-dog-dg-bag-box"), "g", "{}", {})
    for key, value in (
        ("edge_threshold", 1.5),
        ("embedding", "tsne"),
        ("id_val_fraction", 1.0),
        ("minority_fraction", 2),
    ):
        with pytest.raises(InputError, match=key):
            SPECS.tasks["cat-dog-indoor-outdoor-p12"].with_overrides({key: value})
    for key, value in (
        ("edge_threshold", -0.1),
        ("community_method", "leiden"),
        ("context_kinds", ["colour"]),
        ("embedding_dim", 1_000_000_000),  # would allocate tens of GiB
        ("embedding_dim", 0),
        ("min_subset_size", "25"),  # strict: a string is not an integer
    ):
        with pytest.raises(InputError, match=key):
            SPECS.collections["metashift"].with_overrides({key: value})


# -- sources --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"1": {"objects": {"5": {"name": "cat"}}},\n "2": {"objects": {', r"scenes.json:2: invalid scene-graph JSON"),
        ('{"1": {"width": 3}}', r"image '1': missing 'objects'"),
        ('{"1": {"objects": {"5": {"attributes": ["black"]}}}}', r"image '1', object '5': object without 'name'"),
        ('{"1": {"objects": {"5": {"name": 7}}}}', r"object 'name' is not a string"),
        ('{"1": {"objects": {"5": {"name": "cat", "attributes": [1]}}}}', r"non-string value"),
        ('[{"image_id": 1}]', r"invalid scene-graph JSON"),
        (
            '{"1": {"objects": {"5": {"name": "cat"}}}, "2": {"objects": {"6": {"name": "dog"}, "7": {"name": " "}}},'
            ' "3": {"objects": {"8": {"name": ""}}}}',
            r"image '2', object '7': object 'name' is empty",
        ),
        (  # JSON keeps the second of two equal keys silently: the reader refuses the file instead
            '{"1": {"objects": {"5": {"name": "cat"}}},\n "1": {"objects": {"6": {"name": "dog"}}}}',
            r"image '1' is defined twice in this file \(lines 1 and 2\)",
        ),
    ],
)
def test_bad_scene_graphs_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "scenes.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as info:
        read_gqa_scene_graph_file(path)
    assert str(path) in str(info.value)
    # Decoded in parts (a large file, one part per worker), the part holding the bad image says the same.
    refused = []
    for part in range(3):
        try:
            decode_part(path, part, 3)
        except InputError as exc:
            refused.append(str(exc))
    assert refused and all(str(path) in error for error in refused)
    assert any(re.search(message, error) for error in refused)


def test_a_scene_graph_file_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(
        '{"1": {"objects": {"5": {"name": "cat"}}},\n "2": {"objects": {"6": {"name": "café"}}}}'.encode("latin-1")
    )
    with pytest.raises(InputError, match=r"latin1.json:2: not UTF-8"):
        read_gqa_scene_graph_file(path)
    with pytest.raises(InputError, match=r"latin1.json:2: not UTF-8"):
        decode_part(path, 1, 2)  # the second half of the file holds the byte


def test_empty_inputs_are_errors_never_an_empty_collection(
    tmp_path: Path, generated: tuple[pl.DataFrame, pl.DataFrame]
) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(InputError, match=r"empty.json: no scene graphs"):
        read_gqa_scene_graph_file(empty)
    bare = tmp_path / "bare.json"
    bare.write_text('{"1": {"objects": {}}, "2": {"objects": {}}}')
    with pytest.raises(InputError, match=r"bare.json: no objects in any scene graph"):
        read_gqa_scene_graphs([bare])
    (tmp_path / "header.csv").write_text("image_id,tag,kind\n")
    (tmp_path / "blank.csv").write_text("")
    pl.DataFrame(schema={"image_id": pl.String, "tag": pl.String}).write_parquet(tmp_path / "none.parquet")
    for name, message in (
        ("header.csv", "no rows"),
        ("blank.csv", "unreadable CSV|missing column|no rows"),
        ("none.parquet", "no rows"),
    ):
        with pytest.raises(InputError, match=message) as info:
            read_tags_table(tmp_path / name)
        assert name in str(info.value)
    objects, images = generated
    strict = SPECS.collections["metashift"].with_overrides({"min_subset_size": 10**6})
    with pytest.raises(InputError, match=r"parameter 'min_subset_size': no class has \d+ subsets of 1000000 or more"):
        collection.build_collection(strict, objects, images, SPECS.general_contexts, {})


def test_several_scene_graph_files_read_side_by_side_as_one_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train, val, again = tmp_path / "train.json", tmp_path / "val.json", tmp_path / "again.json"
    train.write_text('{"1": {"objects": {"5": {"name": "cat", "attributes": ["black"]}}, "location": "indoors"}}')
    val.write_text('{"2": {"objects": {"6": {"name": "dog"}, "7": {"name": "sofa"}}}}')
    again.write_text('{"3": {"objects": {}}, "2": {"objects": {}}}')
    both = read_gqa_scene_graphs([train, val], workers=2)
    assert both.objects["image_id"].to_list() == ["1", "2", "2"]
    assert both.images["location"].to_list() == ["indoors", None]
    assert read_gqa_scene_graphs([val, train], workers=1).fingerprint == both.fingerprint
    # The files' hash comes from the bytes the workers decoded, as hashing the files again gives it.
    assert both.files_sha256 == sha256_files([train, val])
    monkeypatch.setattr(scene_graphs, "PARALLEL_FROM_BYTES", 16)  # each file in two parts: part 0 hashes it
    assert read_gqa_scene_graphs([train, val], workers=2).files_sha256 == both.files_sha256
    with pytest.raises(InputError, match=r"again.json: image '2' is also in .*val.json"):
        read_gqa_scene_graphs([train, val, again])


def test_tag_tables_build_subsets_and_reject_numeric_ids(tmp_path: Path) -> None:
    csv = tmp_path / "tags.csv"
    csv.write_text("image_id,tag,kind\na,cat,object\na,sofa,object\na,indoors,general\nb,cat,object\nb,grass,object\n")
    tables = read_tags_table(csv)
    memberships = candidate_memberships(tables.objects, tables.images, ["object", "general"], SPECS.general_contexts)
    assert set(memberships.frame()["subset"]) >= {"cat(sofa)", "cat(grass)", "cat(indoors)", "sofa(cat)"}
    pl.DataFrame({"image_id": [1, 2], "tag": ["cat", "dog"]}).write_parquet(tmp_path / "tags.parquet")
    with pytest.raises(InputError, match="column 'image_id' must be strings"):
        read_tags_table(tmp_path / "tags.parquet")
    (tmp_path / "bad.csv").write_text("image_id,tag,kind\na,cat,object\nb,dog,colour\n")
    with pytest.raises(InputError, match=r"bad.csv:3: kind must be one of object, general"):
        read_tags_table(tmp_path / "bad.csv")


def test_figures_drawn_by_a_worker_process_are_the_bytes_drawn_here() -> None:
    """Large collections' figures are drawn in a worker while the version is staged: the same PNGs, in order."""
    from shiftbench.metashift.figures import MetaGraphDrawing, metagraph_figures_started

    drawings = [
        MetaGraphDrawing(["cat(sofa)", "cat(bed)", "cat(grass)"], [40, 30, 25], [(0, 1, 0.5)], [0, 0, 1], "cat"),
        MetaGraphDrawing(["dog(ball)", "dog(car)"], [50, 26], [(0, 1, 0.2)], [0, 1], "dog"),
    ]
    here = metagraph_figures_started(drawings, in_worker=False)()
    assert metagraph_figures_started(drawings, in_worker=True)() == here
    assert here[0] != here[1] and all(png.startswith(b"\x89PNG") for png in here)


# -- publishing -----------------------------------------------------------------------------
def test_collections_and_tasks_publish_deterministically_and_contracts_catch_leakage(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    first = make_settings()
    other = make_settings(SHIFTBENCH_HOME=str(tmp_path / "other"))
    versions = []
    for settings in (first, other):
        staged = [
            stage_one(settings, "metashift/collection", "metashift-attributes"),
            stage_one(settings, "metashift/task", "cat-dog-dg-cabinet-bed@generated"),
        ]
        for version in staged:
            assert not failures(check_staged(version))
        versions.append([s.version for s in staged])
        figures = [n for n in staged[0].manifest()["attachments"] if n.endswith(".png")]
        assert figures and all(name.startswith("metagraph_") for name in figures)
        assert sorted(staged[1].manifest()["attachments"]) == ["card.md", "croissant.json", "task_distances.png"]
    assert versions[0] == versions[1]

    tables = build.task_tables(
        SPECS.tasks["cat-dog-dg-cabinet-bed"],
        _task_data(*generate_scene_tables()[:2], "cat-dog-dg-cabinet-bed"),
        "generated-scenes",
        "{}.jpg",
        {},
    )
    leaked = tables["examples"].filter(pl.col("split") == "test").head(1).with_columns(pl.lit("train").alias("split"))
    tables["examples"] = pl.concat([tables["examples"], leaked])  # one test image also in train
    with pytest.raises(ContractViolation, match=r"examples\.train_disjoint_from_evaluation: observed 1"):
        stage_check_publish(first, "metashift", "leaky", tables, {})


@pytest.mark.slow
def test_cli_builds_metashift_and_the_catalog_answers(
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from shiftbench.pipelines.cli import main

    settings = make_settings()
    monkeypatch.setenv("SHIFTBENCH_HOME", str(settings.home))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("SHIFTBENCH_GQA_SCENE_GRAPHS", str(SCENES))
    # The fixture is in GQA's format but is not GQA's release: shipped names and their variants carry @gqa-files.
    task = [
        "--benchmark",
        "cat-dog-indoor-outdoor-p12@gqa-files",
        "--set",
        "allow_scale_down=true",
        "--name",
        "p12-scaled",
    ]
    assert main(["build", "metashift", *task]) == 0, capsys.readouterr().err
    # The released scripts' settings (networkx embedding) at both thresholds they used.
    for threshold in ("0.1", "0.2"):
        released = ["--benchmark", "metashift-attributes@gqa-files", "--set", "embedding=networkx"]
        name = f"metashift-attributes-released-{threshold[-1]}"
        code = main(["build", "metashift", *released, "--set", f"edge_threshold={threshold}", "--name", name])
        assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "metashift-attributes-released-2@gqa-files: version" in out and "now latest" in out
    query = "SELECT benchmark, params->>'edge_threshold', params->>'allow_scale_down' FROM benchmarks ORDER BY 1"
    assert main(["sql", query, "--csv"]) == 0
    out = capsys.readouterr().out
    assert "p12-scaled@gqa-files,0.1,true" in out and "metashift-attributes-released-2@gqa-files,0.2," in out
    query = (
        "SELECT count(*) FILTER (distance IS NULL), count(*) FROM metashift_distances "
        "WHERE benchmark = 'metashift-attributes-released-2@gqa-files'"
    )
    assert main(["sql", query, "--csv"]) == 0
    null, total = map(int, capsys.readouterr().out.splitlines()[1].split(","))
    assert 0 < null < total  # the fixture's meta-graphs are disconnected: cross-component pairs are NULL
    bad = ["build", "metashift", "--benchmark", "metashift@gqa-files", "--set", "edge_threshold=2", "--name", "bad"]
    assert main(bad) == 2
    assert "edge_threshold" in capsys.readouterr().err


def test_released_settings_build_on_the_generated_sample(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    for threshold in (0.1, 0.2):
        staged = stage_one(
            settings,
            "metashift/collection",
            "metashift-attributes",
            {"embedding": "networkx", "edge_threshold": threshold},
        )
        assert not failures(check_staged(staged))


def _table_hashes(tables: dict[str, Any]) -> dict[str, str]:
    from shiftbench.tables.fingerprint import sha256_streamed, sha256_table

    return {k: sha256_table(v) if hasattr(v, "columns") else sha256_streamed(v) for k, v in sorted(tables.items())}


def test_collection_content_does_not_depend_on_string_hashing(
    generated_collection: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """networkx iterates sets of subset names: the published bytes must not depend on PYTHONHASHSEED. A process with
    another seed than this one (its string hashes differ, checked) builds the tables this process built."""
    script = (
        "import json; from shiftbench.metashift.collection import build_collection;"
        "from shiftbench.metashift.specs import load_specs;"
        "from shiftbench.sources.generated_scenes import generate_scene_tables;"
        "from shiftbench.tables.fingerprint import sha256_streamed, sha256_table; s = load_specs();"
        "o, i, _ = generate_scene_tables();"
        "t, _, _ = build_collection(s.collections['metashift'], o, i, s.general_contexts, {});"
        "h = lambda v: sha256_table(v) if hasattr(v, 'columns') else sha256_streamed(v);"
        "print(json.dumps([hash('cat(sofa)'), {k: h(v) for k, v in sorted(t.items())}]))"
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONHASHSEED": seed},
        capture_output=True,
        text=True,
        check=True,
    )
    string_hash, hashes = json.loads(done.stdout)
    assert string_hash != hash("cat(sofa)")  # the two processes hash strings differently
    assert hashes == _table_hashes(generated_collection[0])


def test_edge_contract_recomputes_overlaps_within_the_class(
    tmp_path: Path, generated: tuple[pl.DataFrame, pl.DataFrame]
) -> None:
    """The edge rule joins images within a class: a wrong count, or an edge to another class's subset, fails it."""
    from shiftbench.store import Store
    from shiftbench.store.contracts import check_tables

    objects, images = generated
    spec = SPECS.collections["metashift"]
    tables, _, _ = collection.build_collection(spec, objects, images, SPECS.general_contexts, {"test": True})
    staged = Store(tmp_path / "store").writer.stage("metashift", "edges-test", tables)
    paths = {t: staged.table_path(t) for t in staged.tables}
    rules = ["metashift_edges", "metashift_subsets"]
    assert not failures(check_tables(paths, rules))
    edges = pl.read_parquet(paths["metashift_edges"])
    subsets = pl.read_parquet(paths["metashift_subsets"]).filter(pl.col("selected"))
    first = edges.row(0, named=True)
    other = subsets.filter(pl.col("class") != first["class"]).sort("subset")["subset"][0]
    for mutated in (
        edges.with_columns(
            pl.when(pl.int_range(pl.len()) == 0)
            .then(pl.col("n_shared") + 1)
            .otherwise(pl.col("n_shared"))
            .alias("n_shared")
        ),
        edges.with_columns(
            pl.when(pl.int_range(pl.len()) == 0).then(pl.lit(other)).otherwise(pl.col("subset_b")).alias("subset_b")
        ),
    ):
        mutated.write_parquet(tmp_path / "edges.parquet")
        found = failures(check_tables({**paths, "metashift_edges": tmp_path / "edges.parquet"}, ["metashift_edges"]))
        assert "overlap_matches_memberships" in {r.rule for r in found}
    # The annotations side: one image the first edge's subsets share, its context of subset_a taken out of the
    # stored annotations, breaks both rules (the edge's count and subset_a's size); the same rows twice (caught by
    # the primary key) count once.
    vocabulary = pl.read_parquet(paths["metashift_scene_vocabulary"])
    code = dict(zip(vocabulary["value"], vocabulary["code"], strict=True))
    objects = pl.read_parquet(paths["metashift_scene_objects"])
    contexts = pl.read_parquet(paths["metashift_scene_contexts"])
    names = pl.read_parquet(paths["metashift_scene_class_names"])
    shown = objects.join(names, on="name")
    listed = pl.read_parquet(paths["metashift_subsets"]).filter(pl.col("selected"))

    def images_of(subset: str) -> set[int]:
        row = listed.filter(pl.col("subset") == subset).row(0, named=True)
        of_class = set(shown.filter(pl.col("class") == code[row["class"]])["image"].to_list())
        table, column = (objects, "name") if row["context_kind"] == "object" else (contexts, "context")
        return of_class & set(table.filter(pl.col(column) == code[row["context"]])["image"].to_list())

    shared = min(images_of(first["subset_a"]) & images_of(first["subset_b"]))
    row_a = listed.filter(pl.col("subset") == first["subset_a"]).row(0, named=True)
    name, column = (
        ("metashift_scene_objects", "name")
        if row_a["context_kind"] == "object"
        else ("metashift_scene_contexts", "context")
    )
    stored = pl.read_parquet(paths[name])
    target = (pl.col("image") == shared) & (pl.col(column) == code[row_a["context"]])
    assert stored.filter(target).height == 1
    for mutated, breaks in ((stored.filter(~target), True), (pl.concat([stored, stored.filter(target)]), False)):
        mutated.write_parquet(tmp_path / "tampered.parquet")
        found = failures(check_tables({**paths, name: tmp_path / "tampered.parquet"}, rules))
        assert ("overlap_matches_memberships" in {r.rule for r in found}) is breaks
        assert ("n_images_matches_memberships" in {r.rule for r in found}) is breaks


def test_networkx_mode_from_500_nodes_gives_networkx_s_dense_distances() -> None:
    """From 500 nodes networkx itself runs unseeded ARPACK; shiftbench's symmetric solver gives the distances
    networkx's dense path gives (eigenvectors up to sign), deterministically."""
    rng = np.random.default_rng(5)
    n = 520
    graph = nx.connected_watts_strogatz_graph(n, 8, 0.3, seed=5)
    weights = np.zeros((n, n))
    for u, v in graph.edges:
        weights[u, v] = weights[v, u] = 0.2 + 0.8 * float(rng.random())
    ours = em.pair_distances(em.embed(sp.csr_array(weights), 5, "networkx"))
    dense = nx.rescale_layout(nx.drawing.layout._spectral(weights, 5))
    i, j = np.triu_indices(n, k=1)
    expected = np.linalg.norm(dense[i] - dense[j], axis=1)
    assert np.allclose(ours.raw, expected, rtol=0, atol=1e-9)
    assert (ours.status_code == 0).all()
    again = em.pair_distances(em.embed(sp.csr_array(weights), 5, "networkx"))
    assert np.array_equal(again.raw, ours.raw)


# -- distances and memberships as views, declared scope, bucketed builds --------------------------------------
def _publish(settings: Settings, name: str, base: str, overrides: dict[str, object]) -> str:
    from shiftbench.families import registry
    from shiftbench.store import Store
    from shiftbench.warehouse.publishing import check_version

    kind = registry.family("metashift").kind("collection")
    if overrides:
        name = registry.register_variant(settings, kind, name, base, overrides).name
    staged = stage_one(settings, "metashift/collection", name)
    store = Store(settings.store_dir)
    assert not failures(check_version(store, staged))
    store.log.publish(staged)
    return name


@pytest.mark.slow
def test_the_distance_view_equals_the_materialized_pairs_null_reasons_included(
    make_settings: Callable[..., Settings], fixture_scenes: tuple[pl.DataFrame, pl.DataFrame]
) -> None:
    """On the fixture's meta-graphs (disconnected, some degenerate): the view over the embeddings gives exactly the
    rows a stored table has, floats and NULL reasons included; and the memberships view gives each selected subset's
    images, the plain sets of the candidate memberships."""
    import duckdb

    from shiftbench.warehouse.catalog import refresh_catalog

    settings = make_settings(SHIFTBENCH_GQA_SCENE_GRAPHS=str(SCENES))
    base = "metashift-attributes@gqa-files"
    released = {"embedding": "networkx", "edge_threshold": 0.2}
    pairs = []
    for settings_of_pair in ({}, released):
        view = _publish(settings, f"view{len(pairs)}", base, {**settings_of_pair, "seed": 1})
        stored = _publish(
            settings, f"stored{len(pairs)}", base, {**settings_of_pair, "seed": 1, "store_distances": True}
        )
        pairs.append((view, stored))
    assert refresh_catalog(settings.catalog_path, settings.store_dir).ok
    with duckdb.connect(str(settings.catalog_path), read_only=True) as con:
        for view, stored in pairs:
            query = "SELECT class, subset_a, subset_b, distance, raw_distance, status FROM metashift_distances "
            got = con.sql(query + f"WHERE benchmark = '{view}' ORDER BY ALL").fetchall()
            expected = con.sql(query + f"WHERE benchmark = '{stored}' ORDER BY ALL").fetchall()
            assert got == expected and len(got) > 1000
            statuses = {row[5] for row in got}
            assert {"ok", "different_components"} <= statuses and all((r[3] is None) == (r[5] != "ok") for r in got)
        assert any(
            row[0] == "degenerate_eigenvalues"
            for row in con.sql(
                f"SELECT DISTINCT status FROM metashift_distances WHERE benchmark = '{pairs[1][0]}'"
            ).fetchall()
        )
        members = con.sql(
            f"SELECT subset, image_id FROM metashift_subset_images WHERE benchmark = '{pairs[0][0]}'"
        ).pl()
        selected = con.sql(f"SELECT subset FROM metashift_subsets WHERE benchmark = '{pairs[0][0]}' AND selected").pl()
    plain = candidate_memberships(*fixture_scenes, ["attribute"], SPECS.general_contexts).frame()
    plain = plain.filter(pl.col("subset").is_in(selected["subset"].implode())).select("subset", "image_id")
    assert members.sort("subset", "image_id").equals(plain.sort("subset", "image_id"))
    assert members.height > 50_000


def test_a_bucketed_build_is_the_same_version(make_settings: Callable[..., Settings], one_piece: str) -> None:
    """Classes built in buckets, each in a worker process from the saved index, give the version one piece gives."""
    settings = make_settings(SHIFTBENCH_METASHIFT_BUCKETS="3")
    assert stage_one(settings, "metashift/collection", "metashift@generated").version == one_piece


def test_a_declared_scope_is_in_the_params_and_on_the_card(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = make_settings()
    overrides = {"classes": "cat,dog", "max_contexts_per_class": 8}
    staged = stage_one(settings, "metashift/collection", "metashift@generated", overrides)
    params = json.loads(pl.read_parquet(staged.table_path("benchmarks"))["params"][0])
    assert params["classes"] == ["cat", "dog"] and params["max_contexts_per_class"] == 8
    assert params["classes_from"] == "inline"
    classes = pl.read_parquet(staged.table_path("metashift_classes"))
    assert classes["class"].to_list() == ["cat", "dog"] and classes["n_capped"].min() > 0
    per_class = pl.read_parquet(staged.table_path("metashift_subsets")).group_by("class").len()
    assert per_class["len"].max() == 8
    card = (staged.path / "files" / "card.md").read_text()
    assert "Scope: the 2 classes of inline; at most the 8 largest contexts of 25 or more images per class" in card
    # the same scope from a file: the same subsets and edges, the file's name and hash recorded
    listed = tmp_path / "classes.txt"
    listed.write_text("# the task's classes\ncat\ndog\n")
    from_file = stage_one(
        settings,
        "metashift/collection",
        "metashift@generated",
        {"classes_file": str(listed), "max_contexts_per_class": 8},
    )
    for table in ("metashift_subsets", "metashift_edges", "metashift_embeddings"):
        assert (
            pl.read_parquet(from_file.table_path(table))
            .drop("version")
            .equals(pl.read_parquet(staged.table_path(table)).drop("version"))
        )
    recorded = json.loads(pl.read_parquet(from_file.table_path("benchmarks"))["params"][0])
    assert recorded["classes_from"] == "classes.txt" and recorded["classes"] == ["cat", "dog"]


def test_a_class_list_with_an_unknown_class_is_one_line_and_publishes_nothing(
    cli_env: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shiftbench.pipelines.cli import main

    listed = tmp_path / "classes.txt"
    listed.write_text("cat\n# and\ndgo\n")
    specs = tmp_path / "specs.yaml"
    specs.write_text(
        "family: metashift\ncollections:\n  pets:\n    context_kinds: [object, general]\n"
        "    classes_file: classes.txt\n    max_contexts_per_class: 10\n"
    )
    settings = cli_env(SHIFTBENCH_METASHIFT_SPECS=str(specs))
    assert main(["build", "metashift", "--benchmark", "pets"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and f"pets: error: {listed}:3: unknown class 'dgo'" in lines[0], err
    assert "did you mean dog" in lines[0] and "nothing published" in lines[0]
    assert not (settings.store_dir / "metashift" / "pets").exists() or not list(
        (settings.store_dir / "metashift" / "pets").glob("publications/*.json")
    )
    listed.write_text("cat\ncat\n")
    assert main(["build", "metashift", "--benchmark", "pets"]) == 2
    assert f"{listed}:2: class 'cat' is listed twice (lines 1 and 2)" in capsys.readouterr().err


def test_the_fanned_out_units_give_the_version_of_one_piece(
    make_settings: Callable[..., Settings], tmp_path: Path, one_piece: str
) -> None:
    """The kind's Fanout (plan, units run apart, stage), as the Dagster job runs it step by step."""
    from shiftbench.families import benchmark_builds, registry, variants

    settings = make_settings()
    family = registry.family("metashift")
    kind = family.kind("collection")
    assert kind.fanout is not None
    target = variants.resolve(settings, kind, "metashift@generated")
    inputs = benchmark_builds.build_inputs(settings, family, kind.inputs_needed(settings, [target.spec]))
    units = kind.fanout.plan(settings, target, inputs, tmp_path / "work", 4)
    assert len(units) == 4
    for unit in reversed(units):  # in any order, as parallel steps finish
        kind.fanout.unit(tmp_path / "work", unit)
    assert kind.fanout.stage(settings, target, inputs, tmp_path / "work").version == one_piece


def test_a_version_written_before_distances_became_a_view_still_checks(
    tmp_path: Path,
    generated: tuple[pl.DataFrame, pl.DataFrame],
    generated_collection: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """Versions of the old layout store every candidate's memberships and every pair's distance: their contracts
    still run (and still catch a wrong count), so `shiftbench check` verifies them."""
    from shiftbench.store import Store
    from shiftbench.store.contracts import check_tables

    objects, images = generated
    spec = SPECS.collections["metashift"]
    tables, results = generated_collection
    memberships = candidate_memberships(objects, images, spec.context_kinds, SPECS.general_contexts)
    old = {name: tables[name] for name in ("benchmarks", "metashift_edges", "metashift_communities",
                                           "metashift_embeddings", "metashift_graphs", "shift_magnitudes")}  # fmt: skip
    old["metashift_subsets"] = subset_table(memberships, spec.min_subset_size, spec.min_subsets_per_class).select(
        "subset", "class", "context", "context_kind", "context_group", "n_images", "selected", "selection"
    )
    old["metashift_subset_images"] = memberships.frame().select("subset", "image_id")
    old["metashift_distances"] = build.distances_table(results)
    staged = Store(tmp_path / "store").writer.stage("metashift", "old-layout", old)
    paths = {t: staged.table_path(t) for t in staged.tables}
    assert not failures(check_tables(paths))
    members = pl.read_parquet(paths["metashift_subset_images"])
    members.slice(1).write_parquet(tmp_path / "members.parquet")  # one membership lost
    found = failures(check_tables({**paths, "metashift_subset_images": tmp_path / "members.parquet"}))
    assert "n_images_matches_memberships" in {r.rule for r in found}


@pytest.mark.slow
def test_the_fanout_job_runs_units_as_steps_and_publishes_the_same_version(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str], one_piece: str
) -> None:
    """`build --units 2`: one Dagster run of metashift_collections_fanout (plan -> 2 unit steps -> publish) on the
    multiprocess executor publishes the version the same build in one piece gives (:func:`one_piece`), as latest."""
    from shiftbench.pipelines.cli import main
    from shiftbench.store import Store

    settings = cli_env()
    assert main(["build", "metashift", "--benchmark", "metashift@generated", "--units", "2"]) == 0
    first = capsys.readouterr().out
    assert re.search(rf"metashift@generated: version {one_piece} \(now latest; .*; 2 units", first), first
    latest = Store(settings.store_dir).log.latest("metashift@generated")
    assert latest is not None and latest.version == one_piece
    assert main(["build", "metashift", "--benchmark", "cat-dog-dg-cabinet-bed@generated", "--units", "2"]) == 2
    assert "metashift tasks are built in one piece" in capsys.readouterr().err


@pytest.mark.slow
def test_more_units_than_classes_is_one_line_never_fewer_steps(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    """A unit builds whole classes: `--units 3` on a two-class collection is refused in one line (exit 2, nothing
    published, the name left free), not a two-step run, nor the long run a huge count planned."""
    from shiftbench.families.variants import load_variants
    from shiftbench.pipelines.cli import main

    settings = cli_env()
    two = ["--benchmark", "metashift@generated", "--set", "classes=cat,dog", "--name", "two"]
    assert main(["build", "metashift", *two, "--units", "3"]) == 2
    out, err = capsys.readouterr()
    errors = [line for line in (out + err).splitlines() if "error" in line]
    assert len(errors) == 1, errors
    assert "parameter 'units': 3 units for the 2 classes of two@generated" in errors[0] and "1..2" in errors[0]
    assert "Traceback" not in out + err and not (settings.store_dir / "metashift" / "two@generated").exists()
    assert "two@generated" not in load_variants(settings)


_COMPILE = """
import sys
import numpy as np
import shiftbench
from shiftbench.metashift import checks, kernels, louvain
assert shiftbench.__file__.startswith(sys.argv[1]), shiftbench.__file__
checks._grouped(np.array([0, 1, 0]), np.array([5, 6, 7]), 2)
if sys.argv[2] == "all":  # kernels' cheapest to compile (count_attributes' np.sort costs 2.5 s more), louvain's all
    i, none = np.array([0]), np.zeros(0, dtype=np.int64)
    kernels.cooccurrences(i, np.array([0, 1]), i, i, np.array([0, 0]), none, i, none, none, i, 1)
    louvain.communities(3, np.array([0, 1]), np.array([1, 2]), np.array([1.0, 1.0]), 0)
"""


@pytest.mark.slow
def test_compiled_loops_are_cached_outside_a_read_only_package(tmp_path: Path) -> None:
    """A read-only copy of the package, imported by fresh processes that compile numba functions of every module
    that has them: the package gains no file (numba caches beside the sources when it can write there, which root
    can, read-only or not); the cache lands in the user's cache folder, or in NUMBA_CACHE_DIR when set, and with no
    writable cache folder the loops still compile and run."""
    site = tmp_path / "site"
    shutil.copytree(PROJECT / "shiftbench", site / "shiftbench", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a-w", str(site)], check=True)
    package = sorted(site.rglob("*"))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    xdg = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    runs = [
        (xdg, "all", tmp_path / "xdg" / "shiftbench" / "numba"),
        ({**xdg, "NUMBA_CACHE_DIR": str(tmp_path / "mine")}, "one", tmp_path / "mine"),  # numba's own setting wins
        ({"XDG_CACHE_HOME": str(blocked / "under")}, "one", None),  # nowhere to write: compiled, cached nowhere
    ]
    try:
        for extra, which, folder in runs:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_"))}
            env |= {"PYTHONPATH": str(site), "HOME": str(tmp_path / "home"), **extra}
            env["PYTHONDONTWRITEBYTECODE"] = "1"  # Python's own .pyc files are not the question here
            done = subprocess.run(
                [sys.executable, "-c", _COMPILE, str(site), which],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, done.stderr
            assert sorted(site.rglob("*")) == package  # nothing written into the installed package
            if folder is not None:
                cached = {p.name.split("-")[0] for p in folder.rglob("*.nbi")}
                expected = {"checks._grouped"}
                if which == "all":
                    expected |= {"louvain._adjacency_py", "kernels.cooccurrences"}
                assert expected <= cached, cached
        assert not (tmp_path / "home").exists()  # nor numba's own fallback under the home folder
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(site)], check=True)
