"""`status.speculation`: whether speculation pays off, measured on the ready serving pods.

Every `speculation_interval_seconds` the sampler scrapes `/metrics` of each deployment's ready pods (the
operator reaches pod IPs as Prometheus does) and keeps, per pod, the counters of the last scrape. The figures
of a window are counter deltas between two scrapes, summed over the pods scraped at both ends (a pod that
restarted, its counters lower, or that could not be scraped, is skipped and counted). They are published,
and the deployment queued for a reconcile that writes them, only when they differ meaningfully from the
published ones (`CHANGE`): an idle deployment (no step in the window) publishes nothing, so its status is
never rewritten, and no deployment is written more than once per interval. `SpeculationEffective` judges the
last window that drafted at least `MIN_DRAFTED_FOR_ALARM` tokens: the tail of a burst (a request or two) is
published but leaves the verdict of the traffic before it standing.

Why scrape pods rather than query Prometheus: the operator must not depend on a monitoring stack to tell a
user whether their draft fits (most clusters that try speculative decoding have none wired to these
metrics), it already knows the ready pods from its own watch, and one small scrape per pod per 30 s costs
less than the Prometheus queries would. A cluster with Prometheus has the same counters there for longer
windows (docs/operator.md, "Speculation figures").
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from specdeploy_operator.api import ConditionStatus, ConditionType, KubeCondition, Reason, ServingSpec

from . import metrics, passcosts
from .conditions import ConditionSpec, rfc3339
from .indexes import every, one

__all__ = [
    "CANARY_PREFIX",
    "COUNTERS",
    "PodSample",
    "SpeculationSampler",
    "Window",
    "close_metrics_session",
    "effectiveness_condition",
    "fetch_metrics",
    "meaningful_change",
    "parse_sample",
    "speculation_targets",
    "window",
]

log = logging.getLogger("specdeploy.speculation")

Obj = dict[str, Any]
Fetch = Callable[[str], Awaitable[str]]

# Server counter (family name, without `_total`) -> PodSample field.
COUNTERS: Final = {
    "specdeploy_draft_tokens": "drafted",
    "specdeploy_accepted_draft_tokens": "accepted",
    "specdeploy_speculative_steps": "steps",
    "specdeploy_generation_tokens": "generated",
    "specdeploy_speculating_steps": "speculating",
}
# Relative change of a published figure that is worth a status write (acceptance: absolute).
CHANGE: Final = {"tokensPerStep": 0.05, "draftLength": 0.05, "tokensPerSecond": 0.10}
ACCEPTANCE_CHANGE: Final = 0.02
# Drafted tokens a window needs before the acceptance rate may raise an alarm (a few requests' worth).
MIN_DRAFTED_FOR_ALARM: Final = 64
SCRAPE_TIMEOUT: Final = 2.0
CONCURRENCY: Final = 32


@dataclass(frozen=True, slots=True)
class PodSample:
    """The speculation counters of one pod's `/metrics` (summed over their labels) at `at` (monotonic s)."""

    at: float
    drafted: float = 0.0
    accepted: float = 0.0
    steps: float = 0.0
    generated: float = 0.0
    speculating: float | None = None  # only servers that export `specdeploy_speculating_steps`
    passes: passcosts.PassSums = field(default_factory=dict)  # trtllm-llmapi's pass costs (passcosts.py)


def parse_sample(text: str, at: float) -> PodSample:
    """The counters of a Prometheus text exposition (`ValueError` if it is not one)."""
    values: dict[str, float] = {}
    passes: passcosts.PassSums = {}
    for family in text_string_to_metric_families(text):
        if family.name in passcosts.FAMILIES:
            passcosts.parse_family(family, passes)
            continue
        name = COUNTERS.get(family.name)
        if name is None:
            continue
        total = sum(s.value for s in family.samples if s.name.endswith("_total"))
        values[name] = values.get(name, 0.0) + total
    return PodSample(at=at, passes=passes, **values)


@dataclass(frozen=True, slots=True)
class Window:
    """Deltas over one window, all pods together."""

    seconds: float
    pods: int
    skipped: int
    drafted: float
    accepted: float
    steps: float
    generated: float
    speculating: float | None
    passes: passcosts.PassSums = field(default_factory=dict)

    def figures(self, measured_at: datetime) -> Obj:
        """`status.speculation` for this window (figures rounded for display; `acceptanceRate` unset when
        nothing was drafted)."""
        out: Obj = {
            "tokensPerStep": round(self.generated / self.steps, 3),
            "draftLength": round(self.drafted / self.steps, 3),
            "tokensPerSecond": round(self.generated / self.seconds, 1) if self.seconds > 0 else 0.0,
            "windowSeconds": round(self.seconds, 1),
            "measuredAt": rfc3339(measured_at),
            "pods": self.pods,
            "podsSkipped": self.skipped,
        }
        if self.drafted > 0:
            out["acceptanceRate"] = round(min(1.0, self.accepted / self.drafted), 3)
        if self.speculating is not None:
            out["speculatingFraction"] = round(min(1.0, self.speculating / self.steps), 3)
        costs = passcosts.figures(self.passes)
        if costs:
            out["passCosts"] = costs
        return out


