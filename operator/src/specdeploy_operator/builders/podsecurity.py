"""The security context of every pod the operator creates (serving Deployments and build Jobs). Pure.

By default the pods pass the Pod Security Standards' `restricted` profile, so they are admitted in a namespace
labelled `pod-security.kubernetes.io/enforce: restricted`:

- the image's non-root numeric user (`IMAGE_USER`, defined by Dockerfile.server), `runAsNonRoot: true`;
- `allowPrivilegeEscalation: false`, every capability dropped, not privileged;
- the runtime's default seccomp profile;
- `automountServiceAccountToken: false`: neither the server nor the build tools talk to the Kubernetes API
  (the one exception, a pod whose named ServiceAccount is its cloud identity for a `s3://` or `gs://`
  download, is `identity.py`'s; the `restricted` profile does not restrict the token);
- a read-only root filesystem. What must stay writable is a volume: `/tmp` (`TMP_VOLUME`, an emptyDir), which
  is also the image's `HOME`, so Python's temporary files, the Hugging Face and PyTorch caches, Triton's
  kernel cache and Open MPI's session directory (TensorRT-LLM's tensor-parallel executors) land there;
  `/dev/shm` of the serving pods (shared memory between the executors) is already a memory emptyDir; the
  engine cache (build pods write it) and the models' download directories are volumes of their own.

GPUs stay reachable through the device plugin (the `nvidia.com/gpu` resource): it hands the container its
device files, which needs neither privileged mode nor capabilities.

`spec.podSecurity` may change the user, groups, seccomp profile and the read-only root filesystem, never
the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from specdeploy_operator.api import PodSecuritySpec

__all__ = [
    "IMAGE_USER",
    "TMP_MOUNT",
    "TMP_VOLUME",
    "container_security_context",
    "harden_pod_spec",
    "pod_security_context",
]

IMAGE_USER: Final = 10001
"""UID and GID of the specdeploy server image's user (Dockerfile.server: `USER 10001:10001`)."""
TMP_VOLUME: Final = "tmp"
TMP_MOUNT: Final = "/tmp"


def pod_security_context(security: PodSecuritySpec | None) -> dict[str, Any]:
    """`spec.securityContext` of the pod."""
    security = security or PodSecuritySpec()
    context: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": security.run_as_user or IMAGE_USER,
        "runAsGroup": IMAGE_USER if security.run_as_group is None else security.run_as_group,
        "fsGroup": IMAGE_USER if security.fs_group is None else security.fs_group,
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    if security.supplemental_groups:
        context["supplementalGroups"] = list(security.supplemental_groups)
    seccomp = security.seccomp_profile
    if seccomp is not None and seccomp.type == "Localhost":
        context["seccompProfile"] = {"type": "Localhost", "localhostProfile": seccomp.localhost_profile}
    else:
        context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context


def container_security_context(security: PodSecuritySpec | None) -> dict[str, Any]:
    """`securityContext` of every container (the pod's seccomp profile and user apply to it)."""
    security = security or PodSecuritySpec()
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": security.read_only_root_filesystem,
        "runAsNonRoot": True,
    }


def harden_pod_spec(
    pod_spec: Mapping[str, Any], security: PodSecuritySpec | None, *, mount_token: bool = False
) -> dict[str, Any]:
    """`pod_spec` with the security contexts, no service-account token (unless `mount_token`: a pod whose
    ServiceAccount is its cloud identity, `identity.py`), and the `/tmp` emptyDir mounted in every container.
    The other keys keep their order; the new ones go where `kubectl get -o yaml` would look for them
    (security settings first, the volume last)."""
    container_context = container_security_context(security)
    out: dict[str, Any] = {
        "automountServiceAccountToken": mount_token,
        "securityContext": pod_security_context(security),
    }
    for key, value in pod_spec.items():
        if key in ("initContainers", "containers"):
            out[key] = [_harden_container(container, container_context) for container in value]
        else:
            out[key] = value
    out["volumes"] = [*(pod_spec.get("volumes") or []), {"name": TMP_VOLUME, "emptyDir": {}}]
    return out


def _harden_container(container: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    hardened = dict(container)
    mounts = list(container.get("volumeMounts") or [])
    if not any(mount.get("mountPath") == TMP_MOUNT for mount in mounts):
        mounts.append({"name": TMP_VOLUME, "mountPath": TMP_MOUNT})
    hardened["volumeMounts"] = mounts
    hardened["securityContext"] = dict(context)
    return hardened
