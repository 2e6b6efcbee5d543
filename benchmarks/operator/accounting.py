"""Request accounting: the apiserver's audit log (only the operator's identity is audited), the operator's
own counters, warnings in its log, and its memory and CPU time."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "METRIC",
    "AuditEntry",
    "ProcessUsage",
    "by_verb_resource",
    "diff",
    "metric_requests",
    "operator_log_problems",
    "process_usage",
    "read_audit",
    "status_writes",
    "window",
]

METRIC = "specdeploy_operator_api_requests_total"


def parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class AuditEntry:
    received: float
    verb: str
    resource: str
    code: int


def read_audit(path: Path) -> list[AuditEntry]:
    entries = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" and event.get("stage") != "Panic":
            continue
        ref = event.get("objectRef") or {}
        if ref.get("resource"):
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        else:
            resource = "(non-resource) " + str(event.get("requestURI", "")).split("?")[0]
        entries.append(
            AuditEntry(
                parse_time(event["requestReceivedTimestamp"]),
                str(event.get("verb")),
                resource,
                int((event.get("responseStatus") or {}).get("code", 0)),
            )
        )
    return entries


def window(entries: Iterable[AuditEntry], start: float, end: float) -> list[AuditEntry]:
    return [e for e in entries if start <= e.received < end]


def by_verb_resource(entries: Iterable[AuditEntry]) -> Counter[tuple[str, str]]:
    return Counter((e.verb, e.resource) for e in entries)


def metric_requests(samples: Mapping[str, float]) -> Counter[tuple[str, str]]:
    """`specdeploy_operator_api_requests_total{verb,resource,code}` summed over code."""
    out: Counter[tuple[str, str]] = Counter()
    for name, value in samples.items():
        if not name.startswith(METRIC + "{"):
            continue
        labels = dict(part.split("=", 1) for part in name[len(METRIC) + 1 : -1].split(",") if "=" in part)
        key = (labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"'))
        out[key] += int(value)
    return out


def diff(after: Counter[tuple[str, str]], before: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    out = Counter(after)
    out.subtract(before)
    return Counter({k: v for k, v in out.items() if v})


def status_writes(samples: Mapping[str, float]) -> dict[str, int]:
    prefix = "specdeploy_operator_status_writes_total{"
    return {
        name[len(prefix) :].split('"')[1]: int(v) for name, v in samples.items() if name.startswith(prefix)
    }


def operator_log_problems(log: Path, since: float) -> tuple[Counter[str], list[str]]:
    """Warnings and errors in the operator's JSON log since `since` (wall clock): counts by level and
    message, and the first few lines."""
    counts: Counter[str] = Counter()
    lines: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            if line.startswith("---"):
                continue
            counts["(not JSON)"] += 1
            if len(lines) < 5:
                lines.append(line[:300])
            continue
        if entry.get("level") not in ("warning", "error", "critical"):
            continue
        counts[f"{entry['level']}: {entry.get('message', '')[:80]}"] += 1
        if len(lines) < 5:
            lines.append(line[:500])
    return counts, lines


@dataclass(frozen=True)
class ProcessUsage:
    """A process's memory and CPU time at one moment, from /proc."""

    rss_mib: float  # resident now
    peak_rss_mib: float  # the most it was resident so far (VmHWM)
    cpu_seconds: float  # user + system time so far


def process_usage(pid: int) -> ProcessUsage:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )

    def mib(name: str) -> float:
        return int(fields[name].split()[0]) / 1024  # "123456 kB"

    # /proc/<pid>/stat: the fields after the command's closing parenthesis start with field 3 (state);
    # utime and stime are fields 14 and 15, in clock ticks.
    after_comm = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(after_comm[11]) + int(after_comm[12])
    return ProcessUsage(mib("VmRSS"), mib("VmHWM"), ticks / os.sysconf("SC_CLK_TCK"))
