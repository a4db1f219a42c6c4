"""BREEDS beyond ImageNet-1k (issue 40): ImageNet-21k tasks, novel subpopulations, any labelled hierarchy.

Through the CLI a newcomer uses: the shipped ``living17@in21k``, ``living17-novel@in21k`` and
``superclasses@cifar100`` build offline, deterministically, with what their names promise; their
subpopulations are queried in DuckDB; a user's 21k spec at any level builds its four variants; bad specs
are one line, exit 2, nothing published; the ImageNet-1k benchmarks keep their version ids.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import networkx as nx
import PIL.Image
import polars as pl
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import shiftbench
from shiftbench.breeds.build import _tree_distance
from shiftbench.breeds.novel import build_novel_task
from shiftbench.breeds.tasks import TaskParams, build_task
from shiftbench.config.settings import Settings
from shiftbench.pipelines.cli import main
from shiftbench.sources.hierarchy import Hierarchy
from shiftbench.sources.imagenet21k import class_list

from .conftest import PUBLISHED_SPLITS

SHIPPED = ["living17@in21k", "living17-good@in21k", "living17-bad@in21k", "living17-novel@in21k"]
SHIPPED += ["superclasses@cifar100"]
SHIPPED += ["superclasses-good@cifar100", "superclasses-bad@cifar100", "superclasses-nosplit@cifar100"]


def _build(*names: str, extra: list[str] | None = None) -> int:
    args = ["build", "breeds"]
    for name in names:
        args += ["--benchmark", name]
    return main(args + (extra or []))


def _catalog(settings: Settings) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(settings.home / "catalog.duckdb"), read_only=True)


def _subpopulations(settings: Settings, benchmark: str) -> list[dict[str, object]]:
    with _catalog(settings) as con:
        frame = con.sql(f"SELECT * FROM breeds_subpopulations WHERE benchmark = '{benchmark}' ORDER BY y, domain, rank")
        return frame.pl().to_dicts()


def _living17() -> list[dict[str, object]]:
    superclasses: list[dict[str, object]] = json.loads(PUBLISHED_SPLITS.read_text())["benchmarks"]["living17"][
        "superclasses"
    ]
    return superclasses


def test_the_shipped_tasks_beyond_1k_build_offline_and_hold_what_their_names_say(
    cli_env: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = cli_env()
    assert _build(*SHIPPED) == 0
    out = capsys.readouterr().out
    assert f"{len(SHIPPED)} published" in out
    in21k, in1k = set(class_list("in21k").wnids), set(class_list("in1k").wnids)
    living17 = _living17()
    # living17@in21k: Living-17's 17 superclasses in its label order, 2 + 2 subclasses from the 21k classes below.
    rows = _subpopulations(settings, "living17@in21k")
    assert [(r["y"], r["superclass_wnid"]) for r in rows if r["domain"] == "source" and r["rank"] == 0] == [
        (s["label"], s["superclass_wnid"]) for s in living17
    ]
    assert len(rows) == 17 * 4 and all(r["subclass_wnid"] in in21k and r["n_images"] == 0 for r in rows)
    # living17-novel@in21k: the source is Living-17's source; the target never an ImageNet-1k class.
    novel = _subpopulations(settings, "living17-novel@in21k")
    for sup in living17:
        mine = [r for r in novel if r["superclass_wnid"] == sup["superclass_wnid"]]
        assert sorted(r["subclass_wnid"] for r in mine if r["domain"] == "source") == sorted(sup["source"])
        targets = [r["subclass_wnid"] for r in mine if r["domain"] == "target"]
        assert len(targets) == 2 and not set(targets) & in1k and set(targets) <= in21k
    with _catalog(settings) as con:
        # Every subclass descends from its superclass in the version's hierarchy (the contract, here in SQL).
        below = con.execute(
            "WITH RECURSIVE up(benchmark, node, ancestor) AS ("
            " SELECT benchmark, child, parent FROM breeds_hierarchy WHERE benchmark = 'living17-novel@in21k'"
            " UNION SELECT u.benchmark, u.node, h.parent FROM up u JOIN breeds_hierarchy h"
            " ON h.benchmark = u.benchmark AND h.child = u.ancestor)"
            " SELECT count(*) FROM breeds_subpopulations s WHERE benchmark = 'living17-novel@in21k' AND NOT EXISTS"
            " (SELECT 1 FROM up WHERE up.node = s.subclass_wnid AND up.ancestor = s.superclass_wnid)"
        ).fetchone()
        assert below == (0,)
        magnitudes = dict(
            con.execute(
                "SELECT benchmark, value FROM shift_magnitudes WHERE measure = 'subclass_distance_mean' "
                "AND scope = 'all'"
            ).fetchall()
        )
    # bad keeps similar subpopulations on one side: farther than good (on 21k's uneven depths rand is not between)
    assert magnitudes["living17-bad@in21k"] > magnitudes["living17-good@in21k"] > 0
    # superclasses@cifar100: CIFAR-100's 20 superclasses, 2 + 2 of their 5 classes.
    cifar = _subpopulations(settings, "superclasses@cifar100")
    assert len({r["superclass_wnid"] for r in cifar}) == 20 and len(cifar) == 80
    assert {r["superclass_name"] for r in cifar} >= {"aquatic mammals", "vehicles 1"}
    # The cards say where the classes came from and that no images were listed.
    card = _card(settings, "living17@in21k")
    assert re.search(r"Classes: in21k \(timm [\d.]+, imagenet21k_goog_synsets.txt, SHA-256 [0-9a-f]{64}", card)
    assert "Images: none listed (SHIFTBENCH_IMAGENET21K_DIR unset" in card
    assert "ImageNet-21k classes outside the 1k" in _card(settings, "living17-novel@in21k")
    assert "CIFAR-100's 20 superclasses x 5 classes" in _card(settings, "superclasses@cifar100")
    # Their Croissant files validate and load in mlcroissant (a dev dependency), the 0-example ones included.
    paths = [next((settings.store_dir / "breeds" / n).glob("versions/*/files/croissant.json")) for n in SHIPPED]
    done = subprocess.run(
        [sys.executable, "-c", CROISSANT_LOAD, *map(str, paths)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {str(p): 0 for p in paths}
    # Deterministic: every home (each run's is another temporary folder) builds these versions. Without images
    # (sources.images = none) the 21k versions keep the ids they had before issue 48 hashed the image listing by
    # content (built on the commit before it and after).
    assert _versions(settings) == {
        "living17@in21k": "20d222d6c471b3b5", "living17-good@in21k": "de03512ad7a23571",
        "living17-bad@in21k": "2edcbc62229e9993", "living17-novel@in21k": "8a4abe9efb78efe7",
        "superclasses@cifar100": "3fd3f0ea8ea1d3b8", "superclasses-good@cifar100": "6cd1db60b7855956",
        "superclasses-bad@cifar100": "9737a1c107c898ea", "superclasses-nosplit@cifar100": "d6b29fcab4a94d33",
    }  # fmt: skip


# In a child process (mlcroissant's logging holds on to the stderr pytest closes): examples per file.
CROISSANT_LOAD = """
import json, sys
import mlcroissant as mlc
out = {}
for path in sys.argv[1:]:
    dataset = mlc.Dataset(jsonld=path)
    assert not dataset.metadata.ctx.issues.errors, dataset.metadata.ctx.issues.errors
    out[path] = sum(1 for _ in dataset.records("examples"))
