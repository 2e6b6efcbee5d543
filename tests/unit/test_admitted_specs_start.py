"""What admission accepts, the server starts with: no admitted SpeculativeDeployment can crash-loop on a
configuration the server refuses.

For every spec the API admits (the pydantic models, the same rules as the CRD's CEL and `specdeploy
validate`), the server configuration the operator renders (the ConfigMap's config.json of `specdeploy render`)
must pass the server's own configuration checks: `ServerConfig` (what `--config` loading validates) and
`startup_problems`, every check `build_engine` makes before it loads a model, reads an engine or imports
TensorRT-LLM; with backend `tensorrt` also the engine checks (`check_engines`, run before TensorRT-LLM is
imported) on engine directories laid out as the EngineBuilds' `trtllm-build` flags and parallelism make them.

The specs: every example in examples/, plus a deterministic product over backend x method x acceptance x
placement (device gpu/cpu, draft colocated/dedicated) x target tensor parallelism, and every boundary value
of every `spec.runtime` field, of the integer `spec.serving` fields and of the draft lengths (read from the
API's own JSON schema) on every backend x method x device. Most of them are refused by admission, which is
the point: the generator does not pre-filter with the rules it checks.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, validate_object
from specdeploy_operator.api.speculative import PromptLookupSpec, RuntimeSpec, ServingSpec, SpeculativeSpec
from specdeploy_operator.builders import OperatorSettings, render_children
from specdeploy_operator.builders.serving import CONFIG_FILE
from specdeploy_server.backends.engine_config import DRAFT_TOKENS_EXTERNAL, EngineConfigError, check_engines
from specdeploy_server.backends.factory import startup_problems
from specdeploy_server.cli import load_config
from specdeploy_server.config import Backend

from tests.example_files import example_files, example_id
from tests.unit.api_cases import merge_patch

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("tensorrt", "pytorch", "transformers")
METHODS = ("draftTarget", "promptLookup", "eagle3", "mtp", "none")
ACCEPTANCES = ("tokenMatch", "logits")
DEVICES = ("gpu", "cpu")
DRAFT_PLACEMENTS = ("colocated", "dedicated")
TARGET_TP = (1, 2)

#: backend x method pairs the docs promise: the product must admit each (else the test proves little)
SUPPORTED = {
    *((b, m) for b in ("tensorrt", "transformers") for m in ("draftTarget", "promptLookup", "none")),
    *(("pytorch", m) for m in METHODS),
    ("transformers", "eagle3"),
}


@dataclass(frozen=True)
class Spec:
    name: str
    manifest: dict[str, Any]


def example_specs() -> list[Spec]:
    out = []
    for path in example_files():
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(doc, dict) and doc.get("kind") == "SpeculativeDeployment":
                out.append(Spec(f"{example_id(path)}[{i}]", doc))
    assert len(out) >= 10
    return out


def manifest(
    *,
    backend: str,
    method: str,
    acceptance: str,
    device: str,
    draft_placement: str,
    target_tp: int,
    patch: dict[str, Any],
) -> dict[str, Any]:
    """A spec with the settings each method needs (its draft, EAGLE head or prompt-lookup settings) and the
    given choices, `patch` merged into `spec` (RFC 7386); whether it is valid is admission's to say."""
    speculative: dict[str, Any] = {"method": method, "acceptance": acceptance, "maxDraftLen": 8}
    if method != "none":
        speculative["draftLen"] = 4
    if method == "eagle3":
        speculative["eagle"] = {"model": {"uri": "hf://org/eagle3-head"}}
    if method == "promptLookup":
        speculative["promptLookup"] = {"maxMatchingNgramSize": 3}
    spec: dict[str, Any] = {
        "backend": backend,
        "target": {"model": {"uri": "hf://org/target"}, "tensorParallel": target_tp},
        "speculative": speculative,
        "placement": {"device": device, "draft": draft_placement},
    }
    if method == "draftTarget":
        spec["draft"] = {"model": {"uri": "hf://org/draft"}}
    name = f"{backend}-{method}-{acceptance}-{device}-{draft_placement}-tp{target_tp}".lower()
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": name[:63].rstrip("-")},
        "spec": merge_patch(spec, patch),
    }


