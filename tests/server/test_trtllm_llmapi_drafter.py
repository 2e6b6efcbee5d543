"""Our drafter inside TensorRT-LLM's PyTorch flow (backends/llmapi_drafter.py), through the drafting double's
executor loop (tests/server/trtllm_double_drafter.py) and through the LLM API backend: output identical to
plain greedy decoding, predictions that really raise accepted tokens, the rendered arguments per TensorRT-LLM
version, and clear errors."""

from __future__ import annotations

import asyncio
import pickle
import sys
import uuid
from typing import Any

import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends import llmapi_drafter
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.llmapi_drafter import (
    SINGLE_PROCESS_ENV,
    DraftingLogic,
    RequestHints,
    drafter_class,
    request_hints,
)
from specdeploy_server.backends.llmapi_schedule import draft_len_schedule, schedule_semantics
from specdeploy_server.backends.trtllm_llmapi import LlmApiEngine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import RequestSpeculation, SamplingParams
from specdeploy_server.engine import Feature
from transformers import AutoModelForCausalLM

from tests.server.conftest import TinyModels, run_live
from tests.server.trtllm_double import DoubleState, trtllm_double
from tests.server.trtllm_double_configs import ValidationError
from tests.server.trtllm_double_drafter import Drafter, DrafterV10, PyExecutor, UserProvidedDecodingConfig

__all__ = ["trtllm_double"]

PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 9, 10], [12, 13, 14, 15, 16, 12, 13, 14]]
MAX_NEW = 24


@pytest.fixture(scope="module")
def target(tiny_models: TinyModels) -> Any:
    model: Any = AutoModelForCausalLM.from_pretrained(tiny_models.target, local_files_only=True)
    return model.eval()


def _run(target: Any, spec: Any, speculation: dict[int, RequestSpeculation] | None = None) -> PyExecutor:
    executor = PyExecutor(target, spec, max_batch_size=2)
    hints = getattr(getattr(executor.drafter, "hints", None), "register", None)
    for client_id, prompt in enumerate(PROMPTS, start=1):
        if speculation and client_id in speculation and hints is not None:
            hints(client_id, speculation[client_id])
        executor.add_request(client_id, prompt, MAX_NEW + 4 * client_id)  # they end apart
    executor.run()
    return executor


def _outputs(executor: PyExecutor) -> list[list[int]]:
    return [executor.done[i] for i in sorted(executor.done)]


def _drafter(hints: RequestHints | None = None, **kwargs: Any) -> Any:
    return drafter_class()(
        max_draft_len=kwargs.pop("max_draft_len", 4),
        prompt_lookup_ngram=kwargs.pop("prompt_lookup_ngram", 2),
        hints=hints,
        **kwargs,
    )


def _edited(tokens: list[int]) -> tuple[int, ...]:
    """A prediction with one token replaced and two inserted."""
    out = list(tokens)
    out[5] = (out[5] + 1) % 50
    return (*out[:12], 3, 4, *out[12:])


