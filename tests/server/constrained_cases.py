"""What the structured-output tests of every backend share: the generated JSON schemas, the chat they answer,
and plain constrained greedy decoding of each (the reference every speculative output must equal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdeploy_server.grammar import GrammarCompiler
from specdeploy_server.tokenizer import HFTokenizer
from specdeploy_testkit.json_schemas import json_schemas

from tests.server.plain_decoding import PlainDecoder

SCHEMAS = json_schemas(50, seed=23)
MAX_TOKENS = 200
MESSAGES: list[Any] = [{"role": "user", "content": "answer in json"}]


def json_schema_format(schema: dict[str, Any]) -> Any:
    """`response_format` asking for `schema`."""
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def chat_prompt_ids(target: Path) -> list[int]:
    tokenizer = HFTokenizer(target)
    return tokenizer.encode(tokenizer.render_chat(MESSAGES), add_special_tokens=False)


def plain_constrained_outputs(plain: PlainDecoder, prompt: list[int]) -> list[str]:
    """Plain constrained greedy decoding of every schema."""
    out = []
    for schema in SCHEMAS:
        tokens = plain.greedy(prompt, MAX_TOKENS, grammar=GrammarCompiler.from_json_schema(schema))
        out.append(plain.tokenizer.decode(tokens, skip_special_tokens=True))
    return out
