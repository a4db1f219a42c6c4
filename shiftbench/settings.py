"""Settings from ``SHIFTBENCH_*`` environment variables (the public interface in the README).

One frozen object, read once per build, so a build never sees a setting change halfway.
Dagster resources and the CLI both construct it through :meth:`Settings.from_env`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shiftbench.errors import InputError

BREEDS_DEFAULT_URL = "https://github.com/MadryLab/BREEDS-Benchmarks/raw/master/imagenet_class_hierarchy/modified"


def _path(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name, "").strip()
    return Path(value).expanduser() if value else None


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not text.lstrip("-").isdigit() or int(text) < minimum:
        raise InputError(f"must be an integer >= {minimum}, got {text!r}", parameter=name)
    return int(text)


@dataclass(frozen=True)
class Settings:
    home: Path
    imagenet_hierarchy_dir: Path | None = None
    breeds_hierarchy_dir: Path | None = None
    imagenet_dir: Path | None = None
    breeds_calibration: Path | None = None
    wordnet_dict_dir: Path = Path("/usr/share/wordnet")
    breeds_url: str = BREEDS_DEFAULT_URL
    offline: bool = False
    download_timeout_s: float = 10.0
    gqa_scene_graphs: tuple[Path, ...] = ()
    tags_table: Path | None = None
    metashift_class_groups: Path | None = None
    celeba_dir: Path | None = None
    celeba_allow_partial: bool = False
    sprites_per_combination: int = 100
    sprites_seed: int = 0
    gqa_images_dir: Path | None = None  # Visual Genome / GQA images, <image_id>.jpg (ERM on MetaShift)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            home=(_path(env, "SHIFTBENCH_HOME") or Path("warehouse")).absolute(),
            imagenet_hierarchy_dir=_path(env, "SHIFTBENCH_IMAGENET_HIERARCHY_DIR"),
            breeds_hierarchy_dir=_path(env, "SHIFTBENCH_BREEDS_HIERARCHY_DIR"),
            imagenet_dir=_path(env, "SHIFTBENCH_IMAGENET_DIR"),
            breeds_calibration=_path(env, "SHIFTBENCH_BREEDS_CALIBRATION"),
            wordnet_dict_dir=_path(env, "SHIFTBENCH_WORDNET_DICT_DIR") or Path("/usr/share/wordnet"),
            breeds_url=env.get("SHIFTBENCH_BREEDS_URL", "").strip() or BREEDS_DEFAULT_URL,
            offline=_flag(env, "SHIFTBENCH_OFFLINE"),
            download_timeout_s=float(env.get("SHIFTBENCH_DOWNLOAD_TIMEOUT_S", "") or 10.0),
            gqa_scene_graphs=tuple(
                Path(part.strip()) for part in env.get("SHIFTBENCH_GQA_SCENE_GRAPHS", "").split(",") if part.strip()
            ),
            tags_table=_path(env, "SHIFTBENCH_TAGS_TABLE"),
            metashift_class_groups=_path(env, "SHIFTBENCH_METASHIFT_CLASS_GROUPS"),
            celeba_dir=_path(env, "SHIFTBENCH_CELEBA_DIR"),
            celeba_allow_partial=_flag(env, "SHIFTBENCH_CELEBA_ALLOW_PARTIAL"),
            sprites_per_combination=_int(env, "SHIFTBENCH_SPRITES_PER_COMBINATION", 100, minimum=1),
            sprites_seed=_int(env, "SHIFTBENCH_SPRITES_SEED", 0, minimum=0),
            gqa_images_dir=_path(env, "SHIFTBENCH_GQA_IMAGES_DIR"),
        )

    @property
    def store_dir(self) -> Path:
        return self.home / "store"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def runs_dir(self) -> Path:
        """Scratch space of training runs (outputs before they are published)."""
        return self.home / "runs"

    @property
    def catalog_path(self) -> Path:
        return self.home / "catalog.duckdb"
