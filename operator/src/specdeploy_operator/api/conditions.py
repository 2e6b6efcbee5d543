"""The vocabulary of status: the phases, condition types and reasons the operator writes, the events it posts,
and the condition types and reasons of Kubernetes objects it reads. Every other module names them from here;
the wire form of each is its string value.

A `SpeculativeDeployment` carries the conditions `EnginesReady`, `Available`, `Progressing`, `Degraded`,
`Synced`, `EngineCacheReady` while it uses an engine-cache claim and, once speculation has been measured,
`SpeculationEffective`; an `EngineBuild` carries
`Succeeded`. `CONDITION_REASONS` lists the reasons each of them may take (docs/operator.md renders it).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final, Literal

__all__ = [
    "CONDITION_REASONS",
    "CREATION_REASONS",
    "BuildPhase",
    "ClaimPhase",
    "ConditionStatus",
    "ConditionType",
    "DeploymentPhase",
    "EngineBuildPhase",
    "EventType",
    "KubeCondition",
    "KubeReason",
    "Phase",
    "PodPhase",
    "PromotionPhase",
    "PromotionPhaseName",
    "Reason",
    "RunPhase",
    "TrainingPhase",
]


Phase = Literal["Pending", "Building", "Deploying", "Ready", "Degraded", "Failed"]
"""`SpeculativeDeployment.status.phase` in the schema; `DeploymentPhase` names each value."""
EngineBuildPhase = Literal["Pending", "Running", "Succeeded", "Failed"]
"""`EngineBuild.status.phase` in the schema; `BuildPhase` names each value."""


class DeploymentPhase(StrEnum):
    """`SpeculativeDeployment.status.phase` (`Phase`)."""

    PENDING = "Pending"
    BUILDING = "Building"
    DEPLOYING = "Deploying"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"


TrainingPhase = Literal["Pending", "Generating", "Training", "Succeeded", "Failed"]
"""`DraftTraining.status.phase` in the schema; `RunPhase` names each value."""


PromotionPhaseName = Literal["Canary", "Promoted", "Rejected", "RolledBack"]
"""`DraftTraining.status.promotion.phase` in the schema; `PromotionPhase` names each value."""


class PromotionPhase(StrEnum):
    """`DraftTraining.status.promotion.phase` (`PromotionPhaseName`)."""

    CANARY = "Canary"
    PROMOTED = "Promoted"
    REJECTED = "Rejected"
    ROLLED_BACK = "RolledBack"


class RunPhase(StrEnum):
    """`DraftTraining.status.phase` (`TrainingPhase`)."""

    PENDING = "Pending"
    GENERATING = "Generating"
    TRAINING = "Training"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class BuildPhase(StrEnum):
    """`EngineBuild.status.phase` (`EngineBuildPhase`)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionType(StrEnum):
    """Condition types the operator writes."""

    ENGINES_READY = "EnginesReady"
    AVAILABLE = "Available"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    SYNCED = "Synced"
    SPECULATION_EFFECTIVE = "SpeculationEffective"
    ENGINE_CACHE_READY = "EngineCacheReady"
    """Whether the engine-cache claim is bound and can be mounted by pods on several nodes."""
    SUCCEEDED = "Succeeded"
    """The EngineBuild's one condition: `True` once built, `False` once failed, `Unknown` before."""
    GENERATED = "Generated"
    """A DraftTraining's generate step: `True` once the deployment answered its prompts."""
    TRAINED = "Trained"
    """A DraftTraining's train step: `True` once the draft is in the claim."""
    PROMOTED = "Promoted"
    """A DraftTraining's promotion: `True` once the deployment serves the trained draft."""


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Reason(StrEnum):
    """Reasons of the operator's conditions and events (an event posted for a condition takes its reason)."""

    # Synced
    RECONCILE_SUCCESS = "ReconcileSuccess"
    RECONCILE_ERROR = "ReconcileError"
    FORBIDDEN = "Forbidden"
    # EnginesReady, Progressing, Degraded and the EngineBuild's Succeeded
    ENGINES_BUILT = "EnginesBuilt"
    JOB_PENDING = "JobPending"
    BUILD_PENDING = "BuildPending"
    BUILDING = "Building"
    BUILD_SUCCEEDED = "BuildSucceeded"
    BUILD_FAILED = "BuildFailed"
    # Available
    MINIMUM_REPLICAS_AVAILABLE = "MinimumReplicasAvailable"
    MINIMUM_REPLICAS_UNAVAILABLE = "MinimumReplicasUnavailable"
    NOT_DEPLOYED = "NotDeployed"
    # Progressing
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    ROLLOUT_COMPLETE = "RolloutComplete"
    # Degraded
    AS_EXPECTED = "AsExpected"
    UNSCHEDULABLE = "Unschedulable"
    CAPACITY_PENDING = "CapacityPending"
    INVALID_SPEC = "InvalidSpec"
    QUOTA_EXCEEDED = "QuotaExceeded"
    POD_CREATION_FORBIDDEN = "PodCreationForbidden"
    POD_CREATION_FAILED = "PodCreationFailed"
    # SpeculationEffective
    ACCEPTANCE_HEALTHY = "AcceptanceHealthy"
    LOW_ACCEPTANCE = "LowAcceptance"
    # EngineCacheReady
    CLAIM_BOUND = "ClaimBound"
    CLAIM_PENDING = "ClaimPending"
    CLAIM_MISSING = "ClaimMissing"
    CLAIM_PROVISIONING_FAILED = "ClaimProvisioningFailed"
    CLAIM_NOT_READ_WRITE_MANY = "ClaimNotReadWriteMany"
    CLAIM_LOST = "ClaimLost"
    # Generated and Trained (a DraftTraining)
    DEPLOYMENT_NOT_FOUND = "DeploymentNotFound"
    DEPLOYMENT_NOT_READY = "DeploymentNotReady"
    TRAINING_REFUSED = "TrainingRefused"
    GENERATING = "Generating"
    SAMPLES_GENERATED = "SamplesGenerated"
    GENERATE_FAILED = "GenerateFailed"
    WAITING_FOR_SAMPLES = "WaitingForSamples"
    TRAINING = "Training"
    DRAFT_TRAINED = "DraftTrained"
    TRAIN_FAILED = "TrainFailed"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    # Promoted (a DraftTraining with spec.promotion)
    CANARY_SERVING = "CanaryServing"
    CANARY_REFUSED = "CanaryRefused"
    DRAFT_PROMOTED = "DraftPromoted"
    DRAFT_REJECTED = "DraftRejected"
    DRAFT_ROLLED_BACK = "DraftRolledBack"
    # events only
    BUILD_STARTED = "BuildStarted"
    ROLLOUT_STARTED = "RolloutStarted"
    DEPLOYING = "Deploying"
    ROLLOUT_FINISHED = "RolloutFinished"
    WORKLOAD_REPLACED = "WorkloadReplaced"
    """A change between one node and several per replica: the old kind of workload is deleted once the new
    one serves every replica."""
    AUTOSCALER_FAILED = "AutoscalerFailed"
    DEGRADED = "Degraded"
    """A Degraded phase's event when no Degraded condition names a reason."""


