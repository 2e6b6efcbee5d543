"""The calls a model makes on its own (``tool_choice: auto``), streamed as they are generated.

The two formats :func:`~specdeploy_server.api.structured.auto_tool_calls` reads are streamed:
``<tool_call>{"name": …, "arguments": …}</tool_call>`` blocks (Hermes, Qwen) after some text or none, and
an answer that is one ``{"name": …, "parameters"|"arguments": …}`` object (Llama 3.1+). The text before the
first call goes out as content as it comes, less what could be the start of a call (a ``<`` that may begin
``<tool_call>``, trailing whitespace, an answer that begins with ``{``), which is held until it is known.
Once a call's opening is recognised — the tag or the object's start, ``"name"`` naming one of the tools,
then ``"arguments"`` (or ``"parameters"``) — a first delta carries its ``id``, ``type`` and ``name``, and the
arguments' text follows as it grows (the last ``}`` and the whitespace around it held until the next text
shows they belong to the arguments rather than closing the call), as OpenAI streams them. The arguments are
the text the model generated, so the fragments concatenate to the non-streamed value.

What is streamed is committed: a call whose block turns out malformed after its opening (cut by
``max_tokens``: ``finish_reason: length``; or ending in invalid JSON) is still sent, with the arguments
generated, where the non-streamed answer would hold that text as content. A block whose opening is not of
that form (its ``"arguments"`` before its ``"name"``, say) is sent whole once it closes, as a call when it is
a valid one, else as content. After the first call, text between calls is not content (as non-streamed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from specdeploy_server.api.contract import FunctionCallDelta, ToolCallDelta
from specdeploy_server.api.forcedcall import new_call_id
from specdeploy_server.api.structured import CALL_HEAD, as_call, before_closing_brace

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass
class StreamDeltas:
    """What one piece of text adds: content, and tool-call deltas."""

    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class _Call:
    index: int
    sent: int = 0  # characters of the arguments sent


class AutoCallStream:
    """One choice's text under ``tool_choice: auto``: :meth:`feed` each text delta, get the content and
    tool-call deltas to send. ``complete_calls``: calls whose closing was generated; ``calls``: calls sent."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.text = ""
        self.calls = 0
        self.complete_calls = 0
        self._pos = 0  # text before this is sent (as content or calls) or dropped
        self._bare = False  # the answer is one bare call object
        self._call: _Call | None = None  # the call whose arguments are being streamed
        self._block_start: int | None = None  # where the open block's JSON begins (after <tool_call>)
        self._gap = ""  # the whitespace before the open block, not sent

    def feed(self, text: str, finished: bool = False) -> StreamDeltas:
        self.text += text
        out = StreamDeltas()
        progress = True
        while progress:
            progress = self._step(out, finished)
        return out

    # One step of the state machine; True when it moved on and another step may find more.
    def _step(self, out: StreamDeltas, finished: bool) -> bool:
        if self._call is not None:
            return self._stream_arguments(out, finished)
        if self._block_start is not None:
            return self._open_block(out, finished)
        return self._content(out, finished)

    def _content(self, out: StreamDeltas, finished: bool) -> bool:
        pending = self.text[self._pos :]
        if self._pos == 0 and pending.lstrip().startswith("{"):  # perhaps one bare call
            head = CALL_HEAD.match(pending.lstrip())
            if head is not None and head.group(1) in self.names:
                self._bare = True
                self._pos = len(pending) - len(pending.lstrip()) + head.end()
                self._start_call(head.group(1), out)
                return True
            if finished:
                out.content += pending
                self._pos = len(self.text)
            return False
        tag = pending.find(OPEN)
        if tag >= 0:
            if self.calls == 0:  # the whitespace before the tag waits to see whether a call follows
                before = pending[:tag]
                sent = before.rstrip() if self._pos or before.strip() else ""
                out.content += sent
                self._gap = before[len(sent) :]
            self._pos += tag + len(OPEN)
            self._block_start = self._pos
            return True
        if finished:
            keep = 0
        else:
            keep = _partial_tag(pending, OPEN)
            keep = len(pending) - len(pending[: len(pending) - keep].rstrip())
        sendable = pending[: len(pending) - keep]
        if self.calls == 0 and (self._pos or sendable.strip() or finished):
            out.content += sendable
            self._pos += len(sendable)
        elif self.calls:
            self._pos += len(sendable)  # text between or after calls is not content
        return False

    def _open_block(self, out: StreamDeltas, finished: bool) -> bool:
        assert self._block_start is not None
        block = self.text[self._block_start :]
        head = CALL_HEAD.match(block.lstrip())
        if head is not None and head.group(1) in self.names:
            self._pos = self._block_start + len(block) - len(block.lstrip()) + head.end()
            self._block_start = None
            self._start_call(head.group(1), out)
            return True
        close = block.find(CLOSE)
        if close < 0:
            if finished and self.calls == 0:  # an unclosed block that never became a call is text
                out.content += self._gap + OPEN + block
                self._pos = len(self.text)
            return False
        whole = self._whole_call(block[:close])
        if whole is not None:
            name, arguments = whole
            self._start_call(name, out)
            assert self._call is not None
            out.calls.append(
                ToolCallDelta(index=self._call.index, function=FunctionCallDelta(arguments=arguments))
            )
            self._call = None
            self.complete_calls += 1
        elif self.calls == 0:
            out.content += self._gap + OPEN + block[: close + len(CLOSE)]
        self._pos = self._block_start + close + len(CLOSE)
        self._block_start = None
        return True

    def _whole_call(self, block: str) -> tuple[str, str] | None:
        try:
            call = as_call(json.loads(block), self.names, block)
        except ValueError:
            return None
        return None if call is None else (call["function"]["name"], call["function"]["arguments"])

    def _start_call(self, name: str, out: StreamDeltas) -> None:
        self._call = _Call(index=self.calls)
        self.calls += 1
        function = FunctionCallDelta(name=name, arguments="")
        out.calls.append(
            ToolCallDelta(index=self._call.index, id=new_call_id(), type="function", function=function)
        )

    def _stream_arguments(self, out: StreamDeltas, finished: bool) -> bool:
        call = self._call
        assert call is not None
        if call.sent == 0:  # whitespace after the opening's colon is not the arguments'
            self._pos += len(self.text[self._pos :]) - len(self.text[self._pos :].lstrip())
        rest = self.text[self._pos :]
        close = -1 if self._bare else rest.find(CLOSE)
        if close >= 0:
            arguments = before_closing_brace(rest[:close])
        elif self._bare and _is_whole_object(self.text):
            arguments = before_closing_brace(rest)
        else:
            held = 0 if self._bare else _partial_tag(rest, CLOSE)
            cut = rest[: len(rest) - held]
            # an output that ends here is a call cut short: all of its arguments go
            arguments = cut.rstrip() if finished else before_closing_brace(cut)
        if len(arguments) > call.sent:
            out.calls.append(
                ToolCallDelta(index=call.index, function=FunctionCallDelta(arguments=arguments[call.sent :]))
            )
            call.sent = len(arguments)
        if close >= 0:
            self.complete_calls += 1
            self._call = None
            self._pos += close + len(CLOSE)
            return True
        if self._bare and _is_whole_object(self.text):
            self.complete_calls += 1
            self._call = None
            self._pos = len(self.text)
        return False


def _is_whole_object(text: str) -> bool:
    stripped = text.strip()
    if not stripped.endswith("}"):
        return False
    try:
        return isinstance(json.loads(stripped), dict)
    except ValueError:
        return False
