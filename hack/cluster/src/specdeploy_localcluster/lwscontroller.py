"""The LeaderWorkerSet controller of the local cluster (pure, but for reading the files build.sh keeps beside
its binary): its identity, its configuration file, its command line, and the API objects it needs, all from
the same sigs.k8s.io/lws module version as the binary: its CRDs, its ClusterRole (bound to its client
certificate's user) and its webhook configurations, pointed at the controller on 127.0.0.1 instead of an
in-cluster Service, with the cluster CA as caBundle (the controller's own certificate management is off: it
serves a certificate from the harness's PKI)."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specdeploy_localcluster.pki import ClientIdentity, ServingIdentity

LWS_USER = "specdeploy-lws-controller"
# Its rights are upstream's ClusterRole (config/rbac/role.yaml of the module), under this name.
LWS_CLUSTER_ROLE = "specdeploy:lws-controller"
LWS_CLIENT = ClientIdentity("lws-controller", LWS_USER)
# The apiserver dials the webhooks at https://127.0.0.1:<port>: the certificate names that address.
LWS_WEBHOOK_SERVING = ServingIdentity(
    file="lws-webhook-serving", common_name="127.0.0.1", dns_names=("localhost",), ips=("127.0.0.1",)
)
# Names of the webhook configurations, as upstream's kustomize deployment calls them (namePrefix `lws-`).
WEBHOOK_CONFIGURATION_PREFIX = "lws-"
_PATCH_PATH = re.compile(r"^/webhooks/(\d+)$")


def lws_dir(bins: Path) -> Path:
    """What build.sh built from sigs.k8s.io/lws (the controller, crds/, rbac/, webhook/): bin/<key>/lws."""
    return bins / "lws"


def lws_config(cert_dir: Path, webhook_port: int) -> dict[str, Any]:
    """The controller's Configuration file (config.lws.x-k8s.io/v1alpha1): webhooks on 127.0.0.1 with the
    certificate in `cert_dir` (tls.crt, tls.key), its internal certificate management off, no leader
    election (one controller), no metrics or health listeners (nothing scrapes or probes them here)."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": "0"},
        "internalCertManagement": {"enable": False},
    }


def lws_argv(bins: Path, config: Path, kubeconfig: Path) -> list[str]:
    return [
        str(lws_dir(bins) / "lws-controller"),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        "--zap-devel=false",
        "--zap-log-level=info",
    ]


def _load_all(path: Path) -> list[dict[str, Any]]:
    import yaml  # noqa: PLC0415 - `down` and `status` run without PyYAML

    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def lws_objects(bins: Path) -> list[dict[str, Any]]:
    """The CRDs (LeaderWorkerSet, and DisaggregatedSet, whose controller the same binary runs) and the
    controller's ClusterRole and its binding to LWS_USER."""
    base = lws_dir(bins)
    crds = [doc for path in sorted((base / "crds").glob("*.yaml")) for doc in _load_all(path)]
    (role,) = _load_all(base / "rbac" / "role.yaml")
    role = {**role, "metadata": {"name": LWS_CLUSTER_ROLE}}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": LWS_CLUSTER_ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": LWS_CLUSTER_ROLE},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": LWS_USER}],
    }
    return [*crds, role, binding]


def _apply_replace_patch(config: dict[str, Any], patch: list[Mapping[str, Any]], source: Path) -> None:
    """Upstream's kustomize patches replace whole webhooks (`op: replace`, `path: /webhooks/<i>`): the pod
    webhooks' objectSelector (only pods of a LeaderWorkerSet)."""
    for op in patch:
        match = _PATCH_PATH.match(str(op.get("path", "")))
        if op.get("op") != "replace" or match is None:
            raise ValueError(f"{source}: unsupported patch operation {op.get('op')} {op.get('path')}")
        config["webhooks"][int(match.group(1))] = copy.deepcopy(op["value"])


def webhook_configurations(bins: Path, webhook_port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """Upstream's Mutating- and ValidatingWebhookConfiguration (config/webhook: manifests.yaml with its
    patches), each webhook's `clientConfig.service` replaced by `url: https://127.0.0.1:<port><path>` and
    `caBundle` (base64 PEM of the CA that signed the controller's serving certificate)."""
    import yaml  # noqa: PLC0415

    webhook_dir = lws_dir(bins) / "webhook"
    configs = {doc["kind"]: doc for doc in _load_all(webhook_dir / "manifests.yaml")}
    patches = {
        "MutatingWebhookConfiguration": webhook_dir / "mutating-patch.yaml",
        "ValidatingWebhookConfiguration": webhook_dir / "validating-patch.yaml",
    }
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = copy.deepcopy(configs[kind])
        _apply_replace_patch(config, yaml.safe_load(patches[kind].read_text()), patches[kind])
        for webhook in config["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{webhook_port}{path}",
                "caBundle": ca_bundle,
            }
        config["metadata"] = {"name": WEBHOOK_CONFIGURATION_PREFIX + config["metadata"]["name"]}
        out.append(config)
    return out


def probe_leaderworkerset(name: str) -> dict[str, Any]:
    """A LeaderWorkerSet to create with dryRun=All: the mutating webhook fills in its rollout strategy."""
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "leaderWorkerTemplate": {
                "size": 2,
                "workerTemplate": {
                    "spec": {"containers": [{"name": "main", "image": "registry.invalid/x:1"}]}
                },
            }
        },
    }


def probe_leader_pod(lws_name: str) -> dict[str, Any]:
    """Group 0's leader pod as the controller makes it, to create with dryRun=All: the pod webhook gives it
    its group labels and the LWS_* environment variables."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{lws_name}-0",
            "labels": {
                "leaderworkerset.sigs.k8s.io/name": lws_name,
                "leaderworkerset.sigs.k8s.io/worker-index": "0",
            },
            "annotations": {"leaderworkerset.sigs.k8s.io/size": "2"},
        },
        "spec": {
            "subdomain": lws_name,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "registry.invalid/x:1"}],
        },
    }


def webhooks_answered(lws: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether the dry-run results of `probe_leaderworkerset` and `probe_leader_pod` carry what the
    controller's mutating webhooks add (so the apiserver reached them, validating webhooks included)."""
    rollout = (lws.get("spec") or {}).get("rolloutStrategy") or {}
    env = {e.get("name") for c in (pod.get("spec") or {}).get("containers") or [] for e in c.get("env") or []}
    return "rollingUpdateConfiguration" in rollout and "LWS_LEADER_ADDRESS" in env
