"""The serving pod of a SpeculativeDeployment: the one place that says what it holds. Where each model and
file is (the server configuration, `serverconfig.py`, points the server at these paths), what is mounted
where, what runs before the server, what it requests and where it is scheduled (the Deployment,
`serving.py`, puts these into its pod template). Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from specdeploy_operator.api import EngineBuild, EngineRole, ModelSource, SpeculativeDeployment

from .common import configmap_name, quantity_value
from .download import CheckpointFetch, fetch_checkpoint
from .engines import engine_models, gpu_product
from .identity import PodIdentity, pull_secrets, serving_service_account
from .layout import (
    CREDENTIALS_MOUNT,
    MODELS_MOUNT,
    CacheLayout,
    builder_image,
    served_source_mount,
    server_image,
    verify_script,
)
from .scheduling import GpuScheduling
from .settings import OperatorSettings

__all__ = [
    "API_KEY_MOUNT",
    "CHAT_TEMPLATE_MOUNT",
    "CONFIG_FILE",
    "CONFIG_MOUNT",
    "PRESTOP_SECONDS",
    "ModelPaths",
    "ServingPod",
    "cpu_resources",
    "cpu_threads",
    "grace_period",
    "serving_pod",
    "serving_scheduling",
    "shutdown_timeout",
]

CONFIG_MOUNT: Final = "/etc/specdeploy"
CONFIG_FILE: Final = "server.yaml"
CHAT_TEMPLATE_FILE: Final = "template.jinja"
API_KEY_MOUNT: Final = "/var/run/secrets/specdeploy/api-key"
CHAT_TEMPLATE_MOUNT: Final = "/etc/specdeploy/chat-template"
PRESTOP_SECONDS: Final = 5
"""The pod keeps taking requests this long after it is marked for deletion (a preStop sleep), while Services
and load balancers stop routing to it; only then does the server get SIGTERM and start draining."""
SHUTDOWN_MARGIN_SECONDS: Final = 5
"""The server finishes draining this long before the kubelet's SIGKILL (uvicorn's backstop, model unload)."""


@dataclass(frozen=True, slots=True)
class ModelPaths:
    """Where the server finds each model: a built engine in the cache, a staged or downloaded checkpoint, or a
    claim's checkpoint."""

    target: str
    draft: str | None
    speculative_model: str | None
    """TensorRT-LLM's `speculative_model`: the EAGLE-3 head, or the PARD or DFlash draft."""
    tokenizer: str | None
    """The tokenizer copied next to a built target engine (backend `tensorrt`)."""


@dataclass(frozen=True, slots=True)
class ServingPod:
    """The facts of one serving pod."""

    image: str
    paths: ModelPaths
    config_file: str
    api_key_file: str | None
    chat_template_file: str | None
    grace_period_seconds: int
    engine_hashes: str
    """`<role>=<hash>,...` of the engines the pod serves (empty without any)."""
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    """The server container's volume mounts."""
    init_containers: list[dict[str, Any]]
    """What runs before the server: the engines' check, then the downloads of checkpoints loaded directly."""
    resources: dict[str, Any]
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    identity: PodIdentity
    """ServiceAccount, pull secrets and whether the account's token is mounted (`identity.py`)."""


def grace_period(sdep: SpeculativeDeployment, settings: OperatorSettings) -> int:
    """`terminationGracePeriodSeconds` of the serving pods: the spec's, else the operator's."""
    grace = sdep.spec.serving.termination_grace_period_seconds
    return grace if grace is not None else settings.termination_grace_period_seconds


def shutdown_timeout(sdep: SpeculativeDeployment, settings: OperatorSettings) -> int:
    """The server's `shutdownTimeoutSeconds`: what is left of the grace period after the preStop sleep and the
    margin (grace = preStop + drain + margin, docs/server.md)."""
    return max(grace_period(sdep, settings) - PRESTOP_SECONDS - SHUTDOWN_MARGIN_SECONDS, 1)


def cpu_resources(sdep: SpeculativeDeployment, settings: OperatorSettings) -> dict[str, Any]:
    """Container resources of a serving pod on CPUs (`spec.placement.device: cpu`): `spec.serving.resources`,
    else the operator's defaults."""
    if sdep.spec.serving.resources is not None:
        return sdep.spec.serving.resources.to_dict()
    return {
        "limits": {"memory": settings.cpu_serving_memory_limit},
        "requests": {"cpu": settings.cpu_serving_cpu_request, "memory": settings.cpu_serving_memory_request},
    }


def cpu_threads(resources: dict[str, Any]) -> int:
    """torch threads of a server on CPUs: its CPU limit, else its CPU request, rounded up; at least 1."""
    cpu = (resources.get("limits") or {}).get("cpu")
    if cpu is None:
        cpu = (resources.get("requests") or {}).get("cpu")
    if cpu is None:
        return 1
    return max(1, math.ceil(quantity_value(cpu)))


