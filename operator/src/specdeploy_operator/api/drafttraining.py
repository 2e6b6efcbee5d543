"""The DraftTraining API (`specdeploy.dev/v1alpha1`, kind `DraftTraining`).

One run of self-distillation for one SpeculativeDeployment: its prompts are answered by the deployment's own
endpoint (the target's responses), a draft is trained on them (an EAGLE-3 head by ModelOpt, or the
deployment's draft model distilled), and the result is written into a claim under a content hash. Each step
is a Job the operator follows, as it follows an EngineBuild's.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from .base import GROUP, VERSION, ApiModel, PrinterColumn, ResourceInfo, Rule, Rules
from .conditions import PromotionPhaseName, TrainingPhase
from .meta import (
    CONDITIONS_LIST_EXTRAS,
    DNS_1035_LABEL,
    Condition,
    DnsSubdomain,
    ObjectMeta,
    ResourceRequirements,
)

__all__ = [
    "DRAFT_TRAINING",
    "PROMPTS_URI_PATTERN",
    "DraftKind",
    "DraftTraining",
    "DraftTrainingSpec",
    "DraftTrainingStatus",
    "GeneratedSamples",
    "PromotionRule",
    "PromotionStatus",
    "PromptSource",
    "SamplingSettings",
    "ServingFigures",
    "TrainedDraft",
    "TrainingBudget",
    "TrainingPhase",
    "TrainingSettings",
]

DraftKind = Literal["eagle3", "draftModel"]

PROMPTS_URI_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?(/\S*)?"
    r"|hf://datasets/[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*)$"
)
PromptsUri = Annotated[str, Field(min_length=1, max_length=1024, pattern=PROMPTS_URI_PATTERN)]
FileKey = Annotated[str, StringConstraints(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)]


class PromptConfigMap(ApiModel):
    """Prompts in a ConfigMap of the training's namespace."""

    name: DnsSubdomain
    """Name of the ConfigMap."""
    key: FileKey = "prompts.jsonl"
    """Key holding the prompts: a `.jsonl` file (one `{"prompt": ...}` or `{"messages": [...]}` per line) or a
    `.txt` file (one prompt per line)."""


class PromptSource(ApiModel):
    """Where the prompts come from: exactly one of `configMap` and `uri`. Request bodies the deployment
    served are never used."""

    validation_rules: ClassVar[Rules] = (
        Rule(
            name="prompts-one-source",
            cel="has(self.configMap) != has(self.uri)",
            message="spec.prompts: set exactly one of configMap and uri",
            field_path=".uri",
            check=lambda p: (p.config_map is None) != (p.uri is None),
        ),
    )

    config_map: PromptConfigMap | None = None
    """A ConfigMap key (up to 1 MiB of prompts)."""
    uri: PromptsUri | None = None
    """`pvc://claim/path` (a `.jsonl`/`.txt` file or a directory of them, in the training's namespace) or
    `hf://datasets/org/name` (downloaded by the generate Job; its `.jsonl`/`.txt` files are read)."""
    credentials_secret: DnsSubdomain | None = None
    """Secret holding `HF_TOKEN` for a gated `hf://datasets/` repository; only the download sees it."""


class SamplingSettings(ApiModel):
    """How the deployment answers the prompts (the OpenAI API's sampling fields)."""

    temperature: Annotated[float, Field(ge=0, le=2)] = 0.0
    """`temperature` of each request; 0 trains on the target's greedy answers."""
    max_tokens: Annotated[int, Field(ge=1, le=32768)] = 256
    """`max_tokens` of each request."""
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    """Seed of the prompts' shuffle and of each request."""
    concurrency: Annotated[int, Field(ge=1, le=256)] = 8
    """Requests in flight at once."""


class TrainingSettings(ApiModel):
    """The optimiser's settings; unset ones take the trainer's defaults for the kind of draft."""

    steps: Annotated[int, Field(ge=1, le=1_000_000)] = 200
    """Optimiser steps (fewer when the time budget ends first)."""
    batch_size: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Samples per step (eagle3: 4, draftModel: 8)."""
    learning_rate: Annotated[float, Field(gt=0, le=1)] | None = None
    """Learning rate (eagle3: 1e-3, draftModel: 1e-4)."""
    max_length: Annotated[int, Field(ge=16, le=131072)] = 1024
    """Tokens of a sample trained on (prompt and response, cut at the end)."""


class TrainingBudget(ApiModel):
    """What the run may spend."""

    timeout_seconds: Annotated[int, Field(ge=300, le=7 * 86400)] = 7200
    """Wall-clock limit of the whole run: each Job's `activeDeadlineSeconds` is what is left of it, and the
    train step stops training 120 s before, to export what it has. At least 300: less trains nothing."""
    gpus: Annotated[int, Field(ge=0, le=8)] = 0
    """GPUs of the train pod (`nvidia.com/gpu`); 0 trains on CPUs (tiny models only)."""
    resources: ResourceRequirements | None = None
    """CPU and memory of the train pod; unset: none requested."""


class PromotionRule(ApiModel):
    """Canary and promotion: the trained draft serves one extra replica behind the deployment's Service, and
    replaces the deployment's draft when the rule holds."""

    min_acceptance_gain: Annotated[float, Field(ge=0, le=1)] = 0.05
    """How much higher the canary's acceptance must be than the current replicas', over the same window."""
    min_drafted_tokens: Annotated[int, Field(ge=1, le=100_000_000)] = 2000
    """Draft tokens both sides must have had verified before a decision: fewer say nothing either way."""
    window_seconds: Annotated[int, Field(ge=30, le=7 * 86400)] = 900
    """The longest the canary serves; still undecided then (too little traffic), the old draft stays."""
    rollback: bool = False
    """`true`: the deployment serves its own draft again (a promoted draft is rolled back; a canary ends);
    `false` again restores a promotion that was decided."""