def window(previous: Mapping[str, PodSample], current: Mapping[str, PodSample], failed: int) -> Window | None:
    """The window between two scrapes of the same pods; None when no pod took a step in it (idle) or no pod
    was scraped at both ends. Pods whose counters went down (a restarted server) are skipped."""
    totals = dict.fromkeys(("drafted", "accepted", "steps", "generated"), 0.0)
    speculating: float | None = 0.0
    spans: list[float] = []
    passes: passcosts.PassSums = {}
    skipped = failed
    for pod, now in current.items():
        before = previous.get(pod)
        if before is None:
            continue
        deltas = {k: getattr(now, k) - getattr(before, k) for k in totals}
        pass_deltas = passcosts.deltas(before.passes, now.passes)
        if any(d < 0 for d in deltas.values()) or pass_deltas is None:
            skipped += 1
            continue
        for k, d in deltas.items():
            totals[k] += d
        for key, (count, seconds) in pass_deltas.items():
            old_count, old_seconds = passes.get(key, (0.0, 0.0))
            passes[key] = (old_count + count, old_seconds + seconds)
        if speculating is not None and now.speculating is not None and before.speculating is not None:
            speculating += max(0.0, now.speculating - before.speculating)
        else:
            speculating = None
        spans.append(now.at - before.at)
    if not spans or totals["steps"] <= 0:
        return None
    return Window(
        seconds=max(spans),
        pods=len(spans),
        skipped=skipped,
        speculating=speculating,
        passes=passes,
        **totals,
    )


def meaningful_change(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether `new` figures are worth a status write over the published `old` ones."""
    if not old:
        return True
    if (old.get("acceptanceRate") is None) != (new.get("acceptanceRate") is None):
        return True
    rate = new.get("acceptanceRate")
    if rate is not None and abs(float(rate) - float(old["acceptanceRate"])) >= ACCEPTANCE_CHANGE - 1e-9:
        return True
    for key, threshold in CHANGE.items():
        a, b = float(old.get(key) or 0.0), float(new.get(key) or 0.0)
        if not math.isclose(a, b, rel_tol=threshold, abs_tol=1e-9):
            return True
    if passcosts.changed(old.get("passCosts"), new.get("passCosts")):
        return True
    return old.get("pods") != new.get("pods") or old.get("podsSkipped") != new.get("podsSkipped")


def judgeable(figures: Mapping[str, Any] | None) -> bool:
    """Whether a window drafted enough tokens for its acceptance rate to say anything either way."""
    if not figures or figures.get("acceptanceRate") is None:
        return False
    return float(figures.get("_drafted", 0)) >= MIN_DRAFTED_FOR_ALARM


def effectiveness_condition(figures: Mapping[str, Any] | None, low: float) -> ConditionSpec | None:
    """`SpeculationEffective` for a window's figures; None where it drafted too little to judge (nothing, or
    a few requests' tail): no claim either way."""
    if not figures or not judgeable(figures):
        return None
    rate = float(figures["acceptanceRate"])
    if rate < low:
        return ConditionSpec(
            ConditionType.SPECULATION_EFFECTIVE,
            ConditionStatus.FALSE,
            Reason.LOW_ACCEPTANCE,
            f"the target accepted {rate:.0%} of the draft's tokens "
            f"over the last {figures['windowSeconds']} s "
            f"(below {low:.0%}): the draft does not fit this target or this traffic, and drafting costs "
            "more than it saves",
        )
    return ConditionSpec(
        ConditionType.SPECULATION_EFFECTIVE,
        ConditionStatus.TRUE,
        Reason.ACCEPTANCE_HEALTHY,
        f"acceptance {rate:.0%}, {figures['tokensPerStep']} tokens per target step",
    )


@dataclass
class _Deployment:
    samples: dict[str, PodSample]
    published: Obj | None = None
    judged: Obj | None = None  # the last window that drafted enough to judge the acceptance by


class SpeculationSampler:
    """Scrapes ready pods once per interval and publishes figures that changed (see the module docstring).
    `fetch(url)` returns a `/metrics` body or raises; `clock` gives the wall time of `measuredAt`."""

    def __init__(
        self, fetch: Fetch, clock: Callable[[], datetime], monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._monotonic = monotonic
        self._state: dict[tuple[str, str], _Deployment] = {}
        self.scrape_failures = 0
        self.last_windows: dict[tuple[str, str], Window] = {}
        """The windows of the last `sample` round, by target (idle ones absent)."""

    def published(self, key: tuple[str, str]) -> Obj | None:
        """The figures for `status.speculation` (without the internal `_drafted`), or None."""
        state = self._state.get(key)
        if state is None or state.published is None:
            return None
        return {k: v for k, v in state.published.items() if not k.startswith("_")}

    def condition(self, key: tuple[str, str], low: float) -> ConditionSpec | None:
        state = self._state.get(key)
        """`SpeculationEffective` by the last window that drafted enough to judge: a window of a few requests'
        tail (or no drafting) leaves the verdict of the traffic before it standing."""
        return effectiveness_condition(state.judged if state else None, low)

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop deployments that are gone."""
        for key in list(self._state):
            if key not in keep:
                del self._state[key]

    async def _scrape(self, url: str, gate: asyncio.Semaphore) -> PodSample | None:
        async with gate:
            try:
                text = await asyncio.wait_for(self._fetch(url), SCRAPE_TIMEOUT)
                sample = parse_sample(text, self._monotonic())
            except (OSError, TimeoutError, ValueError, RuntimeError, aiohttp.ClientError) as error:
                self.scrape_failures += 1
                metrics.SPECULATION_SCRAPES.labels("failed").inc()
                log.debug("scrape failed", extra={"url": url, "error": f"{type(error).__name__}: {error}"})
                return None
            metrics.SPECULATION_SCRAPES.labels("ok").inc()
            return sample

    async def sample(
        self, targets: Mapping[tuple[str, str], Sequence[tuple[str, str]]]
    ) -> list[tuple[str, str]]:
        """Scrape `targets` (deployment -> (pod name, metrics URL) of its ready pods); returns the deployments
        whose published figures changed."""
        gate = asyncio.Semaphore(CONCURRENCY)
        jobs = {
            (key, pod): asyncio.ensure_future(self._scrape(url, gate))
            for key, pods in targets.items()
            for pod, url in pods
        }
        if jobs:
            await asyncio.gather(*jobs.values())
        changed = []
        now = self._clock()
        self.last_windows = {}
        for key, pods in targets.items():
            state = self._state.setdefault(key, _Deployment(samples={}))
            current = {pod: s for pod, _ in pods if (s := jobs[(key, pod)].result()) is not None}
            failed = len(pods) - len(current)
            win = window(state.samples, current, failed)
            state.samples = current
            if win is None:
                continue
            self.last_windows[key] = win
            figures = {**win.figures(now), "_drafted": win.drafted}
            verdict_changed = False
            if judgeable(figures):
                verdict_changed = meaningful_change(state.judged, figures)
                state.judged = figures
            if meaningful_change(state.published, figures) or verdict_changed:
                state.published = figures
                changed.append(key)
        self.forget(set(targets))
        return changed


DEFAULT_PORT: Final = ServingSpec.model_fields["port"].default
_session: aiohttp.ClientSession | None = None


async def fetch_metrics(url: str) -> str:
    """GET a pod's `/metrics` (plain HTTP, as Prometheus scrapes it)."""
    global _session  # noqa: PLW0603 - one connection pool for the process's scrapes
    if _session is None:
        _session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT))
    async with _session.get(url) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        return await response.text()


