"""A DraftTraining on the local cluster: the operator runs its generate Job against the CPU example's real
server, then its train Job, both real processes (the server image; the trainer image for EAGLE-3), and
writes what their termination messages say into status.

The local cluster has no cluster DNS and no kube-proxy, so a pod cannot reach `<deployment>.<ns>.svc`; the
training names its endpoint (`spec.endpoint`): the Service through specdeploy_localcluster's ServiceGateway.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from kubernetes import client
from safetensors.torch import load_file, save_file
from specdeploy_localcluster.servicegateway import ServiceGateway
from specdeploy_server.demo_models import corpus_text, documents

from tests.conftest import Kubectl, wait_for
from tests.integration.test_real_pods import Served, served

pytestmark = pytest.mark.usefixtures("operator")
__all__ = ["served"]

GROUP, VERSION, PLURAL = "specdeploy.dev", "v1alpha1", "drafttrainings"
# The demo target learnt one small corpus (specdeploy_server.demo_models): the first words of each of its
# paragraphs are prompts it continues at length.
PROMPTS = [" ".join(doc.split()[:6]) for doc in documents(corpus_text())]


@pytest.fixture
def forwarder(served: tuple[Served, Path]) -> Iterator[str]:
    """The deployment's Service as the training's pods reach it here (`ServiceGateway`)."""
    s, _ = served
    with ServiceGateway(s.api, s.namespace, s.name) as gateway:
        yield f"{gateway.url}/v1"


def _training(s: Served, name: str, endpoint: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DraftTraining",
        "metadata": {"name": name, "namespace": s.namespace},
        "spec": {
            "deployment": s.name,
            "prompts": {"configMap": {"name": "prompts"}},
            "samples": 24,
            "heldOut": 4,
            "sampling": {"maxTokens": 24, "concurrency": 4},
            "outputPvcName": "demo-models",
            "endpoint": endpoint,
            **spec,
        },
    }


def _run(s: Served, kubectl: Kubectl, doc: dict[str, Any]) -> dict[str, Any]:
    custom = client.CustomObjectsApi(s.api)
    name = doc["metadata"]["name"]

    def status() -> dict[str, Any]:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, s.namespace, PLURAL, name)
        return dict(obj.get("status") or {})

    def finished() -> dict[str, Any] | None:
        current = status()
        return current if current.get("phase") in ("Succeeded", "Failed") else None

    def describe() -> str:
        return f"training: {json.dumps(status())}\n{s.describe()}"

    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
    result: dict[str, Any] = wait_for(
        finished, timeout=420, interval=1, what=f"{name} finished", describe=describe
    )
    assert result["phase"] == "Succeeded", describe()
    return result


@pytest.fixture
def prompts(served: tuple[Served, Path], kubectl: Kubectl) -> None:
    s, _ = served
    lines = "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "prompts", "namespace": s.namespace},
        "data": {"prompts.jsonl": lines},
    }
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(configmap))


@pytest.mark.usefixtures("prompts")
def test_a_draft_model_is_distilled_from_the_deployments_own_answers(
    served: tuple[Served, Path], kubectl: Kubectl, forwarder: str
) -> None:
    s, models = served
    status = _run(s, kubectl, _training(s, "distil", forwarder, draft="draftModel", training={"steps": 6}))
    assert status["generated"]["prompts"] == 28
    assert status["generated"]["samples"] == 24
    assert status["generated"]["heldOut"] == 4
    assert status["generated"]["failed"] == 0
    assert status["generated"]["completionTokens"] > 0
    assert status["trained"]["steps"] == 6
    assert 0 < status["trained"]["samples"] <= 24  # a response shorter than two tokens teaches nothing
    assert status["trained"]["loss"] > 0
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {"Generated": ("True", "SamplesGenerated"), "Trained": ("True", "DraftTrained")}
    assert status["uri"] == f"pvc://demo-models/drafts/{status['hash']}/model"
    out = models / "drafts" / status["hash"]
    assert {"samples.jsonl", "heldout.jsonl", "generate.json"} <= {p.name for p in (out / "data").iterdir()}
    assert {"config.json", "model.safetensors", "train.json"} <= {p.name for p in (out / "model").iterdir()}
    samples = [json.loads(line) for line in (out / "data" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 24
    events = kubectl(
        "get", "events", "-n", s.namespace, "--field-selector", "involvedObject.name=distil", "-o", "json"
    )
    reasons = {e["reason"] for e in json.loads(events.stdout)["items"]}
    assert {"Generating", "SamplesGenerated", "DraftTrained"} <= reasons


@pytest.mark.usefixtures("prompts")
def test_an_eagle3_head_is_trained_in_the_trainer_image(
    served: tuple[Served, Path], kubectl: Kubectl, forwarder: str
) -> None:
    s, models = served
    status = _run(s, kubectl, _training(s, "eagle", forwarder, draft="eagle3", training={"steps": 4}))
    assert status["trained"]["steps"] == 4
    assert 0 <= status["trained"]["accuracy"] <= 1
    head = models / "drafts" / status["hash"] / "model"
    config = json.loads((head / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    jobs = client.BatchV1Api(s.api).read_namespaced_job(status["trainJob"], s.namespace)
    assert jobs.spec.template.spec.containers[0].image == "ghcr.io/specdeploy/trainer:0.1.0"


def _zeroed_copy(source: Path, dest: Path) -> None:
    """`source` (a checkpoint) copied to `dest` with every weight zero: a draft that agrees with nothing."""
    shutil.copytree(source, dest)
    weights = dest / "model.safetensors"
    save_file({k: torch.zeros_like(v) for k, v in load_file(weights).items()}, weights)
    for path in [dest, *dest.rglob("*")]:
        origin = source / path.relative_to(dest)
        os.chown(path, origin.stat().st_uid, origin.stat().st_gid)
        path.chmod(origin.stat().st_mode)


@pytest.mark.usefixtures("prompts")
def test_a_better_draft_is_promoted_through_a_canary_and_rolled_back_by_one_field(
    served: tuple[Served, Path], kubectl: Kubectl
) -> None:
    plain, models = served
    _zeroed_copy(models / "draft", models / "zero-draft")
    doc = json.loads(json.dumps(plain.doc))
    doc["metadata"]["name"] = "tiny-zero"
    doc["spec"]["draft"]["model"]["uri"] = "pvc://demo-models/zero-draft"
    s = Served(kubectl, plain.api, plain.namespace, doc)
    s.apply()
    s.wait_ready()
    custom = client.CustomObjectsApi(s.api)
    rule = {"minAcceptanceGain": 0.1, "minDraftedTokens": 300, "windowSeconds": 400}
    with ServiceGateway(s.api, s.namespace, s.name) as gateway:
        training = _training(s, "head", f"{gateway.url}/v1", draft="eagle3", training={"steps": 300})
        training["spec"].update(samples=30, promotion=rule, sampling={"maxTokens": 48, "concurrency": 4})
        trained = _run(s, kubectl, training)

    def status() -> dict[str, Any]:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, s.namespace, PLURAL, "head")
        return dict(obj.get("status") or {})

    def config() -> str:
        return str(
            client.CoreV1Api(s.api).read_namespaced_config_map(f"{s.name}-server-config", s.namespace).data
        )

    canary = wait_for(
        lambda: (status().get("promotion") or {}).get("phase") == "Canary" and s.endpoints.ready()[1:],
        timeout=180,
        what="the canary serving beside the deployment's replica",
        describe=lambda: f"{json.dumps(status())}\n{s.describe()}",
    )
    assert canary

    def decided() -> dict[str, Any] | None:
        promotion = status().get("promotion") or {}
        if promotion.get("phase") != "Canary":
            return promotion
        # A client per request: round robin over both endpoints, each side its share.
        for prompt in PROMPTS[:8]:
            try:
                s.openai().completions.create(model="target", prompt=prompt, max_tokens=32, temperature=0)
            except (ConnectionError, openai.APIConnectionError):
                break  # decided meanwhile: the canary goes and the deployment rolls to the promoted draft
        return None

    promotion = wait_for(
        decided, timeout=300, what="a promotion decision", describe=lambda: json.dumps(status())
    )
    assert promotion["phase"] == "Promoted", promotion
    assert promotion["canary"]["acceptance"] >= promotion["current"]["acceptance"] + 0.1
    assert promotion["canary"]["drafted"] >= 300
    assert promotion["current"]["drafted"] >= 300
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status()["conditions"]}
    assert conditions["Promoted"] == ("True", "DraftPromoted")
    wait_for(
        lambda: (
            not [
                d
                for d in client.AppsV1Api(s.api).list_namespaced_deployment(s.namespace).items
                if d.metadata.name == "head-canary"
            ]
        ),
        timeout=60,
        what="the canary gone with the decision",
    )
    # The deployment serves the trained head now, and goes back to its own draft when rollback is set.
    assert trained["uri"].removeprefix("pvc://demo-models/") in config()
    s.wait_ready()
    kubectl(
        "patch",
        "dtrain",
        "head",
        "-n",
        s.namespace,
        "--type=merge",
        "-p",
        '{"spec":{"promotion":{"rollback":true}}}',
    )
    wait_for(lambda: "zero-draft" in config(), timeout=60, what="the deployment's own draft again")
    assert status()["promotion"]["phase"] == "RolledBack"
    events = kubectl(
        "get", "events", "-n", s.namespace, "--field-selector", "involvedObject.name=head", "-o", "json"
    )
    assert {"DraftPromoted", "DraftRolledBack"} <= {e["reason"] for e in json.loads(events.stdout)["items"]}
