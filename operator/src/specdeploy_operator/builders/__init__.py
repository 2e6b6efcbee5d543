"""Pure builders of the objects the operator creates: no API calls, no environment reads, no randomness.
Names and ordering are deterministic, so a retry or a restart renders byte-identical objects."""

from .autoscaling import (
    METRIC_NAMES,
    autoscaler_kind,
    autoscaler_report,
    build_autoscaler,
    build_hpa,
    build_scaled_object,
    keda_query,
    quantity,
)
from .claims import (
    READ_WRITE_MANY,
    CacheClaim,
    build_cache_pvc,
    build_default_cache_pvc,
    cache_claim,
    cache_pvc_name,
)
from .common import (
    FIELD_MANAGER,
    endpoint,
    labels,
    owner_reference,
    pod_selector,
    selector_labels,
    selector_string,
    status_selector,
)
from .engines import build_engine_builds, engine_build, engine_build_name, engine_builds, needs_build
from .job import BuildCommands, build_commands, build_job, job_name
from .leaderworkerset import group_set_name, leader_worker_set_for
from .pod import ServingPod, serving_pod
from .render import dump_yaml, render_children
from .serverconfig import build_configmap, build_server_config, cpu_threads, device_placement
from .serving import ServingChildren, build_deployment, build_pdb, build_service, serving_children
from .settings import OperatorSettings

__all__ = [
    "FIELD_MANAGER",
    "METRIC_NAMES",
    "READ_WRITE_MANY",
    "BuildCommands",
    "CacheClaim",
    "OperatorSettings",
    "ServingChildren",
    "ServingPod",
    "autoscaler_kind",
    "autoscaler_report",
    "build_autoscaler",
    "build_cache_pvc",
    "build_commands",
    "build_configmap",
    "build_default_cache_pvc",
    "build_deployment",
    "build_engine_builds",
    "build_hpa",
    "build_job",
    "build_pdb",
    "build_scaled_object",
    "build_server_config",
    "build_service",
    "cache_claim",
    "cache_pvc_name",
    "cpu_threads",
    "device_placement",
    "dump_yaml",
    "endpoint",
    "engine_build",
    "engine_build_name",
    "engine_builds",
    "group_set_name",
    "job_name",
    "keda_query",
    "labels",
    "leader_worker_set_for",
    "needs_build",
    "owner_reference",
    "pod_selector",
    "quantity",
    "render_children",
    "selector_labels",
    "selector_string",
    "serving_children",
    "serving_pod",
    "status_selector",
]
