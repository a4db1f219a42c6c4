"""The metashift family's own settings (``SHIFTBENCH_*`` variables, read through ``Settings.of``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from shiftbench.config.settings import PathList


class MetaShiftSettings(BaseModel):
    """MetaShift: GQA scene graphs (or a tags table), its images, class groups, extra specs, build buckets."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    gqa_scene_graphs: PathList = Field(
        (),
        description="GQA scene-graph JSON files, comma-separated (train_sceneGraphs.json,val_sceneGraphs.json); "
        "unset: the shipped attribute annotations (attribute contexts) and the generated scene sample (object and "
        "general contexts, @generated)",
    )
    tags_table: Path | None = Field(
        None,
        description="instead of GQA: a Parquet/CSV table image_id, tag[, kind] (kind = object or general), e.g. COCO "
        "labels",
    )
    metashift_class_groups: Path | None = Field(
        None,
        description='a class grouping {"group": [object names]} (MetaShift\'s class_hierarchy.json), used with --set '
        "group_classes=true",
    )
    metashift_specs: Path | None = Field(
        None, description="an extra MetaShift spec file (same format as shiftbench/specs/metashift.yaml)"
    )
    metashift_buckets: int = Field(
        0,
        ge=0,
        description="build a collection's classes in this many buckets, each in a worker process (0: on threads of "
        "this process); the version is the same either way",
    )
    gqa_images_dir: Path | None = Field(
        None, description="Visual Genome / GQA images (<image_id>.jpg), for ERM on MetaShift tasks"
    )
