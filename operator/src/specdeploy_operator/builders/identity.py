"""Who the pods the operator creates are, and what they pull their images with: `imagePullSecrets`, the
ServiceAccount and whether its API token is mounted. The one place that combines a deployment's
`spec.images.pullSecrets` and `spec.serviceAccounts` with the operator's defaults. Pure.

The token: every pod keeps `automountServiceAccountToken: false` (neither the server nor the build tools talk
to the Kubernetes API), except a pod that runs under a named ServiceAccount and downloads a `s3://` or
`gs://` checkpoint without a `credentialsSecret`: there the cloud SDK may assume the account's role with it
(the projected tokens that IRSA, EKS Pod Identity and Azure Workload Identity inject are the webhooks' own;
GKE Workload Identity needs none, but an SDK falling back to the in-cluster token does)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from specdeploy_operator.api import ModelSource, SpeculativeDeployment

from .settings import OperatorSettings

__all__ = [
    "CLOUD_SCHEMES",
    "PodIdentity",
    "build_service_account",
    "needs_cloud_token",
    "pull_secrets",
    "serving_service_account",
]

CLOUD_SCHEMES: Final = ("s3", "gs")
"""Checkpoint schemes whose download may authenticate as the pod's ServiceAccount (a cloud role)."""


def pull_secrets(sdep: SpeculativeDeployment, settings: OperatorSettings) -> list[str]:
    """`imagePullSecrets` names of every pod of `sdep`: the operator's, then the spec's, each once."""
    own = (sdep.spec.images.pull_secrets if sdep.spec.images else None) or []
    return list(dict.fromkeys([*settings.image_pull_secrets, *own]))


def serving_service_account(sdep: SpeculativeDeployment, settings: OperatorSettings) -> str | None:
    """ServiceAccount of the serving pods: `spec.serviceAccounts.serving`, else the operator's default."""
    accounts = sdep.spec.service_accounts
    return (accounts.serving if accounts else None) or settings.serving_service_account


def build_service_account(sdep: SpeculativeDeployment, settings: OperatorSettings) -> str | None:
    """ServiceAccount of the build and staging pods: `spec.serviceAccounts.build`, else the operator's."""
    accounts = sdep.spec.service_accounts
    return (accounts.build if accounts else None) or settings.build_service_account


def needs_cloud_token(sources: Iterable[ModelSource]) -> bool:
    """Whether downloading `sources` may need the pod's ServiceAccount: a cloud store read without a
    credentials Secret."""
    return any(
        source.uri.partition("://")[0] in CLOUD_SCHEMES and not source.credentials_secret
        for source in sources
    )


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """The identity fields of one pod."""

    service_account: str | None = None
    pull_secrets: Sequence[str] = ()
    mount_token: bool = False
    """Mount the ServiceAccount's API token (only with `service_account`)."""

    @classmethod
    def of(
        cls, service_account: str | None, secrets: Sequence[str], downloads: Iterable[ModelSource]
    ) -> PodIdentity:
        """A pod under `service_account` with `secrets` that downloads `downloads`."""
        mount = service_account is not None and needs_cloud_token(downloads)
        return cls(service_account, tuple(secrets), mount)

    def pod_fields(self) -> dict[str, Any]:
        """`serviceAccountName` and `imagePullSecrets` of the pod spec (none when unset)."""
        fields: dict[str, Any] = {}
        if self.service_account:
            fields["serviceAccountName"] = self.service_account
        if self.pull_secrets:
            fields["imagePullSecrets"] = [{"name": name} for name in self.pull_secrets]
        return fields
