"""Waiting, at start-up, until the API server's discovery serves the kinds the operator watches.

kopf reads discovery once when it starts and afterwards learns of new resources only from changes to CRDs.
An operator started before its CRDs are installed, or in the moment between a CRD becoming Established and
its group appearing in discovery, would watch nothing and stay silent until some CRD changes. So the
operator waits for its group first, and says so in its log while it waits."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection

import aiohttp

from .kube import ApiError, Kube

log = logging.getLogger(__name__)


async def served_kinds(kube: Kube, group: str, version: str) -> frozenset[str]:
    """The resources (plurals) discovery serves for `group`/`version`; empty while the group is absent."""
    groups = await kube.request("GET", "/apis", resource="discovery")
    if not any(g.get("name") == group for g in groups.get("groups", [])):
        return frozenset()
    try:
        listed = await kube.request("GET", f"/apis/{group}/{version}", resource="discovery")
    except ApiError as error:
        if error.status == 404:
            return frozenset()
        raise
    return frozenset(str(r["name"]) for r in listed.get("resources", []) if "/" not in str(r["name"]))


async def wait_until_served(
    kube: Kube,
    group: str,
    version: str,
    plurals: Collection[str],
    *,
    interval: float = 1.0,
    report_every: float = 30.0,
) -> None:
    """Return once discovery serves every one of `plurals` in `group`/`version`; until then poll every
    `interval` seconds, logging what is missing every `report_every` seconds (API errors included)."""
    wanted = frozenset(plurals)
    reported = float("-inf")
    while True:
        problem: str
        try:
            missing = wanted - await served_kinds(kube, group, version)
            if not missing:
                return
            problem = f"not served yet: {', '.join(sorted(missing))} (are the CRDs installed?)"
        except (TimeoutError, ApiError, aiohttp.ClientError, OSError) as error:
            problem = f"discovery failed: {error}"
        now = time.monotonic()
        if now - reported >= report_every:
            log.warning("waiting for the API", extra={"group": f"{group}/{version}", "problem": problem})
            reported = now
        await asyncio.sleep(interval)
