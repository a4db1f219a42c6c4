"""Raw sources: WordNet read from its database files equals ImageNet's files; strict readers."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from shiftbench.errors import InputError
from shiftbench.sources.breeds_hierarchy import (
    BREEDS_FILES,
    read_breeds_hierarchy_dir,
    read_dataset_class_info,
)
from shiftbench.sources.imagenet import (
    imagenet_classes,
    list_train_images,
    read_imagenet_hierarchy_dir,
    validation_images,
)
from shiftbench.sources.wordnet import load_wordnet

from .conftest import BREEDS_FIXTURE, IMAGENET_WORDNET_FIXTURE, TEST_CACHE, ToyDir


@pytest.mark.slow
def test_wordnet_read_from_its_database_equals_imagenet_files(fixtures: Path) -> None:
    wordnet = load_wordnet(Path("/usr/share/wordnet"), TEST_CACHE)
    imagenet = read_imagenet_hierarchy_dir(IMAGENET_WORDNET_FIXTURE)
    assert wordnet.edges.height == imagenet.edges.height == 75_850
    assert wordnet.nodes.height == imagenet.nodes.height == 82_115
    assert wordnet.edges.equals(imagenet.edges)
    assert wordnet.nodes.equals(imagenet.nodes)
    # The second call is served from the Parquet cache with the same fingerprint.
    again = load_wordnet(Path("/usr/share/wordnet"), TEST_CACHE)
    assert again.fingerprint == wordnet.fingerprint
    assert again.edges.equals(wordnet.edges)


def test_a_malformed_or_missing_wordnet_database_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "dict").mkdir()
    licence = "  1 This software and database is being provided to you, the LICENSEE, by\n"
    good = "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 ~ 00002137 n 0000 ~ 04431553 n 0000 | that which is\n"
    (tmp_path / "dict" / "data.noun").write_text(licence + good + "00001930 03 n 01\n")
    with pytest.raises(InputError, match=r"data.noun:3: not a WordNet data.noun line") as info:
        load_wordnet(tmp_path / "dict", tmp_path / "cache", offline=True)
    assert info.value.line == 3
    with pytest.raises(InputError, match="SHIFTBENCH_OFFLINE"):
        load_wordnet(tmp_path / "nowhere", tmp_path / "cache", offline=True)


def test_imagenet_classes_and_validation_labels_from_the_package() -> None:
    classes = imagenet_classes()
    assert classes.height == 1000
    assert classes["wnid"].n_unique() == 1000
    assert classes.row(0) == (0, "n01440764", "tench, Tinca tinca")
    images = validation_images(classes)
    assert images.height == 50_000
    assert images["wnid"].null_count() == 0
    assert images.group_by("wnid").len()["len"].unique().to_list() == [50]
    assert images["image_id"].str.starts_with("val/ILSVRC2012_val_").all()


def test_train_listing_reads_names_not_images(tmp_path: Path) -> None:
    for wnid, count in (("n01440764", 3), ("n01443537", 2)):
        folder = tmp_path / "train" / wnid
        folder.mkdir(parents=True)
        for i in range(count):
            (folder / f"{wnid}_{i}.JPEG").write_bytes(b"")
        (folder / "notes.txt").write_text("not an image")
    listed = list_train_images(tmp_path, ["n01443537", "n01440764", "n99999999"])
    assert listed.height == 5
    assert listed["image_id"].to_list()[0] == "train/n01440764/n01440764_0.JPEG"
    with pytest.raises(InputError, match="train"):
        list_train_images(tmp_path / "missing", ["n01440764"])


def test_breeds_fixture_reads_as_a_tree(fixtures: Path) -> None:
    files = read_breeds_hierarchy_dir(fixtures / "breeds" / "modified")
    assert len(files.hierarchy.edges) == 1327
    assert files.hierarchy.is_tree()
    assert len(files.dataset_classes) == 1000


@pytest.mark.parametrize(
    ("files", "message", "line"),
    [
        ({"class_hierarchy.txt": "n00001740 dummy1\ndummy1 n01440764 extra\n"}, "expected 'parent child'", 2),
        ({"class_hierarchy.txt": "n00001740 dummy1\ndummy1 n0X\n"}, "unknown id n0X", 2),
        ({"class_hierarchy.txt": "n00001740 dumm$y\n"}, "malformed node id", 1),
        ({"node_names.txt": "dummy1 no tab here\n"}, "expected 'id<TAB>name'", 1),
        ({"dataset_class_info__json": '[[0, "n01440764", "tench"],\n[1, "n0144'}, "invalid JSON", 2),
    ],
)
def test_malformed_breeds_files_name_file_and_line(
    toy_breeds_dir: ToyDir, files: dict[str, str], message: str, line: int
) -> None:
    directory = toy_breeds_dir(**{k.replace(".", "__"): v for k, v in files.items()})
    with pytest.raises(InputError, match=message) as info:
        read_breeds_hierarchy_dir(directory)
    assert info.value.line == line
    assert info.value.path is not None and Path(info.value.path).parent == directory


def test_cycle_and_missing_root_are_errors(toy_breeds_dir: ToyDir) -> None:
    cyclic = toy_breeds_dir("cyclic")
    with (cyclic / "class_hierarchy.txt").open("a") as handle:
        handle.write("n01440764 dummy1\n")
    with pytest.raises(InputError, match="cycle"):
        read_breeds_hierarchy_dir(cyclic)
    rootless = toy_breeds_dir("rootless")
    text = (rootless / "class_hierarchy.txt").read_text().replace("n00001740", "dummy0")
    (rootless / "class_hierarchy.txt").write_text(text)
    (rootless / "node_names.txt").write_text((rootless / "node_names.txt").read_text().replace("n00001740", "dummy0"))
    with pytest.raises(InputError, match="root n00001740 is missing"):
        read_breeds_hierarchy_dir(rootless)


def test_a_cycle_in_wordnet_is_a_names_the_file_and_the_line_that_closes_it(tmp_path: Path) -> None:
    directory = tmp_path / "imagenet"
    directory.mkdir()
    (directory / "words.txt").write_text("n00001740\tentity\nn00001930\tphysical entity\nn00002137\tabstraction\n")
    (directory / "wordnet.is_a.txt").write_text("n00001740 n00001930\nn00001930 n00002137\nn00002137 n00001930\n")
    with pytest.raises(InputError, match=r"wordnet\.is_a\.txt:3: the hierarchy has a cycle: n00001930 -> n00002137"):
        read_imagenet_hierarchy_dir(directory)


def test_only_the_release_bytes_are_called_the_published_hierarchy(fixtures: Path, tmp_path: Path) -> None:
    """A class dropped from class_hierarchy.txt (or any edit) builds, but never as breeds-published."""
    from shiftbench.breeds.calibrated import KIND_FILES, KIND_PUBLISHED, from_published

    release = read_breeds_hierarchy_dir(BREEDS_FIXTURE)
    assert release.is_release and from_published(release).kind == KIND_PUBLISHED
    edited = tmp_path / "edited"
    edited.mkdir()
    for name in BREEDS_FILES:
        (edited / name).write_bytes((BREEDS_FIXTURE / name).read_bytes())
    lines = (edited / "class_hierarchy.txt").read_text().splitlines(keepends=True)
    leaf = next(line for line in lines if line.split()[1] == "n02085620")  # Chihuahua
    (edited / "class_hierarchy.txt").write_text("".join(line for line in lines if line != leaf))
    files = read_breeds_hierarchy_dir(edited)
    assert files.differs_from_release == ("class_hierarchy.txt",)
    calibrated = from_published(files)
    assert calibrated.kind == KIND_FILES and calibrated.sources["hierarchy"] == KIND_FILES
    assert calibrated.origin["differs_from_release"] == ["class_hierarchy.txt"]
    assert "n02085620" not in calibrated.classes_in_hierarchy


@pytest.mark.parametrize(
    ("rows", "message", "line"),
    [
        ([[0, "n01440764", "tench"], [1, "n09999999", "nothing"]], r"entry 1 \(n09999999\): not an ImageNet-1k", 2),
        ([[0, "n01440764", "a"], [1, "n01443537", "b"], [2, "n01440764", "c"]], "listed twice", 3),
        ([[0, "n01440764", "tench"], [0, "n01443537", "goldfish"]], "index 0 is used twice", 2),
        ([[True, "n01440764", "tench"]], r"entry 0 is not \[index, wnid, name\]", None),
    ],
)
def test_dataset_class_info_classes_are_known_and_unique(
    tmp_path: Path, rows: list[list[object]], message: str, line: int | None
) -> None:
    path = tmp_path / "dataset_class_info.json"
    path.write_text("[" + ",\n".join(json.dumps(row) for row in rows) + "]")
    with pytest.raises(InputError, match=message) as info:
        read_dataset_class_info(path)
    assert info.value.line == line


def test_dataset_class_info_shape_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "dataset_class_info.json"
    path.write_text(json.dumps([[0, "n01440764"]]))
    with pytest.raises(InputError, match="entry 0"):
        read_dataset_class_info(path)


def test_imagenet_hierarchy_dir_reader_matches_fixture_counts(fixtures: Path) -> None:
    files = read_imagenet_hierarchy_dir(IMAGENET_WORDNET_FIXTURE)
    assert files.edges.schema == pl.Schema({"parent": pl.String, "child": pl.String})
    assert files.nodes.filter(pl.col("node") == "n00001740")["name"].to_list() == ["entity"]


def test_validation_images_follow_class_folders_when_the_root_has_them(tmp_path: Path) -> None:
    from shiftbench.sources.imagenet import locate_validation_images

    images = validation_images(imagenet_classes())
    first = images.row(0, named=True)
    file = first["image_id"].removeprefix("val/")
    (tmp_path / "val" / first["wnid"]).mkdir(parents=True)
    (tmp_path / "val" / first["wnid"] / file).touch()
    located = locate_validation_images(tmp_path, images)
    assert located.height == 50_000
    assert located.row(0, named=True)["image_id"] == f"val/{first['wnid']}/{file}"
    assert located.row(1, named=True)["image_id"] == images.row(1, named=True)["image_id"]
    (tmp_path / "val" / "n99999999").mkdir()
    (tmp_path / "val" / first["wnid"] / file).rename(tmp_path / "val" / "n99999999" / file)
    with pytest.raises(InputError, match="wrong class folder"):
        locate_validation_images(tmp_path, images)
