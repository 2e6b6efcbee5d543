"""lm-evaluation-harness's ``local-completions`` model against the live server, on two tasks made here (no
data set or tokenizer is downloaded): a multiple-choice task scored by loglikelihood (prompt logprobs, from
``echo`` with ``logprobs``) and a ``generate_until`` task. The loglikelihoods lm-eval computes from the
server's answers are the target model's own, computed here with transformers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from lm_eval import simple_evaluate  # type: ignore[import-untyped]
from lm_eval.tasks import TaskManager  # type: ignore[import-untyped]
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.clients.conftest import MODEL, ClientServer

QUESTIONS = [
    {"question": "The draft model proposes", "choices": ["tokens", "nothing", "a river"], "answer": 0},
    {"question": "The target model verifies", "choices": ["the draft", "the sky"], "answer": 0},
    {"question": "Speculative decoding is", "choices": ["fast", "slow", "green", "loud"], "answer": 0},
]
CHOICE_TASK = """\
task: specdeploy_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""
GENERATE_TASK = """\
task: specdeploy_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{choices[answer]}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 12
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lm-eval-tasks")
    data = root / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    (root / "choice.yaml").write_text(CHOICE_TASK.format(data=data), encoding="utf-8")
    (root / "generate.yaml").write_text(GENERATE_TASK.format(data=data), encoding="utf-8")
    return root


def _target_loglikelihood(model: Any, tokenizer: Any, context: str, continuation: str) -> float:
    """log P(continuation | context) under the target, tokenised as lm-eval does (the whole string, split
    where the context's own tokens end; no special tokens)."""
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    context_ids = tokenizer(context, add_special_tokens=False).input_ids
    with torch.inference_mode():
        logits = model(torch.tensor([whole])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return sum(float(logprobs[i - 1, whole[i]]) for i in range(len(context_ids), len(whole)))


def test_local_completions_scores_loglikelihood_and_generates(
    client_server: ClientServer, tasks: Path
) -> None:
    results: Any = simple_evaluate(
        model="local-completions",
        model_args={
            "model": MODEL,
            "base_url": f"{client_server.v1}/completions",
            "tokenizer": str(client_server.tokenizer),
            "tokenizer_backend": "huggingface",
            "num_concurrent": 1,
            "max_retries": 1,
            "max_length": 1024,
        },
        tasks=["specdeploy_choice", "specdeploy_generate"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    choice_samples = results["samples"]["specdeploy_choice"]
    assert len(choice_samples) == len(QUESTIONS)
    tokenizer: Any = AutoTokenizer.from_pretrained(str(client_server.tokenizer), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(client_server.tokenizer), local_files_only=True)
    model.eval()
    for sample in choice_samples:
        question = QUESTIONS[sample["doc_id"]]
        scored = [loglikelihood for loglikelihood, _greedy in sample["filtered_resps"]]
        # lm-eval puts its target delimiter, a space, between the question and each choice
        expected = [
            _target_loglikelihood(model, tokenizer, question["question"], f" {c}")
            for c in question["choices"]
        ]
        assert scored == pytest.approx(expected, abs=1e-3)
        assert sample["acc"] == float(
            max(range(len(expected)), key=expected.__getitem__) == question["answer"]
        )
    accuracy = results["results"]["specdeploy_choice"]["acc,none"]
    assert math.isclose(accuracy, sum(s["acc"] for s in choice_samples) / len(QUESTIONS))

    generated = results["samples"]["specdeploy_generate"]
    assert len(generated) == len(QUESTIONS)
    for sample in generated:
        [text] = sample["filtered_resps"]
        assert isinstance(text, str)
        assert "\n" not in text
        assert "." not in text
    assert "exact_match,none" in results["results"]["specdeploy_generate"]
