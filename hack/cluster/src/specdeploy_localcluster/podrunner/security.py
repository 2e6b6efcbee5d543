"""A container's `securityContext` on the pod runner: who its process runs as, and what it may write.

What is honoured, as a kubelet and a container runtime would:
- the user: `runAsUser`/`runAsGroup` (container, else pod, else the image's USER, as `ImageDefaults.user`
  records it), the pod's `fsGroup` and `supplementalGroups` as supplementary groups. The process is started
  as that user by `setpriv` after its volumes are mounted, with an empty inheritable and bounding capability
  set; `allowPrivilegeEscalation: false` sets no_new_privs. `runAsNonRoot` with a root user refuses to start
  the container (the kubelet's CreateContainerConfigError);
- `fsGroup`: volumes the runner makes (emptyDir, configMap, secret, projected, downwardAPI) and claims are
  group-owned by it and group-accessible (setgid directories), as the kubelet's SetVolumeOwnership does;
  with `fsGroupChangePolicy: OnRootMismatch` a claim whose root already has that group is left alone;
  emptyDirs are world-writable (mode 0777), as the kubelet makes them;
- `readOnlyRootFilesystem`: in the container's mount namespace every mount of this machine (the stand-in for
  the image) is made read-only, except /proc, /sys and /dev; only the pod's volumes stay writable.

The "image" is this machine: a directory other users cannot enter on the way to the programs (/root, where
pyenv keeps the virtualenv's interpreter) is replaced, in a non-root container's mount namespace, by a tmpfs
showing only the entries that lead to them (`hidden_ancestors`).

What is not: seccomp and AppArmor profiles, SELinux options and the capability lists are not applied (the
process simply has no capabilities as a non-root user), `procMount`, sysctls and user namespaces
(`hostUsers`) are ignored. The image is this machine's filesystem, so "read-only root" means the machine's
files are read-only for the process, not that a container image is.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .selection import ImageDefaults
from .volumes import UnsupportedPod

__all__ = ["ProcessIdentity", "apply_fs_group", "hidden_ancestors", "identity", "privilege_drop"]


@dataclass(frozen=True)
class ProcessIdentity:
    """What a container's process runs as."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    no_new_privs: bool
    read_only_root: bool


def identity(pod: Mapping[str, Any], container: Mapping[str, Any], image: ImageDefaults) -> ProcessIdentity:
    """The identity of `container`'s process; `UnsupportedPod` for runAsNonRoot with a root user."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    context = container.get("securityContext") or {}

    def pick(key: str, image_value: int) -> int:
        for source in (context, pod_context):
            if source.get(key) is not None:
                return int(source[key])
        return image_value

    image_uid, image_gid = image.user
    uid, gid = pick("runAsUser", image_uid), pick("runAsGroup", image_gid)
    non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
    if non_root and uid == 0:
        raise UnsupportedPod(
            f"container {container['name']!r}: CreateContainerConfigError: container has runAsNonRoot and "
            "image will run as root"
        )
    groups = [int(pod_context["fsGroup"])] if pod_context.get("fsGroup") is not None else []
    groups += [int(g) for g in pod_context.get("supplementalGroups") or []]
    return ProcessIdentity(
        uid=uid,
        gid=gid,
        groups=tuple(dict.fromkeys(groups)),
        no_new_privs=context.get("allowPrivilegeEscalation") is False,
        read_only_root=bool(context.get("readOnlyRootFilesystem")),
    )


def privilege_drop(who: ProcessIdentity) -> list[str]:
    """The argv prefix that starts the command as `who` (nothing for root without restrictions)."""
    if who.uid == 0 and who.gid == 0 and not who.groups and not who.no_new_privs:
        return []
    argv = ["setpriv", f"--reuid={who.uid}", f"--regid={who.gid}"]
    argv.append(f"--groups={','.join(str(g) for g in who.groups)}" if who.groups else "--clear-groups")
    if who.uid != 0:
        argv += ["--inh-caps=-all", "--bounding-set=-all"]
    if who.no_new_privs:
        argv.append("--no-new-privs")
    return [*argv, "--"]


def _own(path: Path, group: int, writable: bool) -> None:
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return
    os.chown(path, -1, group)
    mode = stat.S_IMODE(info.st_mode) | stat.S_IRGRP | (stat.S_IWGRP if writable else 0)
    if stat.S_ISDIR(info.st_mode):
        mode |= stat.S_IXGRP | stat.S_ISGID
    os.chmod(path, mode)


def apply_fs_group(pod: Mapping[str, Any], volumes: Mapping[str, Path], claims: set[str]) -> None:
    """Give the pod's volumes to its `fsGroup` (kubelet's SetVolumeOwnership). `claims`: names of the
    volumes that are PersistentVolumeClaims (OnRootMismatch applies to them); hostPath volumes are never
    changed. emptyDirs become mode 0777, fsGroup or not."""
    spec = pod.get("spec") or {}
    by_name = {v["name"]: v for v in spec.get("volumes") or []}
    context = spec.get("securityContext") or {}
    group = context.get("fsGroup")
    for name, path in volumes.items():
        volume = by_name.get(name) or {}
        if "emptyDir" in volume:
            path.chmod(0o777)
        if group is None or "hostPath" in volume:
            continue
        if name in claims and context.get("fsGroupChangePolicy") == "OnRootMismatch":
            info = path.stat()
            if info.st_gid == int(group) and info.st_mode & stat.S_ISGID:
                continue
        # Files the kubelet writes (configMap, secret, projected, downwardAPI) are read-only volumes.
        read_only = not ("emptyDir" in volume or "persistentVolumeClaim" in volume) or bool(
            (volume.get("persistentVolumeClaim") or {}).get("readOnly")
        )
        for root, dirs, files in os.walk(path):
            for entry in [
                root,
                *(os.path.join(root, d) for d in dirs),
                *(os.path.join(root, f) for f in files),
            ]:
                _own(Path(entry), int(group), writable=not read_only)


def hidden_ancestors(paths: list[Path]) -> dict[Path, set[str]]:
    """For each of `paths` (as given and resolved) the first directory on the way that other users cannot
    enter (no o+x: /root, where pyenv keeps the virtualenv's interpreter), with the entries below it that
    lead to the path. The "image" is this machine: a non-root container must reach the programs, as it would
    in a real image (`_mount_script` shows just those entries over a tmpfs in the container's mount
    namespace)."""
    hidden: dict[Path, set[str]] = {}
    for path in [*paths, *(p.resolve() for p in paths)]:
        parts = path.absolute().parts
        for depth in range(2, len(parts)):
            ancestor = Path(*parts[:depth])
            try:
                mode = ancestor.stat().st_mode
            except OSError:
                break
            if not mode & stat.S_IXOTH:
                hidden.setdefault(ancestor, set()).add(parts[depth])
                break
    return hidden
