"""A pod's volumes as directories on this machine, and each container's mounts of them.

What a kubelet materialises, the runner writes under the pod's directory: ConfigMap, Secret, downward API
and projected volumes (service-account tokens from the TokenRequest API), emptyDirs; PersistentVolumeClaims
resolve to their bound volume's `hostPath`/`local` directory (the local cluster's provisioner makes those);
`hostPath` volumes are the path itself. Other volume types make the pod fail with a message naming them.
Files are written once at start: later edits of a ConfigMap or Secret do not reach a running pod (a kubelet
refreshes them within a minute; nothing here relies on that).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

__all__ = [
    "Mount",
    "PodNotReady",
    "PodSources",
    "UnsupportedPod",
    "container_mounts",
    "field_value",
    "prepare_volumes",
]


class UnsupportedPod(Exception):
    """The runner cannot give the pod what it asks for (the pod fails with this message)."""


class PodNotReady(Exception):
    """Something the pod needs does not exist yet (an unbound claim, a missing ConfigMap): try again."""


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API `fieldRef.fieldPath` of the pod (`metadata.name`, `status.podIP`, a label, ...)."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((meta.get(source) or {}).get(path[len(prefix) + 2 : -2], ""))
    raise UnsupportedPod(f"downward API field {path!r} is not supported by the pod runner")


def _write(directory: Path, files: Mapping[str, bytes], mode: int | None) -> None:
    for rel, data in files.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if mode is not None:
            target.chmod(mode)


def _select(data: Mapping[str, bytes], items: list[Mapping[str, Any]] | None, what: str) -> dict[str, bytes]:
    if not items:
        return dict(data)
    out = {}
    for item in items:
        if item["key"] not in data:
            raise PodNotReady(f"{what} has no key {item['key']!r}")
        out[item["path"]] = data[item["key"]]
    return out


class PodSources:
    """Reads the API objects that volumes and environment variables are made of."""

    def __init__(self, core: client.CoreV1Api, pod: Mapping[str, Any]) -> None:
        self.core = core
        self.pod = pod
        self.namespace = pod["metadata"]["namespace"]

    def config_map(self, name: str, optional: bool) -> dict[str, bytes]:
        try:
            cm = self.core.read_namespaced_config_map(name, self.namespace)
        except ApiException as err:
            if err.status == 404 and optional:
                return {}
            if err.status == 404:
                raise PodNotReady(f'configmap "{name}" not found') from err
            raise
        data = {k: v.encode() for k, v in (cm.data or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
        return data

    def secret(self, name: str, optional: bool) -> dict[str, bytes]:
        try:
            secret = self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as err:
            if err.status == 404 and optional:
                return {}
            if err.status == 404:
                raise PodNotReady(f'secret "{name}" not found') from err
            raise
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    def token(self, audience: str | None, seconds: int | None) -> bytes:
        account = self.pod["spec"].get("serviceAccountName") or "default"
        meta = self.pod["metadata"]
        body = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[audience] if audience else [],
                expiration_seconds=seconds or 3600,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=meta["name"], uid=meta["uid"]
                ),
            )
        )
        result = self.core.create_namespaced_service_account_token(account, self.namespace, body)
        return str(result.status.token).encode()

    def downward(self, items: list[Mapping[str, Any]]) -> dict[str, bytes]:
        out = {}
        for item in items:
            if "fieldRef" not in item:
                raise UnsupportedPod("downward API resourceFieldRef is not supported by the pod runner")
            out[item["path"]] = field_value(self.pod, item["fieldRef"]["fieldPath"]).encode()
        return out


def _projected(src: PodSources, volume: Mapping[str, Any]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for source in volume.get("sources") or []:
        if "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            files[sat["path"]] = src.token(sat.get("audience"), sat.get("expirationSeconds"))
        elif "configMap" in source:
            ref = source["configMap"]
            data = src.config_map(ref["name"], bool(ref.get("optional")))
            files.update(_select(data, ref.get("items"), f"configmap {ref['name']}"))
        elif "secret" in source:
            ref = source["secret"]
            data = src.secret(ref["name"], bool(ref.get("optional")))
            files.update(_select(data, ref.get("items"), f"secret {ref['name']}"))
        elif "downwardAPI" in source:
            files.update(src.downward(source["downwardAPI"].get("items") or []))
        else:
            raise UnsupportedPod(
                f"projected volume source {sorted(source)} is not supported by the pod runner"
            )
    return files


def _claim_path(core: client.CoreV1Api, namespace: str, claim: str) -> Path:
    try:
        pvc = core.read_namespaced_persistent_volume_claim(claim, namespace)
    except ApiException as err:
        if err.status == 404:
            raise PodNotReady(f'persistentvolumeclaim "{claim}" not found') from err
        raise
    if pvc.status.phase != "Bound" or not pvc.spec.volume_name:
        raise PodNotReady(f'persistentvolumeclaim "{claim}" is not bound yet')
    pv = core.read_persistent_volume(pvc.spec.volume_name)
    if pv.spec.host_path is not None:
        path = Path(pv.spec.host_path.path)
    elif pv.spec.local is not None:
        path = Path(pv.spec.local.path)
    else:
        raise UnsupportedPod(f"volume {pv.metadata.name} is neither hostPath nor local")
    path.mkdir(parents=True, exist_ok=True)
    return path


def prepare_volumes(core: client.CoreV1Api, pod: Mapping[str, Any], pod_dir: Path) -> dict[str, Path]:
    """Each volume of `pod` as a directory (written under `pod_dir/volumes/` where the runner makes it)."""
    src = PodSources(core, pod)
    out: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        directory = pod_dir / "volumes" / name
        if "persistentVolumeClaim" in volume:
            out[name] = _claim_path(core, src.namespace, volume["persistentVolumeClaim"]["claimName"])
            continue
        if "hostPath" in volume:
            out[name] = Path(volume["hostPath"]["path"])
            if volume["hostPath"].get("type") in ("DirectoryOrCreate", None, ""):
                out[name].mkdir(parents=True, exist_ok=True)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        out[name] = directory
        if "emptyDir" in volume:
            continue
        if "configMap" in volume:
            ref = volume["configMap"]
            data = src.config_map(ref["name"], bool(ref.get("optional")))
            _write(
                directory, _select(data, ref.get("items"), f"configmap {ref['name']}"), ref.get("defaultMode")
            )
        elif "secret" in volume:
            ref = volume["secret"]
            data = src.secret(ref["secretName"], bool(ref.get("optional")))
            files = _select(data, ref.get("items"), f"secret {ref['secretName']}")
            _write(directory, files, ref.get("defaultMode", 0o644))
        elif "projected" in volume:
            _write(directory, _projected(src, volume["projected"]), volume["projected"].get("defaultMode"))
        elif "downwardAPI" in volume:
            _write(directory, src.downward(volume["downwardAPI"].get("items") or []), None)
        else:
            kinds = sorted(k for k in volume if k != "name")
            raise UnsupportedPod(f"volume {name!r} of type {kinds} is not supported by the pod runner")
    return out


def container_mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> list[Mount]:
    """The container's `volumeMounts` as (directory on this machine, mount path, read-only)."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        source = volumes[mount["name"]]
        sub = mount.get("subPath")
        if sub:
            source = source / sub
            if not source.exists():
                source.mkdir(parents=True)
        mounts.append(Mount(source, mount["mountPath"], bool(mount.get("readOnly"))))
    return mounts