def serving_scheduling(sdep: SpeculativeDeployment, settings: OperatorSettings) -> GpuScheduling:
    """The GPUs of one serving pod: `gpusPerReplica` of `placement.gpuResource` on the GPU product, shared out
    over the nodes of a replica that spans several (each of its pods takes a whole node's GPUs)."""
    spec = sdep.spec
    return GpuScheduling(
        product=gpu_product(sdep, settings),
        count=spec.gpus_per_pod,
        resource=spec.placement.gpu_resource,
        tolerations=tuple(t.to_dict() for t in spec.placement.tolerations or ()),
    )


def _scheduling(
    sdep: SpeculativeDeployment, settings: OperatorSettings
) -> tuple[dict[str, Any], dict[str, str], list[dict[str, Any]]]:
    """(container resources, nodeSelector, tolerations) of the serving pods. On GPUs: the replica's GPUs on a
    node of the GPU product, tolerating the GPU taint, plus `spec.serving.resources`. On CPUs: no GPU
    anywhere, `spec.serving.resources` or the operator's defaults. The user's selector and tolerations apply
    to both."""
    spec = sdep.spec
    node_selector = dict(sorted((spec.placement.node_selector or {}).items()))
    tolerations: list[dict[str, Any]] = []
    if spec.placement.device == "cpu":
        resources = cpu_resources(sdep, settings)
    else:
        gpus = serving_scheduling(sdep, settings)
        resources = dict(gpus.resources())
        if spec.serving.resources is not None:
            extra = spec.serving.resources.to_dict()
            for key in ("requests", "limits"):
                resources[key] = {**extra.get(key, {}), **resources[key]}
        node_selector.update(gpus.node_selector())
        tolerations = gpus.pod_tolerations()
    for toleration in spec.placement.tolerations or []:
        item = toleration.to_dict()
        if item not in tolerations:
            tolerations.append(item)
    return resources, node_selector, tolerations


def _direct(role: str, source: ModelSource) -> CheckpointFetch:
    """A checkpoint the pod loads as it is: downloaded by an init container into `/models/<role>`, or its
    claim mounted at `/models/source-<role>`."""
    return fetch_checkpoint(source, f"{MODELS_MOUNT}/{role}", served_source_mount(role))


def _paths(
    sdep: SpeculativeDeployment, by_role: dict[str, EngineBuild], settings: OperatorSettings
) -> tuple[ModelPaths, list[tuple[str, CheckpointFetch]]]:
    """Where each model is, and the checkpoints the pod loads directly (models without an engine build, the
    EAGLE-3 head, the PARD or DFlash draft) with how each gets there."""
    spec = sdep.spec
    layout = CacheLayout.of(settings)
    direct: list[tuple[str, CheckpointFetch]] = []
    found: dict[EngineRole, str] = {}
    for role, model in engine_models(sdep):
        engine = by_role.get(role)
        if engine is not None:
            found[role] = layout.engine(engine.spec.cache.path)
        elif spec.backend == "tensorrt":
            # Serving is rendered only once every engine exists; never fall back to the raw checkpoint.
            raise ValueError(f"no EngineBuild for the {role} engine: build the engines first")
        else:
            fetch = _direct(role, model.model)
            direct.append((role, fetch))
            found[role] = fetch.path
    speculative_model = None
    head = spec.speculative.speculative_model
    if head is not None:
        # The EAGLE-3 head, or the PARD / DFlash draft: fetched by the pod under the method's name.
        head_role = "eagle" if spec.speculative.method == "eagle3" else str(spec.speculative.method)
        fetch = _direct(head_role, head)
        direct.append((head_role, fetch))
        speculative_model = fetch.path
    tokenizer = None
    if "target" in by_role and spec.backend == "tensorrt":
        tokenizer = layout.tokenizer(by_role["target"].spec.cache.path)
    paths = ModelPaths(found["target"], found.get("draft"), speculative_model, tokenizer)
    return paths, direct


