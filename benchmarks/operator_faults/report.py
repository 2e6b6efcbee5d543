"""The operator table of docs/reliability.md, rendered from the campaign's record. What each scenario injects
is in its name and in the doc's prose; the record keeps it in full (`injected`)."""

from __future__ import annotations

from benchmarks import records


def render(recs: list[records.Record]) -> str:
    record = recs[0]
    rows = ["| Scenario | Checked | Result | Figures |", "|---|---|---|---|"]
    for o in record["figures"]["outcomes"]:
        result = "pass" if o["passed"] else "FAIL: " + "; ".join(o["problems"])[:300]
        figures = ", ".join(
            f"{k} {int(v) if float(v).is_integer() else round(v, 1)}" for k, v in o["figures"].items()
        )
        rows.append(f"| {o['scenario']} | {o['checked']} | {result} | {figures} |")
    passed = sum(1 for o in record["figures"]["outcomes"] if o["passed"])
    total = len(record["figures"]["outcomes"])
    return f"{records.provenance(record)}\n\n{passed} of {total} scenarios pass.\n\n" + "\n".join(rows) + "\n"
