"""A DraftTraining's lifecycle as the pure plan decides it: the deployment it waits for, the generate Job, the
train Job, the figures their termination messages carry, failures, the budget, and a changed spec."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import InvalidObjectError, parse_object
from specdeploy_operator.builders import OperatorSettings
from specdeploy_operator.controller.trainingplan import TrainingObserved, plan_training

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SETTINGS = OperatorSettings()


def deployment(phase: str = "Ready") -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "09-transformers-cpu-tiny.yaml").read_text())
    doc["metadata"].update(namespace="team", uid="sdep-uid")
    doc["status"] = {"phase": phase}
    return doc


def training(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": "learn", "namespace": "team", "uid": "dt-uid", "generation": 1},
        "spec": {
            "deployment": "tiny-cpu",
            "draft": "draftModel",
            "prompts": {"configMap": {"name": "prompts"}},
            "samples": 200,
            "heldOut": 16,
            **spec,
        },
    }
    return body


def with_status(body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {**copy.deepcopy(body), "status": status}


def completed(
    job: dict[str, Any], summary: dict[str, Any] | None, container: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    done = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    terminated = {"exitCode": 0, "reason": "Completed"}
    if summary is not None:
        terminated["message"] = json.dumps(summary) + "\n"
    pod = {
        "metadata": {"name": f"{job['metadata']['name']}-abcde", "creationTimestamp": "2026-11-29T12:00:00Z"},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": container, "state": {"terminated": terminated}}],
        },
    }
    return done, [pod]


def failed(job: dict[str, Any], container: str, message: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cond = {
        "type": "Failed",
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
    }
    terminated = {"exitCode": 2, "reason": "Error", "message": message}
    pod = {
        "metadata": {"name": f"{job['metadata']['name']}-x", "creationTimestamp": "2026-11-29T12:00:00Z"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": container, "state": {"terminated": terminated}}],
        },
    }
    return {**job, "status": {"conditions": [cond]}}, [pod]


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


GENERATED = {
    "prompts": 216,
    "samples": 200,
    "held_out": 16,
    "failed": 0,
    "completion_tokens": 9000,
    "seconds": 41.2,
}
TRAINED = {
    "samples": 200,
    "tokens": 12000,
    "steps": 100,
    "loss": 0.812345,
    "agreement": 0.61,
    "seconds": 88.0,
}


def run_to_training(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the status once generated, the generate Job, the train Job) of `body` against a Ready deployment."""
    first = plan_training(TrainingObserved(body, deployment()), SETTINGS, NOW)
    generate = first.create
    assert generate is not None
    job, pods = completed(generate, GENERATED, "generate")
    body = with_status(body, first.status)
    second = plan_training(
        TrainingObserved(body, deployment(), {"generate": job}, {"generate": pods}), SETTINGS, NOW
    )
    assert second.create is not None
    return second.status, generate, second.create


def test_a_deployment_that_is_absent_or_not_ready_holds_the_run_in_pending_without_a_job() -> None:
    absent = plan_training(TrainingObserved(training(), None), SETTINGS, NOW)
    assert absent.create is None
    assert absent.status["phase"] == "Pending"
    assert condition(absent.status, "Generated")["reason"] == "DeploymentNotFound"
    waiting = plan_training(TrainingObserved(training(), deployment("Building")), SETTINGS, NOW)
    assert waiting.create is None
    assert condition(waiting.status, "Generated")["reason"] == "DeploymentNotReady"
    assert condition(waiting.status, "Trained")["reason"] == "WaitingForSamples"


def test_a_ready_deployment_gets_a_generate_job_that_asks_its_own_endpoint() -> None:
    plan = plan_training(TrainingObserved(training(), deployment()), SETTINGS, NOW)
    job = plan.create
    assert job is not None
    assert plan.status["phase"] == "Generating"
    assert plan.status["startTime"] == "2026-11-29T12:00:00Z"
    assert job["metadata"]["name"] == plan.status["generateJob"]
    assert job["metadata"]["ownerReferences"][0]["kind"] == "DraftTraining"
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    assert job["spec"]["backoffLimit"] == 0
    container = job["spec"]["template"]["spec"]["containers"][0]
    argv = container["command"]
    assert argv[:2] == ["specdeploy-distill", "generate"]
    assert argv[argv.index("--endpoint") + 1] == "http://tiny-cpu.team.svc:8000/v1"
    assert argv[argv.index("--model") + 1] == "target"
    assert argv[argv.index("--prompts") + 1] == "/prompts/prompts.jsonl"
    assert argv[argv.index("--out") + 1] == f"/output/drafts/{plan.status['hash']}/data"
    assert container["image"] == SETTINGS.server_image
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["prompts"]["configMap"]["name"] == "prompts"
    # the output goes to the deployment's engine-cache claim unless the spec names one
    assert volumes["output"]["persistentVolumeClaim"]["claimName"] == SETTINGS.cache_pvc_name