print(json.dumps(out))
"""


def _versions(settings: Settings) -> dict[str, str]:
    with _catalog(settings) as con:
        return dict(con.execute("SELECT benchmark, version FROM benchmarks").fetchall())


def _card(settings: Settings, benchmark: str) -> str:
    (card,) = (settings.store_dir / "breeds" / benchmark).glob("versions/*/files/card.md")
    return card.read_text()


DOGS = ["dogs@in12k", "dogs-good@in12k", "dogs-bad@in12k", "dogs-nosplit@in12k"]


@pytest.fixture(scope="module")
def dogs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, Path, Path]:
    """A user's 21k spec at a level (:func:`_dog_specs`) built through the CLI with its three variants, over class
    folders of images (:func:`_dog_images`): the home (only read by the tests), the spec file and the image root."""
    from .conftest import TEST_CACHE

    folder = tmp_path_factory.mktemp("dogs")
    specs, root = _dog_specs(folder), _dog_images(folder / "in21k")
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(folder / "home"), "SHIFTBENCH_OFFLINE": "1"})
    settings.cache_dir.mkdir(parents=True)
    for name in ("wordnet", "nltk_data"):  # the run's WordNet cache, as make_settings links it
        (TEST_CACHE / name).mkdir(parents=True, exist_ok=True)
        (settings.cache_dir / name).symlink_to(TEST_CACHE / name)
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("SHIFTBENCH_")]:
            patch.delenv(key)
        variables = {"SHIFTBENCH_HOME": str(settings.home), "SHIFTBENCH_OFFLINE": "1",
                     "DAGSTER_HOME": str(folder / "dagster_home"), "SHIFTBENCH_BREEDS_SPECS": str(specs),
                     "SHIFTBENCH_IMAGENET21K_DIR": str(root)}  # fmt: skip
        for key, value in variables.items():
            patch.setenv(key, value)
        assert _build(*DOGS) == 0
    return settings, specs, root


def test_a_users_21k_spec_at_a_level_builds_its_four_variants_and_images_when_given(
    dogs: tuple[Settings, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, _, root = dogs
    monkeypatch.setenv("SHIFTBENCH_IMAGENET21K_DIR", str(root))
    assert set(_versions(settings)) == set(DOGS)
    with _catalog(settings) as con:
        splits = dict(
            con.execute("SELECT split, count(*) FROM examples WHERE benchmark = 'dogs@in12k' GROUP BY ALL").fetchall()
        )
        assert set(splits) == {"train", "id_test", "test", "ood_train"}
        roots = con.execute("SELECT DISTINCT dataset FROM examples WHERE benchmark LIKE 'dogs%'").fetchall()
        assert roots == [("imagenet21k",)]
    assert "Images: ImageNet-21k (" in _card(settings, "dogs@in12k")
    # A user's loader finds the listed images under SHIFTBENCH_IMAGENET21K_DIR.
    split = shiftbench.load_split("dogs@in12k", home=settings.home)
    image, label, _ = split.dataset("train")[0]
    assert tuple(image.shape) == (3, 8, 8) and int(label) in set(split.examples["y"].to_list())


def _dog_specs(folder: Path) -> Path:
    specs = folder / "specs.yaml"
    specs.write_text(
        "family: breeds\nbenchmarks:\n  dogs:\n    classes: in12k\n    level: 14\n    ancestor: n02084071\n"
        "    n_subclasses: 4\nvariants:\n  good: {split: good}\n  bad: {split: bad}\n  nosplit: {split: none}\n"
    )
    return specs


def _dog_images(root: Path) -> Path:
    """Class folders in the winter21 layout for every in12k class below "dog"; twelve small JPEGs each."""
    jpeg = io.BytesIO()
    PIL.Image.new("RGB", (8, 8), (200, 40, 40)).save(jpeg, "JPEG")
    for wnid in _below("n02084071", set(class_list("in12k").wnids)):
        folder = root / "winter21_whole" / wnid
        folder.mkdir(parents=True)
        for i in range(12):
            (folder / f"{wnid}_{i}.JPEG").write_bytes(jpeg.getvalue())
    return root


def test_the_version_id_is_the_images_not_where_or_when_they_were_copied(
    dogs: tuple[Settings, Path, Path],
    cli_env: Callable[..., Settings],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same images copied without their times (``cp -r``, a restore, another disk) give the same version id
    (issue 48); an image added or removed gives another."""
    first, specs, original = dogs
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, copy_function=shutil.copyfile)  # new files: nothing of the originals' stat
    for path in sorted(copy.rglob("*"), reverse=True):
        os.utime(path, ns=(3_000_000_000, 3_000_000_000))
    home = str(tmp_path / "other")
    second = cli_env(SHIFTBENCH_HOME=home, SHIFTBENCH_BREEDS_SPECS=str(specs), SHIFTBENCH_IMAGENET21K_DIR=str(copy))
    assert _build("dogs@in12k") == 0, capsys.readouterr().err
    ids = [_versions(first)["dogs@in12k"], _versions(second)["dogs@in12k"]]
    assert ids[1] == ids[0]
    folder = next((copy / "winter21_whole").iterdir())
    (folder / f"{folder.name}_99.JPEG").write_bytes((folder / f"{folder.name}_0.JPEG").read_bytes())
    assert _build("dogs@in12k") == 0, capsys.readouterr().err
    ids.append(_versions(second)["dogs@in12k"])
    (folder / f"{folder.name}_99.JPEG").unlink()
    (folder / f"{folder.name}_0.JPEG").unlink()
    assert _build("dogs@in12k") == 0, capsys.readouterr().err
    ids.append(_versions(second)["dogs@in12k"])
    assert len(set(ids[1:])) == 3, ids


