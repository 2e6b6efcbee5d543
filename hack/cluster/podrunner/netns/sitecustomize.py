"""Imported at start-up by every Python process the pod runner starts (PYTHONPATH): a pod's own address.

In a real pod, binding the wildcard address (0.0.0.0) listens on the pod's network namespace only, that is on
the pod IP. The local cluster has no network namespaces per pod, so a wildcard IPv4 bind is turned into a
bind of the pod IP (SPECDEPLOY_POD_RUNNER_POD_IP, set by the runner). Nothing else is changed.
"""

from __future__ import annotations

import os
import socket
from typing import Any

_POD_IP = os.environ.get("SPECDEPLOY_POD_RUNNER_POD_IP", "")
_WILDCARDS = ("", "0.0.0.0")

if _POD_IP:
    _bind = socket.socket.bind

    def _pod_bind(self: socket.socket, address: Any) -> None:
        if self.family == socket.AF_INET and isinstance(address, tuple) and address[0] in _WILDCARDS:
            address = (_POD_IP, *address[1:])
        _bind(self, address)

    socket.socket.bind = _pod_bind  # type: ignore[method-assign,assignment]
