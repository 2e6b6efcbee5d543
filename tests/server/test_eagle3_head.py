"""Our EAGLE-3 head against NVIDIA ModelOpt's own: the checkpoint ModelOpt exports, loaded by the reference
backend, drafts what ModelOpt's forward pass drafts (the layer-index and norm conventions included)."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from specdeploy_server.backends.eagle3_drafter import Eagle3DraftExecutor, load_head_for
from specdeploy_server.backends.eagle3_head import Eagle3HeadError
from specdeploy_server.backends.kvbatch import CachedModel
from specdeploy_server.core.executors import DraftRequest
from specdeploy_server.core.types import SamplingParams, SequenceState
from specdeploy_testkit import checkpoints
from specdeploy_testkit.checkpoints import TinyLlama

from tests.server.conftest import TinyModels
from tests.server.modelopt_eagle3 import convert, export, modelopt_drafts

CPU = torch.device("cpu")
PROMPTS = [[5, 17, 42, 8, 99, 3, 61], [120, 7, 7, 7, 30], list(range(40, 64))]
#: eight layers: ModelOpt's default picks three, layers 1, 3 and 4 (by output)
DEEP = TinyLlama(layers=8)


@pytest.fixture(scope="module")
def deep_target(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.save_tiny_llama(
        tmp_path_factory.mktemp("deep") / "target", tiny_models.tokenizer, 3, DEEP
    )


@pytest.fixture(scope="module", params=[None, 150], ids=["full-vocab", "draft-vocab-d2t"])
def trained(
    request: pytest.FixtureRequest, deep_target: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    model = convert(deep_target, draft_vocab_size=request.param, seed=7)
    head = export(model, tmp_path_factory.mktemp("head"))
    return model, head


@pytest.fixture
def worker() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    yield pool
    pool.shutdown()


def _our_drafts(
    target_dir: Path, head_dir: Path, prompt: list[int], steps: int, worker: Any
) -> tuple[int, list[int]]:
    """The reference backend's way: the target verifies the prompt (its tapped layers kept), emits a token,
    and the head drafts from the target's rows."""
    target = CachedModel(target_dir, CPU, torch.float32)
    executor = Eagle3DraftExecutor(load_head_for(head_dir, target), target, worker)
    base = int(target.logits_for("r", prompt, [])[-1].argmax())
    seq = SequenceState("r", [*prompt, base], 100, SamplingParams(temperature=0.0))
    proposal = executor._draft(DraftRequest(seq, steps, want_probs=False))
    return base, proposal.tokens


def test_the_head_drafts_what_modelopts_forward_drafts(deep_target: Path, trained: Any, worker: Any) -> None:
    model, head = trained
    assert json.loads((head / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"
    ] == [
        1,
        3,
        4,
    ]
    for prompt in PROMPTS:
        assert _our_drafts(deep_target, head, prompt, 5, worker) == modelopt_drafts(model, prompt, 5)


def test_layer_ids_counted_by_input_would_draft_something_else(
    deep_target: Path, trained: Any, worker: Any, tmp_path: Path
) -> None:
    """The test above can tell the two conventions apart: the same head told ids one higher (what a head
    counted by input would say) drafts differently."""
    model, head = trained
    shifted = tmp_path / "shifted"
    shifted.mkdir()
    config = json.loads((head / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, 5]
    (shifted / "config.json").write_text(json.dumps(config))
    (shifted / "model.safetensors").write_bytes((head / "model.safetensors").read_bytes())
    differ = [
        _our_drafts(deep_target, shifted, p, 5, worker)[1] != modelopt_drafts(model, p, 5)[1] for p in PROMPTS
    ]
    assert any(differ)


def test_drafting_again_after_acceptance_reuses_the_heads_cache_and_stays_exact(
    deep_target: Path, trained: Any, worker: Any
) -> None:
    """Step after step (the target verifies each draft, some tokens are accepted), the head's drafts equal
    ModelOpt's drafting from scratch over the same tokens."""
    model, head = trained
    target = CachedModel(deep_target, CPU, torch.float32)
    executor = Eagle3DraftExecutor(load_head_for(head, target), target, worker)
    tokens = list(PROMPTS[0])
    seq = SequenceState("r", list(tokens), 100, SamplingParams(temperature=0.0))
    for _ in range(4):
        seq.token_ids = list(tokens)
        drafts = executor._draft(DraftRequest(seq, 3, want_probs=False)).tokens
        if drafts:
            assert (tokens[-1], drafts) == modelopt_drafts(model, tokens[:-1], 3)
        rows = target.logits_for("r", tokens, drafts).argmax(dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == rows[accepted]:
            accepted += 1
        tokens += [*drafts[:accepted], rows[accepted]]
    assert len(executor._caches["r"].tokens) >= len(tokens) - 1


def test_a_head_for_another_target_is_refused_with_the_field_named(
    tiny_models: TinyModels, trained: Any, tmp_path: Path
) -> None:
    _, head = trained
    target = CachedModel(tiny_models.target, CPU, torch.float32)  # two layers: ids 3 and 4 do not exist
    with pytest.raises(Eagle3HeadError, match=r"eagle_aux_hidden_state_layer_ids .* name layers \[3, 4\]"):
        load_head_for(head, target)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c, s: c.update(architectures=["LlamaForCausalLM"]), "is not ModelOpt's EAGLE-3 export"),
        (lambda c, s: c.update(hidden_size=32), "hidden_size 32 differs from the target's 64"),
        (lambda c, s: c.pop("vocab_size"), "config.json has no vocab_size"),
        (lambda c, s: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[]), "is empty"),
        (lambda c, s: s.pop("fc.weight"), "missing \\['fc.weight'\\]"),
        (lambda c, s: s.update({"fc.weight": torch.zeros(64, 64)}), "does not fit its config.json"),
    ],
    ids=["architecture", "hidden-size", "no-vocab-size", "no-layers", "missing-tensor", "wrong-shape"],
)
def test_a_malformed_head_is_refused_naming_what_is_wrong(
    deep_target: Path, trained: Any, tmp_path: Path, change: Any, message: str
) -> None:
    _, head = trained
    config = json.loads((head / "config.json").read_text())
    state = load_file(str(head / "model.safetensors"))
    change(config, state)
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(Eagle3HeadError, match=message):
        load_head_for(tmp_path, CachedModel(deep_target, CPU, torch.float32))


def test_a_sampled_draft_comes_with_the_distribution_each_token_was_drawn_from(
    deep_target: Path, trained: Any, worker: Any
) -> None:
    """What rejection sampling (`acceptance: logits`) needs: one distribution per drafted token, over the
    target's vocabulary, that gives the token drawn a chance; with a smaller draft vocabulary nothing outside
    it."""
    _, head = trained
    target = CachedModel(deep_target, CPU, torch.float32)
    executor = Eagle3DraftExecutor(load_head_for(head, target), target, worker)
    prompt = PROMPTS[0]
    base = int(target.logits_for("r", prompt, [])[-1].argmax())
    seq = SequenceState("r", [*prompt, base], 100, SamplingParams(temperature=1.0, seed=3))
    proposal = executor._draft(DraftRequest(seq, 4, want_probs=True))
    assert proposal.probs is not None
    assert proposal.probs.shape == (4, target.vocab_size)
    assert proposal.probs.sum(axis=1) == pytest.approx(1.0)
    assert all(proposal.probs[i, t] > 0 for i, t in enumerate(proposal.tokens))
    draft_vocab = json.loads((head / "config.json").read_text())["draft_vocab_size"]
    assert int((proposal.probs > 0).sum(axis=1).max()) <= draft_vocab
