"""Serving children of a SpeculativeDeployment: ConfigMap (the server configuration, `serverconfig.py`),
Deployment, Service, PDB, and the engine-cache claims."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

from specdeploy_operator.api import SpeculativeDeployment

from .common import (
    COMPONENT_LABEL,
    ENGINE_HASHES_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    deployment_owner,
    derived_name,
    labels,
    metadata,
    selector_labels,
    selector_string,
)
from .engines import cache_pvc_name, gpu_product
from .job import download_step
from .layout import (
    CREDENTIALS_MOUNT,
    MODELS_MOUNT,
    CacheLayout,
    builder_image,
    pvc_source,
    served_source_mount,
    verify_script,
)
from .podsecurity import harden_pod_spec
from .scheduling import GpuScheduling
from .serverconfig import (
    API_KEY_MOUNT,
    CHAT_TEMPLATE_MOUNT,
    PRESTOP_SECONDS,
    build_server_config,
    cpu_resources,
    direct_sources,
    grace_period,
)
from .settings import OperatorSettings

__all__ = [
    "CONFIG_FILE",
    "CONFIG_MOUNT",
    "build_cache_pvc",
    "build_configmap",
    "build_default_cache_pvc",
    "build_deployment",
    "build_pdb",
    "build_service",
    "endpoint",
    "pod_selector",
    "status_selector",
]

COMPONENT: Final = "server"
CONFIG_HASH_ANNOTATION: Final = "specdeploy.dev/config-hash"
CONFIG_MOUNT: Final = "/etc/specdeploy"
CONFIG_FILE: Final = "server.yaml"


def _name(sdep: SpeculativeDeployment) -> str:
    name = sdep.metadata.name
    if not name:
        raise ValueError("metadata.name is required")
    return name


def pod_selector(sdep: SpeculativeDeployment) -> dict[str, str]:
    """matchLabels of the serving pods."""
    return selector_labels(_name(sdep), COMPONENT)


def status_selector(sdep: SpeculativeDeployment) -> str:
    """`status.selector` of the deployment (scale subresource)."""
    return selector_string(pod_selector(sdep))


def endpoint(sdep: SpeculativeDeployment) -> str:
    """The OpenAI-compatible base URL written to `status.endpoint`."""
    namespace = sdep.metadata.namespace or "default"
    return f"http://{_name(sdep)}.{namespace}.svc:{sdep.spec.serving.port}/v1"


def configmap_name(sdep: SpeculativeDeployment) -> str:
    return derived_name(_name(sdep), "server-config")


def config_digest(configmap: dict[str, Any]) -> str:
    """The digest of a server ConfigMap's data: the pod template carries it, so a changed configuration (or
    inline chat template) rolls the pods."""
    data = configmap["data"]
    content = json.dumps(json.loads(data[CONFIG_FILE]), sort_keys=True)
    if "template.jinja" in data:
        content += "\x00" + data["template.jinja"]
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def build_configmap(
    sdep: SpeculativeDeployment, engines: list[dict[str, Any]], settings: OperatorSettings | None = None
) -> dict[str, Any]:
    """ConfigMap holding the server configuration (`server.yaml`, JSON, which is valid YAML) and the inline
    chat template when there is one."""
    config = build_server_config(sdep, engines, settings)
    data = {CONFIG_FILE: json.dumps(config, indent=2, sort_keys=True) + "\n"}
    if sdep.spec.serving.chat_template:
        data["template.jinja"] = sdep.spec.serving.chat_template
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            configmap_name(sdep),
            sdep.metadata.namespace,
            labels(_name(sdep), COMPONENT),
            [deployment_owner(sdep)],
        ),
        "data": data,
    }


def _probe(path: str, port: int, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _volumes(
    sdep: SpeculativeDeployment, engines: list[dict[str, Any]], settings: OperatorSettings
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, server volume mounts, init containers that download unbuilt checkpoints)."""
    spec = sdep.spec
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
        claim = engines[0]["spec"]["cache"]["pvcName"]
        volumes.append(
            {"name": "engine-cache", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        mounts.append({"name": "engine-cache", "mountPath": settings.cache_mount_path, "readOnly": True})
    built = {engine["spec"]["role"] for engine in engines}
    for role, source in direct_sources(sdep, built):
        argv, _, env = download_step(source, f"{MODELS_MOUNT}/{role}")
        claim = pvc_source(source)
        if argv is None and claim is not None:
            volumes.append(
                {
                    "name": f"source-{role}",
                    "persistentVolumeClaim": {"claimName": claim.claim, "readOnly": True},
                }
            )
            mounts.append(
                {"name": f"source-{role}", "mountPath": served_source_mount(role), "readOnly": True}
            )
            continue
        if argv is None:
            raise ValueError(f"{source.uri}: no download step and no claim")
        volumes.append({"name": f"model-{role}", "emptyDir": {}})
        mount: dict[str, Any] = {"name": f"model-{role}", "mountPath": f"{MODELS_MOUNT}/{role}"}
        mounts.append({**mount, "readOnly": True})
        step: dict[str, Any] = {
            "name": f"download-{role}",
            "image": builder_image(sdep, settings),
            "command": argv,
        }
        if env:
            step["env"] = env
        step_mounts: list[dict[str, Any]] = [mount]
        if source.credentials_secret:
            volumes.append(
                {
                    "name": f"credentials-{role}",
                    "secret": {"secretName": source.credentials_secret, "defaultMode": 0o400},
                }
            )
            step_mounts.append(
                {"name": f"credentials-{role}", "mountPath": CREDENTIALS_MOUNT, "readOnly": True}
            )
        step["volumeMounts"] = step_mounts
        init.append(step)
    if spec.serving.api_key_secret:
        volumes.append(
            {
                "name": "api-key",
                "secret": {
                    "secretName": spec.serving.api_key_secret,
                    "items": [{"key": "api-key", "path": "api-key"}],
                    "defaultMode": 0o400,
                },
            }
        )
        mounts.append({"name": "api-key", "mountPath": API_KEY_MOUNT, "readOnly": True})
    if spec.serving.chat_template_config_map is not None:
        ref = spec.serving.chat_template_config_map
        volumes.append(
            {
                "name": "chat-template",
                "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": "template.jinja"}]},
            }
        )
        mounts.append({"name": "chat-template", "mountPath": CHAT_TEMPLATE_MOUNT, "readOnly": True})
    elif spec.serving.chat_template:
        volumes.append(
            {
                "name": "chat-template",
                "configMap": {
                    "name": configmap_name(sdep),
                    "items": [{"key": "template.jinja", "path": "template.jinja"}],
                },
            }
        )
        mounts.append({"name": "chat-template", "mountPath": CHAT_TEMPLATE_MOUNT, "readOnly": True})
    return volumes, mounts, init


