"""The desired state of a SpeculativeDeployment (`spec`), and the rules that relate its parts: the models to
the backend, the method and the placement.

Field names are the public contract. Docstrings below each field become the CRD's descriptions (what
`kubectl explain sdep.spec...` prints) and the text of `docs/api.md`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from .autoscaling import AutoscalingSpec
from .base import ApiModel, Rule, Rules
from .buildflags import MODELLED_BUILD_FLAGS, OPERATOR_BUILD_FLAGS, conflicting_args, conflicting_args_cel
from .checkpoint import QuantizationSpec
from .identity import ServiceAccountsSpec
from .modelspec import ModelSpec
from .placement import PlacementSpec
from .podsecurity import PodSecuritySpec
from .serving import EngineCacheSpec, ImagesSpec, RolloutSpec, RuntimeSpec, ServingSpec
from .speculation import EAGLE3_BACKENDS, MAINTAINED_PATH_METHODS, SA_ENHANCED_METHODS, SpeculativeSpec
from .trtllm import METHOD_FLOORS, RELEASES, SA_COMBINED_FLOOR, MethodFloor, TrtllmVersion, cel_version_key

__all__ = ["SPEC_RULES", "TENSORRT_BACKEND_WARNING", "Backend", "SpeculativeDeploymentSpec"]

Backend = Literal["tensorrt", "pytorch", "transformers"]

TENSORRT_BACKEND_WARNING = (
    "spec.backend: tensorrt builds engines with trtllm-build for TensorRT-LLM's TensorRT-engine workflow, "
    "which TensorRT-LLM deprecated in February 2026 and removed in July 2026: it runs only on the 1.2.x "
    "image (docs/trtllm.md#supported-versions). Migrate to spec.backend: pytorch, the default, which loads "
    "the Hugging Face checkpoint directly: drop spec.target.build and spec.draft.build "
    "(docs/trtllm.md#from-tensorrt-to-pytorch)."
)
"""What `kubectl apply` prints for a deployment that chooses the engine workflow (the admission policy in
crds/)."""

# --- spec.target and spec.draft------------------------------------------------------------------------------

_ModelCheck = Callable[["SpeculativeDeploymentSpec", "ModelSpec"], bool]


def _model_rules(role: Literal["target", "draft"]) -> list[Rule[SpeculativeDeploymentSpec]]:
    """Rules about one model of the spec, parametrised by role so messages carry the full path."""
    m = f"self.{role}"
    path = f"spec.{role}"

    def cel(expr: str) -> str:
        return expr if role == "target" else f"!has(self.draft) || ({expr})"

    def check(predicate: _ModelCheck) -> Callable[[SpeculativeDeploymentSpec], bool]:
        def run(spec: SpeculativeDeploymentSpec) -> bool:
            model = spec.target if role == "target" else spec.draft
            return model is None or predicate(spec, model)

        return run

    def rule(
        name: str, expr: str, message: str, field_path: str, predicate: _ModelCheck, **kw: Any
    ) -> Rule[Any]:
        return Rule["SpeculativeDeploymentSpec"](
            name=f"{role}-{name}",
            cel=cel(expr),
            message=message,
            field_path=f".{role}{field_path}",
            check=check(predicate),
            **kw,
        )

    def extra_args_ok(flags: tuple[str, ...]) -> _ModelCheck:
        def ok(_: SpeculativeDeploymentSpec, model: ModelSpec) -> bool:
            args = model.build.extra_args if model.build is not None else None
            return not args or not conflicting_args(args, flags)

        return ok

    def fp8_plugins_ok(_: SpeculativeDeploymentSpec, model: ModelSpec) -> bool:
        build = model.build
        if build is None or model.quantization.format == "fp8":
            return True
        return build.gemm_swiglu_plugin != "fp8" and build.low_latency_gemm_plugin != "fp8"

    def input_within_seq(_: SpeculativeDeploymentSpec, model: ModelSpec) -> bool:
        build = model.build
        if build is None or build.max_input_len is None or build.max_seq_len is None:
            return True
        return build.max_input_len <= build.max_seq_len

    has_args = f"!has({m}.build) || !has({m}.build.extraArgs) || "
    operator_flags = tuple(OPERATOR_BUILD_FLAGS)
    modelled_flags = tuple(MODELLED_BUILD_FLAGS)
    return [
        rule(
            "build-needs-tensorrt",
            f"self.backend == 'tensorrt' || !has({m}.build)",
            f"{path}.build must not be set unless spec.backend is tensorrt "
            "(only the tensorrt backend builds engines; pytorch and transformers load checkpoints)",
            ".build",
            lambda s, model: s.backend == "tensorrt" or model.build is None,
            reason="FieldValueForbidden",
        ),
        rule(
            "quantization-not-for-transformers",
            f"self.backend != 'transformers' || ({m}.quantization.format == 'none' && "
            f"{m}.quantization.kvCacheDtype == 'auto' && {m}.quantization.calibSize == 512 && "
            f"{m}.quantization.dtype == 'auto')",
            f"{path}.quantization must be left at its defaults when spec.backend is transformers "
            "(the checkpoint is served as it is, without quantization)",
            ".quantization",
            lambda s, model: s.backend != "transformers" or model.quantization == QuantizationSpec(),
        ),
        rule(
            "kv-cache-quantization-on-pytorch",
            f"self.backend != 'pytorch' || {m}.quantization.kvCacheDtype == 'auto' || "
            f"({m}.quantization.kvCacheDtype == 'fp8' && {m}.quantization.format != 'none')",
            f"{path}.quantization.kvCacheDtype with spec.backend pytorch must be auto, or fp8 with a "
            "weight format: ModelOpt exports FP8 KV-cache scales with quantized weights only, and "
            "TensorRT-LLM's PyTorch path has no int8 KV cache",
            ".quantization.kvCacheDtype",
            lambda s, model: (
                s.backend != "pytorch"
                or model.quantization.kv_cache_dtype == "auto"
                or (model.quantization.kv_cache_dtype == "fp8" and model.quantization.format != "none")
            ),
        ),
        rule(
            "single-device-for-transformers",
            f"self.backend != 'transformers' || ({m}.tensorParallel == 1 && {m}.pipelineParallel == 1)",
            f"{path}.tensorParallel and {path}.pipelineParallel must be 1 when spec.backend is transformers "
            "(the reference backend runs each model on one device)",
            ".tensorParallel",
            lambda s, model: s.backend != "transformers" or model.gpus == 1,
        ),
        rule(
            "pipeline-parallel-without-speculation",
            f"self.speculative.method == 'none' || {m}.pipelineParallel == 1",
            f"{path}.pipelineParallel must be 1 when spec.speculative.method is not none "
            "(speculative decoding does not support pipeline parallelism)",
            ".pipelineParallel",
            lambda s, model: s.speculative.method == "none" or model.pipeline_parallel == 1,
        ),
        rule(
            "extra-args-derived-flags",
            has_args + conflicting_args_cel(f"{m}.build.extraArgs", operator_flags),
            f"{path}.build.extraArgs must not set flags the operator derives ({', '.join(operator_flags)})",
            ".build.extraArgs",
            extra_args_ok(operator_flags),
        ),
        rule(
            "extra-args-modelled-flags",
            has_args + conflicting_args_cel(f"{m}.build.extraArgs", modelled_flags),
            f"{path}.build.extraArgs must not set flags that have a field in {path}.build "
            f"({', '.join(modelled_flags)}): set the field instead",
            ".build.extraArgs",
            extra_args_ok(modelled_flags),
        ),
        rule(
            "input-len-within-seq-len",
            f"!has({m}.build) || !has({m}.build.maxInputLen) || !has({m}.build.maxSeqLen) || "
            f"{m}.build.maxInputLen <= {m}.build.maxSeqLen",
            f"{path}.build.maxInputLen must not exceed {path}.build.maxSeqLen",
            ".build.maxInputLen",
            input_within_seq,
        ),
        rule(
            "fp8-plugins-need-fp8",
            f"!has({m}.build) || {m}.quantization.format == 'fp8' || "
            f"((!has({m}.build.gemmSwigluPlugin) || {m}.build.gemmSwigluPlugin != 'fp8') && "
            f"(!has({m}.build.lowLatencyGemmPlugin) || {m}.build.lowLatencyGemmPlugin != 'fp8'))",
            f"{path}.build.gemmSwigluPlugin fp8 and {path}.build.lowLatencyGemmPlugin fp8 need "
            f"{path}.quantization.format fp8",
            ".build",
            fp8_plugins_ok,
        ),
    ]


# --- spec----------------------------------------------------------------------------------------------------


_GPUS = (
    "(self.placement.device == 'cpu' ? 0 : self.target.tensorParallel * self.target.pipelineParallel + "
    "(has(self.draft) && self.placement.draft == 'dedicated' ? "
    "self.draft.tensorParallel * self.draft.pipelineParallel : 0))"
)
"""CEL: GPUs per replica (`SpeculativeDeploymentSpec.gpus_per_replica`)."""


def _takes_whole_nodes(s: SpeculativeDeploymentSpec) -> bool:
    gpus, per_node = s.gpus_per_replica, s.placement.gpus_per_node
    return gpus <= per_node or gpus % per_node == 0


def _colocated_draft_fits(s: SpeculativeDeploymentSpec) -> bool:
    if s.draft is None or s.placement.draft != "colocated":
        return True
    return s.draft.tensor_parallel <= s.target.tensor_parallel * s.target.pipeline_parallel


_RELEASE_CEL = (
    "(has(self.images) && has(self.images.trtllmVersion) ? self.images.trtllmVersion : "
    f"(self.backend == 'tensorrt' ? '{RELEASES.tensorrt}' : '{RELEASES.pytorch}'))"
)
"""CEL: the TensorRT-LLM release a deployment runs (`SpeculativeDeploymentSpec.trtllm_release`)."""


SERVER_DEFAULT_MAX_BATCH_SIZE = 64
"""The server's `runtime.maxBatchSize` when the spec leaves it unset (a contract test holds it)."""


