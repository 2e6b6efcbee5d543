"""The local cluster's LeaderWorkerSet controller setup (pure, from the files build.sh keeps beside its
binary): webhooks reached on 127.0.0.1 only, its own certificate management off, upstream's RBAC under our
name."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.lwscontroller import (
    LWS_CLUSTER_ROLE,
    LWS_USER,
    lws_argv,
    lws_config,
    lws_dir,
    lws_objects,
    probe_leader_pod,
    probe_leaderworkerset,
    webhook_configurations,
    webhooks_answered,
)


@pytest.fixture(scope="module")
def bins() -> Path:
    """The harness's pinned build (hack/cluster/build.sh; a cache hit is instant)."""
    return LocalCluster(Path(tempfile.gettempdir()) / "specdeploy-unused").bin_dir


def test_every_webhook_is_reached_at_a_loopback_url_trusting_the_given_ca(bins: Path) -> None:
    mutating, validating = webhook_configurations(bins, 12345, "Q0E=")
    assert mutating["metadata"] == {"name": "lws-mutating-webhook-configuration"}
    assert validating["metadata"] == {"name": "lws-validating-webhook-configuration"}
    urls = {}
    for config in (mutating, validating):
        for webhook in config["webhooks"]:
            assert set(webhook["clientConfig"]) == {"url", "caBundle"}
            assert webhook["clientConfig"]["caBundle"] == "Q0E="
            assert webhook["clientConfig"]["url"].startswith("https://127.0.0.1:12345/")
            assert webhook["failurePolicy"] == "Fail"
            urls[webhook["name"]] = webhook["clientConfig"]["url"]
    assert urls["mleaderworkerset.kb.io"].endswith("/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset")
    assert urls["vleaderworkerset.kb.io"].endswith("/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset")
    assert urls["mpod.kb.io"].endswith("/mutate--v1-pod")
    assert urls["vpod.kb.io"].endswith("/validate--v1-pod")


def test_pod_webhooks_only_see_pods_of_a_leaderworkerset(bins: Path) -> None:
    configs = webhook_configurations(bins, 1, "")
    pod_webhooks = [w for c in configs for w in c["webhooks"] if w["rules"][0]["resources"] == ["pods"]]
    assert sorted(w["name"] for w in pod_webhooks) == ["mpod.kb.io", "vpod.kb.io"]
    for webhook in pod_webhooks:
        assert webhook["objectSelector"] == {
            "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
        }


def test_an_unknown_patch_of_the_webhook_manifests_is_refused_naming_the_file(
    tmp_path: Path, bins: Path
) -> None:
    fake = tmp_path / "lws" / "webhook"
    fake.mkdir(parents=True)
    for name in ("manifests.yaml", "validating-patch.yaml"):
        (fake / name).write_text((lws_dir(bins) / "webhook" / name).read_text())
    (fake / "mutating-patch.yaml").write_text("- {op: add, path: /webhooks/-, value: {}}\n")
    with pytest.raises(
        ValueError, match=r"mutating-patch\.yaml: unsupported patch operation add /webhooks/-"
    ):
        webhook_configurations(tmp_path, 1, "")


def test_the_controller_serves_webhooks_on_loopback_with_our_certificate_and_no_other_listener() -> None:
    config = lws_config(Path("/state/lws/certs"), 4444)
    assert config["apiVersion"] == "config.lws.x-k8s.io/v1alpha1"
    assert config["webhook"] == {"host": "127.0.0.1", "port": 4444, "certDir": "/state/lws/certs"}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["metrics"] == {"bindAddress": "0"}
    assert config["health"] == {"healthProbeBindAddress": "0"}
    argv = lws_argv(Path("/bins"), Path("/state/lws/config.yaml"), Path("/state/lws.kubeconfig"))
    assert argv[0] == "/bins/lws/lws-controller"
    assert "--config=/state/lws/config.yaml" in argv


def test_crds_and_upstream_cluster_role_bound_to_the_controllers_user(bins: Path) -> None:
    objects = lws_objects(bins)
    crds = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition")
    assert crds == [
        "disaggregatedsets.disaggregatedset.x-k8s.io",
        "leaderworkersets.leaderworkerset.x-k8s.io",
    ]
    (role,) = (o for o in objects if o["kind"] == "ClusterRole")
    assert role["metadata"] == {"name": LWS_CLUSTER_ROLE}
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert {
        ("leaderworkerset.x-k8s.io", "leaderworkersets"),
        ("apps", "statefulsets"),
        ("", "pods"),
    } <= granted
    (binding,) = (o for o in objects if o["kind"] == "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == LWS_CLUSTER_ROLE
    assert binding["subjects"] == [
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": LWS_USER}
    ]


def test_webhooks_count_as_answering_only_when_both_dry_runs_come_back_mutated() -> None:
    lws, pod = probe_leaderworkerset("p"), probe_leader_pod("p")
    assert not webhooks_answered(lws, pod)
    lws["spec"]["rolloutStrategy"] = {"type": "RollingUpdate", "rollingUpdateConfiguration": {"partition": 0}}
    assert not webhooks_answered(lws, pod)
    pod["spec"]["containers"][0]["env"] = [{"name": "LWS_LEADER_ADDRESS", "value": "p-0.p.default"}]
    assert webhooks_answered(lws, pod)
