"""Each export loaded by the client it is made for, with that client's own code (.venv-clients: torchvision 0.29 as
DomainBed calls it, WILDS 2.0.0; .venv: Hugging Face datasets), never by reading our files back:

- DomainBed: one ``ImageFolder`` per sorted environment folder, as ``MultipleEnvironmentImageFolder`` builds them;
  the same classes and ``class_to_idx`` in every environment and every image's label equal to its example's ``y``
  (a ConDS case, its attribute as the environment, and a MetaShift task on stand-in images).
- WILDS: a ``WILDSDataset`` subclass written as WILDS' docs say, built from the export (``check_init`` passes,
  ``get_subset('train')`` and ``'val'``), its metadata decoding through ``_metadata_map`` to the split's values,
  and ``CombinatorialGrouper`` + WILDS' ``Accuracy`` giving the groups and metrics ``Split.evaluate`` gives.
- Hugging Face: ``datasets.load_dataset(DIR)`` after the export and the warehouse were both moved.
- The default ``--images link`` survives moving the warehouse; ``symlink`` does not (the control that shows the
  move breaks every absolute path).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from shiftbench.config.settings import Settings
from shiftbench.families import registry
from shiftbench.pipelines.cli import main

from .conftest import publish_all, run_client

pytestmark = [pytest.mark.clients, pytest.mark.slow]

SC = "sc-small"  # ConDS sprites-sc-object_color, 20 images per combination, 150 training examples
TASK = "dg-small@generated"  # MetaShift cat-dog-dg-cabinet-bed@generated, 40 training and 20 test images
SPRITES = {"SHIFTBENCH_SPRITES_PER_COMBINATION": "20"}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A warehouse whose images all live inside it (sprites generated into its cache, stand-ins rendered there), so
    that moving it moves every image an export could point at."""
    root = tmp_path_factory.mktemp("clients")
    settings = Settings.from_env({"SHIFTBENCH_HOME": str(root / "home"), "SHIFTBENCH_OFFLINE": "1", **SPRITES})
    case = registry.family("conds").kind("case")
    registry.register_variant(settings, case, SC, "sprites-sc-object_color", {"train_size": 150})
    publish_all(settings, "conds/case", [SC])
    task = registry.family("metashift").kind("task")
    registry.register_variant(
        settings, task, TASK, "cat-dog-dg-cabinet-bed@generated", {"train_size": 40, "test_size": 20}
    )
    publish_all(settings, "metashift/task", [TASK])
    return settings


