"""kwok's per-pod `Logs`, `Exec` and `PortForward` objects, so that `kubectl logs` (and `--previous`, `-f`),
`kubectl exec` and `kubectl port-forward` reach the runner's processes through the apiserver and kwok's
kubelet API, as they reach a kubelet's containers.

Each object is named like its pod and owned by it (the garbage collector removes it with the pod):
- Logs: each container's current log file and the previous run's (`--previous`);
- Exec: commands run on this machine with the container's environment (not inside its mount namespace:
  kwok runs the command itself);
- PortForward: each container port to `<pod IP>:<port>`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from kubernetes import client
from kubernetes.client.rest import ApiException

if TYPE_CHECKING:
    from .process import ContainerRun

__all__ = ["KwokObjects"]

GROUP: Final = "kwok.x-k8s.io"
VERSION: Final = "v1alpha1"


class KwokObjects:
    def __init__(self, api: client.ApiClient, pod: Mapping[str, Any]) -> None:
        self.custom = client.CustomObjectsApi(api)
        meta = pod["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.owner = {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": meta["uid"]}

    def _upsert(self, kind: str, plural: str, spec: dict[str, Any]) -> None:
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": kind,
            "metadata": {"name": self.name, "namespace": self.namespace, "ownerReferences": [self.owner]},
            "spec": spec,
        }
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, body)
        except ApiException as err:
            if err.status != 409:
                raise
            live = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, self.name)
            body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
            self.custom.replace_namespaced_custom_object(
                GROUP, VERSION, self.namespace, plural, self.name, body
            )

    def apply(
        self, runs: Iterable[ContainerRun], pod_ip: str, env_of: Callable[[ContainerRun], dict[str, str]]
    ) -> None:
        """Write all three objects for the containers' current (and previous) log files."""
        logs, execs, forwards = [], [], []
        for run in runs:
            entry: dict[str, Any] = {"containers": [run.name], "follow": True}
            if run.log_path is not None:
                entry["logsFile"] = str(run.log_path)
                if run.restarts:
                    entry["previousLogsFile"] = str(
                        run.log_path.with_name(f"{run.name}-{run.restarts - 1}.log")
                    )
            logs.append(entry)
            env = env_of(run)
            local: dict[str, Any] = {"envs": [{"name": k, "value": v} for k, v in sorted(env.items())]}
            if run.spec.get("workingDir"):
                local["workDir"] = run.spec["workingDir"]
            execs.append({"containers": [run.name], "local": local})
            for port in run.spec.get("ports") or []:
                number = int(port["containerPort"])
                forwards.append({"ports": [number], "target": {"address": pod_ip, "port": number}})
        self._upsert("Logs", "logs", {"logs": logs})
        self._upsert("Exec", "execs", {"execs": execs})
        if forwards:
            self._upsert("PortForward", "portforwards", {"forwards": forwards})
