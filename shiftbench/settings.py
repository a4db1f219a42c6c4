"""Settings from ``SHIFTBENCH_*`` environment variables (the public interface in the README).

One frozen pydantic-settings model, read once per build, so a build never sees a setting change
halfway. The CLI reads the process environment (:meth:`Settings.from_env`); the Dagster resource
``ShiftbenchSettings`` binds every variable set at load time through ``EnvVar`` and builds the
same model. A value that does not parse is an :class:`InputError` naming the variable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shiftbench.errors import InputError

ENV_PREFIX = "SHIFTBENCH_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class Settings(BaseSettings):
    """Every ``SHIFTBENCH_*`` variable; the field ``x_y`` is the variable ``SHIFTBENCH_X_Y``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, env_ignore_empty=True, extra="ignore")

    home: Path = Field(Path("warehouse"), description="warehouse root: store/, cache/, catalog.duckdb, dagster_home/")
    imagenet_hierarchy_dir: Path | None = Field(None, description="ImageNet-format hierarchy files")
    wordnet_dict_dir: Path = Field(Path("/usr/share/wordnet"), description="the WordNet database nltk reads")
    breeds_hierarchy_dir: Path | None = Field(None, description="BREEDS calibrated hierarchy files")
    breeds_hierarchy_source: Literal["release", "wordnet-default"] = Field(
        "release",
        description="release: the BREEDS hierarchy (SHIFTBENCH_BREEDS_HIERARCHY_DIR, else WordNet + the shipped "
        "calibration); wordnet-default: the project's own calibration of WordNet (names get @wordnet-default)",
    )
    breeds_calibration: Path | None = Field(None, description="an edit file applied on top of the hierarchy")
    breeds_specs: Path | None = Field(None, description="an extra BREEDS spec file")
    imagenet_dir: Path | None = Field(None, description="an ILSVRC-2012 root")
    offline: bool = Field(False, description="never try a download (of WordNet through nltk)")
    gqa_scene_graphs: Annotated[tuple[Path, ...], NoDecode] = Field((), description="GQA scene-graph JSON files")
    tags_table: Path | None = Field(None, description="an image -> tag table instead of GQA")
    metashift_class_groups: Path | None = Field(None, description="a class grouping for group_classes=true")
    metashift_specs: Path | None = Field(None, description="an extra MetaShift spec file")
    fanout_executor: Literal["multiprocess", "k8s"] = Field(
        "multiprocess",
        description="the executor of fanned-out builds (metashift_collections_fanout): Dagster's multiprocess "
        "executor, or dagster-k8s' k8s_job_executor (one pod per step; docs/kubernetes.md)",
    )
    metashift_buckets: int = Field(
        0,
        ge=0,
        description="build a collection's classes in this many buckets, each in a worker process (0: on threads of "
        "this process); the version is the same either way",
    )
    gqa_images_dir: Path | None = Field(None, description="Visual Genome / GQA images, <image_id>.jpg")
    celeba_dir: Path | None = Field(None, description="a folder with CelebA's list_attr_celeba.txt")
    celeba_allow_partial: bool = Field(False, description="accept an attribute file whose header count disagrees")
    sprites_per_combination: int = Field(100, ge=1, description="generated sprites per combination")
    sprites_seed: int = Field(0, ge=0, description="seed of the generated sprites")
    conds_specs: Path | None = Field(None, description="an extra ConDS spec file")
    erm_presets: Path | None = Field(None, description="an extra file of ERM presets")
    checkpoint_dir: Path | None = Field(
        None, description="where registered pretrained weights are placed (before torchvision's cache)"
    )
    k8s_pod: Path | None = Field(
        None,
        description="a YAML/JSON file of the training pod's settings with PipesK8sClient: image, GPUs, volumes, "
        "mounted roots (docs/kubernetes.md)",
    )

    @field_validator("gqa_scene_graphs", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(Path(part.strip()) for part in value.split(",") if part.strip())
        return value

    @field_validator("offline", "celeba_allow_partial", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip().lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
        return value

    @field_validator("home", mode="after")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings of ``env`` (default: the process environment); unset variables take defaults."""
        if env is None:
            return _validated(cls)  # pydantic-settings reads the SHIFTBENCH_* variables itself
        values = {name: text for name in cls.model_fields if (text := env.get(variable(name), "").strip())}
        return cls.parse(values)

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> Settings:
        """Validate raw values (strings or typed), ignoring the environment."""
        return _validated(lambda: cls.model_validate(dict(values)))

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

    @property
    def variants_path(self) -> Path:
        """Named variants (``--name``): their base spec and overrides, one file for every family."""
        return self.home / "variants.json"


def _validated(make: Callable[[], Settings]) -> Settings:
    """Build the settings; the first bad value is an InputError naming its variable."""
    try:
        return make()
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "?"
        message = str(error["msg"]).replace("Input should be", "must be").replace("Value error, ", "")
        raise InputError(f"{message}, got {error.get('input')!r}", parameter=variable(name)) from None


def variable(field: str) -> str:
    """The environment variable of a settings field: ``celeba_dir`` -> ``SHIFTBENCH_CELEBA_DIR``."""
    return f"{ENV_PREFIX}{field.upper()}"
