"""Stored responses (``store``, the default), for ``previous_response_id`` and ``GET``/``DELETE``: in the
memory of the pod that served them, bounded in number and size, each kept for a fixed time.

Behind a Service with several replicas a follow-up request may reach another pod, which does not know the
response: it gets the 400 ``previous_response_not_found`` (docs/server.md says how to avoid that).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdeploy_server.api.contract import body
from specdeploy_server.api.responses_api.contract import Response

#: how long a stored response is kept, in seconds
DEFAULT_TTL_SECONDS = 3600.0
#: most responses kept; the oldest go first
DEFAULT_MAX_RESPONSES = 1024
#: most characters of JSON (responses and their conversations) kept; the oldest go first
DEFAULT_MAX_CHARS = 64 * 1024 * 1024


@dataclass(frozen=True)
class Stored:
    response: Response
    #: the conversation up to and including this response: every input item of it and of the responses
    #: before it, and every output item, as Responses items (what ``previous_response_id`` continues)
    conversation: list[dict[str, Any]]
    expires: float
    chars: int


class ResponseStore:
    def __init__(
        self,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        max_responses: int = DEFAULT_MAX_RESPONSES,
        max_chars: int = DEFAULT_MAX_CHARS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._clock = clock
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response: Response, conversation: list[dict[str, Any]]) -> None:
        """Keep ``response`` (replacing one of its id) and its conversation; a pair larger than the whole
        budget is not kept."""
        chars = len(json.dumps(body(response))) + len(json.dumps(conversation))
        self.delete(response.id)
        if chars > self.max_chars:
            return
        self._entries[response.id] = Stored(response, conversation, self._clock() + self.ttl_seconds, chars)
        self._chars += chars
        while len(self._entries) > self.max_responses or self._chars > self.max_chars:
            self._drop(next(iter(self._entries)))

    def get(self, response_id: str) -> Stored | None:
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        if response_id not in self._entries:
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        self._chars -= self._entries.pop(response_id).chars

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:  # in insertion order, which is expiry order (one TTL for all)
            oldest, entry = next(iter(self._entries.items()))
            if entry.expires > now:
                return
            self._drop(oldest)
