"""What reconciling one DraftTraining should do, decided from the DraftTraining, its deployment and its two
Jobs. Pure; `trainings.py` observes, asks here, and applies through the cluster port.

    Pending -> Generating -> Training -> Succeeded | Failed

A run is its content hash (`DraftTrainingSpec.content_hash`): a changed spec, or a deployment whose target
changed, is another run, whose Jobs have other names and whose output goes elsewhere. `Succeeded` and
`Failed` are terminal for the run that reached them: nothing is inferred from Jobs deleted afterwards.
The generate Job starts once the deployment is `Ready` (unless `spec.endpoint` names another server); the
train Job once the generate Job completed. The budget runs from the first Job's creation: each Job gets what
is left of it as its deadline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from specdeploy_operator.api import (
    ConditionStatus,
    ConditionType,
    DeploymentPhase,
    DraftTraining,
    KubeCondition,
    Reason,
    RunPhase,
    SpeculativeDeployment,
)
from specdeploy_operator.api.drafttraining import GeneratedSamples, TrainedDraft
from specdeploy_operator.builders import OperatorSettings
from specdeploy_operator.builders.training import (
    TrainingRefused,
    TrainingRun,
    generate_job,
    train_job,
    training_run,
)

from .conditions import MAX_MESSAGE, ConditionSpec, merge_conditions, rfc3339
from .podstate import by_creation, scheduling_problem, termination_message

__all__ = ["TERMINAL_RUN", "TrainingObserved", "TrainingPlan", "plan_training"]

Obj = Mapping[str, Any]
TERMINAL_RUN = frozenset({RunPhase.SUCCEEDED, RunPhase.FAILED})


@dataclass(frozen=True, slots=True)
class TrainingObserved:
    """What the reconcile saw: the DraftTraining, its deployment (None: absent), and each step's Job and
    pods by step name (`generate`, `train`)."""

    training: Obj
    deployment: Obj | None
    jobs: Mapping[str, Obj | None] = field(default_factory=dict)
    pods: Mapping[str, Sequence[Obj]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    """The Job to create (None: none now), the status to write, and the run's Job names by step."""

    create: dict[str, Any] | None
    status: dict[str, Any]
    job_names: Mapping[str, str] = field(default_factory=dict)