def test_generated_samples_go_into_status_and_start_the_train_job_on_the_same_data() -> None:
    status, _, train = run_to_training(training(outputPvcName="drafts"))
    assert status["phase"] == "Training"
    assert status["generated"] == {
        "prompts": 216,
        "samples": 200,
        "heldOut": 16,
        "failed": 0,
        "completionTokens": 9000,
        "seconds": 41.2,
    }
    assert condition(status, "Generated")["status"] == "True"
    argv = train["spec"]["template"]["spec"]["containers"][0]["command"]
    hash_ = status["hash"]
    assert argv[:2] == ["specdeploy-distill", "train-draft"]
    assert argv[argv.index("--samples") + 1] == f"/output/drafts/{hash_}/data/samples.jsonl"
    assert argv[argv.index("--out") + 1] == f"/output/drafts/{hash_}/model"
    # the deployment's pvc:// checkpoints are mounted read-only from their claim
    assert argv[argv.index("--target") + 1] == "/model-source-target/target"
    assert argv[argv.index("--draft") + 1] == "/model-source-draft/draft"
    volumes = {v["name"]: v for v in train["spec"]["template"]["spec"]["volumes"]}
    assert volumes["source-target"]["persistentVolumeClaim"] == {"claimName": "demo-models", "readOnly": True}
    assert volumes["output"]["persistentVolumeClaim"]["claimName"] == "drafts"


def test_a_trained_draft_is_succeeded_with_its_uri_and_figures() -> None:
    body = training(outputPvcName="drafts")
    status, generate, train = run_to_training(body)
    gen_job, gen_pods = completed(generate, GENERATED, "generate")
    train_done, train_pods = completed(train, TRAINED, "train")
    observed = TrainingObserved(
        with_status(body, status),
        deployment(),
        {"generate": gen_job, "train": train_done},
        {"generate": gen_pods, "train": train_pods},
    )
    plan = plan_training(observed, SETTINGS, NOW + timedelta(minutes=3))
    assert plan.create is None
    final = plan.status
    assert final["phase"] == "Succeeded"
    assert final["uri"] == f"pvc://drafts/drafts/{final['hash']}/model"
    assert final["trained"] == {
        "samples": 200,
        "tokens": 12000,
        "steps": 100,
        "loss": 0.8123,
        "seconds": 88.0,
        "accuracy": 0.61,
    }
    assert final["completionTime"] == "2026-11-29T12:03:00Z"
    assert condition(final, "Trained")["reason"] == "DraftTrained"
    # terminal: the Jobs' TTL deleting them changes nothing
    again = plan_training(
        TrainingObserved(with_status(body, final), deployment()), SETTINGS, NOW + timedelta(hours=1)
    )
    assert again.create is None
    assert again.status == final


def test_a_failed_step_fails_the_run_with_the_steps_own_words() -> None:
    body = training()
    first = plan_training(TrainingObserved(body, deployment()), SETTINGS, NOW)
    assert first.create is not None
    job, pods = failed(
        first.create, "generate", "specdeploy-distill generate: prompts.jsonl: no prompts in it"
    )
    plan = plan_training(
        TrainingObserved(
            with_status(body, first.status), deployment(), {"generate": job}, {"generate": pods}
        ),
        SETTINGS,
        NOW,
    )
    assert plan.create is None
    assert plan.status["phase"] == "Failed"
    generated = condition(plan.status, "Generated")
    assert generated["status"] == "False"
    assert generated["reason"] == "GenerateFailed"
    assert "no prompts in it" in generated["message"]
    assert "no prompts in it" in plan.status["message"]


def test_draft_model_training_is_refused_for_a_deployment_without_a_draft() -> None:
    sdep = deployment()
    sdep["spec"].pop("draft")
    sdep["spec"]["speculative"] = {"method": "none"}
    plan = plan_training(TrainingObserved(training(), sdep), SETTINGS, NOW)
    assert plan.create is None
    assert plan.status["phase"] == "Failed"
    refused = condition(plan.status, "Generated")
    assert refused["reason"] == "TrainingRefused"
    assert refused["message"].startswith("spec.draft: draftModel distils the deployment's draft model")


