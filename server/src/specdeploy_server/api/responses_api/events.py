"""The typed stream events of a Responses request, translated from the chat completion chunks the serving path
streams for it (:class:`EventTranslator`, pure: chunks in, events out, numbered from 0).

A chunk's text opens a ``message`` item (``response.output_item.added``, ``response.content_part.added``)
and is sent as ``response.output_text.delta``; a chunk's tool call opens a ``function_call`` item (closing
the message before it) and its arguments are sent as ``response.function_call_arguments.delta`` as they come.
The finish closes every open item (``*.done`` events, the whole text or arguments in each); the stream ends
with ``response.completed``, ``response.incomplete`` or ``response.failed`` carrying the whole response.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from specdeploy_server.api.contract import ErrorDetail, FinishReasonName, Usage
from specdeploy_server.api.responses_api.contract import (
    ContentPartEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    ItemStatus,
    OutputItem,
    OutputItemEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    Response,
    ResponseError,
    ResponseLifecycleEvent,
    ResponseStatus,
    TerminalEvent,
    error_event,
)
from specdeploy_server.api.responses_api.output import (
    Echo,
    function_call_item,
    item_status,
    message_item,
    new_id,
    output_text,
    response,
    response_usage,
)

_TERMINAL: dict[ResponseStatus, TerminalEvent] = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "in_progress": "response.failed",  # never: a finished response is not in progress
}


@dataclass
class _Message:
    id: str
    text: list[str] = field(default_factory=list)
    status: ItemStatus = "in_progress"


@dataclass
class _Call:
    id: str
    call_id: str
    name: str
    arguments: list[str] = field(default_factory=list)
    done: bool = False


class EventTranslator:
    def __init__(self, echo: Echo) -> None:
        self.echo = echo
        self._sequence = 0
        self._items: list[_Message | _Call] = []
        self._open_message: int | None = None
        self._calls: dict[int, int] = {}  # the chat tool call's index -> its output index
        self.finish: FinishReasonName | None = None
        self.usage: Usage | None = None
        self.final: Response | None = None

    def _next(self) -> int:
        number = self._sequence
        self._sequence += 1
        return number

    def start(self) -> list[BaseModel]:
        begun = response(self.echo, [], None, None)
        return [
            ResponseLifecycleEvent(type="response.created", sequence_number=self._next(), response=begun),
            ResponseLifecycleEvent(type="response.in_progress", sequence_number=self._next(), response=begun),
        ]

    def chunk(self, chunk: dict[str, Any]) -> list[BaseModel]:
        """The events of one chat completion chunk (its text, its tool calls, its finish, its usage)."""
        events: list[BaseModel] = []
        if chunk.get("usage"):
            self.usage = Usage.model_validate(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                events += self._close_all()
        return events

    def _text(self, text: str) -> list[BaseModel]:
        events: list[BaseModel] = []
        if self._open_message is None:
            self._open_message = len(self._items)
            message = _Message(new_id("msg"))
            self._items.append(message)
            events += self._message_opened(self._open_message, message)
        index = self._open_message
        item = self._items[index]
        assert isinstance(item, _Message)
        item.text.append(text)
        events.append(
            OutputTextDeltaEvent(
                type="response.output_text.delta",
                sequence_number=self._next(),
                item_id=item.id,
                output_index=index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _message_opened(self, index: int, message: _Message) -> list[BaseModel]:
        return [
            OutputItemEvent(
                type="response.output_item.added",
                sequence_number=self._next(),
                output_index=index,
                item=message_item(message.id, None, "in_progress"),
            ),
            ContentPartEvent(
                type="response.content_part.added",
                sequence_number=self._next(),
                item_id=message.id,
                output_index=index,
                content_index=0,
                part=output_text(""),
            ),
        ]

    def _tool_call(self, call: dict[str, Any]) -> list[BaseModel]:
        events: list[BaseModel] = []
        chat_index = call.get("index", 0)
        function = call.get("function") or {}
        if chat_index not in self._calls:
            if self._calls and not self.echo.parallel_tool_calls:
                return []  # only the first call is kept
            events += self._close_message("completed")
            self._calls[chat_index] = len(self._items)
            item = _Call(new_id("fc"), call.get("id") or new_id("call"), function.get("name") or "")
            self._items.append(item)
            events.append(
                OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self._next(),
                    output_index=self._calls[chat_index],
                    item=function_call_item(item.id, item.call_id, item.name, "", "in_progress"),
                )
            )
        index = self._calls[chat_index]
        call_item = self._items[index]
        assert isinstance(call_item, _Call)
        arguments = function.get("arguments") or ""
        if arguments:
            call_item.arguments.append(arguments)
            events.append(
                FunctionCallArgumentsDeltaEvent(
                    type="response.function_call_arguments.delta",
                    sequence_number=self._next(),
                    item_id=call_item.id,
                    output_index=index,
                    delta=arguments,
                )
            )
        return events

    def _close_message(self, status: ItemStatus) -> list[BaseModel]:
        index = self._open_message
        if index is None:
            return []
        self._open_message = None
        message = self._items[index]
        assert isinstance(message, _Message)
        message.status = status
        text = "".join(message.text)
        return [
            OutputTextDoneEvent(
                type="response.output_text.done",
                sequence_number=self._next(),
                item_id=message.id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            ContentPartEvent(
                type="response.content_part.done",
                sequence_number=self._next(),
                item_id=message.id,
                output_index=index,
                content_index=0,
                part=output_text(text),
            ),
            OutputItemEvent(
                type="response.output_item.done",
                sequence_number=self._next(),
                output_index=index,
                item=message_item(message.id, text, status),
            ),
        ]

    def _close_all(self) -> list[BaseModel]:
        events: list[BaseModel] = []
        if not self._items:  # nothing generated: an empty message, as the whole response has
            self._open_message = 0
            message = _Message(new_id("msg"))
            self._items.append(message)
            events += self._message_opened(0, message)
        events += self._close_message(item_status(self.finish))
        for index, item in enumerate(self._items):
            if isinstance(item, _Call) and not item.done:
                item.done = True
                arguments = "".join(item.arguments)
                events.append(
                    FunctionCallArgumentsDoneEvent(
                        type="response.function_call_arguments.done",
                        sequence_number=self._next(),
                        item_id=item.id,
                        output_index=index,
                        name=item.name,
                        arguments=arguments,
                    )
                )
                events.append(
                    OutputItemEvent(
                        type="response.output_item.done",
                        sequence_number=self._next(),
                        output_index=index,
                        item=function_call_item(
                            item.id, item.call_id, item.name, arguments, item_status(self.finish)
                        ),
                    )
                )
        return events

    def output(self) -> list[OutputItem]:
        items: list[OutputItem] = []
        for item in self._items:
            if isinstance(item, _Message):
                items.append(message_item(item.id, "".join(item.text), item.status))
            else:
                items.append(
                    function_call_item(
                        item.id,
                        item.call_id,
                        item.name,
                        "".join(item.arguments),
                        item_status(self.finish) if item.done else "incomplete",
                    )
                )
        return items

    def end(self) -> list[BaseModel]:
        """The last event: the whole response, completed, incomplete or failed."""
        usage = response_usage(self.usage) if self.usage is not None else None
        self.final = response(self.echo, self.output(), self.finish or "stop", usage)
        kind = _TERMINAL[self.final.status]
        return [ResponseLifecycleEvent(type=kind, sequence_number=self._next(), response=self.final)]

    def failed(self, detail: ErrorDetail) -> list[BaseModel]:
        """A failure after the stream began: an ``error`` event, then ``response.failed``."""
        for item in self._items:
            if isinstance(item, _Message) and item.status == "in_progress":
                item.status = "incomplete"
        usage = response_usage(self.usage) if self.usage is not None else None
        # the response's error code is one of OpenAI's (server_error); the error event names the precise one
        error = ResponseError(code="server_error", message=detail.message)
        self.final = response(self.echo, self.output(), None, usage, status="failed", error=error)
        return [
            error_event(detail, self._next()),
            ResponseLifecycleEvent(type="response.failed", sequence_number=self._next(), response=self.final),
        ]