CREATION_REASONS: Final = frozenset(
    {Reason.QUOTA_EXCEEDED, Reason.POD_CREATION_FORBIDDEN, Reason.POD_CREATION_FAILED}
)
"""Reasons that say pods cannot be created (the API server refused them)."""

CONDITION_REASONS: Final[Mapping[ConditionType, tuple[Reason, ...]]] = {
    ConditionType.SYNCED: (Reason.RECONCILE_SUCCESS, Reason.RECONCILE_ERROR, Reason.FORBIDDEN),
    ConditionType.ENGINES_READY: (
        Reason.ENGINES_BUILT,
        Reason.BUILD_PENDING,
        Reason.BUILDING,
        Reason.BUILD_FAILED,
        Reason.QUOTA_EXCEEDED,
        Reason.POD_CREATION_FORBIDDEN,
        Reason.POD_CREATION_FAILED,
    ),
    ConditionType.AVAILABLE: (
        Reason.MINIMUM_REPLICAS_AVAILABLE,
        Reason.MINIMUM_REPLICAS_UNAVAILABLE,
        Reason.NOT_DEPLOYED,
    ),
    ConditionType.PROGRESSING: (
        Reason.BUILDING,
        Reason.ROLLOUT_IN_PROGRESS,
        Reason.ROLLOUT_COMPLETE,
        Reason.BUILD_FAILED,
        Reason.CAPACITY_PENDING,
    ),
    ConditionType.DEGRADED: (
        Reason.AS_EXPECTED,
        Reason.CAPACITY_PENDING,
        Reason.UNSCHEDULABLE,
        Reason.BUILD_FAILED,
        Reason.INVALID_SPEC,
        Reason.QUOTA_EXCEEDED,
        Reason.POD_CREATION_FORBIDDEN,
        Reason.POD_CREATION_FAILED,
    ),
    ConditionType.SPECULATION_EFFECTIVE: (Reason.ACCEPTANCE_HEALTHY, Reason.LOW_ACCEPTANCE),
    ConditionType.ENGINE_CACHE_READY: (
        Reason.CLAIM_BOUND,
        Reason.CLAIM_PENDING,
        Reason.CLAIM_MISSING,
        Reason.CLAIM_PROVISIONING_FAILED,
        Reason.CLAIM_NOT_READ_WRITE_MANY,
        Reason.CLAIM_LOST,
    ),
    ConditionType.SUCCEEDED: (
        Reason.JOB_PENDING,
        Reason.UNSCHEDULABLE,
        Reason.BUILDING,
        Reason.BUILD_SUCCEEDED,
        Reason.BUILD_FAILED,
        Reason.QUOTA_EXCEEDED,
        Reason.POD_CREATION_FORBIDDEN,
        Reason.POD_CREATION_FAILED,
    ),
    ConditionType.GENERATED: (
        Reason.DEPLOYMENT_NOT_FOUND,
        Reason.DEPLOYMENT_NOT_READY,
        Reason.TRAINING_REFUSED,
        Reason.INVALID_SPEC,
        Reason.GENERATING,
        Reason.SAMPLES_GENERATED,
        Reason.GENERATE_FAILED,
        Reason.BUDGET_EXHAUSTED,
    ),
    ConditionType.TRAINED: (
        Reason.WAITING_FOR_SAMPLES,
        Reason.TRAINING,
        Reason.DRAFT_TRAINED,
        Reason.TRAIN_FAILED,
        Reason.BUDGET_EXHAUSTED,
    ),
    ConditionType.PROMOTED: (
        Reason.CANARY_SERVING,
        Reason.CANARY_REFUSED,
        Reason.DRAFT_PROMOTED,
        Reason.DRAFT_REJECTED,
        Reason.DRAFT_ROLLED_BACK,
    ),
}
"""The reasons each condition type may take."""


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class KubeCondition(StrEnum):
    """Condition types of Kubernetes objects the operator reads."""

    JOB_COMPLETE = "Complete"
    JOB_SUCCESS_CRITERIA_MET = "SuccessCriteriaMet"
    JOB_FAILED = "Failed"
    JOB_FAILURE_TARGET = "FailureTarget"
    POD_SCHEDULED = "PodScheduled"
    POD_READY = "Ready"
    DEPLOYMENT_AVAILABLE = "Available"
    DEPLOYMENT_REPLICA_FAILURE = "ReplicaFailure"
    HPA_ABLE_TO_SCALE = "AbleToScale"
    HPA_SCALING_ACTIVE = "ScalingActive"


class PodPhase(StrEnum):
    """`status.phase` of a Kubernetes pod."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ClaimPhase(StrEnum):
    """`status.phase` of a PersistentVolumeClaim."""

    PENDING = "Pending"
    BOUND = "Bound"
    LOST = "Lost"


class KubeReason(StrEnum):
    """Reasons of Kubernetes conditions and events the operator reads."""

    PROVISIONING_FAILED = "ProvisioningFailed"
    """A provisioner could not create a volume for a claim (an event about the claim)."""
    POD_UNSCHEDULABLE = "Unschedulable"
    JOB_FAILED_CREATE = "FailedCreate"
    JOB_SUCCESSFUL_CREATE = "SuccessfulCreate"
