"""`spec.podSecurity`: the security context of the serving and build pods, for the rare cluster that needs
another one than the default.

The default (the field unset) passes the Pod Security Standards' `restricted` profile: the image's non-root
user (10001 in Dockerfile.server), no privilege escalation, every capability dropped, the runtime's default
seccomp profile, a read-only root filesystem. What may change here is what clusters legitimately differ in:
the user and groups (an image built with another user, a storage system that wants a given group), a
Localhost seccomp profile, and whether the root filesystem is read-only. Nothing here can make the pods run
as root, privileged, or with added capabilities.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from .base import ApiModel, Rule, Rules

__all__ = ["PodSecuritySpec", "SeccompProfileSpec"]

_NonRootId = Annotated[int, Field(ge=1, le=2147483647)]
_GroupId = Annotated[int, Field(ge=0, le=2147483647)]


class SeccompProfileSpec(ApiModel):
    """The seccomp profile of every container (Kubernetes `SeccompProfile`, without `Unconfined`)."""

    validation_rules: ClassVar[Rules] = (
        Rule["SeccompProfileSpec"](
            name="localhost-profile-with-localhost",
            cel="(self.type == 'Localhost') == has(self.localhostProfile)",
            message="spec.podSecurity.seccompProfile.localhostProfile is required with type Localhost and "
            "forbidden otherwise",
            field_path=".localhostProfile",
            check=lambda s: (s.type == "Localhost") == (s.localhost_profile is not None),
        ),
    )

    type: Literal["RuntimeDefault", "Localhost"] = "RuntimeDefault"
    """`RuntimeDefault`: the container runtime's default profile. `Localhost`: a profile file on the node."""
    localhost_profile: (
        Annotated[str, StringConstraints(pattern=r"^[^/]\S*$", min_length=1, max_length=512)] | None
    ) = None
    """With `Localhost`: the profile's path relative to the kubelet's seccomp directory."""


class PodSecuritySpec(ApiModel):
    """Security context of the serving pods and of the build Jobs of their engines. Unset fields keep the
    defaults, which pass the `restricted` Pod Security Standard. Always set, whatever is here:
    `runAsNonRoot: true`, `allowPrivilegeEscalation: false`, `capabilities.drop: [ALL]`,
    `automountServiceAccountToken: false`."""

    run_as_user: _NonRootId | None = None
    """UID of every container; unset: 10001, the user of the specdeploy server image. Set it to the user an
    image from `spec.images` defines; 0 (root) is not accepted."""
    run_as_group: _GroupId | None = None
    """Primary GID of every container; unset: 10001."""
    fs_group: _GroupId | None = None
    """Group that owns the pods' volumes (the engine cache is written by build pods and read by serving
    pods, so both need it); unset: 10001. Applied with `fsGroupChangePolicy: OnRootMismatch`, so a large
    cache is not re-owned at every start."""
    supplemental_groups: Annotated[list[_GroupId], Field(max_length=32)] | None = None
    """Extra GIDs of every container (for example the group of an NFS export)."""
    seccomp_profile: SeccompProfileSpec | None = None
    """Seccomp profile; unset: `RuntimeDefault`."""
    read_only_root_filesystem: bool = True
    """Mount the image read-only. The server and build tools write only to `/tmp` (an emptyDir, also their
    `HOME`), `/dev/shm` (serving) and their volumes; false for an image that writes elsewhere."""
