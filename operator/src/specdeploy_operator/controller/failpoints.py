"""Fault injection for the reliability campaign (benchmarks/operator_faults.py): the operator kills itself
with SIGKILL at a named point of its write path, as a node failure would, so that a restart can be shown to
converge from exactly there.

`SPECDEPLOY_FAILPOINT=<point>` (or `<point>#<n>`: at the n-th time it is reached, default the first) arms one
point; unset, `hit` costs one comparison. Points are named by `Kube.request` around every write:
`before:<VERB> <resource>` and `after:<VERB> <resource>`, e.g. `before:POST jobs`,
`after:PATCH speculativedeployments/status`, `before:DELETE enginebuilds`. Reads are kopf's and never fail
here.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Final

__all__ = ["ENV", "hit"]

ENV: Final = "SPECDEPLOY_FAILPOINT"
log = logging.getLogger(__name__)


def _armed() -> tuple[str, int] | None:
    raw = os.environ.get(ENV, "")
    if not raw:
        return None
    point, _, nth = raw.partition("#")
    return point, int(nth or "1")


_ARMED: Final = _armed()
_seen = 0


def hit(point: str) -> None:
    """Reached `point`: die here if it is the armed one (its n-th time)."""
    global _seen  # noqa: PLW0603 - one counter per process, as the point is
    if _ARMED is None or point != _ARMED[0]:
        return
    _seen += 1
    if _seen >= _ARMED[1]:
        log.warning("failpoint reached: SIGKILL", extra={"point": point, "times": _seen})
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
