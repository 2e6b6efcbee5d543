"""Self-distillation's steps on the tiny target: prompts are read and refused as they should be, the generate
step asks a live server through the OpenAI API, and the train step's EAGLE-3 head (ModelOpt) speculates
better on held-out prompts than an untrained one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from specdeploy_server import demo_models
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.distill.__main__ import main
from specdeploy_server.distill.generate import GenerateSettings, generate
from specdeploy_server.distill.prompts import DistillError, Prompt, read_prompts, split
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import LiveServer, TinyModels, run_live
from tests.server.modelopt_eagle3 import convert, export

MAX_TOKENS = 24


def _serve(target: Path) -> Any:
    config = ServerConfig.model_validate(
        {"model": {"target": str(target)}, "speculative": {"method": "none"}}
    )
    return run_live(create_app(build_engine(config), served_model_name="tiny"))


@pytest.fixture(scope="module")
def live(tiny_models: TinyModels) -> Iterator[LiveServer]:
    with _serve(tiny_models.target) as server:
        yield server


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LiveServer]]:
    """The demo's target, trained briefly (a random model's next-token distributions are nearly flat: there is
    little for a head to learn), served."""
    models = demo_models.build(tmp_path_factory.mktemp("demo"), demo_models.TrainSettings(steps=120, seed=3))
    with _serve(models.target) as server:
        yield models.target, server


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    ("lines", "suffix", "message"),
    [
        ([], ".jsonl", "empty"),
        (["", "  "], ".txt", "empty"),
        (['{"prompt": "a"}', "not json"], ".jsonl", "line 2: not JSON"),
        (['{"text": "a"}'], ".jsonl", 'line 1: expected {"prompt"'),
        (['{"messages": [{"content": "no role"}]}'], ".jsonl", "line 1: expected"),
    ],
    ids=["empty-file", "blank-lines", "not-json", "no-prompt", "message-without-role"],
)
def test_a_dataset_that_is_empty_or_malformed_is_refused_naming_the_line(
    tmp_path: Path, lines: list[str], suffix: str, message: str
) -> None:
    with pytest.raises(DistillError, match=message):
        read_prompts(_write(tmp_path / f"prompts{suffix}", lines))


def test_a_directory_contributes_its_files_and_a_missing_path_is_named(tmp_path: Path) -> None:
    _write(tmp_path / "a.txt", ["one", "two"])
    _write(tmp_path / "b.jsonl", ['{"messages": [{"role": "user", "content": "three"}]}'])
    (tmp_path / "ignored.csv").write_text("x\n")
    prompts = read_prompts(tmp_path)
    assert [p.text for p in prompts[:2]] == ["one", "two"]
    assert prompts[2].messages == ({"role": "user", "content": "three"},)
    with pytest.raises(DistillError, match="no such file"):
        read_prompts(tmp_path / "missing")
    with pytest.raises(DistillError, match="heldOut 3 leaves none"):
        split(prompts, 10, 3, seed=0)


def test_generate_asks_the_endpoint_and_keeps_held_out_prompts_out(live: LiveServer, tmp_path: Path) -> None:
    prompts = [Prompt(text=t) for t in sample_text.prompts(6, seed=1)]
    prompts.append(Prompt(messages=({"role": "user", "content": "Hello there"},)))
    training, held_out = split(prompts, samples=5, held_out=2, seed=3)
    settings = GenerateSettings(endpoint=f"{live.base_url}/v1", model="tiny", max_tokens=MAX_TOKENS)
    summary = generate(settings, training, held_out, tmp_path)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert (summary.samples, summary.held_out, summary.failed) == (5, 2, 0)
    assert summary.completion_tokens == sum(s["completionTokens"] for s in samples) > 0
    held = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert held == [p.to_json() for p in held_out]
    assert not {json.dumps(p.to_json()) for p in held_out} & {
        json.dumps({k: v for k, v in s.items() if k in ("prompt", "messages")}) for s in samples
    }
    assert json.loads((tmp_path / "generate.json").read_text())["samples"] == 5


def test_generate_fails_with_the_endpoints_error_when_nothing_is_answered(
    live: LiveServer, tmp_path: Path
) -> None:
    settings = GenerateSettings(endpoint=f"{live.base_url}/v1", model="no-such-model")
    with pytest.raises(RuntimeError, match=r"no prompt got a response.*HTTP 404"):
        generate(settings, [Prompt(text="a")], [], tmp_path)
    assert json.loads((tmp_path / "generate.json").read_text())["failed"] == 1


def test_the_cli_refuses_bad_input_with_one_line_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = _write(tmp_path / "p.txt", [])
    args = ["generate", "--prompts", str(empty), "--endpoint", "http://127.0.0.1:9/v1", "--model", "m"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert "specdeploy-distill generate: prompts" in capsys.readouterr().err
    samples = _write(tmp_path / "s.jsonl", ['{"prompt": "a", "completion": "b"}'])
    train = [
        "train-eagle3",
        "--target",
        str(tmp_path),
        "--samples",
        str(samples),
        "--out",
        str(tmp_path / "h"),
    ]
    assert main([*train, "--steps", "0"]) == 2
    assert "steps 0: the budget trains nothing" in capsys.readouterr().err


def _acceptance(config: ServerConfig, prompts: list[str], params: SamplingParams) -> float:
    """Accepted / drafted over ``prompts``, one after another, through the server's own engine."""

    async def run() -> float:
        engine = build_engine(config)
        assert isinstance(engine, Engine)
        await engine.start()
        for prompt in prompts:
            gen = engine.generate(engine.tokenizer.encode(prompt), MAX_TOKENS, params)
            [_ async for _ in gen.outputs]
        await engine.stop(5)
        return engine.stats.accepted / max(engine.stats.drafted, 1)

    return asyncio.run(run())


