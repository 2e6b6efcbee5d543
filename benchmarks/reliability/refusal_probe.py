"""The flood's refusal probe, in a process of its own: whenever the server's queue gauge reads full, one
request on its own keep-alive connection, timed; until ``requests`` were sent or its stdin closes.

python -m benchmarks.reliability.refusal_probe BASE_URL MODEL CAPACITY REQUESTS
prints ``ready`` once its connection is up and the first gauge read, then, at the end,
``{"statuses": {status: count}, "refused_seconds": [...]}``

A process of its own so that what it times is the server: not the flooding client's event loop (a thousand
connections on the same cores), nor that client's garbage collections, which stop every thread of its process.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.reliability.hostile import completion_body
from benchmarks.reliability.probes import IDLE_GAUGES


def queue_full(client: httpx.Client, capacity: int) -> bool:
    text = client.get("/metrics").text
    depth = [
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == IDLE_GAUGES[0]
    ]
    return bool(depth) and depth[0] >= capacity


def probe(
    base_url: str, model: str, capacity: int, requests: int, stop: threading.Event
) -> dict[str, object]:
    statuses: dict[str, int] = {}
    refused: list[float] = []
    with httpx.Client(base_url=base_url, timeout=60) as client:
        queue_full(client, capacity)
        print("ready", flush=True)
        for i in range(requests):
            while not stop.is_set() and not queue_full(client, capacity):
                time.sleep(0.01)
            if stop.is_set():
                break
            started = time.monotonic()
            response = client.post("/v1/completions", json=completion_body(model, i, False, 4))
            statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
            if response.status_code == 503:
                refused.append(time.monotonic() - started)
    return {"statuses": statuses, "refused_seconds": refused}


def main(argv: list[str]) -> int:
    base_url, model, capacity, requests = argv[0], argv[1], int(argv[2]), int(argv[3])
    stop = threading.Event()

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    print(json.dumps(probe(base_url, model, capacity, requests, stop)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
