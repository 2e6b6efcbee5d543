"""Offline: every pod the chart, the operator (`specdeploy render` of every example) and the demo's
manifests make passes the Pod Security Standards' `restricted` profile (tests/pod_security_standards.py; the
cluster test tests/integration/test_pod_security.py shows the checker and the API server agree). Plus the
chart's NetworkPolicy for the serving pods."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, render_children

from tests.chart.conftest import CHART, KUBE_VERSION, REPO, Helm, render
from tests.example_files import example_files
from tests.pod_security_standards import pod_specs, violations

EXAMPLES = example_files()
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
CUSTOM_SECURITY = {
    "runAsUser": 4000,
    "runAsGroup": 4000,
    "fsGroup": 5000,
    "supplementalGroups": [6000],
    "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/trtllm.json"},
    "readOnlyRootFilesystem": False,
}


def rendered(example: Path, spec_patch: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(example.read_text()):
        if not doc or doc.get("kind") != "SpeculativeDeployment":
            continue
        doc["spec"].update(spec_patch or {})
        sdep = parse_object(doc)
        assert isinstance(sdep, SpeculativeDeployment)
        objects += render_children(sdep, OperatorSettings())
    return objects


def assert_restricted(objects: list[dict[str, Any]]) -> int:
    pods = [(where, spec) for obj in objects for where, spec in pod_specs(obj)]
    broken = {where: found for where, spec in pods if (found := violations(spec))}
    assert not broken, f"pods that `restricted` refuses: {broken}"
    return len(pods)


@pytest.mark.parametrize("values", [None, *VALUES_FILES], ids=lambda p: p.stem if p else "defaults")
def test_the_charts_pods_pass_restricted(helm: Helm, values: Path | None) -> None:
    assert assert_restricted(render(helm, values=[values] if values else [])) == 1


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_pod_the_operator_renders_passes_restricted(example: Path) -> None:
    objects = rendered(example)
    jobs = [o for o in objects if o["kind"] == "Job"]
    groups = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    # the build Jobs, and the Deployment or a LeaderWorkerSet's leader and worker templates
    assert assert_restricted(objects) == len(jobs) + (2 if groups else 1)
    for obj in objects:
        for _, spec in pod_specs(obj):
            assert spec["automountServiceAccountToken"] is False
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
                assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("example", EXAMPLES[:1] + EXAMPLES[-2:], ids=lambda p: p.stem)
def test_a_custom_pod_security_still_passes_restricted_and_reaches_the_build_pods(example: Path) -> None:
    objects = rendered(example, {"podSecurity": CUSTOM_SECURITY})
    assert_restricted(objects)
    for obj in objects:
        for _, spec in pod_specs(obj):
            context = spec["securityContext"]
            assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (4000, 4000, 5000)
            assert context["supplementalGroups"] == [6000]
            assert context["seccompProfile"] == CUSTOM_SECURITY["seccompProfile"]
            assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    # The user owns what the build writes: another one is another EngineBuild.
    default_names = {o["metadata"]["name"] for o in rendered(example) if o["kind"] == "EngineBuild"}
    custom_names = {o["metadata"]["name"] for o in objects if o["kind"] == "EngineBuild"}
    assert not default_names & custom_names


@pytest.mark.parametrize(
    "bad",
    [
        {"runAsUser": 0},
        {"seccompProfile": {"type": "Localhost"}},
        {"seccompProfile": {"type": "RuntimeDefault", "localhostProfile": "x.json"}},
        {"seccompProfile": {"type": "Unconfined"}},
        {"runAsNonRoot": False},
        {"privileged": True},
    ],
    ids=[
        "root",
        "localhost-without-profile",
        "profile-without-localhost",
        "unconfined",
        "root-allowed",
        "priv",
    ],
)
def test_pod_security_that_would_leave_restricted_is_refused(bad: dict[str, Any]) -> None:
    doc = yaml.safe_load(EXAMPLES[0].read_text())
    doc["spec"]["podSecurity"] = bad
    with pytest.raises(ValueError, match="podSecurity"):
        parse_object(doc)


def test_the_demo_models_job_passes_restricted() -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "hack" / "demo-models.yaml").read_text()) if d]
    assert assert_restricted(docs) == 1


# -- the checker itself can fail ----------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], object]


def _container(spec: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = spec["containers"][0]
    return container


MUTATIONS: dict[str, tuple[Mutation, str]] = {
    "escalation": (
        lambda s: _container(s)["securityContext"].pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation != false",
    ),
    "capabilities": (
        lambda s: _container(s)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
        "unrestricted capabilities",
    ),
    "non-root": (
        lambda s: [c["securityContext"].pop("runAsNonRoot") for c in [s, *s["containers"]]],
        "runAsNonRoot != true",
    ),
    "root-user": (lambda s: _container(s)["securityContext"].update(runAsUser=0), "runAsUser=0"),
    "seccomp": (lambda s: s["securityContext"].pop("seccompProfile"), "seccompProfile"),
    "host-path": (
        lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "restricted volume types",
    ),
    "privileged": (  # validation refuses privileged with allowPrivilegeEscalation false
        lambda s: _container(s)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True),
        "privileged",
    ),
    "host-network": (lambda s: s.update(hostNetwork=True), "host namespaces"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_the_checker_catches_each_broken_rule(name: str) -> None:
    deployment = next(o for o in rendered(EXAMPLES[0]) if o["kind"] == "Deployment")
    spec = copy.deepcopy(deployment["spec"]["template"]["spec"])
    assert violations(spec) == []
    mutate, rule = MUTATIONS[name]
    mutate(spec)
    assert rule in violations(spec)


# -- NetworkPolicy ------------------------------------------------------------------------------------------


def test_no_network_policy_by_default(helm: Helm) -> None:
    assert not [o for o in render(helm) if o["kind"] == "NetworkPolicy"]


def test_the_serving_network_policy_admits_clients_and_monitoring_on_the_http_port(helm: Helm) -> None:
    objs = render(
        helm,
        sets=[
            "servingNetworkPolicy.enabled=true",
            "watchNamespaces={team-a,team-b}",
            "servingNetworkPolicy.clientNamespaces={gateway}",
        ],
    )
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert [p["metadata"]["namespace"] for p in policies] == ["team-a", "team-b"]
    for policy in policies:
        assert kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "server"
        clients, workers, operator, monitoring = spec["ingress"]
        # A leader's own workers reach its ranks on every port (NCCL and Open MPI choose them at run time).
        assert workers == {
            "from": [
                {
                    "podSelector": {
                        "matchLabels": {
                            "app.kubernetes.io/name": "specdeploy",
                            "app.kubernetes.io/component": "worker",
                            "app.kubernetes.io/managed-by": "specdeploy",
                        }
                    }
                }
            ]
        }
        assert clients["from"][0] == {"podSelector": {}}
        # The operator's own pods, which scrape /metrics for status.speculation.
        [from_operator] = operator["from"]
        assert from_operator["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "specdeploy-system"}
        }
        assert from_operator["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
        assert clients["from"][1]["namespaceSelector"]["matchExpressions"][0]["values"] == ["gateway"]
        assert monitoring["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
        assert (
            clients["ports"]
            == operator["ports"]
            == monitoring["ports"]
            == [{"port": "http", "protocol": "TCP"}]
        )
    # The serving container names its port `http`, so the policy follows spec.serving.port.
    deployment = next(o for o in rendered(EXAMPLES[0]) if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] == "http"


def test_the_network_policy_needs_namespaces(helm: Helm) -> None:
    out = helm("template", "x", str(CHART), "--set", "servingNetworkPolicy.enabled=true", check=False)
    assert out.returncode != 0
    assert "needs servingNetworkPolicy.namespaces or watchNamespaces" in out.stderr
    objs = render(helm, sets=["servingNetworkPolicy.enabled=true", "servingNetworkPolicy.namespaces={llm}"])
    [policy] = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["namespace"] == "llm"
