"""The operator at scale on the simulated GPU cluster: `python -m benchmarks.operator` (see `__main__`).

Modules: `workload` (the SpeculativeDeployments and what they need, rendered offline by the operator's own
builders), `cluster` (the benchmark's cluster, applying and waiting for Ready), `accounting` (the apiserver's
audit log, the operator's metrics, log and process usage), `run` (one run: reference, operator, steady
state), `figures` (what the record keeps of a run) and `report` (the docs block rendered from the record).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