def serving_scheduling(sdep: SpeculativeDeployment, settings: OperatorSettings) -> GpuScheduling:
    """The GPUs of one serving replica: `gpusPerReplica` of `placement.gpuResource` on the GPU product."""
    spec = sdep.spec
    return GpuScheduling(
        product=gpu_product(sdep, settings),
        count=spec.gpus_per_replica,
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


def build_deployment(
    sdep: SpeculativeDeployment,
    engines: list[dict[str, Any]],
    settings: OperatorSettings | None = None,
    *,
    configmap: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Deployment of the serving pods. With backend `tensorrt`, `engines` must hold the EngineBuild of
    every model (`ValueError` otherwise). `configmap`: the deployment's `build_configmap`, when the caller
    rendered it already (the configuration is rendered once)."""
    settings = settings or OperatorSettings()
    if configmap is None:
        configmap = build_configmap(sdep, engines, settings)
    spec = sdep.spec
    name = _name(sdep)
    port = spec.serving.port
    hashes = ",".join(f"{engine['spec']['role']}={engine['spec']['hash']}" for engine in engines)
    volumes, mounts, init = _volumes(sdep, engines, settings)
    resources, node_selector, tolerations = _scheduling(sdep, settings)
    image = (spec.images.server if spec.images else None) or settings.server_image
    container: dict[str, Any] = {
        "name": "server",
        "image": image,
        "command": ["specdeploy-server", "--config", f"{CONFIG_MOUNT}/{CONFIG_FILE}"],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": resources,
        "volumeMounts": mounts,
        # Every 2 s while the server starts: a replica serves within 2 s of being able to (with 10 s, up to
        # 10 s late: the scale-up benchmark saw it). Cheap: one GET per 2 s, only until the first success.
        "startupProbe": _probe("/health/ready", port, 2, max(settings.startup_timeout_seconds // 2, 1)),
        "readinessProbe": _probe("/health/ready", port, 5, 3),
        "livenessProbe": _probe("/health/live", port, 10, 6),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }
    pod_spec: dict[str, Any] = {"terminationGracePeriodSeconds": grace_period(sdep, settings)}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.placement.affinity is not None:
        pod_spec["affinity"] = spec.placement.affinity.to_dict()
    if spec.placement.priority_class_name:
        pod_spec["priorityClassName"] = spec.placement.priority_class_name
    if engines:
        # Trust a built engine only once its completion marker is there (written last by its build Job).
        built = [(e["spec"]["role"], e["spec"]["hash"], e["spec"]["cache"]["path"]) for e in engines]
        verify = {
            "name": "verify-engines",
            "image": image,
            "command": ["sh", "-c", verify_script(CacheLayout.of(settings), built)],
            "volumeMounts": [m for m in mounts if m["name"] == "engine-cache"],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        init = [verify, *init]
    if init:
        pod_spec["initContainers"] = init
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = volumes
    pod_spec = harden_pod_spec(pod_spec, spec.pod_security)
    # A changed configuration (runtime, serving) or a new engine changes the pod template: pods roll.
    annotations = {CONFIG_HASH_ANNOTATION: config_digest(configmap)}
    if hashes:
        annotations[ENGINE_HASHES_ANNOTATION] = hashes
    template_meta: dict[str, Any] = {"labels": labels(name, COMPONENT), "annotations": annotations}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(
            name, sdep.metadata.namespace, labels(name, COMPONENT), [deployment_owner(sdep)]
        ),
        "spec": {
            "replicas": spec.replicas,
            "progressDeadlineSeconds": settings.startup_timeout_seconds + 300,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": pod_selector(sdep)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": spec.rollout.max_surge,
                    "maxUnavailable": spec.rollout.max_unavailable,
                },
            },
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def build_cache_pvc(
    sdep: SpeculativeDeployment, settings: OperatorSettings | None = None
) -> dict[str, Any] | None:
    """The engine-cache claim the operator creates for `spec.engineCache.size` (None otherwise), owned by the
    deployment. An existing claim (`pvcName`) or the operator's default claim is never created here."""
    settings = settings or OperatorSettings()
    cache = sdep.spec.engine_cache
    if cache is None or not cache.size:
        return None
    name = _name(sdep)
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": str(cache.size)}},
    }
    storage_class = cache.storage_class_name or settings.cache_storage_class_name
    if storage_class:
        claim["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(
            cache_pvc_name(sdep, settings),
            sdep.metadata.namespace,
            labels(name, "engine-cache"),
            [deployment_owner(sdep)],
        ),
        "spec": claim,
    }


