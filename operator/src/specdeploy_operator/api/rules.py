"""Every cross-field rule of the SpeculativeDeployment spec, by the object it is attached to. Each rule is CEL
(for the CRD) and Python (for pydantic), and is declared next to the type it checks; this module gathers
them.

A rule is attached to the smallest object whose path is unique, so that its message can name the offending
field by its full path: rules about `spec.target` and `spec.draft` (which share one type) live on the spec.
Messages must stay free of line breaks (the apiserver requires it).

CEL notes: defaults are applied before validation, so defaulted fields (`speculative.maxDraftLen`,
`placement.draft`, `runtime.enableKvCacheReuse`, `target.quantization.format`, ...) are always present;
optional fields are guarded with `has()`; lists used in rules have `maxItems` and `maxLength` so the cost
estimate stays within the apiserver's budget."""

from __future__ import annotations

from .autoscaling import AUTOSCALING_RULES
from .placement import PLACEMENT_RULES
from .serving import ENGINE_CACHE_RULES, ROLLOUT_RULES, SERVING_RULES
from .spec import SPEC_RULES
from .speculation import SPECULATIVE_RULES

__all__ = [
    "AUTOSCALING_RULES",
    "ENGINE_CACHE_RULES",
    "PLACEMENT_RULES",
    "ROLLOUT_RULES",
    "SERVING_RULES",
    "SPECULATIVE_RULES",
    "SPEC_RULES",
]
