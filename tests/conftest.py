"""Fixtures for tests against a real Kubernetes API (tests/integration, and the chart's cluster tests).

By default a session starts its own local control plane (etcd, kube-apiserver, controller-manager, scheduler,
kwok with the default GPU node pools) in a temporary directory and stops it at the end. With
``USE_EXISTING_CLUSTER=1`` the tests use the cluster named by ``KUBECONFIG`` instead (kind, or a real cluster
prepared with ``hack/kind-up.sh``); nothing is started or stopped then.

Nothing here mocks the Kubernetes API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.netguard import NetGuard
from specdeploy_localcluster.operatorproc import OperatorProcess
from specdeploy_localcluster.podnet import POD_NETWORK

REPO = Path(__file__).resolve().parents[1]
CRDS = REPO / "crds"


class Kubectl(Protocol):
    def __call__(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]: ...


_NET_GUARD = pytest.StashKey[NetGuard]()
_WORKER_VIOLATIONS = pytest.StashKey[list[str]]()
VIOLATIONS_KEY = "netguard_violations"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Loopback only: every socket of this process and of everything it starts (the local cluster, operators,
    the pod runner's servers, kubectl, helm) is sampled for the whole session
    (specdeploy_localcluster.netguard); pod IPs count as this machine's (specdeploy_localcluster.podnet keeps
    POD_NETWORK here). Under pytest-xdist each worker samples its own processes and hands what it saw to the
    controller, which samples the workers too and reports.

    kubectl's discovery cache is the session's own: two local clusters of one machine (xdist workers, a test's
    second cluster) can serve on the same port one after the other, and must not read each other's."""
    os.environ["KUBECACHEDIR"] = tempfile.mkdtemp(prefix="specdeploy-kubecache-")
    session.config.stash[_WORKER_VIOLATIONS] = []
    session.stash[_NET_GUARD] = NetGuard(lambda: [os.getpid()], allowed=[POD_NETWORK]).start()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, in the controller: keep what a finished worker's guard saw."""
    node.config.stash[_WORKER_VIOLATIONS] += node.workeroutput.get(VIOLATIONS_KEY, [])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A connection to an address off this machine fails the session, whatever the tests said."""
    guard = session.stash.get(_NET_GUARD, None)
    if guard is None:
        return
    violations = guard.stop()
    shutil.rmtree(os.environ.get("KUBECACHEDIR", ""), ignore_errors=True)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports
        workeroutput[VIOLATIONS_KEY] = violations
        return
    violations = [*violations, *session.config.stash.get(_WORKER_VIOLATIONS, [])]
    if violations:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["connections to addresses off this machine (only loopback is allowed):", *violations]
        if reporter is not None:
            reporter.write_sep("!", "loopback-only guard", red=True)
            for line in lines:
                reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def net_guard(request: pytest.FixtureRequest) -> NetGuard:
    """The session's loopback-only guard, for tests that check what it saw right after an action."""
    return request.session.stash[_NET_GUARD]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test that ran beside the session's operator reports the operator's last log lines."""
    report = yield
    operator = getattr(item, "funcargs", {}).get("operator")
    if report.failed and isinstance(operator, OperatorProcess):
        state = "running" if operator.running else "EXITED"
        title = f"the session operator ({state}): its last 60 log lines"
        report.sections.append((title, operator.log_tail(60)))
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/integration needs the cluster (elsewhere, tests mark themselves)."""
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent / "integration"):
            item.add_marker(pytest.mark.integration)


