"""Dynamic volume provisioning for the local cluster: an external provisioner, as a real cluster's CSI
provisioner works, backed by directories on this machine.

The cluster's default StorageClass (`STORAGE_CLASS`) names `PROVISIONER` as its provisioner. For such a class
the controller-manager's PV controller does not provision anything itself: it annotates each pending claim
with `volume.kubernetes.io/storage-provisioner` and waits. This process watches claims, creates for each one a
PersistentVolume (hostPath `<dir>/pvc-<claim uid>`, the claim's size and access modes, a `claimRef`, the
class's reclaim policy) that the PV controller then binds, and deletes the directory and the volume once a
`Delete` volume is released. Every simulated node sees the same directories (they are all this machine), so
ReadWriteMany works, as it would on a shared file system; capacity is not enforced.

Run: `python -m specdeploy_localcluster.provisioner --kubeconfig K --dir D` (LocalCluster starts it as the
component `provisioner`).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

__all__ = ["PROVISIONER", "STORAGE_CLASS", "HostPathProvisioner", "storage_class_manifest"]

PROVISIONER: Final = "specdeploy.dev/local-hostpath"
STORAGE_CLASS: Final = "standard"
_PROVISIONER_ANNOTATIONS: Final = (
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
)
_PROVISIONED_BY: Final = "pv.kubernetes.io/provisioned-by"

log = logging.getLogger("provisioner")


def storage_class_manifest() -> dict[str, Any]:
    """The cluster's default StorageClass: claims without `storageClassName` get it (DefaultStorageClass
    admission), so applying an example in a fresh namespace just works."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_for_claim(claim: client.V1PersistentVolumeClaim, path: Path, reclaim: str) -> dict[str, Any]:
    """The PersistentVolume provisioned for `claim`."""
    meta, spec = claim.metadata, claim.spec
    requests = (spec.resources.requests if spec.resources else None) or {}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pvc-{meta.uid}", "annotations": {_PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": requests.get("storage", "1Gi")},
            "accessModes": list(spec.access_modes or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": reclaim,
            "storageClassName": spec.storage_class_name,
            "volumeMode": spec.volume_mode or "Filesystem",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta.namespace,
                "name": meta.name,
                "uid": meta.uid,
            },
            "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
        },
    }


class HostPathProvisioner:
    """Provisions and deletes the volumes of `PROVISIONER`'s StorageClasses under `root`."""

    def __init__(self, api: client.ApiClient, root: Path) -> None:
        self.core = client.CoreV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.root = root
        self.stopping = threading.Event()

    def _reclaim_policy(self, class_name: str | None) -> str | None:
        """The class's reclaim policy, or None when the class is not ours."""
        if not class_name:
            return None
        try:
            sc = self.storage.read_storage_class(class_name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return (sc.reclaim_policy or "Delete") if sc.provisioner == PROVISIONER else None

    def provision(self, claim: client.V1PersistentVolumeClaim) -> None:
        annotations = claim.metadata.annotations or {}
        if claim.spec.volume_name or claim.status.phase != "Pending" or claim.metadata.deletion_timestamp:
            return
        if all(annotations.get(key) != PROVISIONER for key in _PROVISIONER_ANNOTATIONS):
            return
        reclaim = self._reclaim_policy(claim.spec.storage_class_name)
        if reclaim is None:
            return
        path = self.root / f"pvc-{claim.metadata.uid}"
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.core.create_persistent_volume(volume_for_claim(claim, path, reclaim))
        except ApiException as err:
            if err.status != 409:  # already provisioned (a repeated event)
                raise
            return
        log.info(
            "provisioned pvc-%s for %s/%s", claim.metadata.uid, claim.metadata.namespace, claim.metadata.name
        )

    def reclaim(self, volume: client.V1PersistentVolume) -> None:
        annotations = volume.metadata.annotations or {}
        if annotations.get(_PROVISIONED_BY) != PROVISIONER or volume.status.phase != "Released":
            return
        if volume.spec.persistent_volume_reclaim_policy != "Delete":
            return
        path = Path(volume.spec.host_path.path)
        if path.parent == self.root:
            shutil.rmtree(path, ignore_errors=True)
        try:
            self.core.delete_persistent_volume(volume.metadata.name)
        except ApiException as err:
            if err.status != 404:
                raise
        log.info("deleted %s (released)", volume.metadata.name)

    def _follow(self, list_call: Callable[..., Any], handle: Callable[[Any], None]) -> None:
        """List, handle everything, then watch from that version; start over when the watch ends."""
        while not self.stopping.is_set():
            try:
                listing = list_call()
                for item in listing.items:
                    handle(item)
                stream = watch.Watch().stream(
                    list_call, resource_version=listing.metadata.resource_version, timeout_seconds=60
                )
                for event in stream:
                    if self.stopping.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        handle(event["object"])
            except Exception:  # keep provisioning whatever one event did (logged with its trace)
                if self.stopping.is_set():
                    return
                log.exception("watch failed; listing again in 1 s")
                time.sleep(1)

    def run(self) -> None:
        threads = [
            threading.Thread(
                target=self._follow,
                args=(self.core.list_persistent_volume_claim_for_all_namespaces, self.provision),
                daemon=True,
            ),
            threading.Thread(
                target=self._follow, args=(self.core.list_persistent_volume, self.reclaim), daemon=True
            ),
        ]
        for thread in threads:
            thread.start()
        self.stopping.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--dir", required=True, type=Path, help="where the volumes' directories go")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    provisioner = HostPathProvisioner(config.new_client_from_config(config_file=args.kubeconfig), args.dir)
    signal.signal(signal.SIGTERM, lambda *_: provisioner.stopping.set())
    log.info("provisioner %s: volumes under %s", PROVISIONER, args.dir)
    provisioner.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
