"""The Jobs of a DraftTraining: generate (prompts -> the deployment's endpoint -> samples, in the serving
image) then train (samples -> a draft, in the trainer image for `eagle3`, the serving image for
`draftModel`). Both run `specdeploy-distill` and write into the output claim:

    drafts/<hash>/data/      samples.jsonl, heldout.jsonl, generate.json   (the generate Job)
    drafts/<hash>/model/     the trained draft and train.json               (the train Job)

Each step's summary (one JSON line) is its container's termination message, which the operator copies into
status. Pure: a DraftTraining and its deployment in, wire-form Jobs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from specdeploy_operator.api import DraftTraining, ModelSource, SpeculativeDeployment

from .claims import cache_pvc_name
from .common import MANAGED_BY, MANAGED_BY_LABEL, NAME_LABEL, owner_reference
from .download import fetch_checkpoint
from .fetchscript import fetch_argv
from .identity import PodIdentity, build_service_account, pull_secrets
from .layout import CREDENTIALS_MOUNT, server_image
from .podsecurity import harden_pod_spec
from .scheduling import DEFAULT_GPU_RESOURCE, GpuScheduling
from .settings import OperatorSettings

__all__ = [
    "TRAINING_LABEL",
    "TRAIN_MARGIN_SECONDS",
    "TrainingRefused",
    "TrainingRun",
    "generate_job",
    "train_job",
    "training_run",
]

TRAINING_LABEL: Final = "specdeploy.dev/draft-training"
"""Label of a DraftTraining's Jobs and pods: the DraftTraining's name."""
TRAIN_MARGIN_SECONDS: Final = 120
"""The train step stops training this long before its deadline, to export what it has."""
OUTPUT_MOUNT: Final = "/output"
PROMPTS_MOUNT: Final = "/prompts"
SOURCE_MOUNTS: Final = {"target": "/model-source-target", "draft": "/model-source-draft"}


class TrainingRefused(ValueError):
    """The DraftTraining cannot run against its deployment; the message names the field."""


@dataclass(frozen=True, slots=True)
class TrainingRun:
    """A DraftTraining resolved against its deployment: what its Jobs need."""

    training: DraftTraining
    deployment: SpeculativeDeployment
    claim: str
    hash: str
    train_image: str
    generate_image: str
    service_account: str | None
    pull_secrets: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.training.metadata.name or ""

    @property
    def namespace(self) -> str:
        return self.training.metadata.namespace or ""

    @property
    def output(self) -> str:
        """The run's directory in the claim."""
        return f"drafts/{self.hash}"

    @property
    def uri(self) -> str:
        """The trained draft, as a deployment names it."""
        return f"pvc://{self.claim}/{self.output}/model"

    def job_name(self, step: str) -> str:
        return f"{self.name}-{step}-{self.hash[:8]}"


def training_run(
    training: DraftTraining, deployment: SpeculativeDeployment, settings: OperatorSettings
) -> TrainingRun:
    """The run of `training` against `deployment`; raises TrainingRefused when the two do not fit."""
    spec = training.spec
    draft_source: ModelSource | None = None
    if spec.draft == "draftModel":
        if deployment.spec.draft is None or deployment.spec.draft.model is None:
            raise TrainingRefused(
                f"spec.draft: draftModel distils the deployment's draft model, and {spec.deployment} has "
                "none (spec.draft.model): train an eagle3 head instead, or give the deployment a draft"
            )
        draft_source = deployment.spec.draft.model
    claim = spec.output_pvc_name or cache_pvc_name(deployment, settings)
    image = settings.trainer_image if spec.draft == "eagle3" else server_image(deployment, settings)
    target = deployment.spec.target.model
    hash_ = spec.content_hash(
        f"{target.uri}@{target.revision or ''}",
        None if draft_source is None else f"{draft_source.uri}@{draft_source.revision or ''}",
        claim,
        image,
    )
    return TrainingRun(
        training,
        deployment,
        claim,
        hash_,
        image,
        server_image(deployment, settings),
        build_service_account(deployment, settings),
        tuple(pull_secrets(deployment, settings)),
    )


def _endpoint(run: TrainingRun) -> str:
    sdep = run.deployment
    return f"http://{sdep.metadata.name}.{run.namespace}.svc:{sdep.spec.serving.port}/v1"


