"""The request body of ``POST /v1/responses``: every field OpenAI defines is known here, and a field this
server cannot honour is refused with a 400 naming it (:meth:`ResponsesRequest.unsupported`); a field OpenAI
does not define follows the server's one policy for unknown fields, as on every endpoint (``api/fields.py``:
logged by name, or refused with ``serving.unknownFields: refuse``). Nested objects OpenAI defines refuse
fields they do not know.

``input`` items are kept as plain objects and read by :mod:`.translate`, which names the exact item and
field (``input[2].content[0].type``) of anything it cannot use.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specdeploy_server.api.protocol import Integer, _Request

#: OpenAI's bounds on ``metadata``: at most 16 pairs, keys up to 64 characters, values up to 512
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
#: ``include`` values that ask for nothing this server would leave out (no reasoning items are produced)
HARMLESS_INCLUDES = frozenset({"reasoning.encrypted_content"})


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FormatText(_Strict):
    type: Literal["text"]


class FormatJSONObject(_Strict):
    type: Literal["json_object"]


class FormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: FormatText | FormatJSONObject | FormatJSONSchema = Field(
        default_factory=lambda: FormatText(type="text"), discriminator="type"
    )
    verbosity: Literal["low", "medium", "high"] | None = None


class FunctionTool(_Strict):
    """A function tool in the Responses shape: name, description, parameters and strict at the top level."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(_Strict):
    type: Literal["function"]
    name: str


class Reasoning(_Strict):
    """Accepted only empty (:meth:`ResponsesRequest.unsupported`): the served models produce no reasoning."""

    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None


class ResponsesRequest(_Request):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Integer | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # hints that change nothing in what is generated: accepted
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    # accepted with the values this server honours (unsupported() refuses the others)
    include: list[str] | None = None
    truncation: Literal["disabled", "auto"] | None = None
    reasoning: Reasoning | None = None
    service_tier: str | None = None
    # known, never honoured here: refused when set (unsupported)
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    max_tool_calls: Integer | None = None
    top_logprobs: Integer | None = None
    # vLLM / SGLang extensions the chat path honours, passed on as they are
    top_k: Integer | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    seed: Integer | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """``(field, reason)`` for the first option set to something this server cannot honour."""
        if self.background:
            return "background", "background mode is not supported; send the request and wait for it"
        if self.conversation is not None:
            return "conversation", "conversations are not supported; use previous_response_id"
        if self.prompt is not None:
            return "prompt", "stored prompt templates are not supported"
        if self.max_tool_calls is not None:
            return "max_tool_calls", "max_tool_calls is not supported"
        reasoning = self.reasoning
        if reasoning is not None and (reasoning.effort or reasoning.summary or reasoning.generate_summary):
            return "reasoning", "reasoning is not supported: the served model produces no reasoning items"
        if self.text is not None and self.text.verbosity not in (None, "medium"):
            return "text.verbosity", "text.verbosity is not supported (only 'medium', the default)"
        if self.top_logprobs:
            return "top_logprobs", "logprobs are not supported by /v1/responses; use /v1/chat/completions"
        if self.truncation == "auto":
            return "truncation", "truncation 'auto' is not supported; the input must fit the context"
        if self.service_tier not in (None, "auto", "default"):
            return "service_tier", f"service_tier '{self.service_tier}' is not supported"
        for name in self.include or []:
            if name not in HARMLESS_INCLUDES:
                return "include", f"include '{name}' is not supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        return self._metadata_problem()

    def _metadata_problem(self) -> tuple[str, str] | None:
        pairs = self.metadata or {}
        if len(pairs) > MAX_METADATA_PAIRS:
            return "metadata", f"metadata holds at most {MAX_METADATA_PAIRS} pairs"
        for key, value in pairs.items():
            if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
                return "metadata", (
                    f"metadata keys are at most {MAX_METADATA_KEY} characters and values at most "
                    f"{MAX_METADATA_VALUE}"
                )
        return None

    def stores(self) -> bool:
        """Whether the response is kept (OpenAI's default: yes)."""
        return self.store is not False

    def text_format(self) -> FormatText | FormatJSONObject | FormatJSONSchema:
        return self.text.format if self.text is not None else FormatText(type="text")