def _pool_holds_the_batch(s: SpeculativeDeploymentSpec) -> bool:
    sa = s.speculative.suffix_automaton
    if sa is None or sa.global_pool_size is None:
        return True
    return sa.global_pool_size >= (s.runtime.max_batch_size or SERVER_DEFAULT_MAX_BATCH_SIZE)


def _floor_rule(
    name: str, what: str, uses_cel: str, uses: Callable[[SpeculativeDeploymentSpec], bool], floor: MethodFloor
) -> Rule[SpeculativeDeploymentSpec]:
    """`what` (where `uses_cel` / `uses` hold) needs a TensorRT-LLM release at or after `floor`."""
    return Rule["SpeculativeDeploymentSpec"](
        name=name,
        cel=f"!({uses_cel}) || {cel_version_key(_RELEASE_CEL)} >= {floor.floor.key}",
        message=f"{what} needs TensorRT-LLM {floor.floor} or later; this deployment runs an earlier release "
        "(spec.images.trtllmVersion, or the operator's default image for the backend: "
        "docs/trtllm.md#methods)",
        field_path=".speculative.method",
        check=lambda s: not uses(s) or s.trtllm_release >= floor.floor,
    )


def _method_floor_rule(method: str, floor: MethodFloor) -> Rule[SpeculativeDeploymentSpec]:
    return _floor_rule(
        f"{method.lower()}-needs-release",
        f"spec.speculative.method {method}",
        f"self.speculative.method == '{method}'",
        lambda s: s.speculative.method == method,
        floor,
    )


