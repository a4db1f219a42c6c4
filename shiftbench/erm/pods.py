"""The training pod on Kubernetes: every setting of the pod as one typed model, and the job's paths inside it.

``PipesK8sClient.run`` takes raw Kubernetes dicts (``base_pod_spec``, ``base_pod_meta``); a typo in one
of them surfaces as a pod that never schedules, or as an API error long after the run started. So
the pod is described by a YAML (or JSON) file, ``SHIFTBENCH_K8S_POD``, validated here before
anything is submitted: one bad value is one :class:`InputError` naming the file, the line and the
setting. Keys are snake_case or, as in Kubernetes manifests, camelCase.

The job reads the split version and the images and writes its outputs to paths the Dagster process
sees; the pod sees them only where a volume is mounted. ``mounted_roots`` maps a root of the Dagster
side to its path in the pod (and mounts its volume there); the job description's paths are rewritten
to in-pod paths, and a path under no mounted root is refused before the pod starts.

Pure library: no Dagster, no kubernetes import (the dicts are plain data).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from shiftbench.config.located_yaml import parse_yaml, validation_error
from shiftbench.config.textio import read_text
from shiftbench.erm.checkpoints import REGISTRY
from shiftbench.errors import InputError

SETTING = "SHIFTBENCH_K8S_POD"
JOB_COMMAND = ("python", "-m", "shiftbench.erm.job")
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
# Paths of the job description the job reads or writes (shiftbench.erm.job); out_dir is written.
JOB_PATHS = ("split_dir", "image_root", "out_dir")
WRITTEN = frozenset({"out_dir"})

# Matched whole (fullmatch: "$" would let a trailing newline through).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")
_RESOURCE_NAME = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


class _Model(BaseModel):
    """Frozen, strict about unknown keys (a misspelt setting would be silently ignored), either key case."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True, loc_by_alias=False
    )


def _dns_label(value: str, what: str) -> str:
    if not _DNS_LABEL.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a Kubernetes name (lower-case letters, digits and '-', <= 63)")
    return value


def _image_reference(value: str) -> str:
    if not value.strip() or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} is not an image reference")
    return value


def _quantity(value: Any) -> str:
    """A Kubernetes quantity as text: ``16Gi``, ``500m``, ``4`` (YAML gives numbers for the plain ones)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a Kubernetes quantity such as 16Gi, 500m or 4, got {value!r}")
    text = str(value).strip()
    if not _QUANTITY.fullmatch(text):
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 16Gi, 512Mi, 500m, 4)")
    return text


def _text(value: Any) -> Any:
    """A YAML scalar as Kubernetes text (``true``, ``4``); None stays None, to be refused as missing."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int | float) else value


def _pod_path(value: Any) -> PurePosixPath:
    path = PurePosixPath(str(value))
    if not path.is_absolute():
        raise ValueError(f"{value!r} must be an absolute path in the pod")
    return PurePosixPath(os.path.normpath(path))


class ClaimSource(_Model):
    claim_name: str
    read_only: bool = False


class HostPathSource(_Model):
    path: str
    type: str | None = None


class NfsSource(_Model):
    server: str
    path: str
    read_only: bool = False


class EmptyDirSource(_Model):
    medium: Literal["", "Memory"] = ""
    size_limit: str | None = None

    @field_validator("size_limit", mode="before")
    @classmethod
    def _size(cls, value: Any) -> str | None:
        return None if value is None else _quantity(value)


_SOURCES = ("persistent_volume_claim", "host_path", "nfs", "empty_dir", "secret", "config_map")


class Volume(_Model):
    """A pod volume: exactly one source (a claim, a host path, NFS, an emptyDir, a secret, a config map)."""

    name: str
    persistent_volume_claim: ClaimSource | None = None
    host_path: HostPathSource | None = None
    nfs: NfsSource | None = None
    empty_dir: EmptyDirSource | None = None
    secret: str | None = Field(default=None, description="the name of a secret mounted as files")
    config_map: str | None = Field(default=None, description="the name of a config map mounted as files")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _dns_label(value, "volume name")

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        given = [name for name in _SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"volume {self.name!r} needs exactly one of {', '.join(_SOURCES)}, got {len(given)}")
        return self

    def as_k8s(self) -> dict[str, Any]:
        volume: dict[str, Any] = {"name": self.name}
        if self.secret is not None:
            volume["secret"] = {"secretName": self.secret}
        elif self.config_map is not None:
            volume["configMap"] = {"name": self.config_map}
        else:
            source = next(name for name in _SOURCES if getattr(self, name) is not None)
            volume[to_camel(source)] = getattr(self, source).model_dump(by_alias=True, exclude_none=True)
        return volume


class VolumeMount(_Model):
    """A mount that carries no path of the job (``/dev/shm``, credentials)."""

    name: str
    mount_path: PurePosixPath
    sub_path: str | None = None
    read_only: bool = False

    @field_validator("mount_path", mode="before")
    @classmethod
    def _path(cls, value: Any) -> PurePosixPath:
        return _pod_path(value)

    def as_k8s(self) -> dict[str, Any]:
        mount: dict[str, Any] = {"name": self.name, "mountPath": str(self.mount_path), "readOnly": self.read_only}
        if self.sub_path:
            mount["subPath"] = self.sub_path
        return mount


