"""The build Job of an EngineBuild: download -> quantize.py (or convert_checkpoint.py) -> trtllm-build ->
completion marker, or for a staged checkpoint (`spec.stageOnly`, backend `transformers`) download straight
into the cache -> completion marker, without a GPU. Each step is one container running one argv, so the
rendered command lines are exactly the seed's (`build_commands`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from specdeploy_operator.api import EngineBuild, ModelSource, PodSecuritySpec

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
from .layout import COMPLETION_MARKER, CREDENTIALS_MOUNT, SOURCE_MOUNT, TOKENIZER_DIR, CacheLayout, pvc_source
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


def job_name(engine_build: Mapping[str, Any]) -> str:
    """`<engine build name>-build`, shortened so it stays a 63-character label (the Job controller copies it
    into the `job-name` pod label). A retry (`specdeploy.dev/retry` annotation) is another attempt with a Job
    of its own: `-build-<hash of the annotation's value>`."""
    spec = engine_build["spec"]
    name: str = engine_build["metadata"]["name"]
    role = spec["role"]
    stem = name.removesuffix(f"-{role}-{spec['hash']}")
    retry = ((engine_build["metadata"].get("annotations")) or {}).get(RETRY_ANNOTATION)
    suffix = f"-{short_hash(str(retry), length=6)}" if retry else ""
    return dns_label(stem, f"{role}-{spec['hash']}-build{suffix}")


def download_step(source: ModelSource, dest: str) -> tuple[list[str] | None, str, list[dict[str, str]]]:
    """(argv of the download, the directory the checkpoint ends up in, env vars naming credential *files*).
    `pvc://` sources are mounted instead of downloaded. Credentials are read from files under
    `CREDENTIALS_MOUNT`; no secret value appears in argv or env."""
    uri = source.uri
    scheme, _, rest = uri.partition("://")
    env: list[dict[str, str]] = []
    claim = pvc_source(source)
    if claim is not None:
        return None, claim.under(SOURCE_MOUNT), env
    if scheme == "hf":
        argv = ["huggingface-cli", "download", rest, "--local-dir", dest]
        if source.revision:
            argv += ["--revision", source.revision]
        if source.credentials_secret:
            env.append({"name": "HF_TOKEN_PATH", "value": f"{CREDENTIALS_MOUNT}/HF_TOKEN"})
        return argv, dest, env
    if scheme == "s3":
        if source.credentials_secret:
            env.append({"name": "AWS_SHARED_CREDENTIALS_FILE", "value": f"{CREDENTIALS_MOUNT}/credentials"})
        return ["aws", "s3", "sync", "--only-show-errors", uri, dest], dest, env
    if source.credentials_secret:
        env.append(
            {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": f"{CREDENTIALS_MOUNT}/credentials.json"}
        )
    return ["gsutil", "-m", "rsync", "-r", uri, dest], dest, env


def _checkpoint_argv(
    spec: dict[str, Any], model_dir: str, output_dir: str, settings: OperatorSettings
) -> list[str]:
    engine = EngineBuild.model_validate({"spec": spec})
    quantization = engine.spec.quantization
    parallelism = engine.spec.parallelism
    tp_pp = ["--tp_size", str(parallelism.tensor_parallel), "--pp_size", str(parallelism.pipeline_parallel)]
    if quantization.format == "none" and quantization.kv_cache_dtype == "auto":
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


def build_commands(engine_build: Mapping[str, Any], settings: OperatorSettings) -> BuildCommands:
    """The command lines of the build of `engine_build` (an EngineBuild dict)."""
    spec = engine_build["spec"]
    hash_ = spec["hash"]
    layout = CacheLayout.of(settings)
    work = layout.work(hash_)
    out_dir = layout.engine(spec["cache"]["path"])
    source = ModelSource.model_validate(spec["model"])
    if spec.get("stageOnly"):
        download, _, _ = download_step(source, out_dir)
        if download is None:
            raise ValueError(f"{source.uri}: a pvc:// checkpoint is mounted, not staged")
        return BuildCommands(
            download=download,
            checkpoint=None,
            build=None,
            complete=["sh", "-c", f"set -e; {_marker(hash_, out_dir)}"],
            model_dir=out_dir,
            engine_dir=out_dir,
        )
    download, model_dir, _ = download_step(source, f"{work}/model")
    is_engine = bool(spec["buildFlags"])  # pytorch: a quantized checkpoint, no engine
    checkpoint_dir = f"{work}/checkpoint" if is_engine else out_dir
    checkpoint = _checkpoint_argv(spec, model_dir, checkpoint_dir, settings)
    build: list[str] | None = None
    if is_engine:
        workers = str(spec.get("parallelism", {}).get("tensorParallel", 1))
        build = ["trtllm-build", "--checkpoint_dir", checkpoint_dir, "--output_dir", out_dir]
        build += ["--workers", workers, *spec["buildFlags"]]
    # Keep the tokenizer next to the engine (the server loads it from there), then write the marker.
    src, dst = shlex.quote(model_dir), shlex.quote(out_dir)
    script = (
        f"set -e; mkdir -p {dst}/{TOKENIZER_DIR}; "
        f"for f in {src}/*token* {src}/generation_config.json {src}/config.json; "
        f'do if [ -f "$f" ]; then cp "$f" {dst}/{TOKENIZER_DIR}/; fi; done; '
        f"{_marker(hash_, out_dir)}"
    )
    return BuildCommands(
        download=download,
        checkpoint=checkpoint,
        build=build,
        complete=["sh", "-c", script],
        model_dir=model_dir,
        engine_dir=out_dir,
    )


def build_scheduling(spec: Mapping[str, Any]) -> GpuScheduling:
    """Where the build of an EngineBuild spec runs: its parallelism's GPUs, of the deployment's GPU
    resource (a MIG slice where the deployment serves on MIG), on its GPU product, with the deployment's
    tolerations."""
    parallelism = spec.get("parallelism", {})
    gpus = int(parallelism.get("tensorParallel", 1)) * int(parallelism.get("pipelineParallel", 1))
    return GpuScheduling(
        product=spec["gpuProduct"],
        count=gpus,
        resource=spec.get("gpuResource") or DEFAULT_GPU_RESOURCE,
        tolerations=tuple(spec.get("tolerations") or ()),
    )


def build_job(engine_build: Mapping[str, Any], settings: OperatorSettings | None = None) -> dict[str, Any]:
    """The Job that builds `engine_build`, owned by it (the uid placeholder is filled in by the handler)."""
    settings = settings or OperatorSettings()
    spec = engine_build["spec"]
    commands = build_commands(engine_build, settings)
    source = ModelSource.model_validate(spec["model"])
    _, _, credential_env = download_step(source, "")
    image = spec["builderImage"]
    cache_mount = {"name": "engine-cache", "mountPath": settings.cache_mount_path}
    mounts: list[dict[str, Any]] = [cache_mount]
    volumes: list[dict[str, Any]] = [
        {"name": "engine-cache", "persistentVolumeClaim": {"claimName": spec["cache"]["pvcName"]}}
    ]
    claim = pvc_source(source)
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
        step_name = "quantize" if "quantize" in commands.checkpoint[1] else "convert"
        gpu_step = {"resources": scheduling.resources(), "volumeMounts": mounts}
        steps.append({"name": step_name, "image": image, "command": commands.checkpoint, **gpu_step})
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
        ENGINE_ROLE_LABEL: spec["role"],
        ENGINE_HASH_LABEL: spec["hash"],
    }
    meta: dict[str, Any] = {"name": job_name(engine_build)}
    if engine_build["metadata"].get("namespace"):
        meta["namespace"] = engine_build["metadata"]["namespace"]
    meta["labels"] = labels
    meta["ownerReferences"] = [owner_reference(engine_build)]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": settings.build_backoff_limit,
            "ttlSecondsAfterFinished": settings.build_ttl_seconds,
            "template": {
                "metadata": {"labels": labels},
                "spec": harden_pod_spec(
                    {
                        "restartPolicy": "Never",
                        **pod_scheduling,
                        "initContainers": steps,
                        "containers": [complete],
                        "volumes": volumes,
                    },
                    PodSecuritySpec.model_validate(spec["podSecurity"]) if spec.get("podSecurity") else None,
                ),
            },
        },
    }
