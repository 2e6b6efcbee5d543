"""The response shapes of the HTTP API, defined once: the handlers build every body from these models, and
the OpenAPI document (``api/openapi.py``) describes responses with them; a schema-driven fuzzer
(tests/server/test_api_contract.py, benchmarks/reliability) checks every response against the document.

A field with a default is left out of a body unless it was set (:func:`body`): ``usage`` in a stream's chunks
before the last, ``tool_calls`` in a message without calls, a chunk's ``delta`` fields.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


def body(model: BaseModel) -> dict[str, Any]:
    """``model`` as the JSON object the server sends: the fields it was given, in their declared order."""
    return model.model_dump(exclude_unset=True)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, for every status other than 200, and in-band at the end of a failed stream."""

    error: ErrorDetail


FinishReasonName = Literal["stop", "length", "abort", "tool_calls"]


class CompletionTokensDetails(BaseModel):
    """Predicted Outputs (docs/server.md): of the prediction's tokens, those that appeared in the completion
    (accepted as draft tokens) and those that did not."""

    accepted_prediction_tokens: int = Field(ge=0)
    rejected_prediction_tokens: int = Field(ge=0)


class Usage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    #: only when the request carried a prediction
    completion_tokens_details: CompletionTokensDetails | None = None


class SpeculativeUsage(BaseModel):
    steps: int = Field(ge=0)
    draft_tokens: int = Field(ge=0)
    accepted_draft_tokens: int = Field(ge=0)
    forced_tokens: int = Field(ge=0)


# ------------------------------------------------------------------------------------------ logprobs
class CompletionLogprobs(BaseModel):
    """``choices[i].logprobs`` of a completion: per token its text, its logprob (None for a token nobody
    predicted: the first prompt token when echoing), its alternatives by text, and where its text starts."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """``choices[i].logprobs`` of a chat completion (or of one chunk)."""

    content: list[ChatTokenLogprob]
    refusal: str | None


# ------------------------------------------------------------------------------------------ completions
class CompletionChoice(_Open):
    index: int = Field(ge=0)
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReasonName | None


class Completion(_Open):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    speculative: SpeculativeUsage


class CompletionChunk(_Open):
    """One event of a streamed completion (``choices`` is empty in the final usage-only chunk)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# ------------------------------------------------------------------------------------------ chat
class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as in OpenAI's API


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Open):
    index: int = Field(ge=0)
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonName | None


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculative: SpeculativeUsage


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None  # a fragment of the arguments' JSON text


class ToolCallDelta(BaseModel):
    """A tool call in a stream, by its position: the first delta of a call has its ``id``, ``type`` and
    ``function.name`` (and ``arguments: ""``), later ones fragments of ``function.arguments`` (OpenAI's
    shape), for forced calls and for the calls a model makes on its own (``tool_choice: auto``) alike."""

    index: int = Field(ge=0)
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChunkDelta(_Open):
    """What a chunk adds to its choice's message: ``role`` in the first, then ``content`` and ``tool_calls``
    (each only when there is some)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(_Open):
    index: int = Field(ge=0)
    delta: ChunkDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonName | None


class ChatCompletionChunk(_Open):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


# ------------------------------------------------------------------------------------------ models, health
class ModelCard(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int
    #: whether ``response_format`` and ``tools`` can be served: the grammar engine can index the tokenizer
    structured_output: bool


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: str