@pytest.fixture
def cli(warehouse: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key in list(os.environ):
        if key.startswith("SHIFTBENCH_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SHIFTBENCH_HOME", str(warehouse.home))
    monkeypatch.setenv("SHIFTBENCH_OFFLINE", "1")
    monkeypatch.setenv("DAGSTER_HOME", str(warehouse.home / "dagster_home"))
    for key, value in SPRITES.items():
        monkeypatch.setenv(key, value)
    return warehouse


def export(benchmark: str, target: Path, *args: str) -> Path:
    assert main(["export", benchmark, str(target), *args]) == 0
    return target


def examples(settings: Settings, benchmark: str) -> pl.DataFrame:
    """The split's examples with every metadata field, as ``shiftbench.load_split`` serves them."""
    from shiftbench import load_split

    split = load_split(benchmark, home=settings.home)
    rows = split.examples
    attributes = split.published.path / f"{split.published.family}_examples.parquet"
    if attributes.is_file():
        extra = pl.read_parquet(attributes).drop("benchmark", "version", "split", "y", strict=False)
        rows = rows.join(extra, on="example_id")
    return rows


def example_of(name: str, ids: set[str]) -> str:
    """An exported file's example: its name, or its name less the image suffix the export added."""
    return name if name in ids else name.rsplit(".", 1)[0]


@contextmanager
def moved(source: Path, destination: Path) -> Iterator[Path]:
    """``source`` moved to ``destination`` (shutil.move) for the block, then moved back."""
    shutil.move(source, destination)
    try:
        yield destination
    finally:
        shutil.move(destination, source)


# -- DomainBed: torchvision's ImageFolder, one per sorted environment folder -------------------------------------
DOMAINBED = """
import json, os, sys
from torchvision.datasets import ImageFolder

out = {}
for root in sys.argv[1:]:
    environments = sorted(f.name for f in os.scandir(root) if f.is_dir())  # MultipleEnvironmentImageFolder
    out[root] = []
    for environment in environments:
        data = ImageFolder(os.path.join(root, environment))
        image, label = data[0]
        out[root].append({
            "environment": environment, "classes": data.classes, "class_to_idx": data.class_to_idx,
            "samples": [[os.path.basename(path), target] for path, target in data.samples], "size": list(image.size),
        })
print(json.dumps(out))
"""
DOMAINBED_CASES = {  # name: (benchmark, export arguments, the field whose values are the environments)
    "conds-default": (SC, [], "split"),
    "conds-object_color": (SC, ["--environment", "object_color"], "object_color"),
    "metashift-standin-default": (TASK, ["--image-root", "standin"], "split"),
}


def test_domainbed_environments_load_with_imagefolder_as_domainbed_calls_it(
    cli: Settings, clients_python: Path, tmp_path: Path
) -> None:
    """A ConDS case by split (the default) and by an attribute, a MetaShift task by split; one client run for the
    three (torchvision's import is most of its time)."""
    targets = {
        name: export(benchmark, tmp_path / name, "--layout", "domainbed", *args)
        for name, (benchmark, args, _) in DOMAINBED_CASES.items()
    }
    loaded = json.loads(run_client(clients_python, DOMAINBED, *(str(t) for t in targets.values())))
    for name, (benchmark, _, field) in DOMAINBED_CASES.items():
        check_environments(examples(cli, benchmark), targets[name], loaded[str(targets[name])], field)


def check_environments(rows: pl.DataFrame, target: Path, loaded: list[dict[str, Any]], field: str) -> None:
    """Every environment has the same classes with ``class_to_idx`` = ``y``, every image's label is its example's
    ``y``, every example is in the environment of its ``field`` value, once."""
    index = json.loads((target / "environments.json").read_text())
    # DomainBed's environment order is the index's: --test_envs numbers are the ones environments.json gives
    assert [e["environment"] for e in loaded] == [e["folder"] for e in index["environments"]]
    assert index["fields"] == [field]
    n_classes = rows["y"].n_unique()
    for environment in loaded:
        assert environment["classes"] == loaded[0]["classes"] and len(environment["classes"]) == n_classes
        assert environment["class_to_idx"] == {folder: y for y, folder in enumerate(environment["classes"])}
        assert environment["size"][0] > 0  # an image of the environment opens
    y_of = dict(zip(rows["example_id"], rows["y"], strict=True))
    value_of = dict(zip(rows["example_id"], rows[field].cast(pl.String), strict=True))
    ids, seen = set(y_of), []
    for environment, entry in zip(loaded, index["environments"], strict=True):
        for name, label in environment["samples"]:
            example = example_of(name, ids)
            assert label == y_of[example], (environment["environment"], name)
            assert entry["environment"] == f"{field}={value_of[example]}"
            seen.append(example)
    assert sorted(seen) == sorted(y_of)  # every example once


# -- WILDS: a WILDSDataset subclass as WILDS' docs write one --------------------------------------------------------
WILDS = """
import json, os, sys
import numpy as np, pandas as pd, torch
from PIL import Image
from wilds.common.grouper import CombinatorialGrouper
from wilds.common.metrics.all_metrics import Accuracy
from wilds.datasets.wilds_dataset import WILDSDataset


class ExportedDataset(WILDSDataset):
    def __init__(self, root_dir):
        info = json.load(open(os.path.join(root_dir, "wilds.json")))
        table = pd.read_csv(os.path.join(root_dir, "metadata.csv"))
        self._dataset_name = info["dataset_name"]
        self._data_dir = root_dir
        self._split_scheme = "official"
        self._split_dict = info["split_dict"]
        self._split_names = info["split_names"]
        self._split_array = table["split"].to_numpy()
        self._y_array = torch.tensor(table["y"].to_numpy())
        self._y_size = info["y_size"]
        self._n_classes = info["n_classes"]
        self._metadata_fields = list(info["metadata_fields"])
        self._metadata_array = torch.tensor(table[self._metadata_fields].to_numpy())
        self._metadata_map = info["metadata_map"]
        self._input_paths = table["path"].tolist()
        self._example_ids = table["example_id"].tolist()
        super().__init__(root_dir, False, "official")

    def get_input(self, idx):
        return Image.open(os.path.join(self.data_dir, self._input_paths[idx])).convert("RGB")


dataset = ExportedDataset(sys.argv[1])
predictions = json.load(open(sys.argv[2]))
fields = [f for f in dataset.metadata_fields if f != "from_source_domain"]
decoded = [
    {field: dataset.metadata_map[field][int(code)] for field, code in zip(fields, row)}
    for row in dataset.metadata_array.tolist()
]
out = {"splits": {}, "decoded": dict(zip(dataset._example_ids, decoded))}
for split in ("train", "val"):
    subset = dataset.get_subset(split)
    x, y, metadata = subset[0]
    out["splits"][split] = {"n": len(subset), "size": list(x.size), "y": int(y)}
grouper = CombinatorialGrouper(dataset, ["object_color", "y"])
groups = grouper.metadata_to_group(dataset.metadata_array)
out["groups"] = dict(zip(dataset._example_ids, groups.tolist()))
test = np.where(dataset.split_array == dataset.split_dict["test"])[0]
y_pred = torch.tensor([predictions[dataset._example_ids[i]] for i in test])
# Accuracy.compute_group_wise averages with torch_scatter (a CUDA extension WILDS leaves optional): the same
# group-wise accuracies and worst group through Accuracy.compute and Accuracy.worst, group by group.
metric, y_true, g = Accuracy(), dataset.y_array[test], groups[test]
present = [int(k) for k in torch.unique(g)]
per_group = {k: metric.compute(y_pred[g == k], y_true[g == k])["acc_avg"] for k in present}
out["acc_wg"] = float(metric.worst(torch.tensor([per_group[k] for k in present])))
out["acc_avg"] = metric.compute(y_pred, y_true)["acc_avg"]
out["group_acc"] = {str(k): v for k, v in per_group.items()}
print(json.dumps(out))
"""


def test_wilds_export_builds_a_wilds_dataset_whose_groups_and_metrics_are_shiftbenchs(
    cli: Settings, clients_python: Path, tmp_path: Path
) -> None:
    from shiftbench import load_split

    target = export(SC, tmp_path / "wilds", "--layout", "wilds")
    rows = examples(cli, SC)
    test = load_split(SC, home=cli.home).examples.filter(pl.col("split") == "test")
    y_pred = [(y + (i % 4 == 0)) % 3 for i, y in enumerate(test["y"].to_list())]  # wrong on every 4th example
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps(dict(zip(test["example_id"], y_pred, strict=True))))
    got = json.loads(run_client(clients_python, WILDS, str(target), str(predictions)))

    counts = dict(rows.group_by("split").len().iter_rows())
    assert got["splits"]["train"]["n"] == counts["train"] and got["splits"]["train"]["size"][0] > 0
    assert got["splits"]["val"]["n"] == counts["id_val"]  # ConDS has only id_val: it is WILDS' val
    # every metadata value decodes through _metadata_map to the split's own value
    fields = ["group", "shape", "object_color", "background_color", "size"]
    for example_id, *values in rows.select("example_id", *fields, "y_name").iter_rows():
        decoded = got["decoded"][example_id]
        assert [decoded[f] for f in fields] == values[:-1] and decoded["y"] == values[-1]
    # CombinatorialGrouper's groups are the partition shiftbench's Grouper (y,object_color) makes
    names = {e: f"y={y},object_color={c}" for e, y, c in rows.select("example_id", "y", "object_color").iter_rows()}
    pairs = {(got["groups"][e], name) for e, name in names.items()}
    assert len(pairs) == len({g for g, _ in pairs}) == len({n for _, n in pairs})
    # and WILDS' Accuracy over them gives the metrics shiftbench eval gives
    scored = load_split(SC, home=cli.home).evaluate(y_pred, "test", group_by=["y", "object_color"])
    value = dict(scored.select("metric", "value").iter_rows())
    assert got["acc_avg"] == pytest.approx(value["acc_avg"], abs=1e-6) and value["acc_avg"] < 1
    assert got["acc_wg"] == pytest.approx(value["acc_wg"], abs=1e-6)
    name_of = {str(g): name for g, name in pairs}
    shiftbench = {name: v for metric, v in value.items() if (name := metric.removeprefix("acc_group:")) != metric}
    assert {name_of[g]: v for g, v in got["group_acc"].items()} == pytest.approx(shiftbench, abs=1e-6)


