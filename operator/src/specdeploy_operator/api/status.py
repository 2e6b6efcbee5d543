"""The observed state of a SpeculativeDeployment (`status`), written by the operator. Its phases, condition
types and reasons are named in `conditions.py`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .base import ApiModel
from .conditions import EngineBuildPhase, Phase
from .meta import CONDITIONS_LIST_EXTRAS, Condition, DnsSubdomain

__all__ = [
    "AutoscalerRef",
    "DraftPassCost",
    "EngineRef",
    "EngineRefs",
    "PassCosts",
    "Phase",
    "SpeculationFigures",
    "SpeculativeDeploymentStatus",
    "TargetPassCost",
]


class EngineRef(ApiModel):
    """The EngineBuild a model of this deployment uses."""

    name: DnsSubdomain
    """Name of the EngineBuild."""
    hash: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,64}$")]
    """Content hash of the engine (the EngineBuild's `spec.hash`)."""
    phase: EngineBuildPhase
    """Phase of the EngineBuild."""


class EngineRefs(ApiModel):
    """Engines of the target and the draft."""

    target: EngineRef | None = None
    """Engine of the target model."""
    draft: EngineRef | None = None
    """Engine of the draft model."""
    previous: Annotated[list[DnsSubdomain], Field(max_length=32)] | None = None
    """EngineBuilds this deployment used before, newest first, kept for rollback (the operator's
    `keepPreviousEngines` per model); other unreferenced EngineBuilds are deleted after the grace period."""


class AutoscalerRef(ApiModel):
    """The autoscaler the operator created for `spec.autoscaling`, and what it last reported."""

    kind: Literal["HorizontalPodAutoscaler", "ScaledObject"]
    """`HorizontalPodAutoscaler` (`engine: hpa`) or `ScaledObject` (`engine: keda`)."""
    name: DnsSubdomain
    """Its name (the deployment's)."""
    metric: Annotated[str, StringConstraints(max_length=128)] | None = None
    """The metric it scales on, as the custom metrics API names it."""
    target: Annotated[str, StringConstraints(max_length=64)] | None = None
    """Average value per replica it aims for (a quantity)."""
    desired_replicas: Annotated[int, Field(ge=0)] | None = None
    """Replicas it last asked for (HPA only)."""
    message: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """Why it cannot scale, when it cannot (its `ScalingActive`/`AbleToScale` condition, or the error of
    creating it)."""


class TargetPassCost(ApiModel):
    """Measured seconds of the target's pass at one size."""

    tokens: Annotated[int, Field(ge=1)]
    """Tokens the pass verified (all sequences together; a size bucket, a factor of √2 wide)."""
    seconds: Annotated[float, Field(ge=0)]
    """Mean seconds of such a pass."""
    count: Annotated[int, Field(ge=0)]
    """Passes measured in the window that set it."""


class DraftPassCost(ApiModel):
    """Measured seconds of one draft-model pass at one size."""

    sequences: Annotated[int, Field(ge=1)]
    """Sequences the pass drafted for (a size bucket, a factor of √2 wide)."""
    seconds: Annotated[float, Field(ge=0)]
    """Mean seconds of such a pass."""
    count: Annotated[int, Field(ge=0)]
    """Passes measured in the window that set it."""


class PassCosts(ApiModel):
    """What a pass costs by its size, measured by `trtllm-llmapi` servers (backend `pytorch`) from
    TensorRT-LLM's iteration statistics; each size keeps the latest window that measured it at least 8
    times. The next pods' `draft_len_schedule` is computed from these (docs/trtllm.md)."""

    target: Annotated[list[TargetPassCost], Field(max_length=32)] | None = None
    """The target's pass, by tokens verified."""
    draft: Annotated[list[DraftPassCost], Field(max_length=32)] | None = None
    """One draft-model pass, by sequences (only where TensorRT-LLM reports the drafter's time apart)."""


class SpeculationFigures(ApiModel):
    """How speculation pays off, from the ready servers' own metrics over the last window (counter deltas of
    `specdeploy_draft_tokens`, `specdeploy_accepted_draft_tokens`, `specdeploy_speculative_steps` and
    `specdeploy_generation_tokens`, summed over the pods that were scraped at both ends of the window)."""

    acceptance_rate: Annotated[float, Field(ge=0, le=1)] | None = None
    """Accepted draft tokens ÷ drafted tokens; unset when nothing was drafted (method `none`)."""
    tokens_per_step: Annotated[float, Field(ge=0)] | None = None
    """Mean tokens a sequence gains per target step (1 without speculation)."""
    draft_length: Annotated[float, Field(ge=0)] | None = None
    """Mean draft tokens proposed per sequence step (the draft length in use, averaged)."""
    speculating_fraction: Annotated[float, Field(ge=0, le=1)] | None = None
    """Fraction of sequence steps that proposed at least one draft token, where the servers export it
    (`specdeploy_speculating_steps`)."""
    tokens_per_second: Annotated[float, Field(ge=0)] | None = None
    """Generated tokens per second, all ready pods together."""
    window_seconds: Annotated[float, Field(ge=0)] | None = None
    """Length of the window the figures cover."""
    measured_at: Annotated[str, StringConstraints(max_length=64)] | None = None
    """When the window ended (RFC 3339)."""
    pods: Annotated[int, Field(ge=0)] | None = None
    """Pods the figures cover."""
    pods_skipped: Annotated[int, Field(ge=0)] | None = None
    """Ready pods that could not be scraped or restarted within the window (not in the figures)."""
    pass_costs: PassCosts | None = None
    """Measured pass costs by size (`trtllm-llmapi` only), kept across windows."""


class SpeculativeDeploymentStatus(ApiModel):
    """Observed state, written by the operator."""

    phase: Phase | None = None
    """Summary: `Pending`, `Building` (engines), `Deploying` (pods starting), `Ready`, `Degraded`, `Failed`.
    """
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The `metadata.generation` this status describes."""
    conditions: (
        Annotated[list[Condition], Field(max_length=16, json_schema_extra=CONDITIONS_LIST_EXTRAS)] | None
    ) = None
    """Conditions `EnginesReady`, `Available`, `Progressing`, `Degraded`, `Synced` and, once speculation
    has been measured, `SpeculationEffective` (`False`, reason `LowAcceptance`, when the draft's tokens are
    mostly rejected)."""
    engines: EngineRefs | None = None
    """EngineBuilds in use."""
    replicas: Annotated[int, Field(ge=0)] | None = None
    """Pods that exist (scale subresource)."""
    ready_replicas: Annotated[int, Field(ge=0)] | None = None
    """Pods that are ready to serve."""
    updated_replicas: Annotated[int, Field(ge=0)] | None = None
    """Pods running the current spec."""
    ready_text: Annotated[str, StringConstraints(max_length=32)] | None = None
    """`readyReplicas/replicas`, as `kubectl get` shows it (printer columns cannot compute)."""
    selector: Annotated[str, StringConstraints(max_length=4096)] | None = None
    """Label selector of the pods, as a string (scale subresource, HPA)."""
    endpoint: Annotated[str, StringConstraints(max_length=512)] | None = None
    """OpenAI-compatible base URL, `http://<service>.<namespace>.svc:<port>/v1`."""
    model_name: Annotated[str, StringConstraints(max_length=256)] | None = None
    """The name clients send in a request's `model` field (`spec.serving.modelName` or its default)."""
    gpus_per_replica: Annotated[int, Field(ge=0)] | None = None
    """GPUs each replica requests."""
    nodes_per_replica: Annotated[int, Field(ge=1)] | None = None
    """Nodes each replica spans, when more than one: each replica is then a group of that many pods (a
    LeaderWorkerSet group), and `replicas`, `readyReplicas` and `updatedReplicas` count groups."""
    capacity_pending_replicas: Annotated[int, Field(ge=0)] | None = None
    """Replicas waiting for GPU capacity (pending because no node has the free GPUs; a cluster autoscaler
    adds nodes for them), a group counted once; unset when none wait."""
    autoscaler: AutoscalerRef | None = None
    """The autoscaler of `spec.autoscaling`; unset without one."""
    speculation: SpeculationFigures | None = None
    """Acceptance and throughput measured on the ready pods (updated at most once per
    `SPECDEPLOY_SPECULATION_INTERVAL_SECONDS`, only when they change meaningfully, never while idle); unset
    until a window with traffic has been measured."""