class MountedRoot(_Model):
    """A root the Dagster process sees at ``local_path`` and the pod at ``pod_path`` (volume ``volume``)."""

    volume: str
    local_path: Path
    pod_path: PurePosixPath
    sub_path: str | None = None
    read_only: bool = False

    @field_validator("pod_path", mode="before")
    @classmethod
    def _pod(cls, value: Any) -> PurePosixPath:
        return _pod_path(value)

    @field_validator("local_path")
    @classmethod
    def _local(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError(f"{str(value)!r} must be an absolute path (as the Dagster process sees it)")
        return Path(os.path.normpath(value))

    def mount(self) -> VolumeMount:
        return VolumeMount(name=self.volume, mount_path=self.pod_path, sub_path=self.sub_path, read_only=self.read_only)


class Toleration(_Model):
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("a toleration with operator Exists takes no value")
        return self

    def as_k8s(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class Resources(_Model):
    """GPUs by count and resource name (a limit: Kubernetes requests extended resources at their limit),
    and any other requests and limits (``cpu``, ``memory``, ``ephemeral-storage``)."""

    gpus: int = Field(default=1, ge=0)
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    requests: dict[str, str] = Field(default_factory=dict)
    limits: dict[str, str] = Field(default_factory=dict)

    @field_validator("requests", "limits", mode="before")
    @classmethod
    def _quantities(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(name): _quantity(amount) for name, amount in value.items()}
        return value

    @field_validator("gpu_resource")
    @classmethod
    def _resource_name(cls, value: str) -> str:
        if not _RESOURCE_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a resource name (e.g. nvidia.com/gpu, amd.com/gpu)")
        return value

    @model_validator(mode="after")
    def _gpus_in_one_place(self) -> Resources:
        for section in (self.requests, self.limits):
            if self.gpu_resource in section:
                raise ValueError(f"set {self.gpu_resource} with gpus (and gpu_resource), not in requests or limits")
        return self

    def as_k8s(self) -> dict[str, Any]:
        limits = {**self.limits, **({self.gpu_resource: str(self.gpus)} if self.gpus else {})}
        resources: dict[str, Any] = {}
        if self.requests:
            resources["requests"] = dict(self.requests)
        if limits:
            resources["limits"] = limits
        return resources


class PodSettings(_Model):
    """Every setting of the training pod (``SHIFTBENCH_K8S_POD``; docs/kubernetes.md has an example)."""

    image: str | None = None
    namespace: str | None = None
    command: tuple[str, ...] = JOB_COMMAND
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str | None = None
    resources: Resources = Resources()  # frozen: one shared default is safe
    env: dict[str, str] = Field(default_factory=dict)
    env_from_secrets: tuple[str, ...] = ()
    volumes: tuple[Volume, ...] = ()
    mounted_roots: tuple[MountedRoot, ...] = ()
    volume_mounts: tuple[VolumeMount, ...] = ()
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    runtime_class_name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    wait_timeout_s: float = Field(default=86_400.0, gt=0, description="how long to wait for the pod to finish")
    keep_pod: bool = Field(default=False, description="leave the finished pod in the cluster (to read its logs)")
    termination_grace_period_seconds: int = Field(
        default=300,
        ge=1,
        le=86_400,
        description="how long Kubernetes waits after SIGTERM (a deleted or evicted pod) before it kills the job: "
        "the time the job has to finish its step and write its checkpoint",
    )

    _source: str | None = PrivateAttr(None)  # the file the settings came from, for error messages

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        return None if value is None else _dns_label(value, "namespace")

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return None if value is None else _image_reference(value)

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("the command must not be empty")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value

    @field_validator("node_selector", "labels", "annotations", "env", mode="before")
    @classmethod
    def _text_values(cls, value: Any) -> Any:
        """YAML reads ``gpu: true`` or ``count: 4`` as a bool or a number; Kubernetes wants text."""
        if isinstance(value, Mapping):
            return {k: _text(v) for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PodSettings:
        names = [volume.name for volume in self.volumes]
        if len(set(names)) != len(names):
            raise ValueError(f"volume names must differ: {', '.join(sorted(names))}")
        for mount in self.mounts():
            if mount.name not in names:
                known = f"; volumes: {', '.join(names)}" if names else ": no volumes are declared"
                raise ValueError(f"volume {mount.name!r} is mounted but not declared{known}")
        mount_paths = [str(mount.mount_path) for mount in self.mounts()]
        if len(set(mount_paths)) != len(mount_paths):
            raise ValueError(f"two mounts share a path in the pod: {', '.join(sorted(mount_paths))}")
        locals_ = [str(root.local_path) for root in self.mounted_roots]
        if len(set(locals_)) != len(locals_):
            raise ValueError(f"two mounted roots share a local path: {', '.join(sorted(locals_))}")
        return self

    @property
    def source(self) -> str | None:
        return self._source

    def mounts(self) -> list[VolumeMount]:
        return [*(root.mount() for root in self.mounted_roots), *self.volume_mounts]

    def with_overrides(self, *, image: str | None = None, namespace: str | None = None) -> PodSettings:
        """These settings with a run's ``k8s_image``/``k8s_namespace`` (a run config outranks the file)."""
        update: dict[str, str] = {}
        for field, parameter, value, check in (
            ("image", "k8s_image", image, _image_reference),
            ("namespace", "k8s_namespace", namespace, lambda text: _dns_label(text, "namespace")),
        ):
            if value is None:
                continue
            try:
                update[field] = check(value)
            except ValueError as exc:
                raise InputError(str(exc), parameter=parameter) from None
        return self.model_copy(update=update)

    def pod_spec(self) -> dict[str, Any]:
        """``base_pod_spec`` of ``PipesK8sClient.run``: the first container is the job's."""
        container: dict[str, Any] = {}
        resources = self.resources.as_k8s()
        if resources:
            container["resources"] = resources
        if self.image_pull_policy is not None:
            container["imagePullPolicy"] = self.image_pull_policy
        if self.env:
            container["env"] = [{"name": name, "value": value} for name, value in self.env.items()]
        if self.env_from_secrets:
            container["envFrom"] = [{"secretRef": {"name": name}} for name in self.env_from_secrets]
        if self.mounts():
            container["volumeMounts"] = [mount.as_k8s() for mount in self.mounts()]
        spec: dict[str, Any] = {
            "containers": [container],
            "restartPolicy": "Never",  # a stopped job is run again by the asset's retry, in a new pod (it resumes)
            "terminationGracePeriodSeconds": self.termination_grace_period_seconds,
        }
        if self.volumes:
            spec["volumes"] = [volume.as_k8s() for volume in self.volumes]
        if self.node_selector:
            spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            spec["tolerations"] = [toleration.as_k8s() for toleration in self.tolerations]
        if self.service_account is not None:
            spec["serviceAccountName"] = self.service_account
        if self.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": name} for name in self.image_pull_secrets]
        if self.runtime_class_name is not None:
            spec["runtimeClassName"] = self.runtime_class_name
        return spec

    def pod_meta(self) -> dict[str, Any]:
        """``base_pod_meta``: labels, annotations and the namespace (Dagster adds its own labels and the name)."""
        meta: dict[str, Any] = {}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        return meta

    def in_pod(self, local: str | Path, what: str) -> str:
        """Where the pod sees ``local``: under the deepest mounted root that holds it."""
        path = Path(os.path.normpath(Path(local).absolute()))
        holders = [root for root in self.mounted_roots if path.is_relative_to(root.local_path)]
        if not holders:
            mounted = ", ".join(str(root.local_path) for root in self.mounted_roots) or "none"
            raise self._error(f"{what} {path} is under no mounted root (mounted: {mounted}): add one to mounted_roots")
        root = max(holders, key=lambda r: len(r.local_path.parts))
        if what in WRITTEN and root.read_only:
            raise self._error(f"{what} {path} is under the read-only mounted root {root.local_path}: the job writes it")
        return str(root.pod_path.joinpath(*path.relative_to(root.local_path).parts))

    def in_pod_job(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """The job description with every path it reads or writes as the pod sees it."""
        rewritten = dict(job)
        for key in JOB_PATHS:
            rewritten[key] = self.in_pod(job[key], key)
        if job.get("checkpoint"):
            rewritten["checkpoint"] = self.in_pod(job["checkpoint"], "checkpoint")
        config = dict(job.get("config") or {})
        if config.get("init_checkpoint") and config["init_checkpoint"] not in REGISTRY:  # a path, not a name
            config["init_checkpoint"] = self.in_pod(config["init_checkpoint"], "init_checkpoint")
            rewritten["config"] = config
        return rewritten

    def run_kwargs(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of ``PipesK8sClient.run`` (all but ``context``) for this job."""
        if self.image is None:
            raise InputError(
                f"the training pod needs an image: set image in {self.source or SETTING} or the run config k8s_image",
                parameter="k8s_image",
            )
        return {
            "image": self.image,
            "command": list(self.command),
            "namespace": self.namespace,
            "extras": {"job": self.in_pod_job(job)},
            "base_pod_spec": self.pod_spec(),
            "base_pod_meta": self.pod_meta(),
            "pod_wait_timeout": self.wait_timeout_s,
            "delete_pod_on_completion": not self.keep_pod,
        }

    def _error(self, message: str) -> InputError:
        if self.source is None:
            return InputError(f"{message} ({SETTING} is not set)", parameter=SETTING)
        return InputError(message, path=self.source, parameter="mounted_roots")


def load_pod_settings(path: Path | None) -> PodSettings:
    """The pod settings of ``path`` (YAML or JSON); none given: the defaults (no volumes, one GPU)."""
    if path is None:
        return PodSettings()
    data = parse_yaml(read_text(path, what="pod settings file", parameter=SETTING), path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError("expected a mapping of pod settings (image, volumes, mounted_roots, ...)", path=path)
    try:
        settings = PodSettings.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data, path) from None
    settings._source = str(path)
    return settings
