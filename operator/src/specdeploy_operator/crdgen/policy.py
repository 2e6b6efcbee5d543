"""The admission policy shipped beside the CRDs: a ValidatingAdmissionPolicy bound with
`validationActions: [Warn]`, so the API server admits a SpeculativeDeployment that chooses
`spec.backend: tensorrt` and `kubectl apply` prints a warning naming the upstream removal and the
migration."""

from __future__ import annotations

from typing import Any

from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.api.spec import TENSORRT_BACKEND_WARNING

__all__ = ["POLICY_FILENAME", "backend_warning_policy"]

POLICY_FILENAME = "specdeploy.dev_admission-warnings.yaml"

# Passes (no warning) unless the spec chooses tensorrt, on create or in a change of the spec: the operator's
# own writes (finalizers, annotations) and a re-apply of an unchanged spec say nothing.
_EXPRESSION = (
    "!has(object.spec.backend) || object.spec.backend != 'tensorrt' "
    "|| (oldObject != null && has(oldObject.spec) && oldObject.spec == object.spec)"
)


def backend_warning_policy() -> list[dict[str, Any]]:
    """The policy and its binding (every namespace; warnings only, never a refusal)."""
    info = SpeculativeDeployment.resource
    name = f"{info.plural}.{info.group}-backend-warnings"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Ignore",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [info.group],
                        "apiVersions": [info.version],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [info.plural],
                    }
                ]
            },
            "validations": [{"expression": _EXPRESSION, "message": TENSORRT_BACKEND_WARNING}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Warn"]},
    }
    return [policy, binding]
