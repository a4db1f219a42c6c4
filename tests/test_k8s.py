"""The Kubernetes launch of the training job, without a cluster.

``PipesK8sClient.run`` is replaced by one that records its arguments; the pod body is then built by
dagster-k8s's own ``build_pod_body`` and serialized as the API would receive it, so what is asserted
is what a cluster would be sent.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_k8s import PipesK8sClient
from dagster_k8s.pipes import build_pod_body
from kubernetes.client import ApiClient

from shiftbench.assets import erm
from shiftbench.assets.resources import resource_class
from shiftbench.config.settings import Settings
from shiftbench.erm import pods
from shiftbench.errors import InputError

PIPES_ENV = {"DAGSTER_PIPES_CONTEXT": "context-payload", "DAGSTER_PIPES_MESSAGES": "messages-payload"}


class CapturingK8sClient(PipesK8sClient):
    """Records what it would submit instead of talking to a cluster."""

    def __init__(self) -> None:
        super().__init__(load_incluster_config=False)
        self.calls: list[dict[str, Any]] = []

    def run(self, **kwargs: Any) -> None:  # type: ignore[override]
        self.calls.append(kwargs)


class CapturingSubprocessClient:
    """Stands in for PipesSubprocessClient; its class name even mimics the K8s client's (type decides)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def run(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)


PipesK8sClientLookalike = type("PipesK8sClient", (CapturingSubprocessClient,), {})


def pod_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(text.replace("HOME", str(tmp_path / "home")).replace("DATA", str(tmp_path / "data")), "utf-8")
    return path


FULL_POD = """\
image: registry.lab/shiftbench-gpu:2.11
namespace: ml-train
command: [/opt/venv/bin/python, -m, shiftbench.erm.job]
imagePullPolicy: IfNotPresent
image_pull_secrets: [lab-registry]
service_account: shiftbench-trainer
runtime_class_name: nvidia
resources:
  requests: {cpu: 8, memory: 32Gi}
  limits: {memory: 48Gi}
env: {OMP_NUM_THREADS: 8, HF_HUB_OFFLINE: "1"}
env_from_secrets: [wandb]
volumes:
  - name: warehouse
    persistentVolumeClaim: {claimName: shiftbench-warehouse}
  - name: imagenet
    nfs: {server: nfs.lab, path: /exports/imagenet, read_only: true}
  - name: dshm
    empty_dir: {medium: Memory, size_limit: 8Gi}
mounted_roots:
  - {volume: warehouse, local_path: HOME, pod_path: /mnt/shiftbench}
  - {volume: imagenet, local_path: DATA/imagenet, pod_path: /mnt/imagenet, read_only: true}
volume_mounts:
  - {name: dshm, mountPath: /dev/shm}
nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, gpu: true}
tolerations:
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  - {key: team, value: vision, effect: NoExecute, toleration_seconds: 60}
labels: {team: vision}
"""


def asset_context(tmp_path: Path, pod: Path | None) -> Any:
    values = {"home": str(tmp_path / "home")} | ({"k8s_pod": str(pod)} if pod is not None else {})
    return dg.build_asset_context(resources={"settings": resource_class()(**values)})


def job_under(tmp_path: Path, image_root: Path | None = None, **config: Any) -> dict[str, Any]:
    home = tmp_path / "home"
    return {
        "split_dir": str(home / "store" / "conds" / "sprites-sc" / "versions" / "v1"),
        "image_root": str(image_root or home / "cache" / "standin" / "sprites-sc-v1"),
        "path_template": "images/{}.png",
        "config": {"model": "small_cnn", "seed": 0, **config},
        "out_dir": str(home / "runs" / "sprites-sc.erm.small_cnn.seed0" / "run-1"),
    }


