"""The state the parts of the TensorRT-LLM double share: what the double was given and what it did.

One state at a time is current; the ``trtllm_double`` fixture installs a fresh one for each test, and every
part of the double reads the current one (:func:`current_state`) when it needs it, never at import. Objects
of the double's other modules are typed loosely here so that this module, which they all read, imports none
of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DoubleState:
    """What the double was given and what it did, for the tests to inspect and steer."""

    checkpoints: dict[Path, Path] = field(default_factory=dict)  # engine dir -> HF checkpoint it stands for
    executors: list[Any] = field(default_factory=list)  # every Executor opened (trtllm_double_executor)
    llms: list[Any] = field(default_factory=list)  # every LLM created (trtllm_double_llmapi)
    cancelled: list[int] = field(default_factory=list)  # cancel_request calls on requests in flight
    cancelled_in_flight: list[int] = field(default_factory=list)  # requests that ended CANCELLED
    ignored_cancels: list[int] = field(default_factory=list)  # cancel_request on already terminated requests
    #: a Request (of the bindings) -> an error message: the executor answers with an error Response instead
    #: of running it, the LLM's generate_async raises
    fail_when: Callable[[Any], str | None] | None = None
    request_delay: float = 0.0  # seconds each request (executor) / response (LLM) takes at least
    #: a target request with draft tokens keeps decoding up to max_tokens after the verified part
    continue_after_verify: bool = False
    #: request_perf_metrics.speculative_decoding carries real counts (False: zeroed, as in 1.2.x)
    perf_metrics_count_speculation: bool = False


_current = DoubleState()


def current_state() -> DoubleState:
    """The state of the test that installed the double (or a default one outside any test)."""
    return _current


def install_state(state: DoubleState) -> DoubleState:
    """Make ``state`` the current state; returns it."""
    global _current  # noqa: PLW0603 (the one place that swaps the state)
    _current = state
    return state
