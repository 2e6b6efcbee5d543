"""The local cluster's control plane (pure): the command lines of etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok, the identities they use, the address plan and the
apiserver's audit policy. startup.py starts them in this order and waits for each."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from specdeploy_localcluster.nodepools import KWOK_ANNOTATION
from specdeploy_localcluster.paths import HARNESS_DIR
from specdeploy_localcluster.pki import ClientIdentity, ServingIdentity
from specdeploy_localcluster.podnet import NODE_POD_CIDR_MASK
from specdeploy_localcluster.podrunner.selection import KWOK_CRDS, kwok_skip_expression

STAGES = tuple(HARNESS_DIR / "stages" / f for f in ("nodes.yaml", "pods.yaml"))

# The address plan (docs/local-cluster.md): nothing of the local cluster is ever reached at an address off
# this machine. Every simulated node reports NODE_IP as its InternalIP and kwok's kubelet-API server port as
# its kubelet port, so the apiserver's `logs`/`exec`/`port-forward`/proxy connections land on kwok. Pod IPs
# come from podnet.POD_NETWORK (198.18.0.0/15), which this machine keeps to itself (podnet.py: a blackhole
# route, a network namespace per real pod): the controller-manager gives each node a /25 of the cluster's
# slot (node IPAM), kwok hands out the bottom of a node's range to the pods it simulates, the pod runner the
# top. Service ClusterIPs stay in SERVICE_CIDR, where the apiserver wants them: nothing connects to a
# ClusterIP here (no kube-proxy; clients follow EndpointSlices).
NODE_IP = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"

OPERATOR_USER = "specdeploy-operator"

APISERVER_SERVING = ServingIdentity(
    file="apiserver",
    common_name="kube-apiserver",
    dns_names=(
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ),
    ips=("127.0.0.1", "10.96.0.1", "::1"),  # 10.96.0.1: the `kubernetes` Service's ClusterIP
)
CONTROL_PLANE_CLIENTS = (
    ClientIdentity("admin", "specdeploy-admin", "system:masters"),
    ClientIdentity("kube-controller-manager", "system:kube-controller-manager"),
    ClientIdentity("kube-scheduler", "system:kube-scheduler"),
    # The node agents: kwok plays the kubelet of simulated pods, the pod runner that of the pods that run for
    # real, the provisioner a storage driver: all in system:masters, as a harness may.
    ClientIdentity("kwok", "kwok", "system:masters"),
    ClientIdentity("pod-runner", "specdeploy-pod-runner", "system:masters"),
    ClientIdentity("provisioner", "specdeploy-provisioner", "system:masters"),
    # The operator's own identity when it runs with admin rights (tests, demo): its requests are the only
    # ones the audit log records, which is how the benchmark counts them.
    ClientIdentity("operator", OPERATOR_USER, "system:masters"),
)

# Only the operator's identity is audited (metadata level, one line per request once it completes): the
# benchmark counts its API requests from this log, and nothing else pays for auditing.
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  users: ["{OPERATOR_USER}"]
- level: None
"""


def kwok_stages(runnable_images: Iterable[str] = ()) -> str:
    """kwok's Stages. With `runnable_images`, every pod Stage skips the pods the pod runner runs for real
    (podrunner/selection.py), so kwok neither readies, completes nor deletes them."""
    import yaml  # noqa: PLC0415 - `down` and `status` run without PyYAML

    docs = [doc for path in STAGES for doc in yaml.safe_load_all(path.read_text()) if doc]
    images = list(runnable_images)
    if images:
        skip = kwok_skip_expression(images)
        for doc in docs:
            if doc["spec"]["resourceRef"]["kind"] == "Pod":
                doc["spec"]["selector"]["matchExpressions"].append(skip)
    return "\n---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in docs)


def etcd_argv(bins: Path, data_dir: Path, port: int, peer_port: int) -> list[str]:
    return [
        str(bins / "etcd"),
        "--name=specdeploy",
        f"--data-dir={data_dir}",
        f"--listen-client-urls=http://127.0.0.1:{port}",
        f"--advertise-client-urls=http://127.0.0.1:{port}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=specdeploy=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_argv(
    bins: Path, *, etcd_port: int, port: int, pki: Path, cert_dir: Path, audit_policy: Path, audit_log: Path
) -> list[str]:
    return [
        str(bins / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=RBAC",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Simulated nodes are reached at their InternalIP only (kwok, on loopback), never by name.
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--api-audiences=https://kubernetes.default.svc.cluster.local",
        # API aggregation (custom metrics adapters register through it).
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        # One user on loopback: no need for request throttling.
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=0",
        "--max-mutating-requests-inflight=0",
        "--profiling=false",
        f"--audit-policy-file={audit_policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        "--audit-log-mode=batch",
        "--audit-log-batch-max-wait=1s",
        "--audit-log-maxsize=512",
        "--v=1",
    ]


def controller_manager_argv(bins: Path, kubeconfig: Path, pki: Path, pod_cidr: str) -> list[str]:
    """Node IPAM on (each node gets a /NODE_POD_CIDR_MASK of `pod_cidr`); HPAs synced every 5 s."""
    return [
        str(bins / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--horizontal-pod-autoscaler-sync-period=5s",
        "--allocate-node-cidrs=true",
        f"--cluster-cidr={pod_cidr}",
        f"--node-cidr-mask-size={NODE_POD_CIDR_MASK}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--v=1",
    ]


def scheduler_argv(bins: Path, kubeconfig: Path) -> list[str]:
    return [
        str(bins / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--secure-port=0",
        "--leader-elect=false",
        "--v=1",
    ]


def kwok_argv(bins: Path, kubeconfig: Path, stages: Path, fallback_cidr: str, port: int) -> list[str]:
    """kwok manages the nodes annotated KWOK_ANNOTATION with `stages`, serving their kubelet API on `port`."""
    return [
        str(bins / "kwok"),
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
        "--node-lease-duration-seconds=40",
        f"--cidr={fallback_cidr}",
        f"--node-ip={NODE_IP}",
        f"--node-port={port}",
        f"--server-address=127.0.0.1:{port}",
        # kubectl logs/exec/port-forward of the pod runner's pods (podrunner/kwokobjects.py).
        f"--enable-crds={','.join(KWOK_CRDS)}",
    ]
