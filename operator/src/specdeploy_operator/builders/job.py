"""The build Job of an EngineBuild. Backend tensorrt: download -> quantize.py (or convert_checkpoint.py) ->
trtllm-build -> completion marker. Backend pytorch: download -> specdeploy-quantize -> completion marker. A
staged checkpoint (`spec.stageOnly`, backend `transformers`): download straight into the cache -> completion
marker, without a GPU. Each step is one container running one argv, so the rendered command lines are exactly
the seed's (`build_commands`). The builders read the EngineBuild as the model; a wire or live object is read
into it once (`engines.engine_build`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from specdeploy_operator.api import EngineBuild, EngineBuildSpec

from .common import (
    ENGINE_HASH_LABEL,
    ENGINE_ROLE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    dns_label,
    owner_reference,
    short_hash,
)
from .download import CheckpointFetch, download_step, fetch_checkpoint
from .engines import engine_build
from .fetchscript import REFUSED_EXIT_CODE
from .identity import PodIdentity
from .layout import COMPLETION_MARKER, CREDENTIALS_MOUNT, SOURCE_MOUNT, TOKENIZER_DIR, CacheLayout
from .podsecurity import harden_pod_spec
from .scheduling import DEFAULT_GPU_RESOURCE, GpuScheduling
from .settings import OperatorSettings

__all__ = [
    "COMPLETION_MARKER",
    "CREDENTIALS_MOUNT",
    "BuildCommands",
    "build_commands",
    "build_job",
    "build_scheduling",
    "download_step",
    "job_name",
]

RETRY_ANNOTATION: Final = "specdeploy.dev/retry"
"""Set (to any new value) on a `Failed` EngineBuild to build it again: the retry gets a Job of its own."""


@dataclass(frozen=True)
class BuildCommands:
    """The argv of each step of a build, in order; `download` is None for `pvc://` sources, `checkpoint` is
    None for a staged checkpoint."""

    download: list[str] | None
    checkpoint: list[str] | None
    build: list[str] | None
    complete: list[str]
    model_dir: str
    engine_dir: str
    fetch: CheckpointFetch
    """How the checkpoint reaches the build pod (its download step, credentials, claim)."""
    checkpoint_step: str = "quantize"
    """The checkpoint step's container name: `quantize`, or `convert` for convert_checkpoint.py."""


def job_name(engine: EngineBuild | Mapping[str, Any]) -> str:
    """`<engine build name>-build`, shortened so it stays a 63-character label (the Job controller copies it
    into the `job-name` pod label). A retry (`specdeploy.dev/retry` annotation) is another attempt with a Job
    of its own: `-build-<hash of the annotation's value>`."""
    role: str
    if isinstance(engine, EngineBuild):
        name, role, hash_ = engine.metadata.name or "", engine.spec.role, engine.spec.hash
        retry = (engine.metadata.annotations or {}).get(RETRY_ANNOTATION)
    else:
        meta, spec = engine["metadata"], engine["spec"]
        name, role, hash_ = str(meta["name"]), str(spec["role"]), str(spec["hash"])
        retry = (meta.get("annotations") or {}).get(RETRY_ANNOTATION)
    stem = name.removesuffix(f"-{role}-{hash_}")
    suffix = f"-{short_hash(str(retry), length=6)}" if retry else ""
    return dns_label(stem, f"{role}-{hash_}-build{suffix}")


HF_QUANTIZE_COMMAND: Final = "specdeploy-quantize"
"""The server image's console script that quantizes a checkpoint for the maintained path with NVIDIA
ModelOpt and exports a Hugging Face checkpoint (TensorRT-LLM's quantize.py wrote engine-build checkpoints
only, and left the release images with the engine workflow)."""


def _hf_quantize_argv(spec: EngineBuildSpec, model_dir: str, output_dir: str) -> list[str]:
    """`specdeploy-quantize` with quantize.py's argument names: a quantized Hugging Face checkpoint, one for
    every tensor-parallel size (the LLM API shards it when it loads)."""
    quantization = spec.quantization
    argv = [HF_QUANTIZE_COMMAND, "--model_dir", model_dir, "--output_dir", output_dir]
    argv += ["--qformat", quantization.format, "--dtype", quantization.dtype]
    if quantization.kv_cache_dtype != "auto":
        argv += ["--kv_cache_dtype", quantization.kv_cache_dtype]
    return [*argv, "--calib_size", str(quantization.calib_size)]


def _converts(spec: EngineBuildSpec) -> bool:
    """Whether an engine build's checkpoint step is convert_checkpoint.py (nothing to quantize)."""
    return spec.quantization.format == "none" and spec.quantization.kv_cache_dtype == "auto"


