"""Request models of the OpenAI API subset we serve. Unsupported options are refused, never ignored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    """A field takes a value of its own JSON type only: no `false` for a number, no `0.0` for a boolean, no
    `"1"` for an integer (an integer is still a number). The document's schema says as much, and the fuzzer
    checks that what it calls invalid is refused."""

    model_config = ConfigDict(strict=True)


class _Request(_Strict):
    # Unknown fields are tolerated (clients send vendor extensions); known-but-unsupported ones are checked.
    model_config = ConfigDict(extra="allow", strict=True)


#: most choices per request (n), and most alternatives per token (top_logprobs; OpenAI allows 20)
MAX_N = 16
MAX_TOP_LOGPROBS = 20


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Request):
    model: str
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    # vLLM / SGLang / trtllm-serve extensions
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

    def unsupported(self) -> list[str]:
        """Names of options set to something this server cannot honour."""
        return []

    def top_logprobs_wanted(self) -> int | None:
        """How many alternatives per token the response reports (None: no logprobs)."""
        raise NotImplementedError


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = None
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
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None

    def top_logprobs_wanted(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

    def tool_mode(self) -> Literal["auto", "forced"] | None:
        """``forced``: the output must be a call (``required`` or a named function); ``auto``: the model
        may call one (OpenAI's default when tools are sent); None: no tools (or ``none``)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return "auto" if self.tool_choice in (None, "auto") else "forced"

    def calls_tools(self) -> bool:
        return self.tool_mode() == "forced"
