"""docs/images/dashboard.png: the chart's dashboard's *Speculation* row, drawn from a real Prometheus.

    python hack/dashboard_picture.py RECORD.json OUT.png

draws the picture from a record, which `record()` writes: every query of the row's panels
(charts/specdeploy/dashboards/specdeploy.json, the file the chart's ConfigMap carries), as range queries
against a Prometheus over a run. tests/integration/test_alerts_live.py writes such a record of its run
(real servers on the local cluster, scraped by its Prometheus) where `SPECDEPLOY_DASHBOARD_RECORD` names
the file; docs/images/dashboard.json is the record the committed picture was drawn from.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[1]
DASHBOARD: Final = REPO / "charts" / "specdeploy" / "dashboards" / "specdeploy.json"
ROW: Final = "Speculation"
RATE_INTERVAL: Final = "30s"
STYLES: Final = ("-", "--", ":")


def row_panels(board: dict[str, Any], row: str = ROW) -> list[dict[str, Any]]:
    """The panels under the row titled `row`."""
    out: list[dict[str, Any]] = []
    current = ""
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
        elif current == row:
            out.append(panel)
    return out


def substitute(expr: str, namespace: str, deployments: list[str]) -> str:
    """Grafana's variables as Grafana sends them: a multi-value variable is a regex alternation."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    return expr.replace("$namespace", namespace).replace("$deployment", "|".join(deployments))


def query_range(prometheus: str, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    args = urllib.parse.urlencode({"query": promql, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{args}", timeout=30) as resp:
        result: list[dict[str, Any]] = json.loads(resp.read())["data"]["result"]
    return result


def record(
    prometheus: str, namespace: str, deployments: list[str], *, start: float, end: float, step: float = 2.0
) -> dict[str, Any]:
    """The row's panels over [start, end]: per panel its title and, per query, the series Prometheus
    returned."""
    board = json.loads(DASHBOARD.read_text())
    panels = []
    for panel in row_panels(board):
        queries = []
        for target in panel["targets"]:
            promql = substitute(target["expr"], namespace, deployments)
            series = query_range(prometheus, promql, start, end, step)
            queries.append({"expr": promql, "legend": target["legendFormat"], "series": series})
        right = [
            o["matcher"]["options"]
            for o in panel["fieldConfig"]["overrides"]
            if {"id": "custom.axisPlacement", "value": "right"} in o["properties"]
        ]
        panels.append(
            {
                "title": panel["title"],
                "unit": panel["fieldConfig"]["defaults"]["unit"],
                "right": right[0] if right else "",
                "queries": queries,
            }
        )
    return {"namespace": namespace, "deployments": deployments, "start": start, "end": end, "panels": panels}


def _legend(template: str, labels: dict[str, str]) -> str:
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def draw(rec: dict[str, Any], out: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only the drawing needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    panels = rec["panels"]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        right = ax.twinx() if panel["right"] else None
        for n, query in enumerate(panel["queries"]):
            for series in query["series"]:
                label = _legend(query["legend"], series["metric"])
                on = right if right is not None and re.fullmatch(panel["right"], label) else ax
                points = [(float(t) - rec["start"], float(v)) for t, v in series["values"]]
                on.plot([p[0] for p in points], [p[1] for p in points], label=label, linestyle=STYLES[n % 3])
        ax.set_title(panel["title"], fontsize=11)
        ax.set_xlabel("seconds into the run")
        if panel["unit"] == "percentunit":
            ax.set_ylim(-0.02, 1.05)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if right is not None:
            more = right.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
            right.set_ylabel(panel["right"].removeprefix(".* "), fontsize=8)  # the override's series
        ax.legend(handles, labels, fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        f"specdeploy dashboard, Speculation row: namespace {rec['namespace']}, real servers on the local "
        "cluster (tiny CPU models), scraped by its Prometheus",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw the dashboard's Speculation row from a record.")
    parser.add_argument("record", type=Path, help="a record written by record() (JSON)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    draw(json.loads(args.record.read_text()), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