def _checkpoint_argv(
    spec: EngineBuildSpec, model_dir: str, output_dir: str, settings: OperatorSettings
) -> list[str]:
    quantization = spec.quantization
    parallelism = spec.parallelism
    tp_pp = ["--tp_size", str(parallelism.tensor_parallel), "--pp_size", str(parallelism.pipeline_parallel)]
    if _converts(spec):
        return [
            settings.python,
            settings.convert_script,
            "--model_dir",
            model_dir,
            "--output_dir",
            output_dir,
            "--dtype",
            quantization.dtype,
            *tp_pp,
        ]
    # quantize.py in the seed's order: --model_dir --dtype --qformat --kv_cache_dtype --output_dir
    # --calib_size --tp_size --pp_size.
    argv = [
        settings.python,
        settings.quantize_script,
        "--model_dir",
        model_dir,
        "--dtype",
        quantization.dtype,
    ]
    argv += ["--qformat", "full_prec" if quantization.format == "none" else quantization.format]
    if quantization.kv_cache_dtype != "auto":
        argv += ["--kv_cache_dtype", quantization.kv_cache_dtype]
    argv += ["--output_dir", output_dir, "--calib_size", str(quantization.calib_size), *tp_pp]
    return argv


def _marker(hash_: str, engine_dir: str) -> str:
    """The shell command that writes the completion marker, last step of every build or staging Job."""
    return f"echo {hash_} > {shlex.quote(engine_dir)}/{COMPLETION_MARKER}"


def build_commands(engine: EngineBuild | Mapping[str, Any], settings: OperatorSettings) -> BuildCommands:
    """The command lines of the build of `engine`."""
    spec = engine_build(engine).spec
    hash_ = spec.hash
    layout = CacheLayout.of(settings)
    work = layout.work(hash_)
    out_dir = layout.engine(spec.cache.path)
    if spec.stage_only:
        fetch = fetch_checkpoint(spec.model, out_dir)
        if fetch.argv is None:
            raise ValueError(f"{spec.model.uri}: a pvc:// checkpoint is mounted, not staged")
        return BuildCommands(
            download=fetch.argv,
            checkpoint=None,
            build=None,
            complete=["sh", "-c", f"set -e; {_marker(hash_, out_dir)}"],
            model_dir=out_dir,
            engine_dir=out_dir,
            fetch=fetch,
        )
    fetch = fetch_checkpoint(spec.model, f"{work}/model")
    model_dir = fetch.path
    is_engine = bool(spec.build_flags)  # pytorch: a quantized checkpoint, no engine
    checkpoint_dir = f"{work}/checkpoint" if is_engine else out_dir
    if is_engine:
        checkpoint = _checkpoint_argv(spec, model_dir, checkpoint_dir, settings)
    else:
        checkpoint = _hf_quantize_argv(spec, model_dir, checkpoint_dir)
    step = "convert" if is_engine and _converts(spec) else "quantize"
    build: list[str] | None = None
    if is_engine:
        workers = str(spec.parallelism.tensor_parallel)
        build = ["trtllm-build", "--checkpoint_dir", checkpoint_dir, "--output_dir", out_dir]
        build += ["--workers", workers, *spec.build_flags]
    # Keep the tokenizer next to the engine (the server loads it from there), then write the marker.
    src, dst = shlex.quote(model_dir), shlex.quote(out_dir)
    script = (
        f"set -e; mkdir -p {dst}/{TOKENIZER_DIR}; "
        f"for f in {src}/*token* {src}/generation_config.json {src}/config.json; "
        f'do if [ -f "$f" ]; then cp "$f" {dst}/{TOKENIZER_DIR}/; fi; done; '
        f"{_marker(hash_, out_dir)}"
    )
    return BuildCommands(
        download=fetch.argv,
        checkpoint=checkpoint,
        build=build,
        complete=["sh", "-c", script],
        model_dir=model_dir,
        engine_dir=out_dir,
        fetch=fetch,
        checkpoint_step=step,
    )


def build_scheduling(spec: EngineBuildSpec) -> GpuScheduling:
    """Where the build of an EngineBuild spec runs: its parallelism's GPUs (`buildGpus` when a node has
    fewer), of the deployment's GPU resource (a MIG slice where the deployment serves on MIG), on its GPU
    product, with the deployment's tolerations."""
    if spec.gpu_product is None:
        raise ValueError("an EngineBuild that builds needs spec.gpuProduct")
    return GpuScheduling(
        product=spec.gpu_product,
        count=spec.build_gpus or spec.parallelism.tensor_parallel * spec.parallelism.pipeline_parallel,
        resource=spec.gpu_resource or DEFAULT_GPU_RESOURCE,
        tolerations=tuple(t.to_dict() for t in spec.tolerations or ()),
    )