WILDS_SPLITS = WILDS.split("dataset = ExportedDataset")[0] + """
out = {}
for root in sys.argv[1:]:
    dataset = ExportedDataset(root)
    x, y, metadata = dataset[0]
    out[root] = {
        "split_dict": dataset.split_dict, "sizes": {s: len(dataset.get_subset(s)) for s in dataset.split_dict},
        "fields": dataset.metadata_fields, "image": list(x.size),
    }
print(json.dumps(out))
"""  # fmt: skip


def test_wilds_splits_keep_wilds_codes_and_a_missing_validation_split_is_declared_empty(
    cli: Settings, clients_python: Path, tmp_path: Path
) -> None:
    """A MetaShift task has train, val and test: WILDS' own codes. A split with no validation split (here the
    ConDS case less its id_val examples) still satisfies check_init: an empty val, said in wilds.json."""
    import dataclasses

    from shiftbench.exports import ExportOptions
    from shiftbench.exports import export as export_split
    from shiftbench.splits.published import published_split, split_images

    task = export(TASK, tmp_path / "task", "--layout", "wilds", "--image-root", "standin")
    split = published_split(cli, SC)
    split = dataclasses.replace(split, examples=split.examples.filter(pl.col("split") != "id_val"))
    done = export_split(split, split_images(cli, split), tmp_path / "noval", ExportOptions("wilds"))
    assert done.counts["val"] == 0
    both = json.loads(run_client(clients_python, WILDS_SPLITS, str(task), str(tmp_path / "noval")))

    got = both[str(task)]
    counts = dict(examples(cli, TASK).group_by("split").len().iter_rows())
    assert got["split_dict"] == {"train": 0, "val": 1, "test": 2} and got["sizes"] == counts
    assert got["fields"] == ["group", "y", "from_source_domain"] and got["image"] == [64, 64]
    got = both[str(tmp_path / "noval")]
    assert got["split_dict"] == {"train": 0, "val": 1, "test": 2} and got["sizes"]["val"] == 0
    info = json.loads((tmp_path / "noval" / "wilds.json").read_text())
    assert info["empty_splits"] == ["val"] and info["split_names"]["val"] == "Validation (OOD): empty"