def _eagle3_acceptance(target: Path, head: Path, prompts: list[str]) -> float:
    config = ServerConfig.model_validate(
        {
            "backend": "pytorch-reference",
            "model": {"target": str(target), "speculativeModel": str(head)},
            "speculative": {"method": "eagle3", "draftLen": 3},
            "placement": {"device": "cpu"},
        }
    )
    return _acceptance(config, prompts, SamplingParams(temperature=0.0))


@pytest.fixture(scope="module")
def demo_samples(demo: tuple[Path, LiveServer], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generate step on the demo's target: a prompt every 9 words of its corpus, 16 of them held out."""
    _, live = demo
    root = tmp_path_factory.mktemp("samples")
    words = demo_models.corpus_text().split()
    prompts = _write(root / "prompts.txt", [" ".join(words[i : i + 6]) for i in range(0, len(words) - 6, 9)])
    base = ["--endpoint", f"{live.base_url}/v1", "--model", "tiny", "--max-tokens", "32"]
    data = root / "data"
    argv = ["generate", "--prompts", str(prompts), *base, "--out", str(data), "--samples", "200"]
    assert main([*argv, "--held-out", "16"]) == 0
    return data


def _held_out(data: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in (data / "heldout.jsonl").read_text().splitlines()]


def test_a_head_trained_on_the_targets_own_outputs_speculates_better_than_an_untrained_one(
    demo: tuple[Path, LiveServer], demo_samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, _ = demo
    head = tmp_path / "head"
    argv = ["train-eagle3", "--target", str(target), "--samples", str(demo_samples / "samples.jsonl")]
    assert main([*argv, "--out", str(head), "--steps", "300", "--learning-rate", "3e-3"]) == 0
    trained: dict[str, Any] = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert trained["steps"] == 300
    assert json.loads((head / "train.json").read_text()) == trained
    assert all(oct(p.stat().st_mode)[-3:] == "644" for p in head.iterdir())
    untrained = export(convert(target, seed=3), tmp_path / "untrained")
    held_out = _held_out(demo_samples)
    before, after = (
        _eagle3_acceptance(target, untrained, held_out),
        _eagle3_acceptance(target, head, held_out),
    )
    # measured: 0.001 untrained, 0.16 trained (0.19 after 900 steps, 0.69 on prompts it was trained on)
    assert after > before + 0.1, (before, after)


def _draft_acceptance(target: Path, draft: Path, prompts: list[str], temperature: float) -> float:
    config = ServerConfig.model_validate(
        {
            "model": {"target": str(target), "draft": str(draft)},
            "speculative": {"method": "draftTarget", "draftLen": 4, "acceptance": "logits"},
            "placement": {"device": "cpu"},
        }
    )
    return _acceptance(config, prompts, SamplingParams(temperature=temperature, seed=1))


def test_a_draft_distilled_on_the_targets_own_outputs_is_accepted_more(
    demo: tuple[Path, LiveServer], demo_samples: Path, tmp_path: Path
) -> None:
    """Sampled traffic gains on held-out prompts; greedy traffic on the prompts trained on (greedy on held-out
    prompts stays level here: measured 0.614 -> 0.604)."""
    target, _ = demo
    draft = target.parent / "draft"
    out = tmp_path / "draft"
    argv = ["train-draft", "--target", str(target), "--draft", str(draft), "--out", str(out)]
    assert main([*argv, "--samples", str(demo_samples / "samples.jsonl"), "--steps", "100"]) == 0
    assert (out / "tokenizer.json").read_bytes() == (draft / "tokenizer.json").read_bytes()
    held_out = _held_out(demo_samples)
    seen = [json.loads(line)["prompt"] for line in (demo_samples / "samples.jsonl").read_text().splitlines()]
    for prompts, temperature, gain in ((held_out, 1.0, 0.03), (seen[:16], 0.0, 0.1)):
        before = _draft_acceptance(target, draft, prompts, temperature)
        after = _draft_acceptance(target, out, prompts, temperature)
        # measured: held-out at 1: 0.548 -> 0.626; trained-on at 0: 0.638 -> 0.808
        assert after > before + gain, (temperature, before, after)


def test_a_draft_with_another_tokenizer_is_refused(
    demo: tuple[Path, LiveServer],
    tiny_models: TinyModels,
    demo_samples: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    target, _ = demo
    argv = ["train-draft", "--target", str(target), "--draft", str(tiny_models.target)]
    assert main([*argv, "--samples", str(demo_samples / "samples.jsonl"), "--out", str(tmp_path / "d")]) == 2
    assert "its tokenizer differs from the target's" in capsys.readouterr().err


def test_the_cli_says_when_the_endpoint_answered_nothing_with_status_1(
    live: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = _write(tmp_path / "p.txt", ["a prompt"])
    argv = ["generate", "--prompts", str(prompts), "--endpoint", f"{live.base_url}/v1", "--model", "nope"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 1
    assert "no prompt got a response" in capsys.readouterr().err