@pytest.mark.parametrize(
    "case",
    [
        "prompt-lookup",
        "prediction-equal",
        "prediction-edited",
        "prediction-unrelated",
        "caps",
        "schedule",
        "schedule-lower",
    ],
)
def test_our_drafter_keeps_greedy_output_identical_to_plain_decoding(
    case: str, target: Any, trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SINGLE_PROCESS_ENV, "1")
    plain = _outputs(_run(target, None))
    hints = request_hints(f"test-{uuid.uuid4().hex}")
    speculation: dict[int, RequestSpeculation] = {}
    kwargs: dict[str, Any] = {}
    if case == "prediction-equal":
        speculation = {i + 1: RequestSpeculation(tuple(out)) for i, out in enumerate(plain)}
    elif case == "prediction-edited":
        speculation = {i + 1: RequestSpeculation(_edited(out)) for i, out in enumerate(plain)}
    elif case == "prediction-unrelated":
        speculation = {i + 1: RequestSpeculation(tuple(range(20, 40))) for i in range(len(plain))}
    elif case == "caps":
        speculation = {1: RequestSpeculation(max_draft_len=0), 2: RequestSpeculation(tuple(plain[1]), 1)}
    elif case == "schedule":  # a newer release: upper bounds, the padded width follows the batch size
        monkeypatch.setattr(Drafter, "schedule_meaning", "upper")
        kwargs["draft_len_schedule"] = {1: 4, 2: 2}
    elif case == "schedule-lower":  # 1.2: lower bounds, the drafter shortens, the target still verifies 4
        kwargs["draft_len_schedule"] = {1: 4, 2: 1, 3: 0}
    drafter = _drafter(hints, **kwargs)
    executor = _run(target, UserProvidedDecodingConfig(max_draft_len=4, drafter=drafter), speculation)
    assert _outputs(executor) == plain
    assert drafter.drafted > 0
    if case == "caps":
        assert drafter.prediction_drafted > 0
    assert executor.drafter is drafter  # single process: the drafter itself, with our channel
    if case == "schedule-lower":  # 3 active: off; 2: at most 1 token each, padded to 4; 1: 4
        assert {(r.active, r.width) for r in executor.iterations if r.drafted} <= {(2, 4), (1, 4)}
        assert all(r.drafted <= 2 for r in executor.iterations if r.active == 2)
        assert any(r.width == 4 for r in executor.iterations if r.active == 2)
        assert all(r.width == 0 for r in executor.iterations if r.active == 3)
    if case == "schedule":  # 3 active: off; 2: width 2; 1: width 4
        widths = {(r.active, r.width) for r in executor.iterations}
        assert widths <= {(3, 0), (2, 2), (1, 4), (2, 0), (1, 0)}
        assert {(3, 0), (2, 2), (1, 4)} <= widths


def test_a_prediction_equal_to_the_output_raises_accepted_tokens(
    target: Any, trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SINGLE_PROCESS_ENV, "1")
    plain_run = _run(target, None)
    plain = _outputs(plain_run)
    lookup = _drafter(request_hints(f"test-{uuid.uuid4().hex}"), prompt_lookup_ngram=None)
    without = _run(target, UserProvidedDecodingConfig(max_draft_len=8, drafter=lookup))
    hints = request_hints(f"test-{uuid.uuid4().hex}")
    drafter = _drafter(hints, max_draft_len=8, prompt_lookup_ngram=None)
    speculation = {i + 1: RequestSpeculation(tuple(out)) for i, out in enumerate(plain)}
    with_prediction = _run(target, UserProvidedDecodingConfig(max_draft_len=8, drafter=drafter), speculation)
    assert _outputs(with_prediction) == plain
    assert sum(r.accepted for r in without.iterations) == 0  # no prediction, no prompt lookup: nothing
    assert drafter.prediction_accepted > 0
    assert sum(r.accepted for r in with_prediction.iterations) >= drafter.prediction_accepted
    assert len(with_prediction.iterations) < len(plain_run.iterations)


def test_without_single_process_the_drafter_is_a_pickled_copy_and_predictions_are_refused(
    tiny_models: TinyModels, trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SINGLE_PROCESS_ENV, raising=False)
    config = {"model": {"target": str(tiny_models.target)}, "backend": "trtllm-llmapi"}
    config["speculative"] = {"method": "promptLookup", "draftLen": 3}
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, LlmApiEngine)
    (llm,) = trtllm_double.llms
    spec = llm.kwargs["speculative_config"]
    assert type(spec).__name__ == "UserProvidedDecodingConfig"
    assert llm.drafter is not spec.drafter
    assert spec.drafter.hints is None
    assert Feature.PREDICTION not in engine.info.features
    assert Feature.SPECULATION_CONTROL not in engine.info.features


