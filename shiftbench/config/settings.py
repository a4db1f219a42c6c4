"""Settings from ``SHIFTBENCH_*`` environment variables (the public interface: docs/settings.md, generated
from this model by ``scripts/generate_docs.py``).

One frozen pydantic-settings model, read once per build, so a build never sees a setting change
halfway. The CLI reads the process environment (:meth:`Settings.from_env`); the Dagster resource
``ShiftbenchSettings`` binds every variable set at load time through ``EnvVar`` and builds the
same model. A value that does not parse is an :class:`InputError` naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, Field, PrivateAttr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from shiftbench.config.family_registry import REGISTRY
from shiftbench.errors import InputError, shown

ENV_PREFIX = "SHIFTBENCH_"
# Off while :meth:`Settings.parse` validates given values: they are the whole configuration, never mixed with
# whatever SHIFTBENCH_* variables the process happens to have.
_READ_ENVIRONMENT: ContextVar[bool] = ContextVar("shiftbench_read_environment", default=True)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
FamilySettings = TypeVar("FamilySettings", bound=BaseModel)


class Settings(BaseSettings):
    """Every ``SHIFTBENCH_*`` variable; the field ``x_y`` is the variable ``SHIFTBENCH_X_Y``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, env_ignore_empty=True, extra="ignore")

    home: Path = Field(
        Path("warehouse"),
        description="warehouse root: store/ (versions), cache/, catalog.duckdb, dagster_home/ (relative to the "
        "working directory)",
    )
    offline: bool = Field(
        False, description="never try a download (the only one: nltk's WordNet, when Debian's files are missing)"
    )
    fanout_executor: Literal["multiprocess", "k8s"] = Field(
        "multiprocess",
        description="the executor of fanned-out builds (the <family>_<kinds>_fanout jobs): Dagster's multiprocess "
        "executor, or dagster-k8s' k8s_job_executor (one pod per step; docs/kubernetes.md)",
    )
    erm_presets: Path | None = Field(
        None,
        description="an extra file of ERM training presets (same format as shiftbench/specs/erm.yaml; it may add "
        "presets, not reuse a shipped name)",
    )
    checkpoint_dir: Path | None = Field(
        None,
        description="where registered pretrained weights are placed (imagenet:resnet18 = resnet18-f37072fd.pth); "
        "torchvision's cache $TORCH_HOME/hub/checkpoints is searched after it",
    )
    k8s_pod: Path | None = Field(
        None,
        description="a YAML/JSON file of the training pod's settings with PipesK8sClient: image, GPUs, volumes, "
        "mounted roots (docs/kubernetes.md)",
    )
    train_backend: Literal["local", "slurm"] = Field(
        "local",
        description="where the ERM assets and `shiftbench train` run a training: `local` (a process on this machine, "
        "or the bound Pipes client's pod) or `slurm` (a Slurm job, a sweep as one job array; docs/clusters.md)",
    )
    slurm_settings: Path | None = Field(
        None,
        description="a YAML file of the Slurm jobs' settings with the slurm backend: partition, account, qos, time, "
        "gres, cpus_per_task, mem, the nodes' python, extra sbatch options (docs/clusters.md); none: the defaults",
    )
    train_retries: int = Field(
        2,
        ge=0,
        le=100,
        description="how often the ERM asset runs a training again after it stopped on SIGTERM or SIGUSR1 (a "
        "Kubernetes pod deleted or evicted, a preemption) and checkpointed; each retry resumes from the checkpoint",
    )
    check_memory: str = Field(
        "1GB",
        description="DuckDB's memory for one version's contract checks (a size such as `1GB` or `512MB`); beyond it "
        "joins and aggregates spill to the temporary folder (a GQA-scale collection's checks need it)",
    )

    # SHIFTBENCH_* values that are no field here: the families' own settings (:meth:`of`), validated with them.
    _family_values: dict[str, Any] = PrivateAttr(default_factory=dict)
    _family_settings: dict[type[BaseModel], BaseModel] = PrivateAttr(default_factory=dict)

    @field_validator("offline", mode="before")
    @classmethod
    def _flag(cls, value: Any) -> Any:
        return flag(value)

    @field_validator("home", mode="after")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if not _READ_ENVIRONMENT.get():
            return (init_settings,)
        return (init_settings, env_settings, dotenv_settings, file_secret_settings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings of ``env`` (default: the process environment); unset variables take defaults."""
        if env is None:
            settings = _validated(cls)  # pydantic-settings reads the SHIFTBENCH_* variables itself
            return settings._with_family_values(_prefixed(os.environ, cls.model_fields))
        return cls.parse(_prefixed(env, ()) if env else {})

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> Settings:
        """Validate raw values (strings or typed), ignoring the environment; names that are no field here
        are kept for the families' own settings (:meth:`of`)."""
        own = {name: value for name, value in values.items() if name in cls.model_fields}
        token = _READ_ENVIRONMENT.set(False)
        try:
            settings = _validated(lambda: cls.model_validate(own))
        finally:
            _READ_ENVIRONMENT.reset(token)
        return settings._with_family_values({k: v for k, v in values.items() if k not in cls.model_fields})

    def _with_family_values(self, values: Mapping[str, Any]) -> Settings:
        """Keep the families' values and validate every registered family's settings now: a bad value is
        one line at the start of any command, whichever family it belongs to."""
        self._family_values.update(values)
        for model in REGISTRY.settings_models():
            self.of(model)
        return self

    def of(self, model: type[FamilySettings]) -> FamilySettings:
        """A family's own settings (its package's pydantic model, fields named like the variables here:
        ``celeba_dir`` is ``SHIFTBENCH_CELEBA_DIR``), validated from this build's values."""
        found = self._family_settings.get(model)
        if found is None:
            given = {name: self._family_values[name] for name in model.model_fields if name in self._family_values}
            found = self._family_settings[model] = _validated(lambda: model.model_validate(given))
        assert isinstance(found, model)
        return found

    def value(self, name: str) -> Any:
        """The setting ``name``, a field here or of a registered family (None when unset)."""
        if name in type(self).model_fields:
            return getattr(self, name)
        for model in REGISTRY.settings_models():
            if name in model.model_fields:
                return getattr(self.of(model), name)
        return self._family_values.get(name)

    @property
    def family_values(self) -> dict[str, Any]:
        """The values given for the families' settings (as given: text from the environment)."""
        return dict(self._family_values)

    def existing_home(self, given_as: str | None = None) -> Path:
        """The warehouse, which must be there: a command that reads one never answers from an empty warehouse it
        made itself (a moved warehouse, a typo, another working directory). One line names the folder and how it
        was chosen: ``given_as`` (an argument), ``SHIFTBENCH_HOME``, or the default ``./warehouse``. Only what
        builds data on purpose (``shiftbench build``, ``generate``) creates a warehouse."""
        if self.home.is_dir():
            return self.home
        what = "is not a folder" if self.home.exists() else "is not there"
        if given_as is not None:
            raise InputError(f"no warehouse at {self.home}: it {what}", parameter=given_as)
        build = "or build one there with `shiftbench build`"
        if "home" in self.model_fields_set:
            how = f"SHIFTBENCH_HOME names it, and it {what}: point SHIFTBENCH_HOME at your warehouse, {build}"
        else:
            how = (
                f"the default ./warehouse, SHIFTBENCH_HOME being unset, and it {what}: run from the folder that "
                f"holds your warehouse, set SHIFTBENCH_HOME to it, {build}"
            )
        raise InputError(f"no warehouse at {self.home} ({how})", parameter=variable("home"))

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


def flag(value: Any) -> Any:
    """``1``/``true``/``yes``/``on`` and ``0``/``false``/``no``/``off``/empty as booleans."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
    return value


def path_list(value: Any) -> Any:
    """Comma-separated paths as a tuple."""
    if isinstance(value, str):
        return tuple(Path(part.strip()) for part in value.split(",") if part.strip())
    return value


Flag = Annotated[bool, BeforeValidator(flag)]
PathList = Annotated[tuple[Path, ...], NoDecode, BeforeValidator(path_list)]


def _prefixed(env: Mapping[str, str], skip: Any) -> dict[str, str]:
    """The non-empty ``SHIFTBENCH_*`` values of ``env`` by field name (``SHIFTBENCH_X_Y`` -> ``x_y``)."""
    return {
        key[len(ENV_PREFIX) :].lower(): text
        for key, value in env.items()
        if key.startswith(ENV_PREFIX) and (text := value.strip()) and key[len(ENV_PREFIX) :].lower() not in skip
    }


M = TypeVar("M", bound=BaseModel)


def _validated(make: Callable[[], M]) -> M:
    """Build the settings; the first bad value is an InputError naming its variable."""
    try:
        return make()
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "?"
        message = str(error["msg"]).replace("Input should be", "must be").replace("Value error, ", "")
        raise InputError(f"{message}, got {shown(error.get('input'))}", parameter=variable(name)) from None


def variable(field: str) -> str:
    """The environment variable of a settings field: ``celeba_dir`` -> ``SHIFTBENCH_CELEBA_DIR``."""
    return f"{ENV_PREFIX}{field.upper()}"