class DraftTrainingSpec(ApiModel):
    """What to train, from what, with what budget. A changed spec is another run: its output has another
    hash, and its Jobs other names."""

    validation_rules: ClassVar[Rules] = (
        Rule(
            name="held-out-below-samples",
            cel="self.heldOut < self.samples",
            message="spec.heldOut must be less than spec.samples",
            field_path=".heldOut",
            check=lambda s: s.held_out < s.samples,
        ),
    )

    deployment: DnsSubdomain
    """The SpeculativeDeployment in this namespace: its endpoint answers the prompts, its target is what the
    draft learns (and, for `draftModel`, its draft is where training starts)."""
    draft: DraftKind
    """`eagle3`: an EAGLE-3 head trained by NVIDIA ModelOpt on the target's hidden states (the trainer image;
    Llama-architecture targets). `draftModel`: the deployment's draft model distilled towards the target's
    next-token distribution (the server image; the draft must share the target's tokenizer)."""
    prompts: PromptSource
    """Where the prompts come from."""
    samples: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    """Prompts answered for training (fewer when the source has fewer)."""
    held_out: Annotated[int, Field(ge=0, le=100_000)] = 0
    """Prompts answered but kept out of training, for measuring the draft afterwards."""
    sampling: SamplingSettings = Field(default_factory=SamplingSettings, json_schema_extra={"default": {}})
    """How the deployment answers."""
    training: TrainingSettings = Field(default_factory=TrainingSettings, json_schema_extra={"default": {}})
    """How the draft is trained."""
    budget: TrainingBudget = Field(default_factory=TrainingBudget, json_schema_extra={"default": {}})
    """Time and GPUs."""
    endpoint: Annotated[str, StringConstraints(pattern=r"^https?://\S+$", max_length=1024)] | None = None
    """OpenAI base URL the prompts are sent to (ending in `/v1`); unset: the deployment's Service,
    `http://<deployment>.<namespace>.svc:<port>/v1`. Not part of the run's identity."""
    promotion: PromotionRule | None = None
    """Canary and promote the trained draft; unset: train only (serve it by naming `status.uri`)."""
    output_pvc_name: DnsSubdomain | None = None
    """Claim the result is written into, under `drafts/<hash>/`; unset: the deployment's engine-cache claim
    (`spec.engineCache.pvcName`, else the operator's default claim)."""

    def content_hash(self, target: str, draft: str | None, claim: str, image: str) -> str:
        """The run's identity: SHA-256 over what changes the trained draft (the spec less the budget's
        placement, the target and draft checkpoints, the claim and the trainer image), 16 hex digits."""
        content = self.to_dict()
        content["budget"].pop("resources", None)
        content.pop("deployment", None)
        content.pop("endpoint", None)
        content.pop("promotion", None)
        content["prompts"].pop("credentialsSecret", None)
        content.update(target=target, draftModel=draft, claim=claim, image=image)
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class GeneratedSamples(ApiModel):
    """What the generate step got from the endpoint."""

    prompts: Annotated[int, Field(ge=0)]
    """Prompts sent."""
    samples: Annotated[int, Field(ge=0)]
    """Answers kept for training."""
    held_out: Annotated[int, Field(ge=0)]
    """Answers kept out of training."""
    failed: Annotated[int, Field(ge=0)]
    """Prompts the endpoint did not answer."""
    completion_tokens: Annotated[int, Field(ge=0)]
    """Tokens the target generated."""
    seconds: Annotated[float, Field(ge=0)]
    """How long generating took."""


class TrainedDraft(ApiModel):
    """What the train step reported."""

    samples: Annotated[int, Field(ge=0)]
    """Samples trained on."""
    tokens: Annotated[int, Field(ge=0)]
    """Tokens in them."""
    steps: Annotated[int, Field(ge=0)]
    """Optimiser steps taken."""
    loss: float
    """Training loss of the last steps."""
    seconds: Annotated[float, Field(ge=0)]
    """How long training took."""
    accuracy: float | None = None
    """How often the draft's top token was the target's, on the last steps."""