def test_predictions_reach_our_drafter_through_the_llm_api_backend(
    tiny_models: TinyModels, trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SINGLE_PROCESS_ENV, "1")
    config = {"model": {"target": str(tiny_models.target)}, "backend": "trtllm-llmapi"}
    config["speculative"] = {"method": "promptLookup", "draftLen": "auto", "maxDraftLen": 6}
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, LlmApiEngine)
    assert {Feature.PREDICTION, Feature.SPECULATION_CONTROL} <= engine.info.features
    (llm,) = trtllm_double.llms
    spec = llm.kwargs["speculative_config"]
    assert llm.drafter is spec.drafter
    assert spec.max_total_draft_tokens == 6
    # draftLen auto: the schedule from our cost model, in 1.2's meaning (lower bounds, {1: maxDraftLen})
    assert spec.drafter.draft_len_schedule == draft_len_schedule(6, 64, "lower", drafts_with_a_model=False)
    prompt = [5, 6, 7, 8, 9, 10]

    async def generate(speculation: RequestSpeculation) -> list[int]:
        gen = engine.generate(prompt, 20, SamplingParams(temperature=0.0), speculation=speculation)
        return [t async for out in gen.outputs for t in out.token_ids]

    async def main() -> tuple[list[int], list[int], list[int]]:
        await engine.start()
        plain = await generate(RequestSpeculation(max_draft_len=0))
        predicted = await generate(RequestSpeculation(tuple(plain)))
        capped = await generate(RequestSpeculation(tuple(plain), max_draft_len=1))
        await engine.stop(1)
        return plain, predicted, capped

    plain, predicted, capped = asyncio.run(main())
    assert predicted == plain == capped
    off, full, one = llm.requests
    assert off.accepted == 0  # cap 0: nothing drafted, only the padding verified
    assert full.accepted > 0
    assert full.responses < off.responses
    assert 0 < one.accepted <= len(plain)
    assert len(spec.drafter.hints) == 0  # each request's hints dropped when it finished


@pytest.mark.parametrize("single_process", [True, False])
def test_drafted_tokens_are_what_our_drafter_proposed_where_it_runs_in_the_servers_process(
    tiny_models: TinyModels, trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch, single_process: bool
) -> None:
    """Prompt lookup drafts only where an n-gram matches, and TensorRT-LLM pads every draft to the full width:
    in the server's process our drafter counts what it proposed; in a worker process the width per step is
    all the server knows (an upper bound)."""
    if single_process:
        monkeypatch.setenv(SINGLE_PROCESS_ENV, "1")
    else:
        monkeypatch.delenv(SINGLE_PROCESS_ENV, raising=False)
    config = {"model": {"target": str(tiny_models.target)}, "backend": "trtllm-llmapi"}
    config["speculative"] = {"method": "promptLookup", "draftLen": 4}
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, LlmApiEngine)

    async def main() -> None:
        await engine.start()
        gen = engine.generate([5, 6, 7, 8, 5, 6, 7], 40, SamplingParams(temperature=0.0))
        [t async for out in gen.outputs for t in out.token_ids]
        await engine.stop(1)

    asyncio.run(main())
    (llm,) = trtllm_double.llms
    (request,) = llm.requests
    drafter = llm.drafter  # the one that ran: ours, or its copy in the "worker process"
    padded = request.drafted  # positions the target verified past each step's first: the width, every step
    assert 0 < drafter.drafted < padded  # some steps matched no n-gram, or only a shorter one
    if single_process:
        assert engine.stats.drafted == drafter.drafted
        assert engine.stats.accepted == min(request.accepted, drafter.drafted) > 0
        assert engine.acceptance_sources.counts == {"drafter": 1, "perf_metrics": 0, "token_counts": 0}
        assert len(llm.kwargs["speculative_config"].drafter.hints) == 0  # dropped when the request ended
    else:
        assert engine.stats.drafted == padded
        assert engine.acceptance_sources.counts == {"drafter": 0, "perf_metrics": 0, "token_counts": 1}


