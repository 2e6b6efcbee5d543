"""Pure builders of the objects the operator creates: no API calls, no environment reads, no randomness.
Names and ordering are deterministic, so a retry or a restart renders byte-identical objects."""

from .autoscaling import (
    METRIC_NAMES,
    autoscaler_kind,
    build_autoscaler,
    build_hpa,
    build_scaled_object,
    keda_query,
    quantity,
)
from .common import FIELD_MANAGER, labels, owner_reference, selector_labels, selector_string
from .engines import build_engine_builds, cache_pvc_name, engine_build_name, needs_build
from .job import BuildCommands, build_commands, build_job, job_name
from .render import dump_yaml, render_children
from .serverconfig import build_server_config, cpu_threads, device_placement
from .serving import (
    build_cache_pvc,
    build_configmap,
    build_default_cache_pvc,
    build_deployment,
    build_pdb,
    build_service,
    endpoint,
    pod_selector,
    status_selector,
)
from .settings import OperatorSettings

__all__ = [
    "FIELD_MANAGER",
    "METRIC_NAMES",
    "BuildCommands",
    "OperatorSettings",
    "autoscaler_kind",
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
    "cache_pvc_name",
    "cpu_threads",
    "device_placement",
    "dump_yaml",
    "endpoint",
    "engine_build_name",
    "job_name",
    "keda_query",
    "labels",
    "needs_build",
    "owner_reference",
    "pod_selector",
    "quantity",
    "render_children",
    "selector_labels",
    "selector_string",
    "status_selector",
]