async def wait_for_async(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> None:
    """`wait_for` inside an event loop: yields to the loop between polls, so the tasks it waits on run."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.001)


def wait_for(
    check: Callable[[], Any],
    timeout: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
    describe: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy; fail the test with ``what`` after ``timeout``, and
    with what ``describe`` reads then (the state that kept the condition false) when given."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    seen = "" if describe is None else (d if isinstance(d := describe(), str) else repr(d))
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last value: {last!r})\n{seen}".rstrip())


def wait_quiet(
    read: Callable[[], Any], quiet: float = 3.0, timeout: float = 60.0, what: str = "value"
) -> Any:
    """Poll ``read`` until its value has stayed the same for ``quiet`` seconds and return that value; fail
    the test with ``what`` if it still changes after ``timeout``."""
    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            pytest.fail(f"{what} still changing after {timeout:.0f}s (last value: {last!r})")
        time.sleep(0.5)
        value = read()
        if value != last:
            last, since = value, time.monotonic()
    return last


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster | None]:
    if os.environ.get("USE_EXISTING_CLUSTER") == "1":
        yield None
        return
    # Not under pytest's basetemp: a concurrent pytest run on the same machine prunes old basetemps.
    state = Path(tempfile.mkdtemp(prefix="specdeploy-cluster-"))
    cluster = LocalCluster(state)
    try:
        cluster.up(timeout=180)
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)


def cluster_running(
    local_cluster: LocalCluster | None, part: str, attribute: str, switch: str
) -> LocalCluster:
    """The local cluster, when it runs `part` (its flag `attribute`). Tests that need a part are skipped,
    saying why, only where a person switched it off: against an existing cluster (USE_EXISTING_CLUSTER=1) or
    with `switch`; `make test` runs them."""
    if local_cluster is None:
        pytest.skip(f"needs the local cluster's {part} (USE_EXISTING_CLUSTER=1)")
    if not getattr(local_cluster, attribute):
        pytest.skip(f"the local cluster runs without its {part} ({switch})")
    return local_cluster


@pytest.fixture
def autoscaling_cluster(local_cluster: LocalCluster | None) -> LocalCluster:
    """The local cluster with its custom metrics adapter and Cluster Autoscaler."""
    return cluster_running(
        local_cluster, "metrics adapter and Cluster Autoscaler", "autoscaling", "SPECDEPLOY_AUTOSCALING=0"
    )


@pytest.fixture
def lws_cluster(local_cluster: LocalCluster | None) -> LocalCluster:
    """The local cluster with its LeaderWorkerSet controller and multinode pools."""
    return cluster_running(
        local_cluster, "LeaderWorkerSet controller and node pools", "lws", "SPECDEPLOY_LWS=0"
    )


@pytest.fixture(scope="session")
def kubeconfig(local_cluster: LocalCluster | None) -> Path:
    if local_cluster is None:
        path = os.environ.get("KUBECONFIG")
        if not path:
            pytest.fail("USE_EXISTING_CLUSTER=1 needs KUBECONFIG to name the cluster's kubeconfig")
        return Path(path)
    return local_cluster.kubeconfig


@pytest.fixture(scope="session")
def kubectl_bin(local_cluster: LocalCluster | None) -> str:
    if local_cluster is not None:
        return str(local_cluster.bin_dir / "kubectl")
    return os.environ.get("KUBECTL", "kubectl")


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Path, kubectl_bin: str) -> Kubectl:
    def run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [kubectl_bin, f"--kubeconfig={kubeconfig}", *args],
            input=input,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    return run


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@contextlib.contextmanager
def fresh_namespace(core: client.CoreV1Api, prefix: str = "t") -> Iterator[str]:
    """A fresh namespace `<prefix>-<random>` (with its default ServiceAccount ready), deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def has_default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    wait_for(has_default_sa, timeout=30, what=f"default ServiceAccount in {name}")
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as err:
            if err.status != 404:
                raise


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace `t-<random>`, deleted after the test."""
    with fresh_namespace(core) as name:
        yield name


@pytest.fixture(scope="session")
def install_crds(kubectl: Kubectl) -> list[str]:
    """Apply crds/ (server-side): the CRDs, each waited for until Established, and the admission policy.
    Returns the CRDs' names."""
    files = sorted(CRDS.glob("*.yaml"))
    if not files:
        pytest.fail(f"no CRDs in {CRDS}: run `make crds`")
    names = []
    for f in files:
        out = kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f), "-o", "name")
        names += [
            line.split("/", 1)[1]
            for line in out.stdout.split()
            if line.startswith("customresourcedefinition.apiextensions.k8s.io/")
        ]
    for name in names:
        kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
    # Established is the CRD's condition; the API server's discovery (what kubectl resolves `sdep` and
    # `kubectl explain` by) lists the new resources a moment later.
    groups = {name.split(".", 1)[1] for name in names}
    wanted = {name.split(".", 1)[0] for name in names}

    def discovered() -> bool:
        listed = set()
        for group in groups:
            out = kubectl("api-resources", f"--api-group={group}", "-o", "name", check=False)
            listed |= {line.split(".", 1)[0] for line in out.stdout.split()}
        return wanted <= listed

    wait_for(discovered, timeout=60, what=f"{sorted(wanted)} in the API server's discovery")
    return names