def _boundaries(schema: dict[str, Any]) -> list[Any]:
    """The extreme values a property of the API's JSON schema admits."""
    options = [o for o in schema.get("anyOf", [schema]) if o.get("type") != "null"]
    (prop,) = options
    if prop.get("x-kubernetes-int-or-string"):  # an integer range or a string (draftLen: 1..64 or auto)
        return [prop["minimum"], prop["maximum"]]
    kind = prop.get("type")
    if kind == "boolean":
        return [True, False]
    if kind == "integer":
        low = prop.get("minimum", 0)
        return [low, prop.get("maximum", 1 << 20)]
    if kind == "number":
        low = prop["minimum"] if "minimum" in prop else prop["exclusiveMinimum"] + 1e-6
        return [low, prop.get("maximum", 1.0)]
    raise AssertionError(f"no boundaries for {prop}")


def variants() -> list[dict[str, Any]]:
    """Patches of `spec`: {} and one boundary value of one field per patch, for every field of `spec.runtime`,
    the integer fields of `spec.serving`, and the draft lengths and n-gram size of `spec.speculative`."""
    out: list[dict[str, Any]] = [{}]
    runtime = RuntimeSpec.model_json_schema(by_alias=True)["properties"]
    for field, prop in sorted(runtime.items()):
        out.extend({"runtime": {field: value}} for value in _boundaries(prop))
    serving = ServingSpec.model_json_schema(by_alias=True)["properties"]
    for field in ("port", "terminationGracePeriodSeconds"):
        out.extend({"serving": {field: value}} for value in _boundaries(serving[field]))
    out.append({"serving": {"chatTemplate": "{{ messages }}", "apiKeySecret": "api-key"}})
    speculative = SpeculativeSpec.model_json_schema(by_alias=True)["properties"]
    assert _boundaries(speculative["maxDraftLen"]) == _boundaries(speculative["draftLen"])
    for n in _boundaries(speculative["maxDraftLen"]):
        out.append({"speculative": {"maxDraftLen": n, "draftLen": n}})
        out.append({"speculative": {"maxDraftLen": n, "draftLen": None}})
        out.append({"speculative": {"maxDraftLen": n, "draftLen": "auto"}})
    for n in _boundaries(speculative["disableAboveConcurrency"]):
        out.append({"speculative": {"disableAboveConcurrency": n}})
    ngram = PromptLookupSpec.model_json_schema(by_alias=True)["properties"]["maxMatchingNgramSize"]
    out.extend({"speculative": {"promptLookup": {"maxMatchingNgramSize": n}}} for n in _boundaries(ngram))
    return out


def generated_specs() -> list[Spec]:
    out = [
        Spec(
            f"product:{b}-{m}-{a}-{d}-{p}-tp{tp}",
            manifest(backend=b, method=m, acceptance=a, device=d, draft_placement=p, target_tp=tp, patch={}),
        )
        for b, m, a, d, p, tp in itertools.product(
            BACKENDS, METHODS, ACCEPTANCES, DEVICES, DRAFT_PLACEMENTS, TARGET_TP
        )
    ]
    # Every boundary on every backend x method x device, the other choices cycling through their values.
    others = itertools.cycle(itertools.product(ACCEPTANCES, DRAFT_PLACEMENTS, TARGET_TP))
    for patch in variants():
        for b, m, device in itertools.product(BACKENDS, METHODS, DEVICES):
            a, p, tp = next(others)
            name = f"variant:{b}-{m}-{a}-{device}-{p}-tp{tp}:{json.dumps(patch, sort_keys=True)}"
            doc = manifest(
                backend=b, method=m, acceptance=a, device=device, draft_placement=p, target_tp=tp, patch=patch
            )
            out.append(Spec(name, doc))
    return out


