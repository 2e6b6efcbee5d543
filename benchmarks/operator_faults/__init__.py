"""The operator's part of the reliability campaign: SIGKILL at named points of its write path, the control
plane stopped under it, a standby replica taking over, hand edits and deletions of what it owns, a write RBAC
forbids, a namespace deleted under a deployment, a deployment deleted mid-build, names of 63 characters. Each
scenario injects one fault into a real operator process on a real control plane, then checks convergence:
every deployment Ready with the status it should have, exactly one Job per engine, no orphaned child, the
operator process alive where it should be. Writes its record, benchmarks/results/reliability-operator.json,
and the operator table of docs/reliability.md (benchmarks/records.py).

python -m benchmarks.operator_faults              # every scenario on its own local cluster (~12 min)
python -m benchmarks.operator_faults --no-write   # print only

Modules: `campaign` (the cluster, operators, waits and the common checks), `faults` (kills, control plane,
failover), `drift` (hand edits and deletions, per kind), `badstates` (the rest), `__main__` (record, table).
The fast cases run in `make test` (tests/integration/test_operator_faults.py) through the same functions.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