async def close_metrics_session() -> None:
    global _session  # noqa: PLW0603
    if _session is not None:
        await _session.close()
        _session = None


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(
        c.get("type") == KubeCondition.POD_READY and c.get("status") == ConditionStatus.TRUE
        for c in status.get("conditions") or ()
    )


CANARY_PREFIX: Final = "canary/"
"""Sampler keys of canaries: `(namespace, "canary/<DraftTraining>")` (no object name has a `/`)."""


def speculation_targets(indices: Mapping[str, Any]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Deployment -> (pod, `/metrics` URL) of each of its ready serving pods, from the operator's indexes; and
    each canary (`CANARY_PREFIX` + its DraftTraining) -> its ready pods."""
    targets: dict[tuple[str, str], list[tuple[str, str]]] = {}
    sdeps = indices.get("sdeps")
    ports: dict[tuple[str, str], int] = {}
    for key in list(sdeps or ()):
        namespace, name = key
        body = one(sdeps, key) or {}
        port = ((body.get("spec") or {}).get("serving") or {}).get("port") or DEFAULT_PORT
        ports[(namespace, name)] = port
        pods = every(indices.get("pods"), (namespace, "serving", name))
        targets[(namespace, name)] = _urls(pods, port)
    for key in list(indices.get("drafttrainings") or ()):
        namespace, name = key
        deployment = str(
            ((one(indices.get("drafttrainings"), key) or {}).get("spec") or {}).get("deployment")
        )
        pods = every(indices.get("pods"), (namespace, "canary", name))
        if pods and (namespace, deployment) in ports:
            targets[(namespace, CANARY_PREFIX + name)] = _urls(pods, ports[(namespace, deployment)])
    return targets


def _urls(pods: Sequence[Mapping[str, Any]], port: int) -> list[tuple[str, str]]:
    return [
        (str(p["metadata"]["name"]), f"http://{p['status']['podIP']}:{port}/metrics")
        for p in pods
        if _ready(p)
    ]
