"""The breeds family's own settings (``SHIFTBENCH_*`` variables, read through ``Settings.of``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BreedsSettings(BaseModel):
    """BREEDS: the ImageNet hierarchy (WordNet, the release or files), its calibration, ImageNet's images, specs."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    imagenet_hierarchy_dir: Path | None = Field(
        None,
        description="ImageNet-format hierarchy files: wordnet.is_a.txt (parent child per line), words.txt (wnid TAB "
        "names); unset: WordNet 3.0 from Debian's files",
    )
    wordnet_dict_dir: Path = Field(
        Path("/usr/share/wordnet"),
        description="the WordNet 3.0 database (data.noun is read; the parsed hierarchy is cached under "
        "$SHIFTBENCH_HOME/cache/wordnet)",
    )
    breeds_hierarchy_dir: Path | None = Field(
        None,
        description="BREEDS calibrated hierarchy files: class_hierarchy.txt, node_names.txt, dataset_class_info.json "
        "(the release's files give the same versions as the default); unset: WordNet + the shipped BREEDS calibration",
    )
    breeds_hierarchy_source: Literal["release", "wordnet-default"] = Field(
        "release",
        description="release: the BREEDS hierarchy (SHIFTBENCH_BREEDS_HIERARCHY_DIR, else WordNet + the shipped "
        "calibration); wordnet-default: the project's own calibration of WordNet (names get @wordnet-default)",
    )
    breeds_calibration: Path | None = Field(
        None, description="an edit file applied on top of the hierarchy (format: docs/breeds.md, Calibration)"
    )
    breeds_specs: Path | None = Field(
        None, description="an extra BREEDS spec file (same format as shiftbench/specs/breeds.yaml)"
    )
    imagenet_dir: Path | None = Field(
        None,
        description="an ILSVRC-2012 root; train/<wnid>/*.JPEG are listed (never opened); unset: the 50,000 packaged "
        "validation labels only",
    )
    imagenet21k_dir: Path | None = Field(
        None,
        description="an ImageNet-21k root: class folders <wnid>/*.JPEG directly or under fall11_whole/ or "
        "winter21_whole/ (listed, never opened); unset: 21k benchmarks hold classes and subpopulations, no images",
    )
    imagenet21k_class_source: Literal["package", "timm"] = Field(
        "package",
        description="where the ImageNet-21k/22k/12k class lists come from: package (shipped, derived from timm's "
        "files) or timm (the files of an installed timm, read without importing it)",
    )
    imagenet21k_calibration: Path | None = Field(
        None,
        description="an edit file applied to WordNet restricted to the ImageNet-21k classes, before the project's "
        "tree rule (format: docs/breeds.md, Calibration)",
    )