# -- Hugging Face datasets, after moving the export and the warehouse ----------------------------------------------
HF = """
import json, os, sys
import datasets

loaded = datasets.load_dataset(sys.argv[1], cache_dir=sys.argv[2])
out = {}
for name, split in loaded.items():
    images = [row["image"] for row in split]
    out[name] = {
        "n": split.num_rows, "names": split.features["label"].names, "sizes": sorted({im.size for im in images}),
        "labels": dict(zip(split["example_id"], split["label"])), "splits": sorted(set(split["split"])),
    }
print(json.dumps(out))
"""


def test_hf_export_loads_with_datasets_after_the_export_and_the_warehouse_moved(
    cli: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shiftbench.exports import hf

    monkeypatch.setattr(hf, "MAX_SHARD_BYTES", 100_000)  # several shards per split, as a large split has
    target = export(SC, tmp_path / "hf", "--layout", "hf")
    shards = sorted(p.name for p in (target / "data").iterdir())
    assert "test-00004-of-00005.parquet" in shards and "train-00000-of-00001.parquet" in shards, shards
    rows = examples(cli, SC)
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_DATASETS_OFFLINE": "1"}
    with moved(cli.home, tmp_path / "warehouse-moved"), moved(target, tmp_path / "hf-moved") as where:
        code = "import os; os.environ.update(" + json.dumps(env) + ")\n" + HF
        got = json.loads(run_client(Path(sys.executable), code, str(where), str(tmp_path / "hf_cache")))
    assert list(got) == ["train", "validation", "test"]  # HF's names; validation is ConDS' id_val
    source = {"train": "train", "validation": "id_val", "test": "test"}
    names = rows.select("y", "y_name").unique().sort("y")["y_name"].to_list()
    for name, split in got.items():
        mine = rows.filter(pl.col("split") == source[name])
        assert split["n"] == mine.height and split["names"] == names and split["splits"] == [source[name]]
        assert split["labels"] == dict(zip(mine["example_id"], mine["y"], strict=True))
        assert split["sizes"] == [[64, 64]]  # every image decodes


# -- --images: the default survives moving the warehouse, symlinks do not --------------------------------------------
IMAGEFOLDER = """
import json, os, sys
from torchvision.datasets import ImageFolder

out = {}
for root in sys.argv[1:]:
    for split in sorted(f.name for f in os.scandir(root) if f.is_dir()):
        data = ImageFolder(os.path.join(root, split))
        opened = 0
        for path, _ in data.samples:
            try:
                data.loader(path)
                opened += 1
            except OSError:
                pass
        out[f"{os.path.basename(root)}/{split}"] = [len(data), opened]
print(json.dumps(out))
"""


def test_default_images_survive_moving_the_warehouse_and_symlinks_do_not(
    cli: Settings, clients_python: Path, tmp_path: Path
) -> None:
    exports = tmp_path / "exports"
    export(SC, exports / "linked", "--layout", "imagefolder")
    export(SC, exports / "copied", "--layout", "imagefolder", "--images", "copy")
    export(SC, exports / "symlinked", "--layout", "imagefolder", "--images", "symlink")
    counts = dict(examples(cli, SC).group_by("split").len().iter_rows())
    with moved(cli.home, tmp_path / "warehouse-moved"), moved(exports, tmp_path / "exports-moved") as where:
        roots = [str(where / name) for name in ("linked", "copied", "symlinked")]
        got = json.loads(run_client(clients_python, IMAGEFOLDER, *roots))
    for split, n in counts.items():
        assert got[f"linked/{split}"] == [n, n] and got[f"copied/{split}"] == [n, n]
        assert got[f"symlinked/{split}"] == [n, 0]  # every symlink dangles: the move broke the absolute paths
