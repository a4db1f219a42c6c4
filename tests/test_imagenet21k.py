"""ImageNet-21k: the shipped class lists are timm's files (rebuilt byte for byte by the script), the timm and
user-list readers, and the listing of an ImageNet-21k folder in each release's layout with its stable val split."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import polars as pl
import pytest

from shiftbench.errors import InputError
from shiftbench.sources import imagenet21k as in21k
from shiftbench.sources.imagenet21k import (
    LISTS,
    TIMM_FILES,
    class_list,
    imagenet21k_dir_stamp,
    imagenet21k_listing_sha256,
    imagenet21k_split,
    list_imagenet21k_images,
    read_wnid_list,
    timm_class_list,
)

from .conftest import PROJECT

# SHA-256 of timm 1.0.31's files (sha256sum of timm/data/_info/* in the wheel), pinned so the check needs no wheel.
TIMM_1_0_31_SHA256 = {
    "in21k": "66362bdedf36d933382edca5493fc562dcc17128ce36403c9e730a75f48cb2f2",
    "in22k": "0ae24538751973797b29d8dec412b2bdc61bc4ec3ecd081eba0735804236bbd2",
    "in12k": "f6483e79f18a9b670d43d915ddba40bbcaf82cfc4e92a07bd44057b9d44935f3",
    "in21k-miil": "cd76d977daaa2f13a4a91fca0f53713f2f29675308d4ce0f0ee0e5b07a3164c6",
    "in21k-miil-w21": "f49dde3d69946b8635586432f34f35985f807d168286ce5fde746aac3a7d94c8",
    "in1k": "70002b0ff5de60a3a17a82dbfcff291931f96225ddf941ad2e182fc39e183d15",
}
SIZES = {
    "in21k": 21_843,
    "in22k": 21_841,
    "in12k": 11_821,
    "in21k-miil": 11_221,
    "in21k-miil-w21": 10_450,
    "in1k": 1000,
}


# -- the shipped lists ------------------------------------------------------------------------------
def test_the_shipped_lists_are_timm_1_0_31s_files() -> None:
    """No wheel needed: sizes, nesting, and each list hashes to the pinned SHA-256 of timm's file."""
    lists = {name: class_list(name) for name in LISTS}
    assert {name: len(c.wnids) for name, c in lists.items()} == SIZES
    sets = {name: set(c.wnids) for name, c in lists.items()}
    assert all(len(sets[name]) == SIZES[name] for name in LISTS)  # no duplicates
    assert sets["in12k"] < sets["in22k"] < sets["in21k"]
    assert sets["in21k"] - sets["in22k"] == {"n03931044", "n09859684"}
    assert sets["in1k"] - sets["in21k"] == {"n04399382"}  # ILSVRC-2012's "teddy bear", not in fall11's 21,843
    assert sets["in21k-miil"] < sets["in21k"] and sets["in21k-miil-w21"] <= sets["in21k"]
    for name, listed in lists.items():
        assert listed.wnids == tuple(sorted(listed.wnids))  # timm's files are sorted, and the index is the line
        assert hashlib.sha256(in21k.list_bytes(listed.wnids)).hexdigest() == TIMM_1_0_31_SHA256[name], name
        assert listed.provenance == {
            "source": "package",
            "timm_version": "1.0.31",
            "file": TIMM_FILES[name],
            "sha256": TIMM_1_0_31_SHA256[name],
        }
    assert class_list("in1k").wnids[:2] == ("n01440764", "n01443537")  # index 0 is tench, as in every 1k model
    recorded = in21k.shipped_provenance()
    assert recorded["timm_version"] == "1.0.31" and recorded["wheel"] == "timm-1.0.31-py3-none-any.whl"
    assert in21k.CLASS_TABLE.stat().st_size < 100_000
    assert "Apache License" in (in21k.CLASS_TABLE.parent / "LICENSE-TIMM").read_text("utf-8")


