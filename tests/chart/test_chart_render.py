"""The Helm chart, offline: lint, rendering validated against the Kubernetes JSON schemas of 1.35 and of the
chart's floor (`kubeVersion`, 1.30), RBAC that is least-privilege, pod security, settings as env vars, the
values schema, and the CRDs kept in sync."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.api.trtllm import RELEASES
from specdeploy_operator.builders import METRIC_NAMES, build_deployment, build_engine_builds, render_children
from specdeploy_operator.builders.settings import ENV_PREFIX, OperatorSettings
from specdeploy_operator.crdgen import render_crds

from tests.chart.conftest import CHART, KUBE_VERSION, KUBE_VERSION_FLOOR, REPO, Helm, render
from tests.example_files import example_files

VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
# Kinds that are not part of Kubernetes itself: validated by the apiserver in the integration tests (kopf
# peering) or only by shape here (ServiceMonitor, whose CRD the local cluster does not have).
NON_CORE_KINDS = {"ClusterKopfPeering", "KopfPeering", "ServiceMonitor", "PodMonitor"}


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(objs)["env"] if "value" in e}


def rules_of(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for o in objs if o["kind"] in ("ClusterRole", "Role") for rule in o["rules"]]


KUBE_VERSIONS = [KUBE_VERSION, KUBE_VERSION_FLOOR]
EXAMPLES = example_files()


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_floor_is_1_30_and_kubernetes_validate_has_its_schemas() -> None:
    """Serving pods stop with `lifecycle.preStop.sleep`: the PodLifecycleSleepAction gate is alpha (off) in
    1.29 and on by default from 1.30 (KEP-3960), a fact no JSON schema shows (1.29's has the field), so the
    floor is asserted here; and the floor's schemas exist (validating against a missing version would fall
    back to another one, which the version check below would catch too)."""
    assert tuple(int(p) for p in KUBE_VERSION_FLOOR.split(".")[:2]) >= (1, 30)
    assert minor(KUBE_VERSION_FLOOR) in {minor(v) for v in kubernetes_validate.utils.all_versions()}
    docs = (REPO / "docs" / "install.md").read_text()
    assert f"Kubernetes ≥ {minor(KUBE_VERSION_FLOOR)} " in docs, "docs/install.md must state the floor"


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_helm_lint_strict(helm: Helm, kube_version: str) -> None:
    for values in [None, *VALUES_FILES]:
        args = ["lint", "--strict", str(CHART), "--kube-version", kube_version]
        if values is not None:
            args += ["-f", str(values)]
        out = helm(*args)
        assert "0 chart(s) failed" in out.stdout, out.stdout


def test_helm_refuses_a_cluster_below_the_floor(helm: Helm) -> None:
    args = ["template", "x", str(CHART), "--kube-version", "1.29.9"]
    proc = helm(*args, check=False)
    assert proc.returncode != 0
    assert "kubeVersion" in proc.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", [None, *VALUES_FILES], ids=lambda p: p.stem if p else "defaults")
def test_rendered_manifests_validate_against_kubernetes_schemas(
    helm: Helm, values: Path | None, kube_version: str
) -> None:
    objs = render(helm, values=[values] if values else [], kube_version=kube_version)
    validated = []
    for obj in objs:
        if obj["kind"] in NON_CORE_KINDS:
            assert obj["apiVersion"] in ("kopf.dev/v1", "monitoring.coreos.com/v1")
            continue
        # Strict: unknown fields are errors too. The returned version is the schema set actually used.
        version = kubernetes_validate.validate(obj, kube_version, strict=True)
        assert version == minor(kube_version), f"validated against {version}, not {minor(kube_version)}"
        validated.append(obj["kind"])
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= set(validated)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_what_the_operator_renders_validates_against_kubernetes_schemas(
    example: Path, kube_version: str
) -> None:
    """The objects the operator creates (`specdeploy render`: Jobs, Deployment with its preStop sleep,
    Service, PodDisruptionBudget, HorizontalPodAutoscaler) are valid for the floor as for 1.35."""
    for doc in yaml.safe_load_all(example.read_text()):
        if not doc or doc.get("kind") != "SpeculativeDeployment":
            continue
        sdep = parse_object(doc)
        assert isinstance(sdep, SpeculativeDeployment)
        for obj in render_children(sdep, OperatorSettings()):
            if obj["apiVersion"].startswith(("specdeploy.dev/", "keda.sh/")):
                continue
            if obj["kind"] == "LeaderWorkerSet":
                # Not a built-in kind: its pod templates are validated as pods here, and the whole object by
                # the LeaderWorkerSet CRD of the real apiserver (tests/integration/test_multinode.py).
                template = obj["spec"]["leaderWorkerTemplate"]
                for role in ("leaderTemplate", "workerTemplate"):
                    pod = {"apiVersion": "v1", "kind": "Pod", **template[role]}
                    assert kubernetes_validate.validate(pod, kube_version, strict=True) == minor(kube_version)
                continue
            version = kubernetes_validate.validate(obj, kube_version, strict=True)
            assert version == minor(kube_version)


def test_schema_validation_catches_a_broken_manifest(helm: Helm) -> None:
    """The validation above can fail: a misspelt Deployment field is reported."""
    deployment = one(render(helm), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


def test_chart_crds_are_the_generated_crds() -> None:
    generated = render_crds()
    chart_crds = {p.name: p.read_text() for p in (CHART / "crds").glob("*")}
    repo_crds = {p.name: p.read_text() for p in (REPO / "crds").glob("*")}
    assert chart_crds == repo_crds, "charts/specdeploy/crds differs from crds/: run `make crds`"
    assert chart_crds == generated, "CRDs are stale: run `make crds`"
    makefile = (REPO / "Makefile").read_text()
    assert "--out-dir charts/specdeploy/crds" in makefile, "`make crds` must regenerate the chart's CRDs"


def test_default_render(helm: Helm) -> None:
    objs = render(helm)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "Deployment",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    crds = {o["metadata"]["name"] for o in by_kind(objs, "CustomResourceDefinition")}
    assert crds == {
        "speculativedeployments.specdeploy.dev",
        "enginebuilds.specdeploy.dev",
        "drafttrainings.specdeploy.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    deployment = one(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    c = container(objs)
    assert c["image"] == "ghcr.io/specdeploy/operator:0.1.0"
    assert c["args"] == ["--health-port=8080", "--metrics-port=8081", "--log-level=info"]
    service = one(objs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_pod_security(helm: Helm) -> None:
    for values in [None, *VALUES_FILES]:
        objs = render(helm, values=[values] if values else [])
        pod = one(objs, "Deployment")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        c = container(objs)
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert set(c["resources"]) == {"requests", "limits"}
        assert {"cpu", "memory"} <= set(c["resources"]["requests"])
        assert "memory" in c["resources"]["limits"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert f"--health-port={ports['health']}" in c["args"]
        assert f"--metrics-port={ports['metrics']}" in c["args"]


def test_every_setting_reaches_the_operator_as_env(helm: Helm) -> None:
    env = env_of(render(helm))
    fields = {ENV_PREFIX + name.upper() for name in OperatorSettings.model_fields}
    assert set(env) == fields, f"missing: {fields - set(env)}, unknown: {set(env) - fields}"
    settings = OperatorSettings.from_env(env)
    assert settings.server_image == "ghcr.io/specdeploy/server:0.1.0"
    # The engine path's image is named after the TENSORRT pin of trtllm-releases.env; builds use the
    # serving image of their deployment.
    assert settings.engine_server_image == f"ghcr.io/specdeploy/server:0.1.0-trtllm{RELEASES.tensorrt}"
    assert settings.builder_image is None
    assert settings.watch_namespaces == ()
    assert settings.cache_storage_class_name is None
    assert settings.cache_pvc_name == "specdeploy-engine-cache"
    assert settings.cache_size == "1Ti"
    # The chart's defaults are the operator's own defaults (the images: at the chart's appVersion).
    assert settings == OperatorSettings()


def test_values_files_reach_the_settings(helm: Helm) -> None:
    settings = OperatorSettings.from_env(
        env_of(render(helm, values=[CHART / "ci" / "production-values.yaml"]))
    )
    assert settings.server_image == "registry.example.com/specdeploy/server:0.1.0"
    assert settings.cache_storage_class_name == "fsx-lustre"
    assert settings.cache_size == "4Ti"
    assert settings.keep_previous_engines == 2
    assert settings.gc_grace_seconds == 7200
    # The serving, build and staging pods pull the private images with the same Secret as the operator's pod.
    assert settings.image_pull_secrets == ("registry-credentials",)
    namespaced = OperatorSettings.from_env(
        env_of(render(helm, values=[CHART / "ci" / "namespaced-values.yaml"]))
    )
    assert namespaced.watch_namespaces == ("team-a", "team-b")


def test_rbac_is_least_privilege(helm: Helm) -> None:
    for values in [None, *VALUES_FILES]:
        rules = rules_of(render(helm, values=[values] if values else []))
        assert rules
        for rule in rules:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"wildcard in {rule}"
            assert not {"secrets", "serviceaccounts/token", "pods/exec", "nodes"} & set(rule["resources"])
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
            # update only on the owners' finalizers (what setting blockOwnerDeletion asks for, where the
            # OwnerReferencesPermissionEnforcement admission plugin runs): writes are server-side apply
            if "update" in rule["verbs"]:
                assert rule["verbs"] == ["update"], rule
                assert all(resource.endswith("/finalizers") for resource in rule["resources"]), rule
            assert "nonResourceURLs" not in rule
        # Only the kopf framework reads CRDs and namespaces, and only reads.
        for rule in rules:
            if "customresourcedefinitions" in rule["resources"] or "namespaces" in rule["resources"]:
                assert rule["verbs"] == ["list", "watch"]
        # Nothing may change a SpeculativeDeployment's spec: the operator writes only its status.
        for rule in rules:
            if "speculativedeployments" in rule["resources"]:
                assert rule["verbs"] == ["get", "list", "watch"]


def test_cluster_wide_mode_has_no_namespaced_roles(helm: Helm) -> None:
    objs = render(helm, values=[CHART / "ci" / "cluster-wide-values.yaml"])
    assert not by_kind(objs, "Role")
    assert not by_kind(objs, "RoleBinding")
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(objs, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "specdeploy", "namespace": "specdeploy-system"}
    ]


def test_namespaced_mode_has_a_role_per_namespace(helm: Helm) -> None:
    objs = render(helm, values=[CHART / "ci" / "namespaced-values.yaml"])
    roles = by_kind(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = by_kind(objs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["subjects"][0]["namespace"] == "specdeploy-system"
    # The only cluster-wide grant is the framework's read-only discovery.
    cluster_role = one(objs, "ClusterRole")
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }
    resources = {r for role in roles for rule in role["rules"] for r in rule["resources"]}
    assert {"speculativedeployments", "enginebuilds", "jobs", "deployments"} <= resources


def test_peering_when_scaled(helm: Helm) -> None:
    single = render(helm)
    assert not by_kind(single, "ClusterKopfPeering")
    assert not any("kopf.dev" in rule["apiGroups"] for rule in rules_of(single))

    objs = render(helm, values=[CHART / "ci" / "production-values.yaml"])
    assert one(objs, "Deployment")["spec"]["replicas"] == 3
    assert "--peering=specdeploy-prod" in container(objs)["args"]
    assert one(objs, "ClusterKopfPeering")["metadata"]["name"] == "specdeploy-prod"
    peering_rules = [rule for rule in rules_of(objs) if "kopf.dev" in rule["apiGroups"]]
    assert {v for rule in peering_rules for v in rule["verbs"]} == {"get", "list", "watch", "patch"}
    assert all(rule["resources"] == ["clusterkopfpeerings"] for rule in peering_rules)

    namespaced = render(helm, values=[CHART / "ci" / "namespaced-values.yaml"], sets=["replicaCount=2"])
    peerings = by_kind(namespaced, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert not by_kind(namespaced, "ClusterKopfPeering")

    no_crds = render(helm, sets=["peering.installCRDs=false"])
    assert {o["metadata"]["name"] for o in by_kind(no_crds, "CustomResourceDefinition")} == {
        "speculativedeployments.specdeploy.dev",
        "enginebuilds.specdeploy.dev",
        "drafttrainings.specdeploy.dev",
    }


def test_service_monitor(helm: Helm) -> None:
    assert not by_kind(render(helm), "ServiceMonitor")
    objs = render(helm, values=[CHART / "ci" / "production-values.yaml"])
    monitor = one(objs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"] == [
        {
            "port": "metrics",
            "path": "/metrics",
            "interval": "15s",
            "scrapeTimeout": "10s",
            "honorLabels": True,  # the per-deployment figures' `namespace` is the deployment's own
        }
    ]
    service = one(objs, "Service")
    assert all(
        service["metadata"]["labels"][k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items()
    )
    failed = helm(
        "template", "x", str(CHART), "--kube-version", KUBE_VERSION,
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false",
        check=False,
    )  # fmt: skip
    assert failed.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in failed.stderr


def test_server_metrics_wiring_matches_the_servers_and_the_operators_names(helm: Helm) -> None:
    """The PodMonitor selects the serving pods the operator renders, on the port that serves /metrics, and
    the prometheus-adapter rules publish the metrics under the names the operator's HPAs ask for."""
    defaults = render(helm)
    assert not by_kind(defaults, "PodMonitor")
    assert not [o for o in by_kind(defaults, "ConfigMap") if "adapter" in o["metadata"]["name"]]
    objs = render(helm, values=[CHART / "ci" / "production-values.yaml"])
    monitor = one(objs, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}

    sdep = parse_object(
        yaml.safe_load((REPO / "examples" / "02-draft-target-llama8b-1b-h100.yaml").read_text())
    )
    assert isinstance(sdep, SpeculativeDeployment)
    template = build_deployment(sdep, build_engine_builds(sdep, OperatorSettings()))["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    assert endpoint["port"] in ports
    assert endpoint["path"] == "/metrics"

    adapter = one([o for o in by_kind(objs, "ConfigMap") if "adapter" in o["metadata"]["name"]], "ConfigMap")
    assert adapter["metadata"]["namespace"] == "monitoring"
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert {r["name"]["as"] for r in rules} == set(METRIC_NAMES.values())
    for rule in rules:
        assert rule["seriesQuery"].startswith(rule["name"]["as"] + "{")
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        assert "<<.LabelMatchers>>" in rule["metricsQuery"]
        assert "by (<<.GroupBy>>)" in rule["metricsQuery"]

    namespaced = one(render(helm, values=[CHART / "ci" / "namespaced-values.yaml"], sets=[
        "serverMetrics.podMonitor.enabled=true"
    ]), "PodMonitor")  # fmt: skip
    assert namespaced["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


BAD_VALUES = [
    (["replicaCount=0"], "/replicaCount"),
    (["replicaCount=two"], "/replicaCount"),
    (["image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["image.digest=latest"], "/image/digest"),
    (["watchNamespaces={Team_A}"], "/watchNamespaces/0"),
    (["watchNamespaces={a,a}"], "/watchNamespaces"),
    (["settings.startupTimeoutSeconds=5"], "/settings/startupTimeoutSeconds"),
    (["settings.gcGraceSeconds=-1"], "/settings/gcGraceSeconds"),
    (["settings.workers=0"], "/settings/workers"),
    (["logLevel=verbose"], "/logLevel"),
    (["engineCache.size=lots"], "/engineCache/size"),
    (["engineCache.mountPath=cache"], "/engineCache/mountPath"),
    (["ports.health=70000"], "/ports/health"),
    (["securityContext.readOnlyRootFilesystem=false"], "/securityContext/readOnlyRootFilesystem"),
    (["securityContext.allowPrivilegeEscalation=true"], "/securityContext/allowPrivilegeEscalation"),
    (["podSecurityContext.runAsNonRoot=false"], "/podSecurityContext/runAsNonRoot"),
    (["podSecurityContext.runAsUser=0"], "/podSecurityContext/runAsUser"),
    (["resources=null"], "resources"),
    (["metrics.serviceMonitor.interval=often"], "/metrics/serviceMonitor/interval"),
    (["serverMetrics.podMonitor.interval=often"], "/serverMetrics/podMonitor/interval"),
    (["serverMetrics.prometheusAdapterRules.namespace=Monitoring"], "/serverMetrics/prometheusAdapterRules"),
    (["settings.prometheusUrl=prometheus:9090"], "/settings/prometheusUrl"),
    (["settings.severImage.repository=x"], "severImage"),
    (["watchNamespace={a}"], "watchNamespace"),
    (["managedPods.buildServiceAccount=Not_A_Name"], "/managedPods/buildServiceAccount"),
    (["managedPods.imagePullSecrets={Bad_Secret}"], "/managedPods/imagePullSecrets"),
]


@pytest.mark.parametrize(("sets", "where"), BAD_VALUES, ids=lambda v: v[0] if isinstance(v, list) else "")
def test_values_schema_rejects_bad_values(helm: Helm, sets: list[str], where: str) -> None:
    args = ["template", "x", str(CHART), "--kube-version", KUBE_VERSION]
    for item in sets:
        args += ["--set", item]
    proc = helm(*args, check=False)
    assert proc.returncode != 0, f"{sets} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert where in proc.stderr, proc.stderr


def test_values_schema_covers_every_value() -> None:
    """values.yaml validates against the schema's shape: every key is declared (additionalProperties is off at
    every level the chart reads), so a typo in values.yaml itself is caught too."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], sch: dict[str, Any], path: str) -> None:
        props = sch.get("properties")
        if props is None:
            return
        for key, value in node.items():
            assert key in props, f"{path}.{key} is not in values.schema.json"
            if isinstance(value, dict) and props[key].get("additionalProperties") is False:
                walk(value, props[key], f"{path}.{key}")

    walk(values, schema, "")
    assert schema["additionalProperties"] is False


def test_values_yaml_is_documented_line_by_line() -> None:
    """Every key in values.yaml has a comment on the line(s) just above it or at the end of its line."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^\s*([A-Za-z][\w-]*):")
    undocumented = []
    for n, line in enumerate(lines):
        if not key.match(line):
            continue
        above = lines[n - 1].strip() if n else ""
        if not above.startswith("#") and "#" not in line:
            undocumented.append(f"{n + 1}: {line.strip()}")
    assert not undocumented, "values without a comment:\n" + "\n".join(undocumented)


def test_helm_template_needs_no_kube_version(helm: Helm) -> None:
    """The harness's helm is built with helm's release ldflags: without a cluster it assumes the Kubernetes
    version of its client-go (1.34), which satisfies the chart's `kubeVersion` (a helm built without them
    assumes v1.20 and refuses the chart)."""
    out = helm("template", "x", str(CHART)).stdout
    assert "kind: Deployment" in out


def test_managed_pod_credentials_reach_the_settings(helm: Helm) -> None:
    """`managedPods.*`: the operator-wide defaults of `spec.images.pullSecrets` and `spec.serviceAccounts`."""
    sets = [
        "managedPods.imagePullSecrets={regcred,mirror-cred}",
        "managedPods.servingServiceAccount=llm-serving",
        "managedPods.buildServiceAccount=model-reader",
    ]
    settings = OperatorSettings.from_env(env_of(render(helm, sets=sets)))
    assert settings.image_pull_secrets == ("regcred", "mirror-cred")
    assert settings.serving_service_account == "llm-serving"
    assert settings.build_service_account == "model-reader"