def test_a_version_without_user_provided_drafters_keeps_its_ngram_drafter_with_a_warning(
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(SINGLE_PROCESS_ENV, "1")
    monkeypatch.delitem(sys.modules, "tensorrt_llm._torch.speculative.drafter")
    config = {"model": {"target": str(tiny_models.target)}, "backend": "trtllm-llmapi"}
    config["speculative"] = {"method": "promptLookup", "draftLen": 3}
    engine = build_engine(ServerConfig.model_validate(config))
    assert type(trtllm_double.llms[-1].kwargs["speculative_config"]).__name__ == "NGramDecodingConfig"
    assert "no user-provided drafters" in caplog.text
    assert Feature.PREDICTION not in engine.info.features


@pytest.mark.parametrize(
    ("version", "method", "expected"),
    [
        ("1.2.1", "draftTarget", draft_len_schedule(5, 64, "lower", drafts_with_a_model=True)),
        ("1.2.1", "eagle3", None),  # 1.2's schedule: two-model drafters only
        ("1.2.1", "mtp", None),
        ("1.3.0rc9", "eagle3", draft_len_schedule(5, 64, "upper", drafts_with_a_model=True)),
        ("1.3.0rc9", "mtp", draft_len_schedule(5, 64, "upper", drafts_with_a_model=True)),
    ],
)
def test_draft_len_schedule_is_rendered_in_the_installed_versions_meaning(
    *,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    method: str,
    expected: dict[int, int] | None,
) -> None:
    monkeypatch.setattr(sys.modules["tensorrt_llm"], "__version__", version)
    model: dict[str, str] = {"target": str(tiny_models.target)}
    if method == "draftTarget":
        model["draft"] = str(tiny_models.draft_same)
    if method == "eagle3":
        model["speculativeModel"] = str(tiny_models.draft_same)
    speculative = {"method": method, "draftLen": "auto", "maxDraftLen": 5}
    build_engine(
        ServerConfig.model_validate({"model": model, "backend": "trtllm-llmapi", "speculative": speculative})
    )
    assert trtllm_double.llms[-1].kwargs["speculative_config"].draft_len_schedule == expected
    fixed = {**speculative, "draftLen": 3}
    build_engine(
        ServerConfig.model_validate({"model": model, "backend": "trtllm-llmapi", "speculative": fixed})
    )
    assert trtllm_double.llms[-1].kwargs["speculative_config"].draft_len_schedule is None


def test_the_schedule_follows_the_cost_model_in_each_meaning() -> None:
    lower = draft_len_schedule(10, 64, "lower", drafts_with_a_model=False)
    upper = draft_len_schedule(10, 64, "upper", drafts_with_a_model=False)
    assert lower[1] == 10
    assert list(lower.values())[-1] == 0
    assert list(upper.values()) == sorted(upper.values(), reverse=True)  # shorter as the batch grows
    assert max(upper) < 64  # off above the last threshold
    assert schedule_semantics("1.2.1") == "lower"
    assert schedule_semantics("1.3.0rc29") == "upper"


def test_an_older_drafter_base_warns_what_it_does_not_take(
    trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys.modules["tensorrt_llm._torch.speculative.drafter"], "Drafter", DrafterV10)
    drafter = _drafter(max_concurrency=4, draft_len_schedule={1: 4, 8: 0})
    assert isinstance(drafter, DrafterV10)
    assert drafter.max_concurrency == 4
    assert "takes no draft_len_schedule" in caplog.text


class _KeywordsBase(Drafter):
    """A base that takes any keyword: it is given every argument we have."""

    def __init__(self, **kwargs: Any) -> None:
        self.given = kwargs
        super().__init__(**kwargs)


def test_a_drafter_base_taking_any_keyword_gets_every_argument(
    trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules["tensorrt_llm._torch.speculative.drafter"], "Drafter", _KeywordsBase)
    drafter = _drafter(max_concurrency=2, draft_len_schedule={1: 4, 8: 0})
    assert drafter.given == {
        "max_draft_len": 4,
        "max_total_draft_tokens": 4,
        "max_concurrency": 2,
        "draft_len_schedule": {1: 4, 8: 0},
    }


def test_bad_input_gives_clear_errors(trtllm_double: DoubleState) -> None:
    with pytest.raises(ValueError, match="max_draft_len must be > 0"):
        _drafter(max_draft_len=0)
    with pytest.raises(ValueError, match="max_matching_ngram_size must be >= 1"):
        _drafter(prompt_lookup_ngram=0)
    with pytest.raises(ValueError, match="TensorRT-LLM version"):
        schedule_semantics("main")
    with pytest.raises(ValueError, match="max_draft_len and max_batch_size"):
        draft_len_schedule(0, 8, "upper", drafts_with_a_model=False)
    with pytest.raises(ValidationError, match="drafter must be a Drafter"):
        UserProvidedDecodingConfig(
            max_draft_len=4, drafter=DraftingLogic(max_draft_len=4, prompt_lookup_ngram=2)
        )
    with pytest.raises(ValidationError, match="max_draft_len must be > 0"):
        UserProvidedDecodingConfig(max_draft_len=0, drafter=_drafter())
    with pytest.raises(ValueError, match="must contain"):  # 1.2's schedule must start at max_draft_len
        _drafter(draft_len_schedule={1: 2})


def test_the_drafter_and_its_channel_pickle_by_name(trtllm_double: DoubleState) -> None:
    hints = request_hints(f"test-{uuid.uuid4().hex}")
    hints.register(7, RequestSpeculation((1, 2, 3)))
    copy = pickle.loads(pickle.dumps(_drafter(hints)))
    assert type(copy).__name__ == "LlmApiDrafter"
    assert type(copy) is llmapi_drafter.LlmApiDrafter
    assert copy.hints is hints  # the same process: the same channel


def test_disable_above_concurrency_reaches_our_drafter_and_its_config(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    """The executor reads max_concurrency from the drafter object (get_spec_drafter returns it unchanged)."""
    config = {"model": {"target": str(tiny_models.target)}, "backend": "trtllm-llmapi"}
    config["speculative"] = {"method": "promptLookup", "draftLen": 4, "disableAboveConcurrency": 1}
    build_engine(ServerConfig.model_validate(config))
    (llm,) = trtllm_double.llms
    spec = llm.kwargs["speculative_config"]
    assert spec.max_concurrency == 1
    assert llm.drafter.max_concurrency == 1
    assert spec.drafter.draft_len_schedule is None  # a fixed draftLen: no schedule
    assert llm.drafter.should_use_spec_decode([1]) is True
    assert llm.drafter.should_use_spec_decode([1, 2]) is False


def test_predictions_and_speculation_control_are_served_over_http_in_single_process_mode(
    tiny_models: TinyModels, trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SINGLE_PROCESS_ENV, "1")
    config = {"model": {"target": str(tiny_models.target)}, "backend": "trtllm-llmapi"}
    config["speculative"] = {"method": "promptLookup", "draftLen": 4}
    engine = build_engine(ServerConfig.model_validate(config))
    with run_live(create_app(engine, served_model_name="tiny")) as live:
        client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0)

        def complete(body: dict[str, Any]) -> str:
            out = client.completions.create(
                model="tiny", prompt="draft target", max_tokens=16, temperature=0, extra_body=body
            )
            return out.choices[0].text

        plain = complete({"speculation": {"enabled": False}})
        assert complete({"prediction": {"type": "content", "content": plain}}) == plain
        assert complete({"speculation": {"max_draft_tokens": 2}}) == plain
        unrelated = "zz qq " * 8
        out = client.completions.create(
            model="tiny",
            prompt="draft target",
            max_tokens=16,
            temperature=0,
            extra_body={"prediction": {"type": "content", "content": plain}},
        )
        details = out.usage.completion_tokens_details if out.usage else None
        assert details is not None
        accepted = trtllm_double.llms[0].requests[-1].accepted  # of the drafts, from the prediction or not
        assert details.accepted_prediction_tokens is not None
        assert 0 < details.accepted_prediction_tokens <= accepted
        assert complete({"prediction": {"type": "content", "content": unrelated}}) == plain
    off, predicted, capped, _, _ = trtllm_double.llms[0].requests
    assert off.accepted == 0
    assert predicted.accepted > 0
    assert capped.responses >= predicted.responses
