"""What the client tests ask for: small output schemas a random-weight model fills under a grammar in a few
dozen tokens (strings and numbers bounded, so a random model cannot run past max_tokens), a tool, and a
grammar that makes the model call that tool of its own accord (``tool_choice: auto``)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=8, pattern=r"^[a-z]+$")
    population: int = Field(ge=0, le=999)
    coastal: bool


#: the same as a plain JSON schema (for clients that take one)
CITY_SCHEMA: dict[str, Any] = City.model_json_schema()

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$"}},
            "required": ["city"],
        },
    },
}


def call_grammar(tool: str = "get_weather") -> dict[str, Any]:
    """``response_format`` (an extension: a Lark grammar) that makes the model's answer one ``<tool_call>``
    block calling ``tool`` with a ``city`` the model writes itself (a lowercase word), as a tool-using model
    writes a call; under ``tool_choice: auto`` the server reads it as a call."""
    opening = json.dumps(f'<tool_call>{{"name": "{tool}", "arguments": {{"city": "')
    closing = json.dumps('"}}</tool_call>')
    return {
        "type": "lark_grammar",
        "lark_grammar": f"start: {opening} WORD {closing}\nWORD: /[a-z]{{3,8}}/\n",
    }