def submitted(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The pod as the Kubernetes API would receive it (camelCase JSON), built by dagster-k8s itself."""
    body = build_pod_body(
        pod_name="shiftbench-erm-test",
        image=kwargs["image"],
        command=kwargs["command"],
        env_vars=PIPES_ENV,
        base_pod_meta=kwargs["base_pod_meta"],
        base_pod_spec=kwargs["base_pod_spec"],
    )
    serialized: dict[str, Any] = ApiClient().sanitize_for_serialization(body)
    return serialized


def launch_k8s(tmp_path: Path, pod: Path | None, job: dict[str, Any], **config: Any) -> dict[str, Any]:
    client = CapturingK8sClient()
    context = asset_context(tmp_path, pod)
    erm._launch(context, client, job, erm.BaselineConfig(**config))
    assert len(client.calls) == 1
    assert client.calls[0]["context"] is context
    return client.calls[0]


def test_pod_body_carries_every_setting(tmp_path: Path) -> None:
    pod = pod_file(tmp_path, FULL_POD)
    job = job_under(tmp_path, image_root=tmp_path / "data" / "imagenet" / "train")
    kwargs = launch_k8s(tmp_path, pod, job)
    assert kwargs["namespace"] == "ml-train"
    assert kwargs["pod_wait_timeout"] == 86_400.0 and kwargs["delete_pod_on_completion"] is True
    body = submitted(kwargs)
    metadata, spec = body["metadata"], body["spec"]
    assert metadata["namespace"] == "ml-train"
    assert metadata["labels"]["team"] == "vision" and metadata["labels"]["app.kubernetes.io/part-of"] == "dagster"
    assert spec["restartPolicy"] == "Never"
    [container] = spec["containers"]
    assert container["image"] == "registry.lab/shiftbench-gpu:2.11"
    assert container["command"] == ["/opt/venv/bin/python", "-m", "shiftbench.erm.job"]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi"},
        "limits": {"memory": "48Gi", "nvidia.com/gpu": "1"},
    }
    assert container["env"] == [
        {"name": "OMP_NUM_THREADS", "value": "8"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        *({"name": name, "value": value} for name, value in PIPES_ENV.items()),
    ]
    assert container["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert container["volumeMounts"] == [
        {"name": "warehouse", "mountPath": "/mnt/shiftbench", "readOnly": False},
        {"name": "imagenet", "mountPath": "/mnt/imagenet", "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm", "readOnly": False},
    ]
    assert spec["volumes"] == [
        {"name": "warehouse", "persistentVolumeClaim": {"claimName": "shiftbench-warehouse", "readOnly": False}},
        {"name": "imagenet", "nfs": {"server": "nfs.lab", "path": "/exports/imagenet", "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
    ]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "gpu": "true"}
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "team", "operator": "Equal", "value": "vision", "effect": "NoExecute", "tolerationSeconds": 60},
    ]
    assert spec["serviceAccountName"] == "shiftbench-trainer"
    assert spec["imagePullSecrets"] == [{"name": "lab-registry"}]
    assert spec["runtimeClassName"] == "nvidia"
    # The job the pod receives reads and writes through the mounts.
    assert kwargs["extras"]["job"] == {
        **job,
        "split_dir": "/mnt/shiftbench/store/conds/sprites-sc/versions/v1",
        "image_root": "/mnt/imagenet/train",
        "out_dir": "/mnt/shiftbench/runs/sprites-sc.erm.small_cnn.seed0/run-1",
    }


def test_gpu_limit_defaults_to_one_nvidia_gpu_and_is_configurable(tmp_path: Path) -> None:
    default = pods.PodSettings(image="img").pod_spec()["containers"][0]["resources"]
    assert default == {"limits": {"nvidia.com/gpu": "1"}}
    pod = pod_file(tmp_path, "resources: {gpus: 4, gpu_resource: amd.com/gpu}\n")
    assert pods.load_pod_settings(pod).pod_spec()["containers"][0]["resources"] == {"limits": {"amd.com/gpu": "4"}}
    cpu_only = pods.PodSettings.model_validate({"resources": {"gpus": 0}}).pod_spec()["containers"][0]
    assert "resources" not in cpu_only


def test_run_config_outranks_the_pod_file(tmp_path: Path) -> None:
    pod = pod_file(tmp_path, FULL_POD)
    kwargs = launch_k8s(
        tmp_path, pod, job_under(tmp_path), k8s_image="registry.lab/shiftbench-gpu:dev", k8s_namespace="scratch"
    )
    body = submitted(kwargs)
    assert body["spec"]["containers"][0]["image"] == "registry.lab/shiftbench-gpu:dev"
    assert kwargs["namespace"] == "scratch" and body["metadata"]["namespace"] == "scratch"
    with pytest.raises(InputError, match=r"^parameter 'k8s_namespace': namespace 'ML_Train' is not a Kubernetes name"):
        launch_k8s(tmp_path, pod, job_under(tmp_path), k8s_namespace="ML_Train")


def test_job_paths_are_rewritten_to_the_deepest_mounted_root(tmp_path: Path) -> None:
    pod = pods.PodSettings.model_validate(
        {
            "volumes": [{"name": "warehouse", "host_path": {"path": "/srv"}}, {"name": "cache", "empty_dir": {}}],
            "mounted_roots": [
                {"volume": "warehouse", "local_path": str(tmp_path / "home"), "pod_path": "/mnt/shiftbench"},
                {"volume": "cache", "local_path": str(tmp_path / "home" / "cache"), "pod_path": "/scratch/cache"},
            ],
        }
    )
    checkpoint = tmp_path / "home" / "runs" / "source" / ".." / "source-model.pt"
    job = job_under(tmp_path, init_checkpoint=str(checkpoint))
    rewritten = pod.in_pod_job(job)
    assert rewritten["split_dir"] == "/mnt/shiftbench/store/conds/sprites-sc/versions/v1"
    assert rewritten["image_root"] == "/scratch/cache/standin/sprites-sc-v1"  # the nested root wins
    assert rewritten["out_dir"] == "/mnt/shiftbench/runs/sprites-sc.erm.small_cnn.seed0/run-1"
    assert rewritten["config"] == {**job["config"], "init_checkpoint": "/mnt/shiftbench/runs/source-model.pt"}
    assert rewritten["path_template"] == job["path_template"]
    assert job["split_dir"].startswith(str(tmp_path))  # the launcher's own job is left as it was


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"image_root": "DATA/elsewhere/images"}, "image_root DATA/elsewhere/images is under no mounted root"),
        ({"image_root": "HOME2/images"}, "image_root HOME2/images is under no mounted root"),  # not a prefix match
        ({"split_dir": "HOME/../data/split"}, "split_dir DATA/split is under no mounted root"),
        ({"out_dir": "DATA/imagenet/out"}, "out_dir DATA/imagenet/out is under the read-only mounted root"),
        ({"config": {"init_checkpoint": "/opt/weights.pt"}}, "init_checkpoint /opt/weights.pt is under no mounted"),
    ],
)
def test_a_path_outside_the_mounted_roots_is_refused(tmp_path: Path, change: dict[str, Any], fragment: str) -> None:
    pod = pod_file(tmp_path, FULL_POD)
    home, data = str(tmp_path / "home"), str(tmp_path / "data")
    expand = {
        key: value.replace("HOME", home).replace("DATA", data) for key, value in change.items() if key != "config"
    }
    job = {**job_under(tmp_path, **change.get("config", {})), **expand}
    client = CapturingK8sClient()
    with pytest.raises(InputError) as caught:
        erm._launch(asset_context(tmp_path, pod), client, job, erm.BaselineConfig())
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{pod}, parameter 'mounted_roots': ")
    assert fragment.replace("HOME", home).replace("DATA", data) in message
    assert not client.calls  # nothing was submitted


def test_without_a_pod_file_the_k8s_branch_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^parameter 'SHIFTBENCH_K8S_POD': split_dir .* under no mounted root"):
        launch_k8s(tmp_path, None, job_under(tmp_path), k8s_image="img")
    no_image = pod_file(tmp_path, "mounted_roots: []\n")
    with pytest.raises(InputError, match=rf"^parameter 'k8s_image': .*set image in {re.escape(str(no_image))} "):
        launch_k8s(tmp_path, no_image, job_under(tmp_path))


def test_the_branch_is_chosen_by_type(tmp_path: Path) -> None:
    job = job_under(tmp_path)
    for client in (CapturingSubprocessClient(), PipesK8sClientLookalike()):
        context = asset_context(tmp_path, None)
        erm._launch(context, client, job, erm.BaselineConfig())
        assert client.calls == [{"command": erm.JOB_COMMAND, "context": context, "extras": {"job": job}}]
    kwargs = launch_k8s(tmp_path, pod_file(tmp_path, FULL_POD), job)
    assert kwargs["image"] == "registry.lab/shiftbench-gpu:2.11"  # a PipesK8sClient subclass: the pod


def test_the_subprocess_path_needs_no_dagster_k8s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dagster_k8s", None)  # what "not installed" looks like to an import
    client = CapturingSubprocessClient()
    erm._launch(asset_context(tmp_path, None), client, job_under(tmp_path), erm.BaselineConfig())
    assert client.calls[0]["command"] == erm.JOB_COMMAND
    # And the code location's modules import without it.
    script = "import sys; sys.modules['dagster_k8s'] = None; import shiftbench.assets.erm, shiftbench.erm.pods"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("text", "where", "fragment"),
    [
        ("nodeSelectr: {gpu: a100}\n", ":1, parameter 'nodeSelectr'", "unknown setting"),
        ("image: x\nresources:\n  gpus: -1\n", ":3, parameter 'resources.gpus'", "greater than or equal to 0"),
        ("resources:\n  limits: {memory: 16GB}\n", ":2, parameter 'resources.limits'", "'16GB' is not a Kubernetes"),
        (
            "resources:\n  limits: {nvidia.com/gpu: 2}\n",
            ":1, parameter 'resources'",
            "set nvidia.com/gpu with gpus",
        ),
        (
            "volumes:\n  - name: w\n    nfs: {server: s, path: /p}\n    host_path: {path: /p}\n",
            ":2, parameter 'volumes.0'",
            "needs exactly one of",
        ),
        (
            "volumes:\n  - name: Warehouse\n    empty_dir: {}\n",
            ":2, parameter 'volumes.0.name'",
            "not a Kubernetes name",
        ),
        (
            "mounted_roots:\n  - {volume: w, local_path: /srv, pod_path: /mnt}\n",
            ": ",
            "volume 'w' is mounted but not declared: no volumes are declared",
        ),
        (
            "volumes: [{name: w, empty_dir: {}}]\nmounted_roots:\n  - {volume: w, local_path: srv, pod_path: /mnt}\n",
            ":3, parameter 'mounted_roots.0.local_path'",
            "'srv' must be an absolute path",
        ),
        ("namespace: ML_Train\n", ":1, parameter 'namespace'", "not a Kubernetes name"),
        (
            "tolerations:\n  - {key: gpu, effect: NoSchedul}\n",
            ":2, parameter 'tolerations.0.effect'",
            "must be 'NoSchedule', 'PreferNoSchedule' or 'NoExecute'",
        ),
        ("- image: x\n", ": ", "expected a mapping of pod settings"),
        ("image: [unclosed\n", ":2: ", "invalid YAML"),
        ('{"image": "x", "keep_pod": "sometimes"}', ":1, parameter 'keep_pod'", "valid boolean"),
        ("terminationGracePeriodSeconds: 0\n", ":1, parameter 'termination_grace_period_seconds'", "or equal to 1"),
    ],
)
def test_bad_pod_settings_are_one_line_naming_the_file(tmp_path: Path, text: str, where: str, fragment: str) -> None:
    pod = pod_file(tmp_path, text)
    with pytest.raises(InputError) as caught:
        pods.load_pod_settings(pod)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{pod}{where}"), message
    assert fragment in message


def test_the_pod_gives_the_job_time_to_checkpoint_and_is_never_restarted_in_place(tmp_path: Path) -> None:
    """A deleted or evicted pod gets SIGTERM, then SIGKILL after the grace period: the job checkpoints in it. The pod
    itself is not restarted; the asset's retry runs a new one, which resumes (tests/test_resume.py)."""
    job = job_under(tmp_path, image_root=tmp_path / "data" / "imagenet" / "train")
    spec = submitted(launch_k8s(tmp_path, pod_file(tmp_path, FULL_POD), job))["spec"]
    assert (spec["restartPolicy"], spec["terminationGracePeriodSeconds"]) == ("Never", 300)
    longer = pod_file(tmp_path, FULL_POD + "terminationGracePeriodSeconds: 900\n")
    assert submitted(launch_k8s(tmp_path, longer, job))["spec"]["terminationGracePeriodSeconds"] == 900


def test_a_bad_pod_file_fails_the_launch_before_submitting(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    client = CapturingK8sClient()
    with pytest.raises(
        InputError, match=rf"^{re.escape(str(missing))}, parameter 'SHIFTBENCH_K8S_POD': pod settings file not found$"
    ):
        erm._launch(asset_context(tmp_path, missing), client, job_under(tmp_path), erm.BaselineConfig())
    assert not client.calls


def test_the_setting_reads_its_variable(tmp_path: Path) -> None:
    assert Settings.from_env({"SHIFTBENCH_K8S_POD": str(tmp_path / "pod.yaml")}).k8s_pod == tmp_path / "pod.yaml"
    assert Settings.from_env({}).k8s_pod is None


def test_the_fanned_out_collection_job_runs_on_the_executor_the_setting_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same fan-out job on Dagster's multiprocess executor, or on dagster-k8s' job executor (a pod per step)."""
    from shiftbench.pipelines.definitions import build_definitions

    for setting, executor in (("multiprocess", "multiprocess"), ("k8s", "k8s")):
        monkeypatch.setenv("SHIFTBENCH_FANOUT_EXECUTOR", setting)
        job = build_definitions().resolve_job_def("metashift_collections_fanout")
        assert job.executor_def.name == executor
        assert sorted(node.name for node in job.nodes) == [
            "metashift__collection_plan",
            "metashift__collection_publish",
            "metashift__collection_unit",
        ]
