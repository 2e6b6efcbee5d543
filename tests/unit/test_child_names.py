"""Names of the children there is one of per deployment (its server ConfigMap, its own engine-cache claim),
and the pattern of its serving pods' names: unique per deployment whatever the length of its name."""

from __future__ import annotations

import re
from typing import Any

import pytest
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import OperatorSettings
from specdeploy_operator.builders.autoscaling import GENERATED_BASE, serving_pod_pattern
from specdeploy_operator.builders.engines import cache_pvc_name
from specdeploy_operator.builders.serving import configmap_name

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def deployment(name: str, cache: dict[str, Any] | None = None) -> SpeculativeDeployment:
    spec: dict[str, Any] = {
        "target": {"model": {"uri": "hf://org/target-8b"}},
        "speculative": {"method": "promptLookup"},
    }
    if cache is not None:
        spec["engineCache"] = cache
    return SpeculativeDeployment.model_validate(
        {
            "apiVersion": "specdeploy.dev/v1alpha1",
            "kind": "SpeculativeDeployment",
            "metadata": {"name": name, "namespace": "team"},
            "spec": spec,
        }
    )


def test_short_names_keep_their_plain_child_names() -> None:
    assert configmap_name(deployment("chat")) == "chat-server-config"
    assert cache_pvc_name(deployment("chat", {"size": "10Gi"}), OperatorSettings()) == "chat-engine-cache"


@pytest.mark.parametrize("length", [49, 50, 55, 63])
def test_long_names_that_share_their_start_get_children_of_their_own(length: int) -> None:
    one, two = "a" * (length - 3) + "one", "a" * (length - 3) + "two"
    settings = OperatorSettings()
    names = {
        "configmap": [configmap_name(deployment(n)) for n in (one, two)],
        "claim": [cache_pvc_name(deployment(n, {"size": "10Gi"}), settings) for n in (one, two)],
    }
    for kind, (first, second) in names.items():
        assert first != second, f"{kind}: {first}"
        assert DNS_LABEL.match(first), first
        assert DNS_LABEL.match(second), second
        assert first.endswith("server-config" if kind == "configmap" else "engine-cache")


def test_a_deployments_own_claim_never_takes_the_name_of_the_shared_default_claim() -> None:
    settings = OperatorSettings()
    assert settings.cache_pvc_name == "specdeploy-engine-cache"
    own = cache_pvc_name(deployment("specdeploy", {"size": "10Gi"}), settings)
    assert own != settings.cache_pvc_name
    assert DNS_LABEL.match(own), own
    assert cache_pvc_name(deployment("specdeploy"), settings) == settings.cache_pvc_name


def pod_name(deployment_name: str, template_hash: str, suffix: str = "x2k9p") -> str:
    """A pod of the Deployment as Kubernetes names it: the ReplicaSet is `<name>-<hash>`, the pod is generated
    from `<replicaset>-`, a base the API server cuts to 58 characters before adding 5 random ones."""
    return f"{deployment_name}-{template_hash}-"[:GENERATED_BASE] + suffix


@pytest.mark.parametrize("length", range(1, 64))
@pytest.mark.parametrize("template_hash", ["5d8f9c7b6d", "6c4b7f9d8"])
def test_the_serving_pod_pattern_matches_the_pods_kubernetes_names(length: int, template_hash: str) -> None:
    name = ("chat-" * 13)[: length - 1] + "z"
    pattern = re.compile(serving_pod_pattern(name))  # PromQL's =~ is anchored at both ends
    pod = pod_name(name, template_hash)
    assert len(pod) <= 63
    assert pattern.fullmatch(pod), (name, pod, pattern.pattern)


def test_the_pods_of_a_deployment_whose_name_starts_with_this_ones_do_not_match() -> None:
    pattern = re.compile(serving_pod_pattern("chat"))
    assert pattern.fullmatch(pod_name("chat", "5d8f9c7b6d"))
    assert not pattern.fullmatch(pod_name("chat-large", "5d8f9c7b6d"))
