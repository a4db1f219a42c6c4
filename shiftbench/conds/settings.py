"""The conds family's own settings (``SHIFTBENCH_*`` variables, read through ``Settings.of``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from shiftbench.config.settings import Flag


class CondsSettings(BaseModel):
    """ConDS: CelebA's files, the generated sprites, extra specs."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    celeba_dir: Path | None = Field(
        None,
        description="a folder with CelebA's list_attr_celeba.txt (and list_eval_partition.txt); unset: the celeba "
        "cases are skipped by build conds",
    )
    celeba_allow_partial: Flag = Field(
        False,
        description="accept an attribute file whose header count disagrees with its rows (recorded; any file with "
        "fewer than 202,599 images builds NAME@partial)",
    )
    sprites_per_combination: int = Field(
        100, ge=1, description="generated sprites per (shape, colour, background, size) combination (100: 8,100 images)"
    )
    sprites_seed: int = Field(0, ge=0, description="seed of the generated sprites")
    conds_specs: Path | None = Field(
        None, description="an extra ConDS spec file with your datasets (same format as shiftbench/specs/conds.yaml)"
    )