_SA_ENHANCER_FLOOR_RULE = _floor_rule(
    "suffix-automaton-enhancer-needs-release",
    "spec.speculative.suffixAutomaton with eagle3, mtp or pard",
    f"has(self.speculative.suffixAutomaton) && self.speculative.method in {list(SA_ENHANCED_METHODS)}",
    lambda s: s.speculative.suffix_automaton is not None and s.speculative.method in SA_ENHANCED_METHODS,
    SA_COMBINED_FLOOR,
)


SPEC_RULES: Rules = (
    Rule["SpeculativeDeploymentSpec"](
        name="draft-required",
        cel="self.speculative.method != 'draftTarget' || has(self.draft)",
        message="spec.draft is required when spec.speculative.method is draftTarget",
        field_path=".draft",
        check=lambda s: s.speculative.method != "draftTarget" or s.draft is not None,
        reason="FieldValueRequired",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="draft-forbidden",
        cel="self.speculative.method == 'draftTarget' || !has(self.draft)",
        message="spec.draft must not be set unless spec.speculative.method is draftTarget "
        "(the other methods use no draft model of spec.draft's kind)",
        field_path=".draft",
        check=lambda s: s.speculative.method == "draftTarget" or s.draft is None,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="method-needs-pytorch",
        cel=f"!(self.speculative.method in {list(MAINTAINED_PATH_METHODS)}) || self.backend == 'pytorch'",
        message=f"spec.speculative.method {', '.join(MAINTAINED_PATH_METHODS)} need spec.backend pytorch "
        "(tensorrt runs draftTarget, promptLookup and none; transformers these and eagle3)",
        field_path=".speculative.method",
        check=lambda s: s.speculative.method not in MAINTAINED_PATH_METHODS or s.backend == "pytorch",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="eagle3-backends",
        cel=f"self.speculative.method != 'eagle3' || self.backend in {list(EAGLE3_BACKENDS)}",
        message="spec.speculative.method eagle3 needs spec.backend pytorch or transformers "
        "(tensorrt engines have no EAGLE-3 build here)",
        field_path=".speculative.method",
        check=lambda s: s.speculative.method != "eagle3" or s.backend in EAGLE3_BACKENDS,
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="suffix-automaton-on-pytorch",
        cel="!has(self.speculative.suffixAutomaton) || self.backend == 'pytorch'",
        message="spec.speculative.suffixAutomaton needs spec.backend pytorch "
        "(it is TensorRT-LLM's suffix automaton)",
        field_path=".speculative.suffixAutomaton",
        check=lambda s: s.speculative.suffix_automaton is None or s.backend == "pytorch",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="suffix-automaton-pool-holds-the-batch",
        cel="!has(self.speculative.suffixAutomaton) || "
        "!has(self.speculative.suffixAutomaton.globalPoolSize) || "
        "self.speculative.suffixAutomaton.globalPoolSize >= "
        f"(has(self.runtime.maxBatchSize) ? self.runtime.maxBatchSize : {SERVER_DEFAULT_MAX_BATCH_SIZE})",
        message="spec.speculative.suffixAutomaton.globalPoolSize must be at least spec.runtime.maxBatchSize "
        f"({SERVER_DEFAULT_MAX_BATCH_SIZE} when unset): TensorRT-LLM refuses a smaller pool at start-up",
        field_path=".speculative.suffixAutomaton.globalPoolSize",
        check=_pool_holds_the_batch,
    ),
    *[_method_floor_rule(method, floor) for method, floor in METHOD_FLOORS.items()],
    _SA_ENHANCER_FLOOR_RULE,
    Rule["SpeculativeDeploymentSpec"](
        name="logits-not-on-pytorch",
        cel="self.speculative.acceptance != 'logits' || self.backend != 'pytorch'",
        message="spec.speculative.acceptance logits needs spec.backend tensorrt or transformers "
        "(with pytorch TensorRT-LLM decides acceptance itself: use tokenMatch)",
        field_path=".speculative.acceptance",
        check=lambda s: s.speculative.acceptance != "logits" or s.backend != "pytorch",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="kv-cache-reuse-for-draft-tokens",
        cel="!(self.speculative.method in ['draftTarget', 'promptLookup']) || "
        "self.runtime.enableKvCacheReuse",
        message="spec.runtime.enableKvCacheReuse must be true when spec.speculative.method is draftTarget or "
        "promptLookup (every step re-sends the whole prefix)",
        field_path=".runtime.enableKvCacheReuse",
        check=lambda s: (
            s.speculative.method not in ("draftTarget", "promptLookup") or s.runtime.enable_kv_cache_reuse
        ),
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="dedicated-placement-needs-draft",
        cel="self.placement.draft != 'dedicated' || has(self.draft)",
        message="spec.placement.draft dedicated needs spec.draft",
        field_path=".placement.draft",
        check=lambda s: s.placement.draft != "dedicated" or s.draft is not None,
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="dedicated-draft-not-on-pytorch",
        cel="self.placement.draft != 'dedicated' || self.backend != 'pytorch'",
        message="spec.placement.draft dedicated needs spec.backend tensorrt or transformers: TensorRT-LLM's "
        "PyTorch flow builds the draft model with the target's mapping, so it runs on the target's GPUs "
        "(use colocated)",
        field_path=".placement.draft",
        check=lambda s: s.placement.draft != "dedicated" or s.backend != "pytorch",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="colocated-draft-fits",
        cel="!has(self.draft) || self.placement.draft != 'colocated' || "
        "self.draft.tensorParallel <= self.target.tensorParallel * self.target.pipelineParallel",
        message="spec.draft.tensorParallel must not exceed spec.target.tensorParallel x "
        "spec.target.pipelineParallel when spec.placement.draft is colocated "
        "(the draft runs on the target's GPUs)",
        field_path=".draft.tensorParallel",
        check=_colocated_draft_fits,
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="replica-takes-whole-nodes",
        cel=f"{_GPUS} <= self.placement.gpusPerNode || {_GPUS} % self.placement.gpusPerNode == 0",
        message="GPUs per replica (spec.target.tensorParallel x spec.target.pipelineParallel, "
        "plus the same of spec.draft when spec.placement.draft is dedicated; none on cpu) "
        "must not exceed spec.placement.gpusPerNode, or must be a multiple of it: "
        "a replica that spans nodes takes every GPU of each of its nodes",
        field_path=".placement.gpusPerNode",
        check=_takes_whole_nodes,
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="multi-node-needs-pytorch",
        cel=f"{_GPUS} <= self.placement.gpusPerNode || self.backend == 'pytorch'",
        message="a replica that spans nodes (more GPUs than spec.placement.gpusPerNode) needs spec.backend "
        "pytorch: tensorrt runs its executors in orchestrator mode, whose MPI-spawned workers cannot leave "
        "the node, and transformers runs each model on one device",
        field_path=".backend",
        check=lambda s: s.nodes_per_replica == 1 or s.backend == "pytorch",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="multi-node-draft-colocated",
        cel=f"{_GPUS} <= self.placement.gpusPerNode || self.placement.draft != 'dedicated'",
        message="spec.placement.draft must be colocated when a replica spans nodes (more GPUs than "
        "spec.placement.gpusPerNode): TensorRT-LLM's PyTorch flow shards the draft model over the "
        "target's ranks, so it has no GPUs of its own",
        field_path=".placement.draft",
        check=lambda s: s.nodes_per_replica == 1 or s.placement.draft != "dedicated",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="draft-kv-fraction-needs-draft",
        cel="!has(self.runtime.draftKvCacheFreeGpuMemFraction) || has(self.draft)",
        message="spec.runtime.draftKvCacheFreeGpuMemFraction needs spec.draft",
        field_path=".runtime.draftKvCacheFreeGpuMemFraction",
        check=lambda s: s.runtime.draft_kv_cache_free_gpu_mem_fraction is None or s.draft is not None,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="runtime-max-seq-len-needs-pytorch",
        cel="!has(self.runtime.maxSeqLen) || self.backend != 'tensorrt'",
        message="spec.runtime.maxSeqLen is only for spec.backend pytorch and transformers "
        "(with tensorrt the engine fixes it: set spec.target.build.maxSeqLen)",
        field_path=".runtime.maxSeqLen",
        check=lambda s: s.runtime.max_seq_len is None or s.backend != "tensorrt",
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="cpu-needs-transformers",
        cel="self.placement.device != 'cpu' || self.backend == 'transformers'",
        message="spec.placement.device cpu needs spec.backend transformers (TensorRT-LLM runs only on GPUs)",
        field_path=".placement.device",
        check=lambda s: s.placement.device != "cpu" or s.backend == "transformers",
    ),
    *_model_rules("target"),
    *_model_rules("draft"),
)


