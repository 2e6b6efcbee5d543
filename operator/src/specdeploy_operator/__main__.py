"""`python -m specdeploy_operator` (or `specdeploy-operator`): run the operator against a cluster.

    python -m specdeploy_operator [--kubeconfig PATH] [--health-port 8080] [--metrics-port 8081]
                                  [--peering NAME]

Credentials: `--kubeconfig`, else the in-cluster service account, else `$KUBECONFIG` / `~/.kube/config`.
Settings: `SPECDEPLOY_*` environment variables (`OperatorSettings`); `SPECDEPLOY_WATCH_NAMESPACES` limits
the operator to those namespaces, otherwise it watches the whole cluster. Health: kopf's liveness endpoint
at `http://0.0.0.0:<health-port>/healthz`. Metrics: Prometheus text at `:<metrics-port>/metrics`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import secrets
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import kopf
from prometheus_client import start_http_server
from pydantic import ValidationError

from specdeploy_operator.api import ENGINE_BUILD, GROUP, SPECULATIVE_DEPLOYMENT, VERSION
from specdeploy_operator.builders import OperatorSettings
from specdeploy_operator.controller.discovery import wait_until_served
from specdeploy_operator.controller.handlers import NoEssence, register
from specdeploy_operator.controller.kube import Kube
from specdeploy_operator.controller.reconciler import Reconciler

__all__ = ["main"]

log = logging.getLogger("specdeploy_operator")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extra fields."""

    _standard = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in self._standard and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specdeploy-operator", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--health-port", type=int, default=8080, help="liveness endpoint port (0: off)")
    parser.add_argument("--metrics-port", type=int, default=8081, help="Prometheus metrics port (0: off)")
    parser.add_argument(
        "--peering",
        metavar="NAME",
        help="kopf peering object name, for several replicas (default: standalone, one replica)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kopf logs every event it handles at debug/info; keep its warnings and errors.
    logging.getLogger("kopf").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


class EndlessBackoffs:
    """kopf's pauses between retries of a failed API request (1, 1, 2, 3, 5, 8, 13 s), then 21 s for ever.

    kopf gives up on a request after its last pause and raises; when that request is a watch's (the
    namespace observer's among them), the whole operator stops, so an API server away for longer than the
    pauses add up to (54 s) would end the process. Controllers built on client-go retry without end; so does
    this operator. Not sized, so kopf counts no attempts; iterable again for every request."""

    def __iter__(self) -> Iterator[float]:
        return itertools.chain((1, 1, 2, 3, 5, 8, 13), itertools.repeat(21))


def build_settings(settings: kopf.OperatorSettings, peering: str | None, lifetime: int = 60) -> None:
    settings.networking.error_backoffs = EndlessBackoffs()
    settings.posting.enabled = False  # events are posted by the reconciler, on milestones only
    settings.persistence.diffbase_storage = NoEssence()  # no handler reads kopf's per-event diffs
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    if peering:
        settings.peering.name = peering
        settings.peering.mandatory = True
        settings.peering.standalone = False
        # kopf lets the highest priority work and pauses the others; equal priorities would all work at
        # once. A random one per process makes exactly one replica active, the others standbys.
        settings.peering.priority = secrets.randbelow(1_000_000) + 1
        settings.peering.lifetime = lifetime
    else:
        settings.peering.standalone = True


async def run(args: argparse.Namespace, settings: OperatorSettings) -> None:
    kube = Kube.from_environment(args.kubeconfig)
    reconciler = Reconciler(kube, settings, workers=settings.workers)
    lifetime = settings.peering_lifetime_seconds
    registry = kopf.OperatorRegistry()
    register(registry)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        build_settings(settings, args.peering, lifetime)

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if args.kubeconfig is None:
            info = kopf.login_with_service_account(**kwargs)
            if info is not None:
                return info
        return kopf.login_with_kubeconfig(**kwargs)

    # kopf reads discovery once: start it only once the CRDs' kinds are served (controller/discovery.py).
    await wait_until_served(kube, GROUP, VERSION, (SPECULATIVE_DEPLOYMENT.plural, ENGINE_BUILD.plural))
    liveness = f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
    namespaces = list(settings.watch_namespaces)
    log.info(
        "starting",
        extra={"namespaces": ",".join(namespaces) or "*", "peering": args.peering or "standalone"},
    )
    await kopf.operator(
        registry=registry,
        memo=kopf.Memo(reconciler=reconciler),
        clusterwide=not namespaces,
        namespaces=namespaces,
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=liveness,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it too
    try:
        settings = OperatorSettings.from_env(os.environ)
    except ValidationError as error:
        for problem in error.errors():
            field = str(problem["loc"][0]) if problem["loc"] else "?"
            print(f"specdeploy-operator: SPECDEPLOY_{field.upper()}: {problem['msg']}", file=sys.stderr)
        return 2
    if args.metrics_port:
        start_http_server(args.metrics_port)
    try:
        asyncio.run(run(args, settings))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
