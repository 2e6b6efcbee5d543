"""One policy for the request fields the server does not implement, for every endpoint's request model.

Every request model derives from ``protocol._Request``, whose validator hands the fields it does not declare
here (:func:`screen`):

* OpenAI fields that change nothing the server computes (:data:`ACCEPTED`) are accepted without a word;
* OpenAI fields it does not implement (:data:`REFUSED`) get a 400 naming the field whenever they are set to
  something that would change the answer, whatever the policy;
* any other field is unknown: a ``warn`` server (the default, as vLLM) accepts the request and logs the
  fields' names (a warning the first time a set of names is seen, then at debug level); a ``refuse`` server
  answers 400 naming the first of them, as OpenAI does (``serving.unknownFields``, ``--unknown-fields``).

The policy is the serving app's: :class:`UnknownFieldsPolicy` puts it in the request's context, where the
model's validator (run by FastAPI while it parses the body) reads it.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping
from typing import Any, Literal

from starlette.types import ASGIApp, Receive, Scope, Send

from specdeploy_server.api.errors import BadRequestError

log = logging.getLogger(__name__)

UnknownFields = Literal["warn", "refuse"]
DEFAULT_UNKNOWN_FIELDS: UnknownFields = "warn"

#: OpenAI request fields that change nothing the server computes: accepted on purpose, and not logged
ACCEPTED: Mapping[str, str] = {
    "metadata": "tags for OpenAI's dashboard",
    "store": "OpenAI's stored completions (nothing is stored here)",
    "service_tier": "OpenAI's processing tiers",
    "prompt_cache_key": "OpenAI's prompt cache routing",
    "safety_identifier": "OpenAI's abuse monitoring",
    "parallel_tool_calls": "an output has at most one tool call here, which satisfies either value",
}

#: OpenAI request fields the server does not implement, refused when set (a null, an empty value, or the
#: value listed here changes nothing and passes)
REFUSED: Mapping[str, tuple[str, Any]] = {
    "audio": ("audio output is not supported", None),
    "modalities": ("only text output is supported", ["text"]),
    "functions": ("the deprecated 'functions' is not supported; use 'tools'", None),
    "function_call": ("the deprecated 'function_call' is not supported; use 'tool_choice'", "none"),
    "web_search_options": ("web search is not supported", None),
    "reasoning_effort": ("the served model has no reasoning-effort setting", None),
    "verbosity": ("the served model has no verbosity setting", None),
}

_POLICY: contextvars.ContextVar[UnknownFields] = contextvars.ContextVar(
    "unknown_fields", default=DEFAULT_UNKNOWN_FIELDS
)
#: the sets of unknown names already warned about (later: debug level); bounded, as names come from clients
_WARNED: set[tuple[str, ...]] = set()
MAX_WARNED = 256
#: at most this many names, each cut to this many characters, go into a log line (they come from clients)
MAX_LOGGED = 16
MAX_NAME = 64


def screen(model: str, extra: Mapping[str, Any]) -> None:
    """Apply the policy to the fields a request model of class ``model`` did not declare."""
    if not extra:
        return
    for name, value in extra.items():
        refused = REFUSED.get(name)
        if refused is not None and value not in (None, "", [], {}, refused[1]):
            raise BadRequestError(f"'{name}': {refused[0]}", param=name)
    unknown = tuple(sorted(name for name in extra if name not in ACCEPTED and name not in REFUSED))
    if not unknown:
        return
    if _POLICY.get() == "refuse":
        raise BadRequestError(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    level = logging.DEBUG if unknown in _WARNED else logging.WARNING
    if len(_WARNED) < MAX_WARNED:
        _WARNED.add(unknown)
    names = [_printable(name) for name in unknown[:MAX_LOGGED]]
    more = f" and {len(unknown) - MAX_LOGGED} more" if len(unknown) > MAX_LOGGED else ""
    log.log(
        level,
        "%s: ignored fields this server does not implement: %s%s",
        model,
        ", ".join(names),
        more,
        extra={"fields": {"request": model, "ignored_fields": names}},
    )


def _printable(name: str) -> str:
    """A client's field name as a log can hold it: ASCII, escapes for the rest, at most 64 characters."""
    text = ascii(name)[1:-1]
    return text if len(text) <= MAX_NAME else text[: MAX_NAME - 3] + "..."


class UnknownFieldsPolicy:
    """Pure ASGI middleware: the app's policy for unknown request fields, in each request's context."""

    def __init__(self, app: ASGIApp, policy: UnknownFields) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _POLICY.set(self.policy)
        try:
            await self.app(scope, receive, send)
        finally:
            _POLICY.reset(token)