def _wheel_lists(timm_wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(timm_wheel) as wheel:
        return {name: wheel.read(f"timm/data/_info/{file}") for name, file in TIMM_FILES.items()}


def test_the_shipped_lists_equal_the_wheels_files(timm_wheel: Path) -> None:
    files = _wheel_lists(timm_wheel)
    for name, raw in files.items():
        assert in21k.list_bytes(class_list(name).wnids) == raw, name
    assert in21k.shipped_provenance()["files"] == {
        name: {"file": TIMM_FILES[name], "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
        for name, raw in files.items()
    }
    assert in21k.shipped_provenance()["wheel_sha256"] == hashlib.sha256(timm_wheel.read_bytes()).hexdigest()


def test_the_script_rebuilds_the_shipped_files_byte_for_byte(tmp_path: Path, timm_wheel: Path) -> None:
    script = PROJECT / "scripts" / "make_package_data.py"
    for out in (tmp_path / "first", tmp_path / "second"):  # never the package's files: others read them
        args = [sys.executable, str(script), "--timm-wheel", str(timm_wheel), "--out", str(out)]
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert sorted(p.name for p in out.iterdir()) == ["LICENSE-TIMM", "imagenet21k_classes.parquet"]
    for name in ("imagenet21k_classes.parquet", "LICENSE-TIMM"):
        first = (tmp_path / "first" / name).read_bytes()
        assert first == (tmp_path / "second" / name).read_bytes(), name  # deterministic
        assert first == (in21k.CLASS_TABLE.parent / name).read_bytes(), name  # and what ships
    notice = (tmp_path / "first" / "LICENSE-TIMM").read_text("utf-8")
    with zipfile.ZipFile(timm_wheel) as wheel:
        licence = wheel.read("timm-1.0.31.dist-info/licenses/LICENSE").decode()
    assert notice.endswith(licence) and "timm 1.0.31" in notice and "scripts/make_package_data.py" in notice
    assert all(file in notice for file in TIMM_FILES.values())


def test_unknown_list_or_source_is_refused() -> None:
    with pytest.raises(InputError, match="unknown class list 'in21'; known: in21k, in22k, in12k") as err:
        class_list("in21")
    assert err.value.parameter == "classes" and all(name in str(err.value) for name in LISTS)
    with pytest.raises(InputError, match="unknown class source 'pip'") as err:
        class_list("in21k", source="pip")  # type: ignore[arg-type]
    assert err.value.parameter == in21k.CLASS_SOURCE_SETTING


# -- the timm source ------------------------------------------------------------------------------
def _fake_timm(site: Path, lists: dict[str, str]) -> Path:
    info = site / "timm" / "data" / "_info"
    info.mkdir(parents=True)
    for name, text in lists.items():
        (info / TIMM_FILES[name]).write_text(text, "utf-8")
    return site / "timm"


def test_the_timm_source_reads_the_packages_data_files(tmp_path: Path) -> None:
    package = _fake_timm(tmp_path, {"in12k": "n00000002\nn00000001\n", "in1k": "n01440764\nn0144\n"})
    got = timm_class_list("in12k", package, "9.9")
    assert got.name == "in12k" and got.wnids == ("n00000002", "n00000001")  # the file's order, not sorted
    assert got.provenance == {
        "source": "timm",
        "timm_version": "9.9",
        "file": "imagenet12k_synsets.txt",
        "sha256": hashlib.sha256(b"n00000002\nn00000001\n").hexdigest(),
    }
    with pytest.raises(InputError, match="not a WordNet id") as err:
        timm_class_list("in1k", package, "9.9")
    assert err.value.path == str(package / "data" / "_info" / "imagenet_synsets.txt") and err.value.line == 2
    with pytest.raises(InputError, match="cannot read the class list") as err:
        timm_class_list("in21k", package, "9.9")
    assert err.value.path is not None and err.value.path.endswith("imagenet21k_goog_synsets.txt")


def test_the_timm_source_finds_an_installed_timm_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timm_wheel: Path
) -> None:
    """An unpacked wheel is an installed distribution (package + dist-info on the path); timm itself would not
    even import here (no torchvision), so the lists must come from its files alone."""
    site = tmp_path / "site"
    with zipfile.ZipFile(timm_wheel) as wheel:
        wheel.extractall(site)
    monkeypatch.syspath_prepend(str(site))
    for name in LISTS:
        got = class_list(name, source="timm")
        assert got.wnids == class_list(name).wnids, name
        assert got.provenance == {**class_list(name).provenance, "source": "timm"}
    assert "timm" not in sys.modules


def test_the_timm_source_without_timm_names_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "timm" not in sys.modules
    monkeypatch.setattr(sys, "path", [str(tmp_path)])  # nothing installed
    with pytest.raises(InputError, match="timm is not installed") as err:
        class_list("in21k", source="timm")
    assert err.value.parameter == "SHIFTBENCH_IMAGENET21K_CLASS_SOURCE"
    assert "SHIFTBENCH_IMAGENET21K_CLASS_SOURCE" in str(err.value)


# -- a user's list --------------------------------------------------------------------------------
def test_a_users_list_keeps_its_order_and_skips_comments(tmp_path: Path) -> None:
    path = tmp_path / "classes.txt"
    raw = "\ufeff# my classes\r\nn02084071  # dog\r\n\r\n  n01440764\r\n#n00000000\r\nn04399382"
    path.write_bytes(raw.encode("utf-8"))
    got = read_wnid_list(path)
    assert got == in21k.ClassList(
        "user",
        ("n02084071", "n01440764", "n04399382"),
        {"source": "user", "file": str(path), "sha256": hashlib.sha256(raw.encode()).hexdigest()},
    )


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        (b"n01440764\nn1440764\n", 2, r"not a WordNet id \(n and 8 digits\): 'n1440764'"),
        (b"n01440764\nN01443537\n", 2, "not a WordNet id"),
        (b"n01440764 n01443537\n", 1, "not a WordNet id"),
        (b"n01440764,\n", 1, "not a WordNet id"),
        (b"# x\nn01440764\n\nn01443537\nn01440764\n", 5, r"n01440764 is listed twice \(lines 2 and 5\)"),
        (b"", None, "no WordNet ids in the file"),
        (b"# only a comment\n\n", None, "no WordNet ids in the file"),
        (b"n01440764\n\xff\n", None, r"not UTF-8 text \(byte 10\)"),
    ],
    ids=["malformed", "capital", "two-a-line", "trailing-comma", "duplicate", "empty", "comments-only", "not-utf8"],
)
def test_a_bad_users_list_names_the_file_and_line(
    tmp_path: Path, content: bytes, line: int | None, message: str
) -> None:
    path = tmp_path / "classes.txt"
    path.write_bytes(content)
    with pytest.raises(InputError, match=message) as err:
        read_wnid_list(path)
    assert err.value.path == str(path) and err.value.line == line
    assert str(err.value).startswith(f"{path}:{line}: " if line else f"{path}: ")