def test_an_unchanged_image_folder_is_not_listed_again(
    make_settings: Callable[..., Settings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folders' stamp (times, inodes) is the listing's cache key; a touched class folder is listed again."""
    from shiftbench.breeds import imagenet21k as in21k_images

    root = _dog_images(tmp_path / "in21k")
    settings = make_settings(SHIFTBENCH_IMAGENET21K_DIR=str(root))
    listed: list[Path] = []
    real = in21k_images.list_imagenet21k_images
    monkeypatch.setattr(in21k_images, "list_imagenet21k_images", lambda r, w: listed.append(r) or real(r, w))
    first = in21k_images.images(settings)
    again = in21k_images.images(settings)
    assert (again.path, again.fingerprint, again.meta) == (first.path, first.fingerprint, first.meta)
    assert listed == [root] and first.meta["n_images"] == pl.read_parquet(first.path / "images.parquet").height > 0
    folder = next((root / "winter21_whole").iterdir())
    os.utime(folder, ns=(4_000_000_000, 4_000_000_000))
    assert in21k_images.images(settings).fingerprint == first.fingerprint and listed == [root, root]


def _below(node: str, classes: set[str]) -> list[str]:
    from shiftbench.sources.wordnet import load_wordnet

    from .conftest import TEST_CACHE

    tables = load_wordnet(Path("/usr/share/wordnet"), TEST_CACHE)
    graph = Hierarchy.from_tables(tables.edges, tables.nodes).graph
    return sorted(n for n in nx.descendants(graph, node) if n in classes)


BAD_SPECS = [
    ("classes: in99k\n    level: 5\n    n_subclasses: 4", r"classes.*must be one of in1k, in21k"),
    ("classes: in21k\n    level: 5\n    superclasses: [n02084071]\n    n_subclasses: 4", r"either superclasses"),
    ("classes: in21k\n    n_subclasses: 4", r"level.*required"),
    ("task: novel\n    classes: in1k\n    level: 5\n    n_subclasses: 4", r"novel task draws its target"),
    ("task: novel\n    level: 5\n    split: bad\n    n_subclasses: 4", r"novel task has no split variants"),
    ("hierarchy: cifar100\n    classes: in21k\n    level: 1\n    n_subclasses: 4", r"give hierarchy or classes"),
    ("classes: in21k\n    level: 5\n    n_subclasses: 4\n    variants: maybe", r"variants must be true or false"),
    ("classes: in21k\n    level: 5\n    n_subclasses: 4\n    tree: false", r"tree applies to a labelled hierarchy"),
    # N/2 source + N/2 target: an odd N published N - 1 subclasses while the spec recorded N (issue 48)
    ("task: novel\n    level: 5\n    n_subclasses: 3", r"'n_subclasses': must be even: a novel .*3 \(in .*yaml"),
    ("classes: in21k\n    level: 5\n    n_subclasses: 5", r"parameter 'n_subclasses': must be even: split 'rand'"),
]


@pytest.mark.parametrize(("entry", "message"), BAD_SPECS)
def test_bad_specs_beyond_1k_are_one_line_naming_the_file_and_exit_2(
    cli_env: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: str, message: str
) -> None:
    specs = tmp_path / "specs.yaml"
    specs.write_text(f"family: breeds\nbenchmarks:\n  mine:\n    {entry}\n")
    settings = cli_env(SHIFTBENCH_BREEDS_SPECS=str(specs))
    assert main(["build", "breeds", "--list"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(message, lines[0]) and str(specs) in lines[0], lines
    assert not settings.store_dir.exists() or not list(settings.store_dir.glob("breeds/*/publications/*.json"))


BAD_BUILDS = [
    # a tag that does not say the classes
    ("mine@in12k:\n    classes: in21k\n    level: 5\n    n_subclasses: 4", "mine@in12k", r"specs.yaml:3.*mine@in21k"),
    # a listed superclass with too few subclasses
    ("mine:\n    classes: in21k\n    superclasses: [n02114100]\n    n_subclasses: 40", "mine@in21k", r"superclasses"),
    # a novel source that is not an ImageNet-1k class
    (
        "mine:\n    task: novel\n    n_subclasses: 2\n    source_subclasses: {n02084071: [n02085374]}",
        "mine@in21k",
        r"source_subclasses.*n02085374.*not an ImageNet-1k class",
    ),
    # a user's wnid file with a wnid outside ImageNet-21k: its file and line
    ("mine:\n    classes: wnids.txt\n    level: 5\n    n_subclasses: 4", "mine@wnids", r"wnids.txt:3.*n99999999"),
    # ImageNet-21k's folder set, but none of the task's classes in it
    (
        "mine:\n    classes: in21k\n    superclasses: [n02114100]\n    n_subclasses: 2",
        "mine@in21k",
        r"SHIFTBENCH_IMAGENET21K_DIR.*none of the 2 subclasses of mine@in21k has a class folder",
    ),
]


@pytest.mark.parametrize(("entry", "name", "message"), BAD_BUILDS)
def test_bad_builds_beyond_1k_are_one_line_exit_2_and_publish_nothing(
    cli_env: Callable[..., Settings],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    entry: str,
    name: str,
    message: str,
) -> None:
    specs = tmp_path / "specs.yaml"
    specs.write_text(f"family: breeds\nbenchmarks:\n  {entry}\n")
    (tmp_path / "wnids.txt").write_text("n02084071\n# a comment\nn99999999\n")
    (tmp_path / "in21k" / "n01440764").mkdir(parents=True)  # a tench folder only
    (tmp_path / "in21k" / "n01440764" / "n01440764_1.JPEG").write_bytes(b"")
    settings = cli_env(SHIFTBENCH_BREEDS_SPECS=str(specs), SHIFTBENCH_IMAGENET21K_DIR=str(tmp_path / "in21k"))
    assert main(["build", "breeds", "--benchmark", name]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and re.search(message, lines[0]), lines
    assert not list(settings.store_dir.glob("breeds/*/publications/*.json"))


def test_a_users_hierarchy_file_builds_its_tasks_and_a_bad_one_is_its_file_and_line(
    cli_env: Callable[..., Settings], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = ["parent,child,child_name"] + [f"root,g{i},group {i}" for i in range(3)]
    rows += [f"g{i},c{i}{j},class {i}{j}" for i in range(3) for j in range(4)]
    (tmp_path / "My Groups.csv").write_text("\n".join(rows) + "\n")
    specs = tmp_path / "specs.yaml"
    specs.write_text(
        "family: breeds\nbenchmarks:\n  mine:\n    hierarchy: My Groups.csv\n    level: 1\n    n_subclasses: 4\n"
    )
    settings = cli_env(SHIFTBENCH_BREEDS_SPECS=str(specs))
    assert _build("mine@my-groups") == 0, capsys.readouterr().err
    rows_built = _subpopulations(settings, "mine@my-groups")
    assert len(rows_built) == 12 and {r["superclass_name"] for r in rows_built} == {"group 0", "group 1", "group 2"}
    # The same file with a cycle: one line naming the file and the edge's line; nothing new published.
    (tmp_path / "My Groups.csv").write_text("\n".join([*rows, "c00,g0,group 0"]) + "\n")
    capsys.readouterr()
    assert _build("mine@my-groups", extra=["--name", "other"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and re.search(r"My Groups.csv:17.*cycle", lines[0]), lines
    assert not list(settings.store_dir.glob("breeds/other*/publications/*.json"))


# -- the task rules on small hierarchies, by hand ------------------------------------------------------
def _hierarchy(edges: list[tuple[str, str]]) -> Hierarchy:
    return Hierarchy.from_edges(edges, {}, root="r")


def test_an_inner_class_is_a_subpopulation_but_never_of_itself() -> None:
    # r -> s (a class, like ImageNet-21k's "dog") -> a (a class) -> a1, a2; s -> b -> b1, b2
    h = _hierarchy([("r", "s"), ("s", "a"), ("a", "a1"), ("a", "a2"), ("s", "b"), ("b", "b1"), ("b", "b2")])
    classes = ["s", "a", "a1", "a2", "b1", "b2"]
    (sup,) = build_task(h, classes, TaskParams(1, 4, "bad", 0))
    assert sup.superclass == "s" and "s" not in sup.source + sup.target
    # bad keeps a's branch on one side: a, a1, a2 are similar; b1, b2 the other branch
    assert set(sup.source) <= {"a", "a1", "a2"} and set(sup.target) <= {"b1", "b2"} | {"a", "a1", "a2"}
    (nosplit,) = build_task(h, classes, TaskParams(1, 5, "none", 0))
    assert sorted(nosplit.source) == ["a", "a1", "a2", "b1", "b2"]


def test_novel_draws_seen_sources_and_unseen_targets_under_each_superclass() -> None:
    h = _hierarchy([("r", "x"), ("r", "y"), ("x", "x1"), ("x", "x2"), ("x", "x3"), ("y", "y1"), ("y", "y2")])
    seen, unseen = ["x1", "y1"], ["x2", "x3", "y2"]
    x, y = build_novel_task(h, seen, unseen, TaskParams(1, 2, seed=0))
    assert (x.superclass, x.source, y.superclass, y.source, y.target) == ("x", ("x1",), "y", ("y1",), ("y2",))
    assert x.target[0] in {"x2", "x3"} and build_novel_task(h, seen, unseen, TaskParams(1, 2, seed=0)) == [x, y]
    with pytest.raises(Exception, match="N/2 = 2 subclasses both inside and outside"):
        build_novel_task(h, seen, unseen, TaskParams(1, 4, seed=0))  # x has one seen class, y one unseen
    with pytest.raises(Exception, match=r"superclass y .* 1 ImageNet-21k subclass"):
        build_novel_task(h, seen, unseen, TaskParams(None, 4, superclasses=("y",)))
    # A given source outside the 1k, or not below its superclass, is refused.
    with pytest.raises(Exception, match=r"y2 .* not an ImageNet-1k class"):
        build_novel_task(h, seen, unseen, TaskParams(None, 2, superclasses=("y",)), {"y": ["y2"]})
    with pytest.raises(Exception, match="x1 is not below superclass y"):
        build_novel_task(h, seen, unseen, TaskParams(None, 2, superclasses=("y",)), {"y": ["x1"]})


@hsettings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1000), min_size=2, max_size=40))
def test_the_tree_distance_is_the_shortest_path(parents: list[int]) -> None:
    edges = [(f"n{parent % (i + 1)}", f"n{i + 1}") for i, parent in enumerate(parents)]
    h = Hierarchy.from_edges(edges, {}, root="n0")
    distance = _tree_distance(h)
    undirected = h.graph.to_undirected()
    nodes = h.nodes
    for a in nodes[:6]:
        lengths = nx.single_source_shortest_path_length(undirected, a)
        assert all(distance(a, b) == lengths[b] for b in nodes)


def test_the_examples_contract_allows_no_examples_only_when_no_images_were_listed(tmp_path: Path) -> None:
    from shiftbench.breeds.build import examples_table, subpopulations_table
    from shiftbench.families.benchmarks_table import benchmarks_row
    from shiftbench.store.contracts import check_tables, failures

    empty = examples_table(subpopulations_table([], _hierarchy([("r", "a")]), "rand"), _no_images())
    for images, broken in (("none", False), ("imagenet21k-dir", True)):
        row = benchmarks_row("breeds", "x", {}, {"images": images}, 0).with_columns(version=pl.lit("v"))
        paths = {"benchmarks": tmp_path / f"b-{images}.parquet", "examples": tmp_path / f"e-{images}.parquet"}
        row.with_columns(benchmark=pl.lit("x")).write_parquet(paths["benchmarks"])
        empty.with_columns(benchmark=pl.lit("x"), version=pl.lit("v")).write_parquet(paths["examples"])
        rules = [r.rule for r in failures(check_tables(paths, only=["examples"]))]
        assert ("not_empty_unless_no_images" in rules) is broken, rules


def _no_images() -> pl.DataFrame:
    return pl.DataFrame(schema={"image_id": pl.String, "wnid": pl.String, "imagenet_split": pl.String})
