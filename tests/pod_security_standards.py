"""An offline checker of the Pod Security Standards' `restricted` profile (which includes `baseline`), as the
API server's PodSecurity admission applies it at version `latest` to Linux pods
(https://kubernetes.io/docs/concepts/security/pod-security-standards/).

`violations(pod_spec)` lists every rule a pod spec breaks, named like the admission's messages;
`pod_specs(obj)` finds the pod specs in a manifest (Pod, a workload's template, a CronJob's job template).
tests/integration/test_pod_security.py shows that the checker and a real API server agree.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

__all__ = ["pod_specs", "violations"]

Obj = Mapping[str, Any]

BASELINE_CAPABILITIES: Final = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
     "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
RESTRICTED_VOLUMES: Final = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS: Final = frozenset(
    {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
     "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
     "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
     "net.ipv4.tcp_keepalive_probes"}
)  # fmt: skip
SELINUX_TYPES: Final = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
WORKLOADS: Final = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"}
)


def pod_specs(obj: Obj) -> Iterator[tuple[str, Obj]]:
    """(`Kind/name`, pod spec) of every pod `obj` makes."""
    kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
    if kind == "Pod":
        yield f"Pod/{name}", obj.get("spec") or {}
    elif kind in WORKLOADS:
        yield f"{kind}/{name}", ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    elif kind == "LeaderWorkerSet":
        template = (obj.get("spec") or {}).get("leaderWorkerTemplate") or {}
        for role in ("leaderTemplate", "workerTemplate"):
            yield f"LeaderWorkerSet/{name}/{role}", (template.get(role) or {}).get("spec") or {}
    elif kind == "CronJob":
        job = ((obj.get("spec") or {}).get("jobTemplate") or {}).get("spec") or {}
        yield f"CronJob/{name}", (job.get("template") or {}).get("spec") or {}


def _containers(spec: Obj) -> list[Obj]:
    return [
        *(spec.get("initContainers") or []),
        *(spec.get("containers") or []),
        *(spec.get("ephemeralContainers") or []),
    ]


def _baseline(spec: Obj, pod_ctx: Obj, containers: list[Obj]) -> list[str]:
    found: list[str] = []
    ctxs = [(c.get("name"), c.get("securityContext") or {}) for c in containers]
    if any(spec.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")):
        found.append("host namespaces")
    if any(ctx.get("privileged") for _, ctx in ctxs):
        found.append("privileged")
    if any((ctx.get("windowsOptions") or {}).get("hostProcess") for _, ctx in [(None, pod_ctx), *ctxs]):
        found.append("hostProcess")
    added = {cap for _, ctx in ctxs for cap in (ctx.get("capabilities") or {}).get("add") or []}
    if added - BASELINE_CAPABILITIES:
        found.append("capabilities")
    if any("hostPath" in v for v in spec.get("volumes") or []):
        found.append("hostPath volumes")
    if any(p.get("hostPort") for c in containers for p in c.get("ports") or []):
        found.append("hostPort")
    for _, ctx in [(None, pod_ctx), *ctxs]:
        armor = (ctx.get("appArmorProfile") or {}).get("type")
        if armor not in (None, "RuntimeDefault", "Localhost"):
            found.append("appArmorProfile")
        selinux = ctx.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append("seLinuxOptions")
        if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append("seccompProfile")
    if any(ctx.get("procMount") not in (None, "Default") for _, ctx in ctxs):
        found.append("procMount")
    if any(s.get("name") not in SAFE_SYSCTLS for s in pod_ctx.get("sysctls") or []):
        found.append("forbidden sysctls")
    return found


def violations(spec: Obj) -> list[str]:
    """Rules of `restricted` (and `baseline`) that the pod spec `spec` breaks; empty when it is admitted."""
    pod_ctx = spec.get("securityContext") or {}
    containers = _containers(spec)
    # As in the admission, restricted's checks of volumes and capabilities supersede baseline's.
    found = [v for v in _baseline(spec, pod_ctx, containers) if v not in ("hostPath volumes", "capabilities")]
    ctxs = [c.get("securityContext") or {} for c in containers]
    kinds = {key for v in spec.get("volumes") or [] for key in v if key != "name"}
    if kinds - RESTRICTED_VOLUMES:
        found.append("restricted volume types")
    if any(ctx.get("allowPrivilegeEscalation") is not False for ctx in ctxs):
        found.append("allowPrivilegeEscalation != false")
    caps = [(ctx.get("capabilities") or {}) for ctx in ctxs]
    if any(
        "ALL" not in (c.get("drop") or []) or set(c.get("add") or []) - {"NET_BIND_SERVICE"} for c in caps
    ):
        found.append("unrestricted capabilities")
    pod_non_root = pod_ctx.get("runAsNonRoot")
    if (
        pod_non_root is False
        or any(ctx.get("runAsNonRoot") is False for ctx in ctxs)
        or (pod_non_root is not True and not all(ctx.get("runAsNonRoot") is True for ctx in ctxs))
    ):
        found.append("runAsNonRoot != true")
    if pod_ctx.get("runAsUser") == 0 or any(ctx.get("runAsUser") == 0 for ctx in ctxs):
        found.append("runAsUser=0")
    allowed = ("RuntimeDefault", "Localhost")
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    container_seccomp = [(ctx.get("seccompProfile") or {}).get("type") for ctx in ctxs]
    if any(t is not None and t not in allowed for t in [pod_seccomp, *container_seccomp]) or (
        pod_seccomp not in allowed and not all(t in allowed for t in container_seccomp)
    ):
        found.append("seccompProfile")
    return list(dict.fromkeys(found))