def _flag(flags: list[str], name: str, default: str) -> str:
    for i, arg in enumerate(flags):
        if arg == name and i + 1 < len(flags):
            return flags[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return default


def write_engine(directory: Path, build: dict[str, Any]) -> None:
    """The engine directory trtllm-build leaves for this EngineBuild, as far as the server's start-up checks
    read it: config.json from its build flags and parallelism (trtllm-build's defaults where a flag is
    absent, paged context FMHA off), one rank file per GPU. Every model has the same vocabulary."""
    spec = build["spec"]
    flags: list[str] = spec.get("buildFlags", [])
    tp, pp = spec["parallelism"]["tensorParallel"], spec["parallelism"]["pipelineParallel"]
    mode = _flag(flags, "--speculative_decoding_mode", "none")
    config = {
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "vocab_size": 128256,
            "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
        },
        "build_config": {
            "max_batch_size": int(_flag(flags, "--max_batch_size", "2048")),
            "max_input_len": int(_flag(flags, "--max_input_len", "1024")),
            "max_seq_len": int(_flag(flags, "--max_seq_len", "8192")),
            "max_num_tokens": int(_flag(flags, "--max_num_tokens", "8192")),
            "max_draft_len": int(_flag(flags, "--max_draft_len", "0")),
            "speculative_decoding_mode": DRAFT_TOKENS_EXTERNAL if mode == "draft_tokens_external" else 1,
            "gather_generation_logits": "--gather_generation_logits" in flags,
            "plugin_config": {
                "use_paged_context_fmha": _flag(flags, "--use_paged_context_fmha", "") == "enable"
            },
        },
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    for rank in range(tp * pp):
        (directory / f"rank{rank}.engine").write_bytes(b"")


def server_refusal(sdep: SpeculativeDeployment, workdir: Path) -> str | None:
    """Why the server would refuse to start with the configuration file the operator mounts (the rendered
    ConfigMap's file, loaded as `specdeploy-server --config` loads it), or None. With backend trtllm-engine
    the engines the EngineBuilds describe are laid out under `workdir` and the server's engine checks run on
    them: everything up to where TensorRT-LLM would be imported."""
    children = render_children(sdep, OperatorSettings())
    (configmap,) = (o for o in children if o["kind"] == "ConfigMap")
    rendered = yaml.safe_load(configmap["data"][CONFIG_FILE])
    builds = {o["spec"]["hash"]: o for o in children if o["kind"] == "EngineBuild"}
    if rendered["backend"] == "trtllm-engine":
        for role in ("target", "draft"):
            if role in rendered["model"]:
                engine_hash = Path(rendered["model"][role]).name
                write_engine(workdir / engine_hash, builds[engine_hash])
                rendered["model"][role] = str(workdir / engine_hash)
    path = workdir / CONFIG_FILE
    path.write_text(json.dumps(rendered))
    try:
        config = load_config(["--config", str(path)])
    except ValueError as exc:  # pydantic's ValidationError included
        return f"configuration: {exc}"
    problems = startup_problems(config)
    if not problems and config.backend == Backend.TRTLLM_ENGINE:
        try:
            check_engines(config)
        except EngineConfigError as exc:
            problems = [str(exc)]
    return "; ".join(problems) if problems else None


@dataclass
class Outcome:
    admitted: list[tuple[Spec, SpeculativeDeployment]]
    refused: int


def admit(specs: list[Spec]) -> Outcome:
    outcome = Outcome([], 0)
    for spec in specs:
        parsed, errors = validate_object(spec.manifest)
        if parsed is None:
            assert errors
            outcome.refused += 1
        else:
            assert isinstance(parsed, SpeculativeDeployment)
            outcome.admitted.append((spec, parsed))
    return outcome


@pytest.fixture(scope="module")
def generated() -> Outcome:
    return admit(generated_specs())


def test_every_example_is_admitted_and_its_rendered_config_starts_the_server(tmp_path: Path) -> None:
    examples = example_specs()
    outcome = admit(examples)
    assert outcome.refused == 0
    refusals = {spec.name: server_refusal(sdep, tmp_path) for spec, sdep in outcome.admitted}
    assert {name: why for name, why in refusals.items() if why} == {}


def test_every_admitted_variation_renders_a_config_the_server_starts_with(
    generated: Outcome, tmp_path: Path
) -> None:
    refusals = {spec.name: server_refusal(sdep, tmp_path) for spec, sdep in generated.admitted}
    bad = {name: why for name, why in refusals.items() if why}
    assert not bad, f"{len(bad)} admitted specs the server refuses, e.g.: " + json.dumps(
        dict(list(bad.items())[:8]), indent=1
    )


def test_the_variations_cover_every_supported_combination(generated: Outcome) -> None:
    """Not vacuous: admission lets through every backend x method the docs promise, logits acceptance on
    tensorrt and transformers, both devices and both draft placements, and every runtime boundary."""
    admitted = [sdep.spec for _, sdep in generated.admitted]
    assert {(s.backend, s.speculative.method) for s in admitted} == SUPPORTED
    logits = {s.backend for s in admitted if s.speculative.acceptance == "logits"}
    assert logits == {"tensorrt", "transformers"}
    placements = {(s.placement.device, s.placement.draft) for s in admitted if s.draft is not None}
    assert placements >= {("gpu", "colocated"), ("gpu", "dedicated"), ("cpu", "colocated")}
    runtime_fields = {f for _, sdep in generated.admitted for f in sdep.spec.runtime.model_fields_set}
    assert runtime_fields == set(RuntimeSpec.model_fields)
    assert generated.refused > 0
