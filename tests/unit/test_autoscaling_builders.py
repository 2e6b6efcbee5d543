"""The autoscaler builders: golden HPA and KEDA ScaledObject per example, KEDA's own CRD schema, the PDB and
grace period that make scale-down safe, and the metric names the server exports.

Regenerate the golden files after an intended change with
`SPECDEPLOY_UPDATE_GOLDEN=1 pytest tests/unit/test_autoscaling_builders.py` and review the diff."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import (
    METRIC_NAMES,
    OperatorSettings,
    build_autoscaler,
    build_deployment,
    build_engine_builds,
    build_hpa,
    build_pdb,
    build_scaled_object,
    build_server_config,
    dump_yaml,
    keda_query,
    quantity,
    status_selector,
)

from tests.example_files import example_files, example_id

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = example_files()
GOLDEN = Path(__file__).resolve().parent / "golden_autoscaling"
UPDATE = os.environ.get("SPECDEPLOY_UPDATE_GOLDEN") == "1"

HPA = {"maxReplicas": 4}
KEDA = {
    "engine": "keda",
    "minReplicas": 0,
    "maxReplicas": 4,
    "metric": "queueDepth",
    "keda": {"serverAddress": "http://prometheus.monitoring.svc:9090"},
}


def _example(path: Path) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "SpeculativeDeployment")


def _sdep(
    body: dict[str, Any], autoscaling: dict[str, Any] | None = None, **spec: Any
) -> SpeculativeDeployment:
    body = copy.deepcopy(body)
    body["metadata"].setdefault("namespace", "llm")
    if autoscaling is not None:
        body["spec"]["autoscaling"] = autoscaling
    body["spec"].update(spec)
    sdep = parse_object(body)
    assert isinstance(sdep, SpeculativeDeployment)
    return sdep


@functools.cache
def _keda_schema() -> dict[str, Any]:
    """The openAPIV3Schema of KEDA's ScaledObject CRD, fetched at the pinned release from the Go module proxy
    (`hack/keda-crds.sh`), made strict: an object that lists its properties accepts no others (the apiserver
    would silently prune them, so a misspelt field would be lost)."""
    crds = subprocess.run(
        ["bash", str(ROOT / "hack" / "keda-crds.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    crd = yaml.safe_load((Path(crds) / "keda.sh_scaledobjects.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]

    def strict(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    # metadata is checked by the apiserver's ObjectMeta, not by the CRD schema.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


@pytest.mark.parametrize("example", EXAMPLES, ids=[example_id(path) for path in EXAMPLES])
def test_golden_autoscalers(example: Path) -> None:
    body = _example(example)
    rendered = dump_yaml([build_hpa(_sdep(body, HPA)), build_scaled_object(_sdep(body, KEDA))])
    golden = GOLDEN / f"{example_id(example)}.yaml"
    if UPDATE:
        golden.write_text(rendered)
    assert golden.is_file(), f"no golden file {golden}; run with SPECDEPLOY_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(), (
        f"{example.name}: the autoscalers render differently from {golden}; if intended, regenerate with "
        "SPECDEPLOY_UPDATE_GOLDEN=1 and review the diff"
    )


def test_no_stale_autoscaler_golden_files() -> None:
    assert sorted(path.stem for path in GOLDEN.glob("*.yaml")) == sorted(
        example_id(path) for path in EXAMPLES
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=[example_id(path) for path in EXAMPLES])
@pytest.mark.parametrize(
    "settings", [HPA, KEDA, {**KEDA, "minReplicas": 2, "keda": None}], ids=["hpa", "keda", "keda-default"]
)
def test_scaled_objects_validate_against_kedas_crd_schema(example: Path, settings: dict[str, Any]) -> None:
    settings = {k: v for k, v in {**settings, "engine": "keda"}.items() if v is not None}
    scaled = build_scaled_object(_sdep(_example(example), settings))
    jsonschema.validate(scaled, _keda_schema())


def test_the_strict_keda_schema_refuses_a_misspelt_field() -> None:
    scaled = build_scaled_object(_sdep(_example(EXAMPLES[0]), KEDA))
    scaled["spec"]["triggers"][0]["metricsType"] = scaled["spec"]["triggers"][0].pop("metricType")
    with pytest.raises(jsonschema.ValidationError, match="metricsType"):
        jsonschema.validate(scaled, _keda_schema())


def test_the_hpa_scales_the_speculative_deployment_on_its_pods_metric() -> None:
    sdep = _sdep(
        _example(EXAMPLES[1]), {"maxReplicas": 6, "minReplicas": 2, "metric": "queueDepth", "target": 2.5}
    )
    hpa = build_hpa(sdep)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "name": sdep.metadata.name,
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "specdeploy_queue_depth"},
                "target": {"type": "AverageValue", "averageValue": "2500m"},
            },
        }
    ]
    assert hpa["metadata"]["ownerReferences"][0]["kind"] == "SpeculativeDeployment"


def test_default_behaviour_scales_up_at_once_and_down_slowly() -> None:
    behavior = build_hpa(_sdep(_example(EXAMPLES[1]), HPA))["spec"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert {p["type"]: p["value"] for p in behavior["scaleUp"]["policies"]} == {"Pods": 4, "Percent": 100}
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]


def test_no_autoscaling_renders_no_autoscaler() -> None:
    assert build_autoscaler(_sdep(_example(EXAMPLES[1]))) is None
    assert build_autoscaler(_sdep(_example(EXAMPLES[1]), KEDA))["kind"] == "ScaledObject"  # type: ignore[index]


def test_quantities_are_plain_or_milli() -> None:
    assert [quantity(v) for v in (10, 10.0, 2.5, 0.25, 0.0005)] == ["10", "10", "2500m", "250m", "1m"]


def test_the_keda_query_selects_only_this_deployments_pods() -> None:
    query = keda_query(_sdep(_example(EXAMPLES[1]), KEDA))
    name = _example(EXAMPLES[1])["metadata"]["name"]
    assert query == f'sum(specdeploy_queue_depth{{namespace="llm",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"}})'
    custom = _sdep(_example(EXAMPLES[1]), {**KEDA, "keda": {"query": "sum(up)"}})
    assert keda_query(custom) == "sum(up)"


def test_keda_falls_back_to_the_operators_prometheus() -> None:
    settings = OperatorSettings(prometheus_url="http://prom.example:9090")
    scaled = build_scaled_object(_sdep(_example(EXAMPLES[1]), {"engine": "keda", "maxReplicas": 3}), settings)
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["metadata"]["serverAddress"] == "http://prom.example:9090"
    assert trigger["metadata"]["threshold"] == "10"
    assert "activationThreshold" not in trigger["metadata"]  # only when scaling from zero


def test_the_metric_names_are_what_the_server_exports() -> None:
    from specdeploy_server.metrics import ServerMetrics

    exported = {metric.name for metric in ServerMetrics("m").registry.collect()}
    assert set(METRIC_NAMES.values()) <= exported


@pytest.mark.parametrize(("replicas", "min_available"), [(0, 0), (1, 0), (2, 1), (5, 4)])
def test_the_pdb_lets_one_serving_pod_go_at_a_time(replicas: int, min_available: int) -> None:
    pdb = build_pdb(_sdep(_example(EXAMPLES[1]), replicas=replicas))
    assert pdb["spec"]["minAvailable"] == min_available
    assert "maxUnavailable" not in pdb["spec"]


def test_the_grace_period_covers_the_servers_drain() -> None:
    settings = OperatorSettings()
    for serving, grace in (({}, 60), ({"terminationGracePeriodSeconds": 300}, 300)):
        sdep = _sdep(_example(EXAMPLES[1]), serving=serving)
        engines = build_engine_builds(sdep, settings)
        pod = build_deployment(sdep, engines, settings)["spec"]["template"]["spec"]
        config = build_server_config(sdep, engines, settings)
        assert pod["terminationGracePeriodSeconds"] == grace
        assert pod["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
        # grace = preStop sleep + drain + margin for the process to exit
        assert config["serving"]["shutdownTimeoutSeconds"] == grace - 10


def test_the_scale_selector_selects_exactly_the_serving_pods() -> None:
    sdep = _sdep(_example(EXAMPLES[1]))
    template = build_deployment(sdep, build_engine_builds(sdep, OperatorSettings()))["spec"]["template"]
    pairs = dict(item.split("=") for item in status_selector(sdep).split(","))
    assert pairs.items() <= template["metadata"]["labels"].items()
    assert pairs["app.kubernetes.io/component"] == "server"
