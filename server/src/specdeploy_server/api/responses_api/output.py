"""The response object of a Responses request, from what the chat serving path generated: pure functions.

The assistant's text becomes a ``message`` item with one ``output_text`` part; each tool call a
``function_call`` item. ``finish_reason: length`` makes the response ``incomplete`` (reason
``max_output_tokens``); ``abort`` (the server stopped the generation) ``failed``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdeploy_server.api.contract import FinishReasonName, ToolCall, Usage
from specdeploy_server.api.responses_api.contract import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    ItemStatus,
    OutputItem,
    OutputMessage,
    OutputText,
    OutputTokensDetails,
    Response,
    ResponseError,
    ResponseStatus,
    ResponseUsage,
)
from specdeploy_server.api.responses_api.protocol import FunctionToolChoice, ResponsesRequest
from specdeploy_server.api.responses_api.translate import function_tools

ABORTED = ResponseError(
    code="server_error", message="the generation was stopped: the server is shutting down"
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Echo:
    """What a response object repeats of its request (in the Responses shape), and its identity."""

    model: str
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, str]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float
    top_p: float
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    user: str | None
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def of(cls, req: ResponsesRequest) -> Echo:
        choice = req.tool_choice
        tool_choice: str | dict[str, Any] = (
            choice.model_dump()
            if isinstance(choice, FunctionToolChoice)
            else choice
            if choice is not None
            else "auto"
        )
        return cls(
            model=req.model,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            metadata=dict(req.metadata or {}),
            parallel_tool_calls=req.parallel_tool_calls is not False,
            previous_response_id=req.previous_response_id,
            store=req.stores(),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            text={"format": req.text_format().model_dump(by_alias=True, exclude_none=True)},
            tool_choice=tool_choice,
            tools=[t.model_dump() for t in function_tools(req)],
            user=req.user,
        )


def response_usage(usage: Usage) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=usage.total_tokens,
    )


def item_status(finish: FinishReasonName | None) -> ItemStatus:
    return "incomplete" if finish in ("length", "abort") else "completed"


def output_text(text: str) -> OutputText:
    return OutputText(type="output_text", text=text, annotations=[], logprobs=[])


def message_item(item_id: str, text: str | None, status: ItemStatus) -> OutputMessage:
    content = [] if text is None else [output_text(text)]
    return OutputMessage(type="message", id=item_id, status=status, role="assistant", content=content)


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: ItemStatus
) -> FunctionCallItem:
    return FunctionCallItem(
        type="function_call", id=item_id, call_id=call_id, name=name, arguments=arguments, status=status
    )


def output_items(
    content: str | None, calls: Sequence[ToolCall], finish: FinishReasonName | None, parallel: bool
) -> list[OutputItem]:
    """A chat answer as output items: its text (when there is some, or when there are no calls: an empty
    message), then its calls (only the first with ``parallel_tool_calls: false``)."""
    items: list[OutputItem] = []
    if content or not calls:
        items.append(message_item(new_id("msg"), content or "", item_status(finish)))
    for call in calls[: None if parallel else 1]:
        function = call.function
        items.append(
            function_call_item(new_id("fc"), call.id, function.name, function.arguments, item_status(finish))
        )
    return items


def response(
    echo: Echo,
    output: list[OutputItem],
    finish: FinishReasonName | None,
    usage: ResponseUsage | None,
    *,
    status: ResponseStatus | None = None,
    error: ResponseError | None = None,
) -> Response:
    """The response object: ``status`` as given, else as ``finish`` says (None: still in progress)."""
    if status is None:
        status = (
            "in_progress"
            if finish is None
            else "incomplete"
            if finish == "length"
            else "failed"
            if finish == "abort"
            else "completed"
        )
        if finish == "abort":
            error = ABORTED
    incomplete = IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
    return Response(
        id=echo.id,
        object="response",
        created_at=echo.created_at,
        status=status,
        background=False,
        error=error,
        incomplete_details=incomplete,
        instructions=echo.instructions,
        max_output_tokens=echo.max_output_tokens,
        model=echo.model,
        output=output,
        parallel_tool_calls=echo.parallel_tool_calls,
        previous_response_id=echo.previous_response_id,
        reasoning={"effort": None, "summary": None},
        store=echo.store,
        temperature=echo.temperature,
        text=echo.text,
        tool_choice=echo.tool_choice,
        tools=echo.tools,
        top_p=echo.top_p,
        truncation="disabled",
        usage=usage,
        user=echo.user,
        metadata=echo.metadata,
    )