@pytest.mark.parametrize("make", ["missing", "directory"])
def test_an_unreadable_users_list_is_refused(tmp_path: Path, make: str) -> None:
    path = tmp_path / "classes.txt"
    if make == "directory":
        path.mkdir()
    with pytest.raises(InputError, match="cannot read the class list") as err:
        read_wnid_list(path)
    assert err.value.path == str(path)


# -- images ---------------------------------------------------------------------------------------
IMAGES = {
    "n01440764": ["n01440764_10026.JPEG", "n01440764_2.JPEG", "n01440764_10.jpg"],
    "n01443537": ["n01443537_7.JPEG"],
    "n09999999": ["n09999999_1.JPEG"],  # not asked for
}


def _tree(root: Path, base: str) -> None:
    for wnid, names in IMAGES.items():
        folder = root / base / wnid
        folder.mkdir(parents=True)
        for name in [*names, "README.txt"]:
            (folder / name).write_bytes(b"not an image: never opened")
    (root / base / "n08888888.tar").write_bytes(b"")  # an archive beside the folders: ignored


@pytest.mark.parametrize("base", ["", "fall11_whole", "winter21_whole", "train"])
def test_images_are_listed_from_each_layout(tmp_path: Path, base: str) -> None:
    _tree(tmp_path, base)
    got = list_imagenet21k_images(tmp_path, ["n01443537", "n01440764", "n07777777"])  # the last has no folder
    prefix = f"{base}/" if base else ""
    names = ["n01440764_10.jpg", "n01440764_10026.JPEG", "n01440764_2.JPEG"]
    expected_ids = [f"{prefix}n01440764/{name}" for name in names] + [f"{prefix}n01443537/n01443537_7.JPEG"]
    assert got.columns == ["image_id", "wnid", "imagenet_split"]
    assert got["image_id"].to_list() == expected_ids  # sorted; README.txt and the other class are not there
    assert got["wnid"].to_list() == ["n01440764"] * 3 + ["n01443537"]
    assert got["imagenet_split"].to_list() == [imagenet21k_split(Path(i).name) for i in expected_ids]
    assert list_imagenet21k_images(tmp_path, ["n07777777"]).height == 0  # a root with classes, none asked