def _download_volumes(
    sdep: SpeculativeDeployment, direct: list[tuple[str, CheckpointFetch]], settings: OperatorSettings
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, server mounts, init containers) of the checkpoints the pod loads directly."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    init: list[dict[str, Any]] = []
    for role, fetch in direct:
        if fetch.argv is None and fetch.claim is not None:
            volumes.append(
                {
                    "name": f"source-{role}",
                    "persistentVolumeClaim": {"claimName": fetch.claim.claim, "readOnly": True},
                }
            )
            mounts.append(
                {"name": f"source-{role}", "mountPath": served_source_mount(role), "readOnly": True}
            )
            continue
        if fetch.argv is None:
            raise ValueError(f"{fetch.source.uri}: no download step and no claim")
        volumes.append({"name": f"model-{role}", "emptyDir": {}})
        mount: dict[str, Any] = {"name": f"model-{role}", "mountPath": f"{MODELS_MOUNT}/{role}"}
        mounts.append({**mount, "readOnly": True})
        step: dict[str, Any] = {
            "name": f"download-{role}",
            "image": builder_image(sdep, settings),
            "command": fetch.argv,
        }
        if fetch.env:
            step["env"] = fetch.env
        step_mounts: list[dict[str, Any]] = [mount]
        if fetch.source.credentials_secret:
            volumes.append(
                {
                    "name": f"credentials-{role}",
                    "secret": {"secretName": fetch.source.credentials_secret, "defaultMode": 0o400},
                }
            )
            step_mounts.append(
                {"name": f"credentials-{role}", "mountPath": CREDENTIALS_MOUNT, "readOnly": True}
            )
        step["volumeMounts"] = step_mounts
        init.append(step)
    return volumes, mounts, init


def _file_volumes(sdep: SpeculativeDeployment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, server mounts) of the API key and the chat template."""
    serving = sdep.spec.serving
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if serving.api_key_secret:
        volumes.append(
            {
                "name": "api-key",
                "secret": {
                    "secretName": serving.api_key_secret,
                    "items": [{"key": "api-key", "path": "api-key"}],
                    "defaultMode": 0o400,
                },
            }
        )
        mounts.append({"name": "api-key", "mountPath": API_KEY_MOUNT, "readOnly": True})
    if serving.chat_template_config_map is not None:
        ref = serving.chat_template_config_map
        source = {"name": ref.name, "items": [{"key": ref.key, "path": CHAT_TEMPLATE_FILE}]}
    elif serving.chat_template:
        items = [{"key": CHAT_TEMPLATE_FILE, "path": CHAT_TEMPLATE_FILE}]
        source = {"name": configmap_name(sdep), "items": items}
    else:
        return volumes, mounts
    volumes.append({"name": "chat-template", "configMap": source})
    mounts.append({"name": "chat-template", "mountPath": CHAT_TEMPLATE_MOUNT, "readOnly": True})
    return volumes, mounts


def serving_pod(
    sdep: SpeculativeDeployment, engines: Sequence[EngineBuild], settings: OperatorSettings
) -> ServingPod:
    """The serving pod of `sdep` with its built `engines`. With backend `tensorrt`, `engines` must hold the
    EngineBuild of every model (`ValueError` otherwise)."""
    spec = sdep.spec
    by_role: dict[str, EngineBuild] = {engine.spec.role: engine for engine in engines}
    paths, direct = _paths(sdep, by_role, settings)
    image = server_image(sdep, settings)
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": configmap_name(sdep)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    init: list[dict[str, Any]] = []
    if engines:
        claim = engines[0].spec.cache.pvc_name
        volumes.append(
            {"name": "engine-cache", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        cache_mount = {"name": "engine-cache", "mountPath": settings.cache_mount_path, "readOnly": True}
        mounts.append(cache_mount)
        # Trust a built engine only once its completion marker is there (written last by its build Job).
        built: list[tuple[str, str, str]] = [(e.spec.role, e.spec.hash, e.spec.cache.path) for e in engines]
        init.append(
            {
                "name": "verify-engines",
                "image": image,
                "command": ["sh", "-c", verify_script(CacheLayout.of(settings), built)],
                "volumeMounts": [cache_mount],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        )
    download_volumes, download_mounts, downloads = _download_volumes(sdep, direct, settings)
    file_volumes, file_mounts = _file_volumes(sdep)
    resources, node_selector, tolerations = _scheduling(sdep, settings)
    serving = spec.serving
    return ServingPod(
        image=image,
        paths=paths,
        config_file=f"{CONFIG_MOUNT}/{CONFIG_FILE}",
        api_key_file=f"{API_KEY_MOUNT}/api-key" if serving.api_key_secret else None,
        chat_template_file=f"{CHAT_TEMPLATE_MOUNT}/{CHAT_TEMPLATE_FILE}"
        if serving.chat_template or serving.chat_template_config_map
        else None,
        grace_period_seconds=grace_period(sdep, settings),
        engine_hashes=",".join(f"{e.spec.role}={e.spec.hash}" for e in engines),
        volumes=[*volumes, *download_volumes, *file_volumes],
        mounts=[*mounts, *download_mounts, *file_mounts],
        init_containers=[*init, *downloads],
        resources=resources,
        node_selector=node_selector,
        tolerations=tolerations,
        identity=PodIdentity.of(
            serving_service_account(sdep, settings),
            pull_secrets(sdep, settings),
            [fetch.source for _, fetch in direct if fetch.argv is not None],
        ),
    )