def _job_condition(job: Obj | None, *types: KubeCondition) -> Obj | None:
    for cond in ((job or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") in types and cond.get("status") == ConditionStatus.TRUE:
            return dict(cond)
    return None


def _summary(pods: Sequence[Obj], container: str) -> dict[str, Any] | None:
    """The JSON summary the step's container left as its termination message (newest pod first)."""
    for pod in reversed(by_creation(pods)):
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            if status.get("name") != container:
                continue
            terminated = (status.get("state") or {}).get("terminated") or {}
            if terminated.get("exitCode") != 0:
                continue
            text = str(terminated.get("message") or "").strip().splitlines()
            for line in reversed(text):
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    return value
    return None


def _failure(job: Obj, pods: Sequence[Obj]) -> str:
    failed = _job_condition(job, KubeCondition.JOB_FAILED, KubeCondition.JOB_FAILURE_TARGET) or {}
    message = f"{failed.get('reason') or 'Failed'}: {failed.get('message') or 'the Job failed'}"
    detail = next((m for m in (termination_message(p) for p in reversed(by_creation(pods))) if m), None)
    return f"{message}; {detail}" if detail else message


def _started(previous: Obj, now: datetime) -> datetime:
    raw = previous.get("startTime")
    if isinstance(raw, str):
        try:
            return datetime.strptime(raw, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            pass
    return now


@dataclass
class _Status:
    """The status being decided, in wire form, with its two conditions."""

    body: dict[str, Any]
    generated: ConditionSpec
    trained: ConditionSpec

    def finish(self, previous: Obj, now: datetime, generation: int | None) -> dict[str, Any]:
        self.body["conditions"] = merge_conditions(
            previous.get("conditions"), [self.generated, self.trained], now, generation
        )
        if self.body.get("message"):
            self.body["message"] = str(self.body["message"])[:MAX_MESSAGE]
        return self.body


def _cond(type_: ConditionType, status: ConditionStatus, reason: Reason, message: str) -> ConditionSpec:
    return ConditionSpec(type_, status, reason, message)


WAITING = _cond(
    ConditionType.TRAINED, ConditionStatus.UNKNOWN, Reason.WAITING_FOR_SAMPLES, "waiting for the samples"
)


def _refused(body: Obj, reason: Reason, message: str, now: datetime, generation: int | None) -> TrainingPlan:
    previous = body.get("status") or {}
    status = _Status(
        {"phase": str(RunPhase.FAILED), "observedGeneration": generation, "message": message},
        _cond(ConditionType.GENERATED, ConditionStatus.FALSE, reason, message),
        _cond(ConditionType.TRAINED, ConditionStatus.FALSE, reason, message),
    )
    if previous.get("completionTime"):
        status.body["completionTime"] = previous["completionTime"]
    else:
        status.body["completionTime"] = rfc3339(now)
    return TrainingPlan(None, status.finish(previous, now, generation))


def plan_training(observed: TrainingObserved, settings: OperatorSettings, now: datetime) -> TrainingPlan:
    """The next step of the DraftTraining in `observed`."""
    body = observed.training
    previous: Obj = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    try:
        training = DraftTraining.model_validate(
            {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        )
    except ValidationError as error:
        message = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors())
        return _refused(body, Reason.INVALID_SPEC, message, now, generation)
    name = training.spec.deployment
    if observed.deployment is None:
        message = f"SpeculativeDeployment {name} not found in this namespace"
        pending = _Status(
            {"phase": str(RunPhase.PENDING), "observedGeneration": generation, "message": message},
            _cond(ConditionType.GENERATED, ConditionStatus.UNKNOWN, Reason.DEPLOYMENT_NOT_FOUND, message),
            WAITING,
        )
        return TrainingPlan(None, pending.finish(previous, now, generation))
    try:
        sdep = SpeculativeDeployment.model_validate(
            {k: observed.deployment[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        )
        run = training_run(training, sdep, settings)
    except (ValidationError, TrainingRefused) as error:
        message = str(error) if isinstance(error, TrainingRefused) else f"{name}: its spec is invalid"
        return _refused(body, Reason.TRAINING_REFUSED, message, now, generation)
    same_run = previous.get("hash") == run.hash
    if same_run and previous.get("phase") in TERMINAL_RUN:
        return TrainingPlan(None, dict(previous))
    return _RunPlan(
        observed,
        run,
        previous if same_run else {},
        conditions_of=previous,
        settings=settings,
        now=now,
        generation=generation,
    ).plan()


class _RunPlan:
    """The run `run` from its Jobs; `previous`: the status of this run so far ({} for a new run)."""

    def __init__(
        self,
        observed: TrainingObserved,
        run: TrainingRun,
        previous: Obj,
        *,
        conditions_of: Obj,
        settings: OperatorSettings,
        now: datetime,
        generation: int | None,
    ) -> None:
        self.observed, self.run, self.previous, self.settings = observed, run, previous, settings
        self.conditions_of, self.now, self.generation = conditions_of, now, generation
        self.names = {"generate": run.job_name("generate"), "train": run.job_name("train")}
        base: dict[str, Any] = {
            "phase": str(RunPhase.PENDING),
            "observedGeneration": generation,
            "hash": run.hash,
            "generateJob": self.names["generate"],
            "trainJob": self.names["train"],
        }
        self.started = _started(previous, now)
        if previous.get("startTime"):
            base["startTime"] = previous["startTime"]
        self.left = run.training.spec.budget.timeout_seconds - int((now - self.started).total_seconds())
        self.status = _Status(base, WAITING, WAITING)

    def done(self, create: dict[str, Any] | None = None) -> TrainingPlan:
        return TrainingPlan(
            create, self.status.finish(self.conditions_of, self.now, self.generation), self.names
        )

    def fail(self, reason: Reason, message: str, *, train: bool) -> TrainingPlan:
        status = self.status
        status.body.update(phase=str(RunPhase.FAILED), message=message, completionTime=rfc3339(self.now))
        status.trained = _cond(ConditionType.TRAINED, ConditionStatus.FALSE, reason, message)
        if not train:
            status.generated = _cond(ConditionType.GENERATED, ConditionStatus.FALSE, reason, message)
        return self.done()

    def running(self, step: str, message: str) -> TrainingPlan:
        pods = self.observed.pods.get(step) or ()
        message = next(
            (f"{step} pod cannot be scheduled: {m}" for m in map(scheduling_problem, pods) if m), message
        )
        if step == "generate":
            self.status.body.update(phase=str(RunPhase.GENERATING), message=message)
            self.status.generated = _cond(
                ConditionType.GENERATED, ConditionStatus.UNKNOWN, Reason.GENERATING, message
            )
        else:
            self.status.body.update(phase=str(RunPhase.TRAINING), message=message)
            self.status.trained = _cond(
                ConditionType.TRAINED, ConditionStatus.UNKNOWN, Reason.TRAINING, message
            )
        return self.done()

    def plan(self) -> TrainingPlan:
        return self.generate_step() or self.train_step()

    def generate_step(self) -> TrainingPlan | None:
        """The plan while the generate step is not done (None once it is: its counts are in status)."""
        spec, status = self.run.training.spec, self.status
        job = self.observed.jobs.get("generate")
        pods = self.observed.pods.get("generate") or ()
        if job is None and self.previous.get(
            "generated"
        ):  # the Job went (its TTL, a person) after it completed
            status.body["generated"] = self.previous["generated"]
        elif job is None:
            ready = ((self.observed.deployment or {}).get("status") or {}).get(
                "phase"
            ) == DeploymentPhase.READY
            if spec.endpoint is None and not ready:
                message = f"waiting for SpeculativeDeployment {spec.deployment} to be Ready"
                status.body["message"] = message
                status.generated = _cond(
                    ConditionType.GENERATED, ConditionStatus.UNKNOWN, Reason.DEPLOYMENT_NOT_READY, message
                )
                return self.done()
            if self.left <= 0:
                return self.fail(
                    Reason.BUDGET_EXHAUSTED, "the budget ended before the generate step", train=False
                )
            status.body["startTime"] = rfc3339(self.started)
            self.running("generate", "the generate Job is being created")
            return self.done(generate_job(self.run, self.left))
        else:
            status.body["startTime"] = self.previous.get("startTime") or rfc3339(self.started)
            if _job_condition(job, KubeCondition.JOB_FAILED, KubeCondition.JOB_FAILURE_TARGET):
                return self.fail(Reason.GENERATE_FAILED, f"generate: {_failure(job, pods)}", train=False)
            if not _job_condition(job, KubeCondition.JOB_COMPLETE, KubeCondition.JOB_SUCCESS_CRITERIA_MET):
                return self.running("generate", "the generate Job is answering prompts through the endpoint")
            summary = (
                _summary(pods, "generate") or {}
            )  # no pod left to say: counts unknown, the data is there
            status.body["generated"] = GeneratedSamples.model_validate(
                {
                    "prompts": int(summary.get("prompts", 0)),
                    "samples": int(summary.get("samples", 0)),
                    "heldOut": int(summary.get("held_out", 0)),
                    "failed": int(summary.get("failed", 0)),
                    "completionTokens": int(summary.get("completion_tokens", 0)),
                    "seconds": round(float(summary.get("seconds", 0.0)), 1),
                }
            ).to_dict()
        generated = status.body["generated"]
        status.generated = _cond(
            ConditionType.GENERATED,
            ConditionStatus.TRUE,
            Reason.SAMPLES_GENERATED,
            f"{generated['samples']} samples for training, {generated['heldOut']} held out, "
            f"{generated['failed']} prompts unanswered",
        )
        return None

    def train_step(self) -> TrainingPlan:
        status = self.status
        job = self.observed.jobs.get("train")
        pods = self.observed.pods.get("train") or ()
        if job is None:
            if self.left <= 0:
                return self.fail(
                    Reason.BUDGET_EXHAUSTED, "the budget ended before the train step", train=True
                )
            self.running("train", "the train Job is being created")
            return self.done(train_job(self.run, self.left, self.settings))
        if _job_condition(job, KubeCondition.JOB_FAILED, KubeCondition.JOB_FAILURE_TARGET):
            return self.fail(Reason.TRAIN_FAILED, f"train: {_failure(job, pods)}", train=True)
        if not _job_condition(job, KubeCondition.JOB_COMPLETE, KubeCondition.JOB_SUCCESS_CRITERIA_MET):
            return self.running("train", "the train Job is training the draft")
        summary = _summary(pods, "train") or {}
        accuracy = summary.get("accuracy", summary.get("agreement"))
        trained = TrainedDraft.model_validate(
            {
                "samples": int(summary.get("samples", 0)),
                "tokens": int(summary.get("tokens", 0)),
                "steps": int(summary.get("steps", 0)),
                "loss": round(float(summary.get("loss", 0.0)), 4),
                "seconds": round(float(summary.get("seconds", 0.0)), 1),
                **({"accuracy": round(float(accuracy), 4)} if accuracy is not None else {}),
            }
        ).to_dict()
        message = f"the draft is at {self.run.uri}"
        status.body.update(phase=str(RunPhase.SUCCEEDED), trained=trained, uri=self.run.uri, message=message)
        status.body["completionTime"] = self.previous.get("completionTime") or rfc3339(self.now)
        status.trained = _cond(ConditionType.TRAINED, ConditionStatus.TRUE, Reason.DRAFT_TRAINED, message)
        return self.done()