def test_the_split_depends_on_the_file_name_only(tmp_path: Path) -> None:
    for base in ("fall11_whole", "winter21_whole"):
        _tree(tmp_path / base.split("_")[0], base)
    fall = list_imagenet21k_images(tmp_path / "fall11", list(IMAGES))
    winter = list_imagenet21k_images(tmp_path / "winter21", list(IMAGES))
    assert fall["imagenet_split"].to_list() == winter["imagenet_split"].to_list()
    assert fall["image_id"].str.strip_prefix("fall11_whole/").to_list() == (
        winter["image_id"].str.strip_prefix("winter21_whole/").to_list()
    )


def test_about_one_file_in_ten_is_val_and_the_rule_is_fixed() -> None:
    names = [f"n{w:08d}_{i}.JPEG" for w in range(1440764, 1440784) for i in range(100)]  # 2,000 names
    splits = [imagenet21k_split(name) for name in names]
    assert splits == [imagenet21k_split(name) for name in names] and set(splits) == {"train", "val"}
    val = [name for name, split in zip(names, splits, strict=True) if split == "val"]
    assert 0.08 < len(val) / len(names) < 0.12
    # The rule as documented (blake2b, 8 bytes, big-endian, divisible by 10), and pinned: changing it would move
    # users' images between train and val.
    documented = [
        n for n in names if int.from_bytes(hashlib.blake2b(n.encode(), digest_size=8).digest(), "big") % 10 == 0
    ]
    assert val == documented
    assert len(val) == 188 and val[:3] == ["n01440764_10.JPEG", "n01440764_11.JPEG", "n01440764_20.JPEG"]
    assert hashlib.sha256("\n".join(val).encode()).hexdigest() == (
        "f5ca15caf5f9e7b460acf8295b5515cf50c6acbd5b682f5d3ccf6fc531ec25d0"
    )


def test_a_folder_without_class_folders_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist") as err:
        list_imagenet21k_images(tmp_path / "nowhere", ["n01440764"])
    assert err.value.parameter == "SHIFTBENCH_IMAGENET21K_DIR" and err.value.path == str(tmp_path / "nowhere")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(InputError, match="the ImageNet-21k folder is not a folder"):
        list_imagenet21k_images(tmp_path / "file", ["n01440764"])
    (tmp_path / "file").unlink()
    (tmp_path / "images").mkdir()
    (tmp_path / "misc").mkdir()
    (tmp_path / "fall11_whole").mkdir()
    with pytest.raises(InputError, match=r"no class folders .* under fall11_whole/, winter21_whole/, train/$") as err:
        list_imagenet21k_images(tmp_path, ["n01440764"])
    assert err.value.parameter == "SHIFTBENCH_IMAGENET21K_DIR" and err.value.path == str(tmp_path)
    for archive in (tmp_path / "n01440764.tar", tmp_path / "fall11_whole" / "n01440764.tar"):  # a tar per class
        archive.write_bytes(b"")
        with pytest.raises(InputError, match=r"per-class \.tar archives: extract each"):
            list_imagenet21k_images(tmp_path, ["n01440764"])
        archive.unlink()
    (tmp_path / "n01440764").write_bytes(b"")  # a file named like a class is not a class folder
    with pytest.raises(InputError, match="no class folders"):
        list_imagenet21k_images(tmp_path, ["n01440764"])


def test_two_layouts_at_once_or_a_bad_wnid_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path, "fall11_whole")
    _tree(tmp_path, "winter21_whole")
    with pytest.raises(InputError, match=r"class folders in more than one place \(fall11_whole/, winter21_whole/\)"):
        list_imagenet21k_images(tmp_path, ["n01440764"])
    with pytest.raises(InputError, match=r"not a WordNet id: '\.\./n01440764'") as err:
        list_imagenet21k_images(tmp_path / "fall11_whole", ["../n01440764"])
    assert err.value.parameter == "classes"


