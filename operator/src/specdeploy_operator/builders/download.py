"""How a checkpoint reaches a pod: downloaded by a step of its own (`hf://`, `s3://`, `gs://`), or mounted
from its claim (`pvc://`). The one place that says which command downloads what, with which credential files,
and where the checkpoint then is; build pods (`job.py`) and serving pods (`pod.py`) both ask here."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdeploy_operator.api import ModelSource

from .fetchscript import fetch_argv
from .layout import CREDENTIALS_MOUNT, SOURCE_MOUNT, PvcSource, pvc_source

__all__ = ["CheckpointFetch", "download_step", "fetch_checkpoint"]


@dataclass(frozen=True, slots=True)
class CheckpointFetch:
    """How one checkpoint reaches a pod. `argv` is the download (None: the checkpoint is on `claim`, mounted),
    `path` the directory the checkpoint is in then, `env` the variables naming credential *files*."""

    source: ModelSource
    argv: list[str] | None
    path: str
    env: list[dict[str, str]] = field(default_factory=list)
    claim: PvcSource | None = None


def fetch_checkpoint(source: ModelSource, dest: str, claim_mount: str = SOURCE_MOUNT) -> CheckpointFetch:
    """`source` downloaded into `dest`, or, for `pvc://`, its claim mounted at `claim_mount`. Credentials are
    read from files under `CREDENTIALS_MOUNT`; no secret value appears in argv or env."""
    uri = source.uri
    scheme = uri.partition("://")[0]
    env: list[dict[str, str]] = []
    claim = pvc_source(source)
    if claim is not None:
        return CheckpointFetch(source, None, claim.under(claim_mount), env, claim)
    if scheme == "hf":
        if source.credentials_secret:
            env.append({"name": "HF_TOKEN_PATH", "value": f"{CREDENTIALS_MOUNT}/HF_TOKEN"})
        return CheckpointFetch(source, fetch_argv(scheme, uri, dest, source.revision), dest, env)
    if scheme == "s3":
        if source.credentials_secret:
            env.append({"name": "AWS_SHARED_CREDENTIALS_FILE", "value": f"{CREDENTIALS_MOUNT}/credentials"})
        return CheckpointFetch(source, fetch_argv(scheme, uri, dest), dest, env)
    if source.credentials_secret:
        env.append(
            {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": f"{CREDENTIALS_MOUNT}/credentials.json"}
        )
    return CheckpointFetch(source, fetch_argv(scheme, uri, dest), dest, env)


def download_step(source: ModelSource, dest: str) -> tuple[list[str] | None, str, list[dict[str, str]]]:
    """(argv of the download, the directory the checkpoint ends up in, env vars naming credential files) in a
    build pod, where a `pvc://` claim is mounted at `SOURCE_MOUNT`."""
    fetch = fetch_checkpoint(source, dest)
    return fetch.argv, fetch.path, fetch.env
