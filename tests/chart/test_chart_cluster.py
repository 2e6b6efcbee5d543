"""The Helm chart in a real cluster: install (CRDs established, the operator pod scheduled and Ready),
upgrade, uninstall; and the RBAC proof: the operator, run with a token of the chart's ServiceAccount (not
the admin certificate), reconciles an example to Ready while requests outside its grant are refused."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_localcluster.processes import PortTaken, free_port, port_taken, retry_on_taken_port

from tests.chart.conftest import CHART, REPO, Helm
from tests.conftest import Kubectl, wait_for

pytestmark = pytest.mark.integration

CRDS = [
    "speculativedeployments.specdeploy.dev",
    "enginebuilds.specdeploy.dev",
    "clusterkopfpeerings.kopf.dev",
    "kopfpeerings.kopf.dev",
]
EXAMPLE = REPO / "examples" / "02-draft-target-llama8b-1b-h100.yaml"


def manifest(helm: Helm, release: str, namespace: str, kubeconfig: Path) -> list[dict[str, Any]]:
    out = helm("get", "manifest", release, "-n", namespace, kubeconfig=kubeconfig).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def operator_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    [deployment] = [o for o in objs if o["kind"] == "Deployment"]
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def get_json(kubectl: Kubectl, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


@pytest.fixture
def other_namespace(kubectl: Kubectl) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def can_i(kubectl: Kubectl, subject: str, *args: str) -> bool:
    proc = kubectl("auth", "can-i", f"--as={subject}", *args, check=False)
    return proc.stdout.strip() == "yes"


def test_install_upgrade_uninstall(helm: Helm, kubectl: Kubectl, kubeconfig: Path, namespace: str) -> None:
    release = "sd"
    install = helm(
        "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "180s", kubeconfig=kubeconfig
    )
    # NOTES.txt tells the user what to do next, with the real names.
    notes = install.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {namespace} rollout status deployment/sd-specdeploy" in notes
    assert f"kubectl apply -n default -f examples/{EXAMPLE.name}" in notes
    assert "kubectl get sdep,enginebuilds -n default -w" in notes

    for crd in CRDS:
        kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")

    # helm --wait waits for the new ReplicaSet; the Deployment's own count follows from its controller.
    def deployment_with(ready: int) -> dict[str, Any] | None:
        deployment: dict[str, Any] = get_json(kubectl, "deployment", "sd-specdeploy", "-n", namespace)
        return deployment if deployment["status"].get("readyReplicas") == ready else None

    wait_for(lambda: deployment_with(1), timeout=60, what="the operator Deployment's 1 ready replica")
    sa = f"system:serviceaccount:{namespace}:sd-specdeploy"
    assert can_i(kubectl, sa, "watch", "speculativedeployments.specdeploy.dev", "-A")
    assert can_i(
        kubectl, sa, "patch", "speculativedeployments.specdeploy.dev", "--subresource=status", "-n", "default"
    )
    assert not can_i(kubectl, sa, "patch", "speculativedeployments.specdeploy.dev", "-n", "default")
    assert not can_i(kubectl, sa, "list", "secrets", "-A")
    assert not can_i(kubectl, sa, "get", "secrets", "-n", namespace)
    get_json(kubectl, "service", "sd-specdeploy-metrics", "-n", namespace)

    # Upgrade: a new setting reaches the pods, and scaling to 2 brings kopf peering (CRD from the install).
    helm(
        "upgrade", release, str(CHART), "-n", namespace, "--wait", "--timeout", "180s",
        "--set", "replicaCount=2", "--set", "settings.defaultGpuProduct=NVIDIA-H200",
        kubeconfig=kubeconfig,
    )  # fmt: skip
    deployment = wait_for(
        lambda: deployment_with(2), timeout=60, what="the operator Deployment's 2 ready replicas"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SPECDEPLOY_DEFAULT_GPU_PRODUCT"] == "NVIDIA-H200"
    assert "--peering=specdeploy" in container["args"]
    get_json(kubectl, "clusterkopfpeering", "specdeploy")
    assert can_i(kubectl, sa, "patch", "clusterkopfpeerings.kopf.dev/specdeploy")
    assert not can_i(kubectl, sa, "patch", "clusterkopfpeerings.kopf.dev/someone-else")
    history = helm("history", release, "-n", namespace, "-o", "json", kubeconfig=kubeconfig).stdout
    assert [h["status"] for h in json.loads(history)] == ["superseded", "deployed"]

    helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s", kubeconfig=kubeconfig)
    cluster_name = f"{namespace}-sd-specdeploy"
    for kind, name, ns in [
        ("deployment", "sd-specdeploy", namespace),
        ("serviceaccount", "sd-specdeploy", namespace),
        ("service", "sd-specdeploy-metrics", namespace),
        ("clusterrole", cluster_name, None),
        ("clusterrolebinding", cluster_name, None),
        ("clusterkopfpeering", "specdeploy", None),
    ]:
        args = ["get", kind, name, "--ignore-not-found", "-o", "name"] + (["-n", ns] if ns else [])
        assert kubectl(*args).stdout.strip() == "", f"{kind}/{name} survived helm uninstall"
    # Helm never deletes CRDs (they hold the users' objects).
    for crd in CRDS:
        get_json(kubectl, "crd", crd)


def test_namespaced_install_grants_only_the_watched_namespaces(
    helm: Helm, kubectl: Kubectl, kubeconfig: Path, namespace: str, other_namespace: str
) -> None:
    watched = f"{namespace}-w"
    kubectl("create", "namespace", watched)
    try:
        helm(
            "install", "nsd", str(CHART), "-n", namespace, "--wait", "--timeout", "180s",
            "--set", f"watchNamespaces={{{watched}}}", "--set", "replicaCount=2",
            kubeconfig=kubeconfig,
        )  # fmt: skip
        sa = f"system:serviceaccount:{namespace}:nsd-specdeploy"
        assert can_i(kubectl, sa, "watch", "speculativedeployments.specdeploy.dev", "-n", watched)
        assert can_i(kubectl, sa, "create", "jobs.batch", "-n", watched)
        assert can_i(kubectl, sa, "patch", "kopfpeerings.kopf.dev/specdeploy", "-n", watched)
        for ns in (other_namespace, namespace):
            assert not can_i(kubectl, sa, "watch", "speculativedeployments.specdeploy.dev", "-n", ns)
            assert not can_i(kubectl, sa, "create", "deployments.apps", "-n", ns)
        assert not can_i(kubectl, sa, "watch", "speculativedeployments.specdeploy.dev", "-A")
        assert not can_i(kubectl, sa, "list", "secrets", "-n", watched)
        assert can_i(kubectl, sa, "watch", "customresourcedefinitions.apiextensions.k8s.io")
        get_json(kubectl, "kopfpeering", "specdeploy", "-n", watched)
        helm("uninstall", "nsd", "-n", namespace, "--wait", kubeconfig=kubeconfig)
        assert kubectl("get", "role", "-n", watched, "-o", "name").stdout.strip() == ""
    finally:
        kubectl("delete", "namespace", watched, "--wait=false", check=False)


def token_kubeconfig(admin: Path, token: str, path: Path) -> Path:
    """A kubeconfig with the admin kubeconfig's server and CA, and nothing but the token as credentials."""
    cfg = yaml.safe_load(admin.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data")
    if ca is None and cluster.get("certificate-authority"):
        ca = base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()
    entry: dict[str, Any] = {"server": cluster["server"]}
    if ca:
        entry["certificate-authority-data"] = ca
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": entry}],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [{"name": "operator", "context": {"cluster": "c", "user": "operator"}}],
                "current-context": "operator",
            }
        )
    )
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("mode", ["cluster-wide-peering", "namespaced"])
def test_operator_reconciles_with_only_the_charts_rbac(  # noqa: PLR0917 (pytest fixtures)
    helm: Helm,
    kubectl: Kubectl,
    kubectl_bin: str,
    kubeconfig: Path,
    namespace: str,
    other_namespace: str,
    tmp_path: Path,
    mode: str,
) -> None:
    assert (REPO / "operator" / "src" / "specdeploy_operator" / "__main__.py").is_file(), (
        "the operator (python -m specdeploy_operator) is missing: the RBAC proof cannot run"
    )
    workloads = f"{namespace}-w"
    kubectl("create", "namespace", workloads)
    kubectl("create", "secret", "generic", "not-yours", "-n", other_namespace, "--from-literal=k=v")
    if mode == "cluster-wide-peering":
        # Its own peering name: the ClusterKopfPeering is cluster-scoped.
        sets = ["--set", "replicaCount=2", "--set", f"peering.name=p-{namespace}"]
    else:
        sets = ["--set", f"watchNamespaces={{{workloads}}}"]
    release = "rbac"
    helm(
        "install",
        release,
        str(CHART),
        "-n",
        namespace,
        "--wait",
        "--timeout",
        "180s",
        *sets,
        kubeconfig=kubeconfig,
    )
    operator: subprocess.Popen[bytes] | None = None
    log_path = tmp_path / "operator.log"
    try:
        # The chart's ServiceAccount, its token, and the chart's own env and args for the operator.
        token = kubectl("create", "token", "rbac-specdeploy", "-n", namespace, "--duration=1h").stdout.strip()
        as_operator = token_kubeconfig(kubeconfig, token, tmp_path / "operator.kubeconfig")
        container = operator_container(manifest(helm, release, namespace, kubeconfig))
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("SPECDEPLOY_")}
        env.update({e["name"]: e["value"] for e in container["env"]})
        args = [a for a in container["args"] if not a.startswith(("--health-port", "--metrics-port"))]

        def start_operator() -> tuple[subprocess.Popen[bytes], int]:
            """The operator on free ports, healthy (on other ports if one was taken before it bound it)."""
            health, metrics = free_port(), free_port()
            argv = [sys.executable, "-m", "specdeploy_operator", "--kubeconfig", str(as_operator)]
            argv += [f"--health-port={health}", f"--metrics-port={metrics}", *args]
            with log_path.open("wb") as log:
                started = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)

            def healthy() -> bool:
                exited = started.poll() is not None
                if port_taken(log_path.read_text()):
                    started.kill()
                    started.wait()
                    raise PortTaken(f"port {health} or {metrics} was taken")
                assert not exited, "operator exited:\n" + log_path.read_text()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as resp:
                        return bool(resp.status == 200)
                except OSError:
                    return False

            wait_for(healthy, timeout=60, what="the operator's /healthz")
            return started, metrics

        operator, metrics = retry_on_taken_port(start_operator)

        kubectl("apply", "--server-side", "-n", workloads, "-f", str(EXAMPLE))

        def phase() -> str | None:
            assert operator is not None
            assert operator.poll() is None, "operator exited:\n" + log_path.read_text()
            sdep = get_json(kubectl, "sdep", "llama-8b-1b-h100", "-n", workloads)
            value: str | None = (sdep.get("status") or {}).get("phase")
            return value if value == "Ready" else None

        try:
            wait_for(phase, timeout=300, interval=1, what="status.phase Ready")
        except BaseException:
            print(log_path.read_text()[-6000:], file=sys.stderr)
            raise

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as resp:
            assert resp.status == 200
            assert b"# TYPE" in resp.read()

        # With the same token, what the chart does not grant is refused by the apiserver.
        def as_sa(*cmd: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [kubectl_bin, f"--kubeconfig={as_operator}", *cmd],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
            )

        for cmd in (
            ["get", "secrets", "-n", other_namespace],
            ["get", "secrets", "-n", workloads],
            ["get", "secret", "not-yours", "-n", other_namespace],
            ["delete", "sdep", "llama-8b-1b-h100", "-n", workloads],
            ["create", "namespace", f"{namespace}-nope"],
        ):
            refused = as_sa(*cmd)
            assert refused.returncode != 0, f"{cmd} was allowed"
            assert "Forbidden" in refused.stderr, refused.stderr
        if mode == "namespaced":
            refused = as_sa("get", "sdep", "-n", other_namespace)
            assert "Forbidden" in refused.stderr, refused.stderr
        assert as_sa("get", "sdep", "-n", workloads).returncode == 0

        # Nothing the operator tried was refused: a 403 in its log names a permission the chart lacks.
        refusal = re.compile(r"\b(403|[Ff]orbidden)\b")
        forbidden = [line for line in log_path.read_text().splitlines() if refusal.search(line)]
        assert not forbidden, "the operator was refused:\n" + "\n".join(forbidden[:20])
    finally:
        kubectl("delete", "sdep", "--all", "-n", workloads, "--wait=false", check=False)
        if operator is not None and operator.poll() is None:
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        helm("uninstall", release, "-n", namespace, "--wait", check=False, kubeconfig=kubeconfig)
        kubectl("delete", "namespace", workloads, "--wait=false", check=False)