def _job(
    run: TrainingRun,
    step: str,
    *,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    deadline: int,
    downloads: list[ModelSource],
    scheduling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    labels = {
        NAME_LABEL: "specdeploy",
        "app.kubernetes.io/component": f"draft-{step}",
        MANAGED_BY_LABEL: MANAGED_BY,
        TRAINING_LABEL: run.name,
    }
    training = run.training
    owner = {
        "apiVersion": training.api_version,
        "kind": training.kind,
        "metadata": {"name": run.name, "uid": (training.metadata.model_extra or {}).get("uid", "")},
    }
    sdep = run.deployment
    identity = PodIdentity.of(run.service_account, run.pull_secrets, downloads)
    for container in [*init, *containers]:
        # The summary line (or a failure's last log lines) becomes the termination message: status reads it.
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        **(scheduling or {}),
        **identity.pod_fields(),
    }
    if init:
        pod["initContainers"] = init
    pod["containers"] = containers
    pod["volumes"] = volumes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": run.job_name(step),
            "namespace": run.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            # A step that failed is the run's answer (its message says why); a retry is a new spec.
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            "template": {
                "metadata": {"labels": labels},
                "spec": harden_pod_spec(pod, sdep.spec.pod_security, mount_token=identity.mount_token),
            },
        },
    }


def _claim_volume(name: str, claim: str, read_only: bool = False) -> dict[str, Any]:
    source: dict[str, Any] = {"claimName": claim}
    if read_only:
        source["readOnly"] = True
    return {"name": name, "persistentVolumeClaim": source}


def _secret_volume(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "secret": {"secretName": secret, "defaultMode": 0o400}}


def _output(run: TrainingRun) -> tuple[dict[str, Any], dict[str, Any]]:
    return _claim_volume("output", run.claim), {"name": "output", "mountPath": OUTPUT_MOUNT}


def generate_job(run: TrainingRun, deadline: int) -> dict[str, Any]:
    """The generate Job: the prompts answered by the deployment's endpoint, `deadline` seconds at most."""
    spec = run.training.spec
    volume, mount = _output(run)
    volumes, mounts = [volume], [mount]
    init: list[dict[str, Any]] = []
    prompts = spec.prompts
    downloads: list[ModelSource] = []
    prompts_mount = {"name": "prompts", "mountPath": PROMPTS_MOUNT, "readOnly": True}
    if prompts.config_map is not None:
        key = prompts.config_map.key
        items = [{"key": key, "path": key}]
        volumes.append({"name": "prompts", "configMap": {"name": prompts.config_map.name, "items": items}})
        path = f"{PROMPTS_MOUNT}/{key}"
    elif prompts.uri is not None and prompts.uri.startswith("pvc://"):
        claim, _, inside = prompts.uri.removeprefix("pvc://").partition("/")
        volumes.append(_claim_volume("prompts", claim, read_only=True))
        path = f"{PROMPTS_MOUNT}/{inside}".rstrip("/")
    else:
        uri = str(prompts.uri)
        path = f"{PROMPTS_MOUNT}/dataset"
        volumes.append({"name": "prompts", "emptyDir": {}})
        download: dict[str, Any] = {
            "name": "download",
            "image": run.generate_image,
            "command": fetch_argv("hf", uri, path),
            "volumeMounts": [{"name": "prompts", "mountPath": PROMPTS_MOUNT}],
        }
        if prompts.credentials_secret:
            volumes.append(_secret_volume("prompts-credentials", prompts.credentials_secret))
            download["env"] = [{"name": "HF_TOKEN_PATH", "value": f"{CREDENTIALS_MOUNT}/HF_TOKEN"}]
            download["volumeMounts"].append(
                {"name": "prompts-credentials", "mountPath": CREDENTIALS_MOUNT, "readOnly": True}
            )
        init.append(download)
        downloads.append(ModelSource(uri=f"hf://{uri.removeprefix('hf://datasets/')}"))
    mounts.append(prompts_mount)
    sampling = spec.sampling
    argv = [
        "specdeploy-distill", "generate",
        "--prompts", path,
        "--endpoint", spec.endpoint or _endpoint(run),
        "--model", run.deployment.spec.served_model_names[0],
        "--out", f"{OUTPUT_MOUNT}/{run.output}/data",
        "--samples", str(spec.samples),
        "--held-out", str(spec.held_out),
        "--max-tokens", str(sampling.max_tokens),
        "--temperature", repr(sampling.temperature),
        "--seed", str(sampling.seed),
        "--concurrency", str(sampling.concurrency),
    ]  # fmt: skip
    container = {"name": "generate", "image": run.generate_image, "command": argv, "volumeMounts": mounts}
    return _job(
        run,
        "generate",
        containers=[container],
        init=init,
        volumes=volumes,
        deadline=deadline,
        downloads=downloads,
    )