class SpeculativeDeploymentSpec(ApiModel):
    """Desired state: a target model served with a speculative decoding method on GPU (or CPU) nodes."""

    validation_rules: ClassVar[Rules] = SPEC_RULES

    replicas: Annotated[int, Field(ge=0, le=1024)] = 1
    """Number of serving replicas; each runs the target (and the draft) on the GPUs (or CPUs) of one node, or
    of several when it needs more GPUs than `spec.placement.gpusPerNode` (a group of pods, one per node)."""
    backend: Backend = "pytorch"
    """`pytorch` (default): the TensorRT-LLM LLM API with a `speculative_config`; the Hugging Face checkpoint
    loads directly, no engine build (seed 002). `tensorrt`: engines built with `trtllm-build` and run by
    paired executors (seeds 000, 001, 003, 004); TensorRT-LLM removed this workflow in July 2026, so it runs
    on the 1.2.x image only and `kubectl apply` warns about it.
    `transformers`: Hugging Face checkpoints run by the specdeploy server's own speculative loop on the
    transformers reference backend, on a GPU or (with `spec.placement.device: cpu`) on CPUs; methods
    `draftTarget`, `promptLookup`, `eagle3` and `none`, no quantization, no engine build (the checkpoint is
    staged into the engine cache, or mounted for `pvc://`). For development, CPU clusters and GPUs without
    TensorRT-LLM; not the fast path: no TensorRT-LLM kernels, no in-flight batching of the TensorRT-LLM
    executor."""
    target: ModelSpec
    """The model whose output is served."""
    draft: ModelSpec | None = None
    """The draft model; required with `spec.speculative.method: draftTarget`, forbidden otherwise. It must
    share the target's tokenizer."""
    speculative: SpeculativeSpec
    """Speculative decoding method and draft lengths."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec, json_schema_extra={"default": {}})
    """Device (GPU or CPU), GPU product, draft placement and pod scheduling."""
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec, json_schema_extra={"default": {}})
    """Executor settings (the seed's `runtime.json`)."""
    serving: ServingSpec = Field(default_factory=ServingSpec, json_schema_extra={"default": {}})
    """HTTP server settings."""
    engine_cache: EngineCacheSpec | None = None
    """Where engines are stored; unset uses the operator's default cache."""
    images: ImagesSpec | None = None
    """Image overrides."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, json_schema_extra={"default": {}})
    """Rolling update limits."""
    autoscaling: AutoscalingSpec | None = None
    """Horizontal autoscaling; unset: `replicas` is fixed."""
    pod_security: PodSecuritySpec | None = None
    """Security context of the serving and build pods; unset: the defaults, which pass the `restricted`
    Pod Security Standard (non-root user 10001, read-only root filesystem, no capabilities)."""
    service_accounts: ServiceAccountsSpec | None = None
    """ServiceAccounts of the serving pods and of the build and staging pods (a cloud role for `s3://` or
    `gs://` checkpoints); unset: the operator's defaults, else the namespace's `default` account."""

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica requests: the target's, plus the draft's when it is placed on dedicated GPUs; 0 on
        CPUs."""
        if self.placement.device == "cpu":
            return 0
        gpus = self.target.gpus
        if self.draft is not None and self.placement.draft == "dedicated":
            gpus += self.draft.gpus
        return gpus

    @property
    def trtllm_release(self) -> TrtllmVersion:
        """The TensorRT-LLM release the serving pods run: `spec.images.trtllmVersion`, else the release of
        the operator's default image for the backend (trtllm-releases.env)."""
        if self.images is not None and self.images.trtllm_version is not None:
            return TrtllmVersion.parse(self.images.trtllm_version)
        return RELEASES.tensorrt if self.backend == "tensorrt" else RELEASES.pytorch

    @property
    def nodes_per_replica(self) -> int:
        """Nodes one replica spans: 1 while its GPUs fit on one node (always on CPUs), else its GPUs divided
        by `spec.placement.gpusPerNode` (a whole number in an admitted spec; rounded up otherwise)."""
        gpus, per_node = self.gpus_per_replica, self.placement.gpus_per_node
        return 1 if gpus <= per_node else -(-gpus // per_node)

    @property
    def gpus_per_pod(self) -> int:
        """GPUs each serving pod requests: the replica's, shared out over its nodes."""
        return self.gpus_per_replica // self.nodes_per_replica

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """The names clients may send: `spec.serving.modelName` first, then the aliases. With `modelName`
        unset, an `hf://org/name` target is served as `org/name` and, as earlier releases served it, as
        `name`."""
        uri = self.target.model.uri
        names = [self.serving.model_name or default_model_name(uri)]
        if self.serving.model_name is None and uri.startswith("hf://"):
            names.append(uri.rstrip("/").rsplit("/", 1)[-1])
        names += self.serving.model_aliases or ()
        return tuple(dict.fromkeys(names))


def default_model_name(uri: str) -> str:
    """The served name of a target at ``uri`` when `spec.serving.modelName` is unset."""
    if uri.startswith("hf://"):
        return uri.removeprefix("hf://").rstrip("/")
    return uri.rstrip("/").rsplit("/", 1)[-1]
