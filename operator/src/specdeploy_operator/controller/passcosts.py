"""`status.speculation.passCosts`: what a pass costs by its size, from the `trtllm-llmapi` servers' summaries
`specdeploy_target_pass_seconds{tokens}` and `specdeploy_draft_pass_seconds{sequences}` (count and sum per
size bucket), windowed like the other speculation counters (speculation.py).

A window's mean per size counts where at least `MIN_PASSES` passes were measured; the status keeps, for every
size, the latest window that measured it (`merge`), so a size measured under yesterday's load is not
forgotten because today's traffic did not reach it. The serving ConfigMap hands them to the next pods
(builders/measured.py), whose `draft_len_schedule` is computed from them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from prometheus_client.metrics_core import Metric

__all__ = [
    "FAMILIES",
    "MIN_PASSES",
    "PassSums",
    "changed",
    "deltas",
    "figures",
    "merge",
    "parse_family",
]

#: summary family -> (kind in `passCosts`, its size label and field)
FAMILIES: Final = {
    "specdeploy_target_pass_seconds": ("target", "tokens"),
    "specdeploy_draft_pass_seconds": ("draft", "sequences"),
}
#: kind -> its size field
FAMILIES_BY_KIND: Final = dict(FAMILIES.values())
#: passes a window needs at a size before its mean replaces the published one
MIN_PASSES: Final = 8
#: relative change of a size's seconds worth a status write
CHANGE: Final = 0.10
#: sizes kept per kind (the CRD's maxItems)
MAX_SIZES: Final = 32

#: (kind, size) -> (count, seconds), summed over labels
PassSums = dict[tuple[str, int], tuple[float, float]]


def parse_family(family: Metric, into: PassSums) -> None:
    """Add one summary family of `FAMILIES` to `into`."""
    kind, label = FAMILIES[family.name]
    for sample in family.samples:
        size_text = sample.labels.get(label, "")
        if not size_text.isdigit() or int(size_text) < 1:
            continue
        count, seconds = into.get((kind, int(size_text)), (0.0, 0.0))
        if sample.name.endswith("_count"):
            count += sample.value
        elif sample.name.endswith("_sum"):
            seconds += sample.value
        into[(kind, int(size_text))] = (count, seconds)


def deltas(before: PassSums, now: PassSums) -> PassSums | None:
    """What a pod measured between two scrapes; None when a counter went down (the server restarted)."""
    out: PassSums = {}
    for key, (count, seconds) in now.items():
        old_count, old_seconds = before.get(key, (0.0, 0.0))
        if count < old_count or seconds < old_seconds - 1e-9:
            return None
        if count > old_count:
            out[key] = (count - old_count, seconds - old_seconds)
    return out


def figures(window: PassSums) -> dict[str, list[dict[str, Any]]]:
    """The window's `passCosts` (sizes with at least `MIN_PASSES` passes; empty kinds left out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for (kind, size), (count, seconds) in sorted(window.items()):
        if count < MIN_PASSES:
            continue
        label = FAMILIES_BY_KIND[kind]
        out.setdefault(kind, []).append(
            {label: size, "seconds": float(f"{seconds / count:.6g}"), "count": int(count)}
        )
    return out


def _by_size(entries: Iterable[Mapping[str, Any]] | None, label: str) -> dict[int, Mapping[str, Any]]:
    return {int(e[label]): e for e in entries or () if isinstance(e, Mapping) and label in e}


def merge(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    """`new`'s sizes over `old`'s, per kind (at most `MAX_SIZES` per kind: the most measured)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, label in FAMILIES_BY_KIND.items():
        sizes = {**_by_size((old or {}).get(kind), label), **_by_size((new or {}).get(kind), label)}
        if not sizes:
            continue
        kept = sorted(sizes.items(), key=lambda item: -int(item[1].get("count") or 0))[:MAX_SIZES]
        out[kind] = [dict(entry) for _, entry in sorted(kept)]
    return out


def changed(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether `new` measures a size `old` has not, or one whose seconds moved by `CHANGE` or more."""
    for kind, label in FAMILIES_BY_KIND.items():
        before = _by_size((old or {}).get(kind), label)
        for size, entry in _by_size((new or {}).get(kind), label).items():
            if size not in before:
                return True
            a, b = float(before[size]["seconds"]), float(entry["seconds"])
            if not math.isclose(a, b, rel_tol=CHANGE, abs_tol=1e-12):
                return True
    return False
