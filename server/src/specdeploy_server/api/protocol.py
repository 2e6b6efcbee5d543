"""Request models of the OpenAI API subset we serve. Unsupported options are refused, never ignored."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from specdeploy_server.api import fields
from specdeploy_server.api.speculation_fields import Prediction, SpeculationOptions


class _Strict(BaseModel):
    """A field takes a value of its own JSON type only: no `false` for a number, no `0.0` for a boolean, no
    `"1"` for an integer (an integer is still a number). The document's schema says as much, and the fuzzer
    checks that what it calls invalid is refused."""

    model_config = ConfigDict(strict=True)


class _Request(_Strict):
    """The base of every endpoint's request model. Fields it does not declare are kept as extras and screened
    once validated (``api/fields.py``: accepted, refused, or logged as ignored, by the server's policy)."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="after")
    def _screen_undeclared_fields(self) -> Self:
        fields.screen(type(self).__name__, self.model_extra or {})
        return self


def _integral(value: Any) -> Any:
    """A float with an integral value (``1.0``) as the integer it is: JSON Schema counts it as an integer,
    and the document declares these fields as integers. Anything else is left for strict validation."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


#: an integer field that takes ``1.0`` as ``1`` (JSON Schema's integer), and still no boolean or string
Integer = Annotated[int, BeforeValidator(_integral)]

#: most choices per request (n), and most alternatives per token (top_logprobs; OpenAI allows 20)
MAX_N = 16
MAX_TOP_LOGPROBS = 20


class StreamOptions(_Strict):
    include_usage: bool = False
    #: vLLM's extension: with ``include_usage``, every chunk carries the usage so far
    continuous_usage_stats: bool = False


class _Sampling(_Request):
    model: str
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: Integer = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Integer | None = None
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    # vLLM / SGLang / trtllm-serve extensions
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    top_k: Integer | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # Stop and output extensions of vLLM, SGLang and trtllm-serve, with their meaning (docs/server.md).
    ignore_eos: bool = False
    min_tokens: Integer = Field(default=0, ge=0)
    stop_token_ids: list[Integer] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # OpenAI's Predicted Outputs, and this server's per-request speculation control (speculation_fields.py)
    prediction: Prediction | None = None
    speculation: SpeculationOptions | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

    def unsupported(self) -> list[str]:
        """Names of options set to something this server cannot honour."""
        return []

    def contradiction(self) -> tuple[str, str] | None:
        """``(field, message)`` for options that make no sense together (OpenAI refuses them too)."""
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        return None

    def top_logprobs_wanted(self) -> int | None:
        """How many alternatives per token the response reports (None: no logprobs)."""
        raise NotImplementedError


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Integer | None = None
    echo: bool = False
    logprobs: Integer | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: Integer | None = None
    suffix: str | None = None

    def unsupported(self) -> list[str]:
        out = super().unsupported()
        if self.best_of not in (None, 1):
            out.append("best_of")
        if self.suffix:
            out.append("suffix")
        return out

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template reads it (Hugging Face's message dicts): role, content as text,
        and ``name``, ``tool_calls`` (an assistant's calls), ``tool_call_id`` (a tool's answer) and any other
        field the client sent, as sent; except that a call's ``arguments``, a JSON string in OpenAI's API, is
        handed over as the object it encodes, which is what tool-calling templates render (as vLLM does)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        message.update(self.model_extra or {})
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [_decoded_arguments(call) for call in calls]
        return message


def _decoded_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    arguments = function["arguments"]
    try:
        decoded = json.loads(arguments)
    except ValueError:
        return call
    if not isinstance(decoded, dict):
        return call
    return {**call, "function": {**function, "arguments": decoded}}


class FunctionDefinition(_Strict):
    model_config = ConfigDict(extra="allow", strict=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedToolChoice(_Strict):
    class Function(_Strict):
        name: str

    type: Literal["function"] = "function"
    function: Function


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Integer | None = None
    max_completion_tokens: Integer | None = None
    logprobs: bool | None = None
    top_logprobs: Integer | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None

    def top_logprobs_wanted(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

    def contradiction(self) -> tuple[str, str] | None:
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true"
        if not self.tools and self.tool_choice not in (None, "none", "auto"):
            return "tool_choice", "tool_choice 'required' or a named function needs tools"
        return super().contradiction()

    def tool_mode(self) -> Literal["auto", "forced"] | None:
        """``forced``: the output must be a call (``required`` or a named function); ``auto``: the model
        may call one (OpenAI's default when tools are sent); None: no tools (or ``none``)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return "auto" if self.tool_choice in (None, "auto") else "forced"

    def calls_tools(self) -> bool:
        return self.tool_mode() == "forced"
