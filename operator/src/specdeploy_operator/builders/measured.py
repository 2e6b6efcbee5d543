"""What the serving pods of a `trtllm-llmapi` deployment with `draftLen: auto` start from: the pass costs and
acceptance its earlier pods measured (`status.speculation`), as the ConfigMap's `measured.json`
(`speculative.measuredCostsFile` of the server configuration; the file's schema is the server's,
docs/trtllm.md). The server computes TensorRT-LLM's `draft_len_schedule` from it at start-up.

The file is not part of the configuration digest: new measurements reach pods that start later (a rollout,
a scale-up, a restarted pod), they never restart pods themselves.
"""

from __future__ import annotations

import json
from typing import Any, Final

from specdeploy_operator.api import SpeculativeDeployment

from .pod import CONFIG_MOUNT

__all__ = ["MEASURED_FILE", "measured_costs", "measured_costs_file"]

MEASURED_FILE: Final = "measured.json"


def measured_costs_file(sdep: SpeculativeDeployment) -> str | None:
    """Where the server reads measured costs, for a deployment whose server computes a schedule from them
    (backend `pytorch`, `draftLen: auto`, a speculative method); None otherwise."""
    spec = sdep.spec
    speculates = spec.speculative.method != "none"
    if spec.backend != "pytorch" or spec.speculative.effective_draft_len != "auto" or not speculates:
        return None
    return f"{CONFIG_MOUNT}/{MEASURED_FILE}"


def measured_costs(sdep: SpeculativeDeployment) -> str | None:
    """The `measured.json` of the deployment's latest figures (sorted keys: the same figures, the same
    bytes); None when it has none or its server does not read them."""
    figures = sdep.status.speculation if sdep.status is not None else None
    if measured_costs_file(sdep) is None or figures is None:
        return None
    out: dict[str, Any] = {}
    if figures.measured_at is not None:
        out["measuredAt"] = figures.measured_at
    if figures.acceptance_rate is not None:
        out["acceptanceRate"] = figures.acceptance_rate
    draft_length = figures.draft_length or 0.0
    if figures.speculating_fraction:
        draft_length /= figures.speculating_fraction  # per sequence step that drafted
    if draft_length > 0:
        out["draftTokensPerSpeculatingStep"] = round(draft_length, 3)
    costs = figures.pass_costs
    if costs is not None and costs.target:
        out["targetPass"] = [c.model_dump(mode="json", by_alias=True) for c in costs.target]
    if costs is not None and costs.draft:
        out["draftPass"] = [c.model_dump(mode="json", by_alias=True) for c in costs.draft]
    if not set(out) - {"measuredAt"}:
        return None
    return json.dumps(out, indent=2, sort_keys=True) + "\n"