def build_job(
    engine: EngineBuild | Mapping[str, Any], settings: OperatorSettings | None = None
) -> dict[str, Any]:
    """The Job that builds `engine`, owned by it (rendered offline, without a uid: the placeholder `""`)."""
    settings = settings or OperatorSettings()
    engine = engine_build(engine)
    spec = engine.spec
    commands = build_commands(engine, settings)
    source = spec.model
    credential_env = commands.fetch.env
    image = spec.builder_image
    cache_mount = {"name": "engine-cache", "mountPath": settings.cache_mount_path}
    mounts: list[dict[str, Any]] = [cache_mount]
    volumes: list[dict[str, Any]] = [
        {"name": "engine-cache", "persistentVolumeClaim": {"claimName": spec.cache.pvc_name}}
    ]
    claim = commands.fetch.claim
    if claim is not None:
        volumes.append(
            {"name": "model-source", "persistentVolumeClaim": {"claimName": claim.claim, "readOnly": True}}
        )
        mounts.append({"name": "model-source", "mountPath": SOURCE_MOUNT, "readOnly": True})
    download_mounts = list(mounts)
    if source.credentials_secret:
        volumes.append(
            {
                "name": "model-credentials",
                "secret": {"secretName": source.credentials_secret, "defaultMode": 0o400},
            }
        )
        download_mounts.append(
            {"name": "model-credentials", "mountPath": CREDENTIALS_MOUNT, "readOnly": True}
        )
    steps: list[dict[str, Any]] = []
    pod_scheduling: dict[str, Any] = {}
    if commands.download is not None:
        download: dict[str, Any] = {"name": "download", "image": image, "command": commands.download}
        if credential_env:
            download["env"] = credential_env
        download["volumeMounts"] = download_mounts
        steps.append(download)
    if commands.checkpoint is not None:
        # Quantizing, converting and building run on the GPUs of the product the engine is for; staging a
        # checkpoint is a download, and needs none.
        scheduling = build_scheduling(spec)
        pod_scheduling = {
            "nodeSelector": scheduling.node_selector(),
            "tolerations": scheduling.pod_tolerations(),
        }
        gpu_step = {"resources": scheduling.resources(), "volumeMounts": mounts}
        steps.append(
            {"name": commands.checkpoint_step, "image": image, "command": commands.checkpoint, **gpu_step}
        )
        if commands.build is not None:
            steps.append({"name": "build", "image": image, "command": commands.build, **gpu_step})
    complete = {"name": "complete", "image": image, "command": commands.complete, "volumeMounts": mounts}
    for container in [*steps, complete]:
        # A failed step's last log lines become its termination message (EngineBuild status.message).
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    labels = {
        NAME_LABEL: "specdeploy",
        "app.kubernetes.io/component": "engine-build",
        MANAGED_BY_LABEL: MANAGED_BY,
        ENGINE_ROLE_LABEL: spec.role,
        ENGINE_HASH_LABEL: spec.hash,
    }
    meta: dict[str, Any] = {"name": job_name(engine)}
    if engine.metadata.namespace:
        meta["namespace"] = engine.metadata.namespace
    meta["labels"] = labels
    owner = {"name": engine.metadata.name, "uid": (engine.metadata.model_extra or {}).get("uid", "")}
    identity = PodIdentity.of(
        spec.service_account_name,
        spec.image_pull_secrets or (),
        [source] if commands.download is not None else [],
    )
    meta["ownerReferences"] = [
        owner_reference({"apiVersion": engine.api_version, "kind": engine.kind, "metadata": owner})
    ]
    job_spec: dict[str, Any] = {"backoffLimit": settings.build_backoff_limit}
    if commands.download is not None:
        # A download the store refused (401, 403, 404) fails the build at once: a retry gets the same answer.
        refused = {"containerName": "download", "operator": "In", "values": [REFUSED_EXIT_CODE]}
        job_spec["podFailurePolicy"] = {"rules": [{"action": "FailJob", "onExitCodes": refused}]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            **job_spec,
            "ttlSecondsAfterFinished": settings.build_ttl_seconds,
            "template": {
                "metadata": {"labels": labels},
                "spec": harden_pod_spec(
                    {
                        "restartPolicy": "Never",
                        **pod_scheduling,
                        **identity.pod_fields(),
                        "initContainers": steps,
                        "containers": [complete],
                        "volumes": volumes,
                    },
                    spec.pod_security,
                    mount_token=identity.mount_token,
                ),
            },
        },
    }