def build_default_cache_pvc(namespace: str, settings: OperatorSettings | None = None) -> dict[str, Any]:
    """The operator's default engine-cache claim (`SPECDEPLOY_CACHE_PVC_NAME`) in `namespace`, created when a
    deployment there leaves `spec.engineCache` unset and the claim does not exist yet. Shared by every such
    deployment of the namespace, so it has no owner: deleting the namespace (or the claim) removes it."""
    settings = settings or OperatorSettings()
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": settings.cache_size}},
    }
    if settings.cache_storage_class_name:
        claim["storageClassName"] = settings.cache_storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(
            settings.cache_pvc_name,
            namespace,
            {NAME_LABEL: "specdeploy", COMPONENT_LABEL: "engine-cache", MANAGED_BY_LABEL: MANAGED_BY},
            [],
        ),
        "spec": claim,
    }


def build_service(sdep: SpeculativeDeployment) -> dict[str, Any]:
    """ClusterIP Service named like the deployment (the endpoint's host)."""
    name = _name(sdep)
    port = sdep.spec.serving.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            name, sdep.metadata.namespace, labels(name, COMPONENT), [deployment_owner(sdep)]
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": pod_selector(sdep),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pdb(sdep: SpeculativeDeployment) -> dict[str, Any]:
    """PodDisruptionBudget: voluntary evictions (node drains, a cluster autoscaler emptying a node) leave at
    least `replicas - 1` serving pods, so they take at most one at a time. A single replica is not protected:
    `minAvailable: 1` would block every drain of its node forever. It follows `spec.replicas`, so it stays
    right while an autoscaler changes the count."""
    name = _name(sdep)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(
            name, sdep.metadata.namespace, labels(name, COMPONENT), [deployment_owner(sdep)]
        ),
        "spec": {
            "minAvailable": max(sdep.spec.replicas - 1, 0),
            "selector": {"matchLabels": pod_selector(sdep)},
        },
    }
