"""`spec.serviceAccounts`: the Kubernetes identity of the pods the operator creates, for clusters where
reading a checkpoint takes a cloud role bound to a ServiceAccount (IRSA or EKS Pod Identity on AWS, Workload
Identity on GKE, Azure Workload Identity) instead of a credentials Secret."""

from __future__ import annotations

from .base import ApiModel
from .meta import DnsSubdomain

__all__ = ["ServiceAccountsSpec"]


class ServiceAccountsSpec(ApiModel):
    """ServiceAccounts of the serving pods and of the build and staging Jobs' pods; an unset one falls back
    to the operator's default (`SPECDEPLOY_SERVING_SERVICE_ACCOUNT`, `SPECDEPLOY_BUILD_SERVICE_ACCOUNT`),
    then to the namespace's `default`. The pods get the account's API token only when they read a `s3://` or
    `gs://` checkpoint without `credentialsSecret` (a cloud SDK may need it to assume the account's role);
    otherwise `automountServiceAccountToken` stays false."""

    serving: DnsSubdomain | None = None
    """ServiceAccount of the serving pods (their init containers download checkpoints that are loaded as
    they are: backend `pytorch` without quantization, the EAGLE-3 draft head)."""
    build: DnsSubdomain | None = None
    """ServiceAccount of the pods of the build and staging Jobs (they download every checkpoint that is
    built or staged). Not part of the engine hash: an engine shared by several deployments is built with the
    account of the first of them."""
