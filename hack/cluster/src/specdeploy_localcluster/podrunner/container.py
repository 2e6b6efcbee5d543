"""Starting one container of a pod as a local process.

- Environment: the container's `env` (values, downward-API `fieldRef`s, ConfigMap/Secret keys) and
  `envFrom`, plus what a container runtime adds (`HOSTNAME`, the image's `PATH` = this checkout's
  virtualenv). Model hubs are unreachable from this machine, so `HF_HUB_OFFLINE=1` is set as the image's
  environment would be in an air-gapped cluster.
- Command: `command`/`args` with `$(VAR)` expansion, falling back to the image's ENTRYPOINT/CMD.
- Files: the process runs in a private mount namespace (`unshare -m`) in which every volume is bind-mounted at
  its `mountPath` (read-only where asked), so the program sees the paths the pod spec names. Mount points that
  do not exist yet are created as empty directories on this machine, as a runtime creates them in an image.
- Network: every container of the pod runs in the pod's network namespace (podnet.py), where the pod IP is
  its `eth0`'s address: a server that binds `0.0.0.0:8000` listens on the pod IP, as in a real pod.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from kubernetes import client

from specdeploy_localcluster.podnet import netns_exec

from .selection import ImageDefaults
from .volumes import Mount, PodNotReady, PodSources, UnsupportedPod, field_value

__all__ = ["command_line", "container_env", "launch"]

_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$\(")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known variables are replaced, `$$(` escapes, unknown ones stay."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$(":
            return "$("
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR.sub(replace, text)


def _sources(core: client.CoreV1Api, namespace: str) -> PodSources:
    return PodSources(core, {"metadata": {"namespace": namespace}, "spec": {}})


def _key_ref(core: client.CoreV1Api, namespace: str, ref: Mapping[str, Any], secret: bool) -> str | None:
    reader = _sources(core, namespace)
    data = reader.secret(ref["name"], True) if secret else reader.config_map(ref["name"], True)
    if ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise PodNotReady(f"{'secret' if secret else 'configmap'} {ref['name']} has no key {ref['key']!r}")
    return data[ref["key"]].decode()


def container_env(
    core: client.CoreV1Api,
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    venv_bin: Path,
    image: ImageDefaults | None = None,
) -> dict[str, str]:
    """The process environment of `container` (pod IP already in the pod's status): the image's ENV, then
    the container's."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {
        "PATH": f"{venv_bin}:{_SYSTEM_PATH}",
        "HOSTNAME": pod["metadata"]["name"],
        "HOME": "/root",
        "HF_HUB_OFFLINE": "1",
        "LANG": "C.UTF-8",
        **(image.env if image is not None else {}),
    }
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            ref = source["configMapRef"]
            data = {k: v.decode() for k, v in _sources(core, namespace).config_map(ref["name"], True).items()}
        else:
            ref = source["secretRef"]
            data = {k: v.decode() for k, v in _sources(core, namespace).secret(ref["name"], True).items()}
        env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        if "valueFrom" not in item:
            env[item["name"]] = expand(item.get("value", ""), env)
            continue
        value_from = item["valueFrom"]
        value: str | None
        if "fieldRef" in value_from:
            value = field_value(pod, value_from["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in value_from:
            value = _key_ref(core, namespace, value_from["configMapKeyRef"], secret=False)
        elif "secretKeyRef" in value_from:
            value = _key_ref(core, namespace, value_from["secretKeyRef"], secret=True)
        else:
            raise UnsupportedPod(
                f"env {item['name']}: {sorted(value_from)} is not supported by the pod runner"
            )
        if value is not None:
            env[item["name"]] = value
    return env


def command_line(container: Mapping[str, Any], env: Mapping[str, str], image: ImageDefaults) -> list[str]:
    """argv of the container: `command` (else the image's ENTRYPOINT) + `args` (else, only without
    `command`, the image's CMD), each item `$(VAR)`-expanded."""
    command = container.get("command")
    args = container.get("args")
    if command is None:
        argv = [*image.entrypoint, *(args if args is not None else image.cmd)]
    else:
        argv = [*command, *(args or [])]
    if not argv:
        raise UnsupportedPod(f"container {container['name']!r} has no command and its image no entrypoint")
    return [expand(part, env) for part in argv]


# readOnlyRootFilesystem: every mount but the kernel's own file systems becomes read-only (the mount
# namespace is private, so only this container sees it). A bind mount copies the read-only flag of the
# mount its source lies on, so writable volumes are made writable again after they are mounted.
_READ_ONLY_ROOT = r"""awk '{print $5}' /proc/self/mountinfo | while read -r point; do
  case "$point" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*|*\\*) continue ;; esac
  mount -o remount,bind,ro "$point" 2>/dev/null || true
done"""


_IMAGE_FD = 3
"""First file descriptor the mount script holds an image directory open on (sh's `exec N<` takes 3 to 9)."""


def _bind_back(fd: int, path: Path) -> list[str]:
    """Script lines that mount what descriptor `fd` holds open at `path` again, then close it."""
    # --no-canonicalize: mount would resolve the /proc link to its path, the empty directory just made.
    return [f'mount --no-canonicalize --bind "/proc/$$/fd/{fd}" {shlex.quote(str(path))}', f"exec {fd}<&-"]


def _mount_script(
    mounts: list[Mount],
    workdir: str | None,
    *,
    read_only_root: bool = False,
    exposed: Mapping[Path, set[str]] | None = None,
    image: Sequence[Path] = (),
) -> str:
    """The shell script that mounts the container's volumes at their paths (mount points are created
    first, before a read-only root forbids it), then execs its arguments. `exposed`: directories a non-root
    user cannot enter, each replaced by a tmpfs that shows only the given entries (held open while the tmpfs
    is mounted). `image`: the directories that are the "image" here (this checkout and its
    virtualenv); a volume mounted over one of their ancestors (an emptyDir at `/tmp` while the checkout is
    under /tmp) would hide the programs, so each is opened before the volumes are mounted and bound back at
    its own path afterwards, as the image's files stay visible under a real container's volumes."""
    lines = ["set -e"]
    covered = [
        root
        for root in dict.fromkeys(image)
        if any(Path(m.target) == root or Path(m.target) in root.parents for m in mounts)
    ]
    for m in mounts:
        dst = shlex.quote(m.target)
        if m.source.is_dir():
            lines.append(f"mkdir -p {dst}")
        else:
            lines.append(f"mkdir -p {shlex.quote(str(Path(m.target).parent))} && touch {dst}")
    if workdir:
        lines.append(f"mkdir -p {shlex.quote(workdir)}")
    for fd, root in enumerate(covered, start=_IMAGE_FD):
        lines.append(f"exec {fd}< {shlex.quote(str(root))}")
    # The volumes first: their sources (the cluster's directory) may lie in a directory hidden below.
    for m in mounts:
        src, dst = shlex.quote(str(m.source)), shlex.quote(m.target)
        lines.append(f"mount --bind {src} {dst}")
        lines += [
            f"mkdir -p {shlex.quote(str(root))} 2>/dev/null || true"
            for root in covered
            if Path(m.target) == root or Path(m.target) in root.parents
        ]
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {dst}")
    if read_only_root:
        lines.append(_READ_ONLY_ROOT)
        lines += [f"mount -o remount,bind,rw {shlex.quote(m.target)}" for m in mounts if not m.read_only]
    for fd, root in enumerate(covered, start=_IMAGE_FD):
        lines += _bind_back(fd, root)
    for hidden, entries in sorted((exposed or {}).items()):
        # Each entry is held open across the tmpfs and bound back from its descriptor (it keeps the
        # read-only flag of the mount it lies on); the tmpfs itself is read-only under a read-only root.
        shown = list(enumerate(sorted(entries), start=_IMAGE_FD))
        assert len(shown) <= 10 - _IMAGE_FD, f"more than {10 - _IMAGE_FD} entries to show in {hidden}"
        lines += [f"exec {fd}< {shlex.quote(str(hidden / entry))}" for fd, entry in shown]
        lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(hidden))}")
        for fd, entry in shown:
            real = shlex.quote(str(hidden / entry))
            lines.append(f"mkdir -p {real}" if (hidden / entry).is_dir() else f"touch {real}")
            lines += _bind_back(fd, hidden / entry)
        if read_only_root:
            lines.append(f"mount -o remount,ro {shlex.quote(str(hidden))}")
    if workdir:
        lines.append(f"cd {shlex.quote(workdir)}")
    lines.append('exec "$@"')
    return "\n".join(lines) + "\n"


