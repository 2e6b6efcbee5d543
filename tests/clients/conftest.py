"""One live server for every client library's tests: the reference backend on CPU, a tiny random-weight
target with a smaller draft model of the same vocabulary (draft-target speculation), a chat template that
renders tools (so ``tool_choice: auto`` works), and a context long enough for the prompts these libraries
write (their own system prompts, JSON schemas, tool lists)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_testkit import checkpoints
from specdeploy_testkit.checkpoints import TinyLlama

from tests.server.livethread import run_live

torch.set_num_threads(1)

# Nothing here may reach a model hub or a telemetry endpoint (the session's loopback guard fails the run if
# anything does): the libraries are told so before they are imported.
for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "DO_NOT_TRACK": "1",
    "LANGCHAIN_TRACING_V2": "false",
    "LOGFIRE_IGNORE_NO_CONFIG": "1",
}.items():
    os.environ.setdefault(_name, _value)

#: the served model's name, as every client names it
MODEL = "tiny"

# Llama-3.1-like in what matters here: the tools are rendered into the prompt, so the server accepts
# tool_choice "auto"; every message's content (None for an assistant's tool calls) is rendered.
TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>tools: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CONTEXT = 8192


@dataclass(frozen=True)
class ClientServer:
    base_url: str  # http://127.0.0.1:<port>
    tokenizer: Path  # the served model's tokenizer, for clients that count tokens themselves

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"


@pytest.fixture(scope="session")
def client_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientServer]:
    root = tmp_path_factory.mktemp("client-models")
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    checkpoints.train_tokenizer(tokenizer)
    target = checkpoints.save_tiny_llama(
        root / "target", tokenizer, seed=0, shape=TinyLlama(max_position_embeddings=CONTEXT)
    )
    (target / "chat_template.j2").write_text(TOOLS_TEMPLATE, encoding="utf-8")
    draft = checkpoints.save_tiny_llama(
        root / "draft",
        tokenizer,
        seed=1,
        shape=TinyLlama(hidden_size=32, layers=1, heads=2, kv_heads=1, max_position_embeddings=CONTEXT),
    )
    config = ServerConfig.model_validate(
        {
            "model": {"target": str(target), "draft": str(draft), "servedModelName": MODEL},
            "placement": {"device": "cpu"},
        }
    )
    with run_live(create_app(build_engine(config), served_model_name=MODEL)) as live:
        yield ClientServer(live.base_url, target)