# -- the operator -------------------------------------------------------------------------------------------

OPERATOR_TEST_SETTINGS = {
    # Short enough for tests: unused engines go after 3 s, a failing build gets one retry.
    "SPECDEPLOY_GC_GRACE_SECONDS": "3",
    "SPECDEPLOY_BUILD_BACKOFF_LIMIT": "1",
    "SPECDEPLOY_RESYNC_SECONDS": "60",
    # status.speculation from windows of 3 s (default 30 s), so a test sees figures within seconds.
    "SPECDEPLOY_SPECULATION_INTERVAL_SECONDS": "3",
}


OPERATOR_NAMESPACE_PREFIX = "op"
"""Namespaces the session's operator watches (`op-*`)."""


@pytest.fixture(scope="session")
def operator(
    local_cluster: LocalCluster | None,
    kubeconfig: Path,
    install_crds: list[str],
    api_client: client.ApiClient,
) -> Iterator[OperatorProcess]:
    """The operator, running for the whole session with cluster-admin rights (its own identity on the local
    cluster, so the audit log holds exactly its requests)."""
    if local_cluster is not None:
        identity, log_dir = local_cluster.operator_kubeconfig, local_cluster.logs
    else:
        identity, log_dir = kubeconfig, Path(tempfile.mkdtemp(prefix="specdeploy-operator-"))
    # Only the operator tests' namespaces: other tests (the chart's RBAC proof) run operators of their own.
    env = {**OPERATOR_TEST_SETTINGS, "SPECDEPLOY_WATCH_NAMESPACES": f"{OPERATOR_NAMESPACE_PREFIX}-*"}
    proc = OperatorProcess(identity, log_dir, env=env)
    proc.start()
    wait_until_watching_new_namespaces(client.CoreV1Api(api_client), proc)
    yield proc
    proc.stop()


CANARY = {
    "apiVersion": "specdeploy.dev/v1alpha1",
    "kind": "SpeculativeDeployment",
    "metadata": {"name": "canary"},
    "spec": {
        "backend": "transformers",
        "target": {"model": {"uri": "pvc://absent/target"}},
        "speculative": {"method": "none"},
        "placement": {"device": "cpu"},
        "replicas": 0,
    },
}


def wait_until_watching_new_namespaces(core: client.CoreV1Api, proc: OperatorProcess) -> None:
    """Wait until the operator reconciles in a namespace created after it started. kopf (1.45) lists the
    namespaces, then starts a watch whose own initial listing it ignores: a namespace created between the
    two is never watched. Its liveness endpoint answers before both, so a test's first namespace can fall
    in that window; each try here uses a new namespace, so a later one lands after the watch began."""
    custom = client.CustomObjectsApi(core.api_client)
    for _ in range(9):  # 9 namespaces, 10 s each: 90 s in all
        with fresh_namespace(core, OPERATOR_NAMESPACE_PREFIX) as namespace:
            custom.create_namespaced_custom_object(
                "specdeploy.dev", "v1alpha1", namespace, "speculativedeployments", CANARY
            )
            # The object's own watch events: the first one with a status ends the wait.
            events = watch.Watch().stream(
                custom.list_namespaced_custom_object,
                "specdeploy.dev",
                "v1alpha1",
                namespace,
                "speculativedeployments",
                timeout_seconds=10,
            )
            if any(event["object"].get("status") for event in events):
                return
            proc.healthy()  # raises if the operator exited
    pytest.fail(f"the operator reconciled nothing in a new namespace for 90 s\n{proc.log_tail()}")