def _copy_lines(stream: IO[bytes], name: str, log: IO[bytes], lock: threading.Lock) -> None:
    """CRI log lines (`<RFC3339Nano> <stream> <F|P> <text>`), the format kwok and `kubectl logs` read."""
    for line in iter(stream.readline, b""):
        full = line.endswith(b"\n")
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
        with lock:
            log.write(
                b"%s %s %s %s"
                % (stamp, name.encode(), b"F" if full else b"P", line if full else line + b"\n")
            )
            log.flush()
    stream.close()


def launch(
    *,
    argv: list[str],
    env: Mapping[str, str],
    mounts: list[Mount],
    workdir: str | None,
    script: Path,
    log_path: Path,
    netns: str,
    read_only_root: bool = False,
    exposed: Mapping[Path, set[str]] | None = None,
    image: Sequence[Path] = (),
) -> subprocess.Popen[bytes]:
    """Start the process in its own mount namespace and process group; its stdout and stderr go to
    `log_path` as CRI log lines. A command that cannot be executed ends the process with status 127 or 126,
    as a shell reports it."""
    script.write_text(
        _mount_script(mounts, workdir, read_only_root=read_only_root, exposed=exposed, image=image)
    )
    proc = subprocess.Popen(
        netns_exec(netns, ["unshare", "--mount", "--propagation", "private", "sh", str(script), *argv]),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    log = log_path.open("ab")
    lock = threading.Lock()
    copiers = [
        threading.Thread(target=_copy_lines, args=(stream, name, log, lock), daemon=True)
        for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))
    ]
    for copier in copiers:
        copier.start()

    def close_when_done() -> None:
        for copier in copiers:
            copier.join()
        log.close()

    threading.Thread(target=close_when_done, daemon=True).start()
    return proc