class ServingFigures(ApiModel):
    """Speculation of one side of the canary over the promotion window, from the servers' own counters."""

    acceptance: Annotated[float, Field(ge=0, le=1)] | None = None
    """Accepted / drafted tokens (unset before any token was drafted)."""
    tokens_per_step: Annotated[float, Field(ge=0)] | None = None
    """Tokens generated per target (verify) step."""
    drafted: Annotated[int, Field(ge=0)] = 0
    """Draft tokens verified."""


class PromotionStatus(ApiModel):
    """Where the canary stands, and the figures each decision was made on."""

    phase: PromotionPhaseName
    """`Canary` (serving beside the current replicas), `Promoted` (the deployment serves the trained draft),
    `Rejected` (the old draft stays; `message` says why) or `RolledBack` (`spec.promotion.rollback`)."""
    start_time: Annotated[datetime, Field(strict=False)] | None = None
    """When the canary's window began."""
    decision_time: Annotated[datetime, Field(strict=False)] | None = None
    """When it was promoted or rejected."""
    canary: ServingFigures | None = None
    """The canary replica's figures over the window."""
    current: ServingFigures | None = None
    """The deployment's own replicas' figures over the same window."""
    message: Annotated[str, StringConstraints(max_length=4096)] | None = None
    """The decision, in words."""


class DraftTrainingStatus(ApiModel):
    """Progress of the run, written by the operator."""

    phase: TrainingPhase | None = None
    """`Pending`, `Generating` (the generate Job), `Training` (the train Job), `Succeeded` (the draft is in
    the claim at `uri`) or `Failed` (`message` says which step and why)."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The `metadata.generation` this status describes."""
    hash: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")] | None = None
    """The run's content hash (`DraftTrainingSpec.content_hash`): where its output goes."""
    uri: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """The trained draft, as a deployment names it: `pvc://<claim>/drafts/<hash>/model` (an EAGLE-3 head for
    `spec.speculative.eagle.model`, or a draft model for `spec.draft.model`)."""
    generate_job: DnsSubdomain | None = None
    """Name of the generate Job."""
    train_job: DnsSubdomain | None = None
    """Name of the train Job."""
    generated: GeneratedSamples | None = None
    """The generate step's counts."""
    trained: TrainedDraft | None = None
    """The train step's figures."""
    start_time: Annotated[datetime, Field(strict=False)] | None = None
    """When the run started."""
    completion_time: Annotated[datetime, Field(strict=False)] | None = None
    """When it succeeded or failed."""
    message: Annotated[str, StringConstraints(max_length=32768)] | None = None
    """Human-readable detail, e.g. a failed step's last log lines."""
    promotion: PromotionStatus | None = None
    """The canary and its decision (with `spec.promotion`)."""
    conditions: (
        Annotated[list[Condition], Field(max_length=16, json_schema_extra=CONDITIONS_LIST_EXTRAS)] | None
    ) = None
    """`Generated` and `Trained` (each `True` once its step succeeded, `False` once it failed), and with
    `spec.promotion` `Promoted` (`Unknown` while the canary serves)."""


DRAFT_TRAINING = ResourceInfo(
    group=GROUP,
    version=VERSION,
    kind="DraftTraining",
    plural="drafttrainings",
    singular="drafttraining",
    short_names=("dtrain",),
    # Its Jobs are `<name>-generate-<8 hex>` and `<name>-train-<8 hex>`: 63-character label values.
    name_max_length=40,
    name_pattern=DNS_1035_LABEL,
    printer_columns=(
        PrinterColumn("Deployment", "string", ".spec.deployment", "The deployment whose target is learnt"),
        PrinterColumn("Draft", "string", ".spec.draft", "eagle3 or draftModel"),
        PrinterColumn("Phase", "string", ".status.phase", "Run phase"),
        PrinterColumn("Samples", "integer", ".status.generated.samples", "Answers trained on"),
        PrinterColumn("Loss", "number", ".status.trained.loss", "Final training loss"),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
        PrinterColumn("URI", "string", ".status.uri", "The trained draft", priority=1),
    ),
)


class DraftTraining(ApiModel):
    """A draft trained on a SpeculativeDeployment's own answers: prompts -> the deployment's endpoint ->
    the target's responses -> an EAGLE-3 head or a distilled draft model, written into a claim under a
    content hash. Each step is a Job the operator runs and follows."""

    resource: ClassVar[ResourceInfo] = DRAFT_TRAINING

    api_version: Literal["specdeploy.dev/v1alpha1"] = "specdeploy.dev/v1alpha1"
    """`specdeploy.dev/v1alpha1`."""
    kind: Literal["DraftTraining"] = "DraftTraining"
    """`DraftTraining`."""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    """Standard object metadata."""
    spec: DraftTrainingSpec
    """What to train."""
    status: DraftTrainingStatus | None = None
    """Progress."""