def test_the_folder_stamp_follows_the_class_folders(tmp_path: Path) -> None:
    """The stamp is a cache key (when to list again): it moves with the class folders' names and times."""
    assert imagenet21k_dir_stamp(None) == imagenet21k_dir_stamp(tmp_path / "nowhere")
    _tree(tmp_path / "a", "winter21_whole")
    for folder in (tmp_path / "a" / "winter21_whole").iterdir():
        os.utime(folder, ns=(1_000_000_000, 1_000_000_000))
    before = imagenet21k_dir_stamp(tmp_path / "a")
    assert before == imagenet21k_dir_stamp(tmp_path / "a") != imagenet21k_dir_stamp(None)
    (tmp_path / "a" / "winter21_whole" / "notes").mkdir()  # not a class folder
    assert imagenet21k_dir_stamp(tmp_path / "a") == before
    os.utime(tmp_path / "a" / "winter21_whole" / "n01440764", ns=(2_000_000_000, 2_000_000_000))  # a file changed
    assert imagenet21k_dir_stamp(tmp_path / "a") != before
    os.utime(tmp_path / "a" / "winter21_whole" / "n01440764", ns=(1_000_000_000, 1_000_000_000))
    assert imagenet21k_dir_stamp(tmp_path / "a") == before
    (tmp_path / "a" / "winter21_whole" / "n01440764").rename(tmp_path / "a" / "winter21_whole" / "n01440765")
    assert imagenet21k_dir_stamp(tmp_path / "a") != before
    (tmp_path / "a" / "winter21_whole").rename(tmp_path / "a" / "fall11_whole")
    assert imagenet21k_dir_stamp(tmp_path / "a") not in (before, imagenet21k_dir_stamp(None))


def _copy_without_times(source: Path, target: Path) -> None:
    """``cp -r`` without ``-p``: new files, new inodes, and times that are not the source's."""
    shutil.copytree(source, target, copy_function=shutil.copyfile)
    for path in sorted(target.rglob("*"), reverse=True):  # files before their folders
        os.utime(path, ns=(3_000_000_000, 3_000_000_000))


def test_the_listing_hash_is_the_images_not_their_times(tmp_path: Path) -> None:
    """What a version records: a copy without times (or on another disk) hashes the same; an image added or
    removed does not; the stamp of the copy differs, which only means it is listed again."""
    _tree(tmp_path / "a", "fall11_whole")
    _copy_without_times(tmp_path / "a", tmp_path / "b")
    wnids = list(IMAGES)
    original = imagenet21k_listing_sha256(list_imagenet21k_images(tmp_path / "a", wnids))
    assert imagenet21k_listing_sha256(list_imagenet21k_images(tmp_path / "b", wnids)) == original
    assert imagenet21k_dir_stamp(tmp_path / "b") != imagenet21k_dir_stamp(tmp_path / "a")
    added = tmp_path / "b" / "fall11_whole" / "n01443537" / "n01443537_8.JPEG"
    added.write_bytes(b"another image")
    with_one_more = imagenet21k_listing_sha256(list_imagenet21k_images(tmp_path / "b", wnids))
    assert with_one_more != original
    added.unlink()
    assert imagenet21k_listing_sha256(list_imagenet21k_images(tmp_path / "b", wnids)) == original
    (tmp_path / "b" / "fall11_whole" / "n01440764" / "n01440764_2.JPEG").unlink()
    assert imagenet21k_listing_sha256(list_imagenet21k_images(tmp_path / "b", wnids)) not in (original, with_one_more)
    # The bytes of an image are not read (a listing never opens a file): rewriting one keeps the hash.
    (tmp_path / "a" / "fall11_whole" / "n01440764" / "n01440764_2.JPEG").write_bytes(b"rewritten")
    assert imagenet21k_listing_sha256(list_imagenet21k_images(tmp_path / "a", wnids)) == original


def test_the_list_frame_types(tmp_path: Path) -> None:
    _tree(tmp_path, "")
    got = list_imagenet21k_images(tmp_path, [])
    assert got.schema == pl.Schema({"image_id": pl.String, "wnid": pl.String, "imagenet_split": pl.String})
