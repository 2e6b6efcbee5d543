"""Canary and promotion of a trained draft: the decision rule, the window, rollback as one field, the canary's
objects, and the deployment serving a promoted draft."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.api.drafttraining import PromotionRule
from specdeploy_operator.builders import OperatorSettings, pod_selector
from specdeploy_operator.builders.canary import CANARY_LABEL, canary_children, serving_trained
from specdeploy_operator.controller.canarywindows import CanaryWindows
from specdeploy_operator.controller.promotionplan import Figures, plan_promotion
from specdeploy_operator.controller.speculation import Window

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RULE = PromotionRule(min_acceptance_gain=0.05, min_drafted_tokens=1000, window_seconds=600)


def side(drafted: float, acceptance: float, tokens_per_step: float = 2.0) -> Figures:
    steps = 100.0
    return Figures(
        drafted=drafted, accepted=drafted * acceptance, steps=steps, generated=steps * tokens_per_step
    )


def test_a_canary_serves_until_both_sides_drafted_enough() -> None:
    plan = plan_promotion(RULE, None, (side(900, 0.9), side(5000, 0.5)), NOW)
    assert plan.canary
    assert plan.status["phase"] == "Canary"
    assert plan.status["startTime"] == "2026-11-29T12:00:00Z"
    assert plan.status["canary"] == {"drafted": 900, "acceptance": 0.9, "tokensPerStep": 2.0}
    assert plan.condition.reason == "CanaryServing"
    assert plan.requeue == 601


def test_the_canary_is_promoted_when_its_acceptance_is_higher_by_the_rule() -> None:
    started = {"phase": "Canary", "startTime": "2026-11-29T12:00:00Z"}
    plan = plan_promotion(RULE, started, (side(1200, 0.62), side(4000, 0.55)), NOW + timedelta(seconds=90))
    assert not plan.canary
    assert plan.status["phase"] == "Promoted"
    assert plan.status["decisionTime"] == "2026-11-29T12:01:30Z"
    assert plan.condition.status == "True"
    assert "0.620 against 0.550 (+0.070; the rule asks +0.050)" in plan.status["message"]


def test_a_smaller_gain_keeps_the_old_draft_and_says_why() -> None:
    started = {"phase": "Canary", "startTime": "2026-11-29T12:00:00Z"}
    plan = plan_promotion(RULE, started, (side(1200, 0.58), side(4000, 0.55)), NOW)
    assert plan.status["phase"] == "Rejected"
    assert plan.condition.reason == "DraftRejected"
    assert plan.status["message"].startswith("rejected, the old draft stays: canary acceptance 0.580")


def test_a_window_without_enough_traffic_rejects_the_canary() -> None:
    started = {"phase": "Canary", "startTime": "2026-11-29T12:00:00Z"}
    plan = plan_promotion(RULE, started, (side(300, 0.9), side(400, 0.5)), NOW + timedelta(seconds=601))
    assert plan.status["phase"] == "Rejected"
    assert (
        "had 300 and the current replicas 400 drafted tokens verified, of 1000 each" in plan.status["message"]
    )


def test_rollback_is_one_field_and_unsetting_it_restores_the_promotion() -> None:
    promoted = plan_promotion(
        RULE,
        {"phase": "Canary", "startTime": "2026-11-29T12:00:00Z"},
        (side(2000, 0.9), side(2000, 0.5)),
        NOW,
    ).status
    back = plan_promotion(RULE.model_copy(update={"rollback": True}), promoted, None, NOW)
    assert back.status["phase"] == "RolledBack"
    assert back.condition.reason == "DraftRolledBack"
    assert back.status["canary"] == promoted["canary"]  # the figures of the decision stay
    again = plan_promotion(RULE, back.status, None, NOW)
    assert again.status["phase"] == "Promoted"
    assert not again.canary


def test_a_decision_stands_without_new_figures() -> None:
    rejected = {"phase": "Rejected", "message": "rejected, the old draft stays: x"}
    plan = plan_promotion(RULE, rejected, (side(9000, 0.99), side(9000, 0.1)), NOW)
    assert plan.status == rejected
    assert not plan.canary


def test_a_deployment_that_cannot_serve_the_draft_refuses_the_canary() -> None:
    plan = plan_promotion(RULE, None, None, NOW, refused="tiny-cpu cannot serve the trained draft: ...")
    assert plan.status["phase"] == "Rejected"
    assert plan.condition.reason == "CanaryRefused"
    assert not plan.canary


def _window(drafted: float, accepted: float) -> Window:
    return Window(
        seconds=3,
        pods=1,
        skipped=0,
        drafted=drafted,
        accepted=accepted,
        steps=10,
        generated=30,
        speculating=None,
    )


def test_canary_windows_count_only_rounds_where_both_sides_took_steps() -> None:
    windows = CanaryWindows()

    def deployment_of(key: tuple[str, str]) -> tuple[str, str]:
        return ("team", "tiny-cpu")

    canary, current = ("team", "canary/learn"), ("team", "tiny-cpu")
    assert windows.add({canary: _window(10, 9)}, deployment_of) == []  # the deployment was idle
    assert windows.add({canary: _window(10, 9), current: _window(20, 10)}, deployment_of) == [
        ("team", "learn")
    ]
    windows.add({canary: _window(5, 5), current: _window(10, 5)}, deployment_of)
    got = windows.figures(("team", "learn"))
    assert got is not None
    assert (got[0].drafted, got[0].accepted, got[1].drafted, got[1].accepted) == (15, 14, 30, 15)
    windows.keep([])
    assert windows.figures(("team", "learn")) is None


def _example() -> SpeculativeDeployment:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "09-transformers-cpu-tiny.yaml").read_text())
    doc["metadata"].update(namespace="team", uid="u1")
    return SpeculativeDeployment.model_validate(doc)


def test_the_canary_is_one_replica_behind_the_deployments_service_serving_the_trained_draft() -> None:
    sdep = _example()
    served = serving_trained(sdep, "draftModel", "pvc://demo-models/drafts/abc/model")
    assert served.spec.draft is not None
    assert served.spec.draft.model is not None
    assert served.spec.draft.model.uri == "pvc://demo-models/drafts/abc/model"
    training = {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": "learn", "namespace": "team", "uid": "t1"},
    }
    configmap, deployment = canary_children(served, [], training, OperatorSettings())
    assert configmap["metadata"]["name"] == deployment["metadata"]["name"] == "learn-canary"
    assert configmap["metadata"]["ownerReferences"][0]["kind"] == "DraftTraining"
    assert "drafts/abc/model" in configmap["data"]["server.yaml"]
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    pod_labels = spec["template"]["metadata"]["labels"]
    assert pod_selector(sdep).items() <= pod_labels.items()  # the deployment's Service selects it
    assert pod_labels[CANARY_LABEL] == "learn"
    assert spec["selector"]["matchLabels"][CANARY_LABEL] == "learn"  # its own Deployment only its own pods
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "learn-canary"


def test_an_eagle3_head_replaces_the_draft_and_a_backend_without_eagle3_refuses_it() -> None:
    sdep = _example()
    served = serving_trained(sdep, "eagle3", "pvc://c/drafts/h/model")
    assert served.spec.draft is None
    assert served.spec.speculative.method == "eagle3"
    assert served.spec.speculative.draft_len == sdep.spec.speculative.draft_len
    doc = sdep.to_dict()
    doc["spec"].update(backend="tensorrt", placement={"device": "gpu"})
    doc["spec"]["target"]["model"]["uri"] = "hf://org/target"
    doc["spec"]["draft"]["model"]["uri"] = "hf://org/draft"
    doc["spec"].pop("serving")
    with pytest.raises(ValueError, match="cannot serve the trained draft"):
        serving_trained(SpeculativeDeployment.model_validate(doc), "eagle3", "pvc://c/drafts/h/model")