def test_the_budget_bounds_each_job_and_a_spent_budget_fails_before_the_next_step() -> None:
    body = training(budget={"timeoutSeconds": 600})
    status, generate, train = run_to_training(body)
    assert generate["spec"]["activeDeadlineSeconds"] == 600
    assert "--max-seconds" in train["spec"]["template"]["spec"]["containers"][0]["command"]
    gen_job, gen_pods = completed(generate, GENERATED, "generate")
    late = plan_training(
        TrainingObserved(
            with_status(body, status), deployment(), {"generate": gen_job}, {"generate": gen_pods}
        ),
        SETTINGS,
        NOW + timedelta(seconds=601),
    )
    assert late.create is None
    assert late.status["phase"] == "Failed"
    assert condition(late.status, "Trained")["reason"] == "BudgetExhausted"
    # with time left, the train Job's deadline is what is left
    early = plan_training(
        TrainingObserved(
            with_status(body, status), deployment(), {"generate": gen_job}, {"generate": gen_pods}
        ),
        SETTINGS,
        NOW + timedelta(seconds=100),
    )
    assert early.create is not None
    assert early.create["spec"]["activeDeadlineSeconds"] == 500


def test_a_changed_spec_is_another_run_with_other_jobs() -> None:
    body = training()
    first = plan_training(TrainingObserved(body, deployment()), SETTINGS, NOW)
    succeeded = with_status(body, {**first.status, "phase": "Succeeded"})
    succeeded["spec"]["samples"] = 500
    plan = plan_training(TrainingObserved(succeeded, deployment()), SETTINGS, NOW)
    assert plan.status["hash"] != first.status["hash"]
    assert plan.create is not None
    assert plan.create["metadata"]["name"] != first.status["generateJob"]
    assert plan.status["phase"] == "Generating"


def test_an_eagle3_head_trains_in_the_trainer_image_with_the_gpus_the_budget_gives() -> None:
    body = training(draft="eagle3", budget={"gpus": 2})
    sdep = deployment()
    sdep["spec"]["placement"] = {"device": "gpu", "gpuProduct": "NVIDIA-H100-80GB-HBM3"}
    sdep["spec"]["backend"] = "pytorch"
    sdep["spec"]["target"]["model"] = {
        "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
        "credentialsSecret": "hf",
    }
    sdep["spec"].pop("serving")
    first = plan_training(TrainingObserved(body, sdep), SETTINGS, NOW)
    job, pods = completed(first.create or {}, GENERATED, "generate")
    second = plan_training(
        TrainingObserved(with_status(body, first.status), sdep, {"generate": job}, {"generate": pods}),
        SETTINGS,
        NOW,
    )
    train = second.create
    assert train is not None
    pod = train["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == SETTINGS.trainer_image
    assert container["command"][1] == "train-eagle3"
    assert "--draft" not in container["command"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    # an hf:// target is downloaded into the run's scratch directory, with its token as a file
    download = pod["initContainers"][0]
    assert download["name"] == "download-target"
    assert f"/output/drafts/{second.status['hash']}/work/target" in download["command"]
    assert {"name": "HF_TOKEN_PATH", "value": "/var/run/secrets/specdeploy/model/HF_TOKEN"} in download["env"]


def test_prompts_from_a_claim_or_a_hub_dataset_reach_the_generate_job() -> None:
    claim = plan_training(
        TrainingObserved(training(prompts={"uri": "pvc://corpora/chat/prompts.jsonl"}), deployment()),
        SETTINGS,
        NOW,
    ).create
    assert claim is not None
    argv = claim["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--prompts") + 1] == "/prompts/chat/prompts.jsonl"
    hub = plan_training(
        TrainingObserved(training(prompts={"uri": "hf://datasets/org/chats"}), deployment()), SETTINGS, NOW
    ).create
    assert hub is not None
    download = hub["spec"]["template"]["spec"]["initContainers"][0]
    assert download["command"][-2:] == ["hf://datasets/org/chats", "/prompts/dataset"]


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"heldOut": 200}, "spec.heldOut", "less than spec.samples"),
        ({"prompts": {"configMap": {"name": "p"}, "uri": "pvc://c/p"}}, "spec.prompts.uri", "exactly one"),
        ({"prompts": {}}, "spec.prompts.uri", "exactly one"),
        ({"budget": {"timeoutSeconds": 60}}, "spec.budget.timeoutSeconds", "greater than or equal to 300"),
        ({"prompts": {"uri": "hf://org/model"}}, "spec.prompts.uri", "pattern"),
        ({"draft": "medusa"}, "spec.draft", "eagle3"),
        ({"training": {"steps": 0}}, "spec.training.steps", "greater than or equal to 1"),
    ],
)
def test_bad_input_is_refused_naming_the_field(patch: dict[str, Any], field: str, words: str) -> None:
    body = training(**patch)
    with pytest.raises(InvalidObjectError) as caught:
        parse_object(body)
    problems = {error.path: error.message for error in caught.value.errors}
    assert field in problems, problems
    assert words in problems[field]
