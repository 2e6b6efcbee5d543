"""The bodies ``/v1/responses`` answers with: the response object, its output items, the streamed events.

Built and serialised like the other bodies (``contract.body``: the fields set, in declared order), and
described by the OpenAPI document from these same models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from specdeploy_server.api.contract import ErrorDetail

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class OutputMessage(BaseModel):
    type: Literal["message"]
    id: str
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text, as in OpenAI's API
    status: ItemStatus


OutputItem = OutputMessage | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(ge=0)
    cache_write_tokens: int = Field(ge=0)


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(ge=0)


class ResponseUsage(BaseModel):
    input_tokens: int = Field(ge=0)
    input_tokens_details: InputTokensDetails
    output_tokens: int = Field(ge=0)
    output_tokens_details: OutputTokensDetails
    total_tokens: int = Field(ge=0)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class Response(BaseModel):
    """OpenAI's response object. ``tools``, ``tool_choice`` and ``text`` are those of the request, in the
    Responses shape; the sampling fields are the values the generation used."""

    id: str
    object: Literal["response"]
    created_at: int
    status: ResponseStatus
    background: bool
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any]
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"]
    deleted: bool


# ------------------------------------------------------------------------------------------ stream events
class _Event(BaseModel):
    sequence_number: int = Field(ge=0)


TerminalEvent = Literal["response.completed", "response.incomplete", "response.failed"]


class ResponseLifecycleEvent(_Event):
    """``response.created``, ``response.in_progress``, ``response.completed``, ``response.incomplete``,
    ``response.failed``: the response object as it stands."""

    type: Literal[
        "response.created",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    response: Response


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int = Field(ge=0)
    item: OutputItem


class ContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int = Field(ge=0)
    content_index: int = Field(ge=0)
    part: OutputText


class OutputTextDeltaEvent(_Event):
    type: Literal["response.output_text.delta"]
    item_id: str
    output_index: int = Field(ge=0)
    content_index: int = Field(ge=0)
    delta: str
    logprobs: list[Any]


class OutputTextDoneEvent(_Event):
    type: Literal["response.output_text.done"]
    item_id: str
    output_index: int = Field(ge=0)
    content_index: int = Field(ge=0)
    text: str
    logprobs: list[Any]


class FunctionCallArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"]
    item_id: str
    output_index: int = Field(ge=0)
    delta: str


class FunctionCallArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int = Field(ge=0)
    name: str
    arguments: str


class ErrorEvent(_Event):
    """A failure after the stream began (the executor failed): OpenAI's ``error`` event."""

    type: Literal["error"]
    code: str | None
    message: str
    param: str | None


StreamEvent = (
    ResponseLifecycleEvent
    | OutputItemEvent
    | ContentPartEvent
    | OutputTextDeltaEvent
    | OutputTextDoneEvent
    | FunctionCallArgumentsDeltaEvent
    | FunctionCallArgumentsDoneEvent
    | ErrorEvent
)
EVENT_MODELS: tuple[type[BaseModel], ...] = (
    ResponseLifecycleEvent,
    OutputItemEvent,
    ContentPartEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    ErrorEvent,
)


def error_event(detail: ErrorDetail, sequence_number: int) -> ErrorEvent:
    return ErrorEvent(
        type="error",
        sequence_number=sequence_number,
        code=detail.code,
        message=detail.message,
        param=detail.param,
    )
