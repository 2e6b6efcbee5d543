"""Hostile clients against a live uvicorn server over stand-in executors, at sizes that fit `make test` (the
campaign, `make chaos`, runs them bigger against the real server process: docs/reliability.md)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.api.limits import DRAIN_BYTES
from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.core.scheduler import SchedulerSettings

from benchmarks.reliability import flood, hostile
from benchmarks.reliability.soak import soak
from tests.server.conftest import LiveServer, run_live

BATCH, QUEUE = 4, 8
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    settings = SchedulerSettings(max_model_len=128, max_batch_size=BATCH, max_queue_size=QUEUE, draft_len=3)
    engine, _ = standin_engine(0.002, 0.0, alpha=0.7, settings=settings)
    with run_live(create_app(engine, max_request_body_bytes=BODY_LIMIT)) as live:
        yield live


def test_a_flood_beyond_the_queue_bound_is_refused_with_retry_after_and_leaves_the_queue_empty() -> None:
    # slower steps than the other tests' server, so that the queue stays full while the probe runs
    settings = SchedulerSettings(max_model_len=128, max_batch_size=BATCH, max_queue_size=QUEUE, draft_len=3)
    engine, _ = standin_engine(0.01, 0.0, alpha=0.7, settings=settings)
    with run_live(create_app(engine)) as server:
        # What is refused and served, not how fast: that is the campaign's (`make chaos`), with the server in
        # a process of its own.
        flooding = flood.flood(
            server.base_url, "standin", count=300, max_tokens=40, capacity=BATCH + QUEUE, probe_bound_ms=None
        )
        outcome = asyncio.run(flooding)
    assert outcome.problems == []
    assert outcome.figures["refused"] > 0
    assert outcome.figures["served"] >= BATCH + QUEUE
    assert outcome.figures["seconds_to_idle"] is not None


def test_the_served_median_is_bounded_below_by_the_edge_of_its_histogram_bucket() -> None:
    before = {0.1: 2.0, 1.0: 3.0, 10.0: 3.0, float("inf"): 3.0}
    after = {0.1: 3.0, 1.0: 5.0, 10.0: 9.0, float("inf"): 9.0}  # 6 more: 1 <= 0.1 s, 1 <= 1 s, 4 <= 10 s
    assert flood.served_median_floor(before, after) == 1.0
    assert flood.served_median_floor(after, after) is None


def test_clients_vanishing_at_random_points_free_every_slot_and_fail_no_bystander(server: LiveServer) -> None:
    outcome = asyncio.run(hostile.disconnects(server.base_url, "standin", 300, concurrency=BATCH + QUEUE))
    assert outcome.problems == []
    assert outcome.figures["innocent_ok"] == outcome.figures["innocent"] > 0
    assert outcome.figures["vanished"] > 200


def test_slow_and_idle_connections_do_not_hold_up_other_clients(server: LiveServer) -> None:
    outcome = asyncio.run(
        hostile.slow_clients(server.base_url, "standin", connections=60, probe_requests=20, floor_ms=None)
    )
    assert outcome.problems == []
    assert outcome.figures["held"] > 0, "every slow connection was gone before the ordinary requests"


def test_bodies_over_the_limit_get_413_without_being_read_whole(server: LiveServer) -> None:
    outcome = asyncio.run(hostile.oversized(server.base_url, BODY_LIMIT))
    assert outcome.problems == []
    assert outcome.figures["endless_sent_bytes"] < outcome.figures["endless_planned_bytes"]


def test_a_body_far_over_the_limit_sent_whole_still_gets_its_413_read(server: LiveServer) -> None:
    """64 x the limit, far beyond what the server drains before its 413: it closes the connection with the
    body still coming (the client's write is reset), and a client that reads after sending still gets the
    413."""
    split = urlsplit(server.base_url)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {split.hostname}\r\nContent-Type: application/json\r\n"
    payload = b'{"model": "' + b"x" * (64 * BODY_LIMIT + DRAIN_BYTES) + b'"}'
    answer = hostile.send_then_read(split.hostname or "", split.port or 80, head, payload)
    assert answer.status == 413, answer.error
    assert json.loads(answer.body)["error"]["code"] == "request_too_large"


def test_mixed_load_with_cancellations_leaves_no_descriptor_open(server: LiveServer) -> None:
    """The short form of the campaign's soak: the server runs in this process, so only its descriptors (not
    its memory, shared with the test) say something here."""
    outcome = asyncio.run(soak(server.base_url, "standin", os.getpid(), seconds=4, workers=4))
    assert outcome.figures["errors"] == 0, outcome.problems
    assert outcome.figures["fds_idle_after"] <= outcome.figures["fds_idle_before"]
    assert outcome.figures["requests"] > 20
