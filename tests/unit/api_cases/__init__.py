"""Invalid SpeculativeDeployment manifests, shared by the unit tests (pydantic) and the integration tests (the
real apiserver), so that both validators are held to the same cases (`cases.py` says what a case is)."""

from tests.unit.api_cases.cases import ALL_RULES, BASES, Case, merge_patch
from tests.unit.api_cases.method_rules import METHOD_CASES
from tests.unit.api_cases.placement_rules import PLACEMENT_AND_BACKEND_CASES
from tests.unit.api_cases.schema import SCHEMA_CASES
from tests.unit.api_cases.serving_rules import BUILD_AND_SERVING_CASES

__all__ = ["ALL_RULES", "BASES", "INVALID_CASES", "RULE_CASES", "SCHEMA_CASES", "Case", "merge_patch"]

RULE_CASES = PLACEMENT_AND_BACKEND_CASES + BUILD_AND_SERVING_CASES + METHOD_CASES
INVALID_CASES = SCHEMA_CASES + RULE_CASES
