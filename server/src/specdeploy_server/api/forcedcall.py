"""A forced tool call's text (``tool_choice`` required or a named function) as OpenAI's ``tool_calls``, whole
or as it is generated.

The grammar makes the output ``{"name":"<tool>","arguments":<the tool's parameters>}`` (``name`` first, as
the call's schema declares it). Once the name is complete the call is known: a stream sends a first delta
with its ``id``, ``type`` and ``name`` and ``arguments: ""``, then the arguments' text as it grows, as OpenAI
streams them. The arguments are the text the model generated (not re-serialised), so streamed fragments
concatenate to the non-streamed value. An output cut by ``max_tokens`` is still a call, with the arguments
generated so far and ``finish_reason: length``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from specdeploy_server.api.contract import FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta

_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]{1,64})"\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True)
class ForcedCall:
    name: str
    #: the arguments' JSON text as generated (cut where the output was cut)
    arguments: str
    #: the whole call object was generated
    complete: bool


def parse_forced_call(text: str) -> ForcedCall | None:
    """The call in a forced call's text (so far); None until its name is complete, or when the text is not of
    the grammar's form."""
    head = _HEAD.match(text)
    if head is None:
        return None
    rest = text[head.end() :].rstrip()
    if rest.endswith("}"):
        try:
            whole = json.loads(text)
        except ValueError:
            whole = None
        if isinstance(whole, dict) and whole.get("name") == head.group(1) and "arguments" in whole:
            return ForcedCall(head.group(1), rest[:-1].rstrip(), complete=True)
    return ForcedCall(head.group(1), rest, complete=False)


def cut_call(text: str, names: frozenset[str]) -> ForcedCall | None:
    """The call of an output cut before its arguments began, when what was generated can only be one tool's
    call (the grammar writes ``{"name":"<tool>","arguments":`` without spaces): that call, its arguments
    empty; None otherwise."""
    generated = text.strip()
    candidates = [name for name in names if f'{{"name":"{name}","arguments":'.startswith(generated)]
    return ForcedCall(candidates[0], "", complete=False) if len(candidates) == 1 else None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def forced_tool_call(call: ForcedCall) -> ToolCall:
    return ToolCall(
        id=new_call_id(), type="function", function=FunctionCall(name=call.name, arguments=call.arguments)
    )


def per_chunk(deltas: list[ToolCallDelta]) -> list[list[ToolCallDelta]]:
    """``deltas`` in the chunks they go out in: a new chunk wherever a call already has a delta in the current
    one (a call's opening, then its first fragment), as OpenAI sends at most one delta per call in a chunk;
    clients read only the first (instructor's partial streaming does)."""
    groups: list[list[ToolCallDelta]] = []
    for delta in deltas:
        if not groups or any(d.index == delta.index for d in groups[-1]):
            groups.append([])
        groups[-1].append(delta)
    return groups


class ForcedCallStream:
    """One choice's forced call, streamed: :meth:`feed` each text delta, get the tool-call deltas to send."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.text = ""
        self.call: ForcedCall | None = None
        self._id: str | None = None
        self._sent = 0

    def feed(self, text: str, finished: bool = False) -> list[ToolCallDelta]:
        """The deltas ``text`` adds; ``finished``: the output ends with it (a call cut before its name was
        complete is still sent when the name can only be one tool's)."""
        self.text += text
        call = self.call = parse_forced_call(self.text)
        if call is None and finished:
            call = self.call = cut_call(self.text, self.names)
        if call is None:
            return []
        out: list[ToolCallDelta] = []
        if self._id is None:
            self._id = new_call_id()
            function = FunctionCallDelta(name=call.name, arguments="")
            out.append(ToolCallDelta(index=0, id=self._id, type="function", function=function))
        if len(call.arguments) > self._sent:
            fragment = call.arguments[self._sent :]
            self._sent = len(call.arguments)
            out.append(ToolCallDelta(index=0, function=FunctionCallDelta(arguments=fragment)))
        return out