def _checkpoint(
    run: TrainingRun, role: str, source: ModelSource, volumes: list[dict[str, Any]]
) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """(the checkpoint's directory in the train pod, its download init container or None, its claim's
    mount or None) for the `role` checkpoint; its volumes are appended to `volumes`."""
    fetch = fetch_checkpoint(source, f"{OUTPUT_MOUNT}/{run.output}/work/{role}", SOURCE_MOUNTS[role])
    if fetch.claim is not None:
        volumes.append(_claim_volume(f"source-{role}", fetch.claim.claim, read_only=True))
        return (
            fetch.path,
            None,
            {"name": f"source-{role}", "mountPath": SOURCE_MOUNTS[role], "readOnly": True},
        )
    assert fetch.argv is not None
    download: dict[str, Any] = {"name": f"download-{role}", "image": run.train_image, "command": fetch.argv}
    if fetch.env:
        download["env"] = fetch.env
    download["volumeMounts"] = [{"name": "output", "mountPath": OUTPUT_MOUNT}]
    if source.credentials_secret:
        volumes.append(_secret_volume(f"{role}-credentials", source.credentials_secret))
        download["volumeMounts"].append(
            {"name": f"{role}-credentials", "mountPath": CREDENTIALS_MOUNT, "readOnly": True}
        )
    return fetch.path, download, None


def train_job(run: TrainingRun, deadline: int, settings: OperatorSettings) -> dict[str, Any]:
    """The train Job: a draft trained on the generate Job's samples, `deadline` seconds at most (training
    itself stops `TRAIN_MARGIN_SECONDS` earlier and exports)."""
    spec = run.training.spec
    sdep = run.deployment
    volume, mount = _output(run)
    volumes, mounts = [volume], [mount]
    init: list[dict[str, Any]] = []
    downloads: list[ModelSource] = []
    roles = [("target", sdep.spec.target.model)]
    if spec.draft == "draftModel" and sdep.spec.draft is not None and sdep.spec.draft.model is not None:
        roles.append(("draft", sdep.spec.draft.model))
    paths: dict[str, str] = {}
    for role, source in roles:
        paths[role], download, claim_mount = _checkpoint(run, role, source, volumes)
        if download is not None:
            init.append(download)
            downloads.append(source)
        if claim_mount is not None:
            mounts.append(claim_mount)
    step = "train-eagle3" if spec.draft == "eagle3" else "train-draft"
    data = f"{OUTPUT_MOUNT}/{run.output}/data"
    argv = ["specdeploy-distill", step, "--target", paths["target"]]
    if "draft" in paths:
        argv += ["--draft", paths["draft"]]
    training = spec.training
    argv += [
        "--samples", f"{data}/samples.jsonl",
        "--out", f"{OUTPUT_MOUNT}/{run.output}/model",
        "--steps", str(training.steps),
        "--max-length", str(training.max_length),
        "--max-seconds", str(max(deadline - TRAIN_MARGIN_SECONDS, 60)),
        "--seed", str(spec.sampling.seed),
    ]  # fmt: skip
    if training.batch_size is not None:
        argv += ["--batch-size", str(training.batch_size)]
    if training.learning_rate is not None:
        argv += ["--learning-rate", repr(training.learning_rate)]
    container: dict[str, Any] = {"name": "train", "image": run.train_image, "command": argv}
    resources: dict[str, dict[str, str]] = {}
    if spec.budget.resources is not None:
        resources = {k: dict(v) for k, v in spec.budget.resources.to_dict().items()}
    scheduling: dict[str, Any] | None = None
    if spec.budget.gpus:
        placement = sdep.spec.placement
        gpus = GpuScheduling(
            product=placement.gpu_product or settings.default_gpu_product,
            count=spec.budget.gpus,
            resource=placement.gpu_resource or DEFAULT_GPU_RESOURCE,
            tolerations=tuple(t.to_dict() for t in placement.tolerations or ()),
        )
        for kind, limits in gpus.resources().items():
            resources.setdefault(kind, {}).update(limits)
        scheduling = {"nodeSelector": gpus.node_selector(), "tolerations": gpus.pod_tolerations()}
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = mounts
    return _job(
        run,
        "train",
        containers=[container],
        init=init,
        volumes=volumes,
        deadline=deadline,
        downloads=downloads,
        scheduling=scheduling,
    )
