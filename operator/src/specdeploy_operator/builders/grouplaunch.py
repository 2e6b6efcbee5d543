"""How the ranks of a replica that spans nodes start: the scripts its pods run and NCCL's environment. Pure.

A replica that spans nodes is a LeaderWorkerSet group (`leaderworkerset.py`): one pod per node, the leader
first. TensorRT-LLM's multi-node runtime is MPI, and its PyTorch flow is started as `mpirun ...
trtllm-llmapi-launch <server>`: rank 0 runs the server (HTTP) and the other ranks wait for its work
(tensorrt_llm/llmapi/trtllm-llmapi-launch). `mpirun` on the leader reaches the workers over SSH:

- the leader makes an SSH key pair at start, in its own memory (`/tmp`), and publishes only the public key
  on `KEY_PORT` for its workers;
- each worker makes a host key, fetches the leader's public key (from `LWS_LEADER_ADDRESS`, which the
  LeaderWorkerSet controller sets) and runs `sshd` as the pod's own non-root user on `SSH_PORT`;
- the leader writes the hostfile from the LeaderWorkerSet's environment (itself first: rank 0 is the
  server), waits until every worker's `sshd` lets it in, then runs `mpirun`.

No Secret, no API permission and no capability is needed (Pod Security `restricted` holds), and a key lives
exactly as long as its group: LeaderWorkerSet recreates a group whole when one of its pods fails.
"""

from __future__ import annotations

import shlex
from typing import Final

from specdeploy_operator.api import NcclSpec, SpeculativeDeployment

from .podtemplate import serving_env

__all__ = [
    "KEY_PORT",
    "LEADER_SCRIPT",
    "SSH_PORT",
    "WORKER_SCRIPT",
    "launch_scripts",
    "rank_env",
]

SSH_PORT: Final = 2222
"""Where a worker's `sshd` listens (unprivileged: the pods run as a non-root user)."""
KEY_PORT: Final = 2223
"""Where the leader publishes its public key to its workers."""
LEADER_SCRIPT: Final = "launch-leader.sh"
WORKER_SCRIPT: Final = "launch-worker.sh"

_SSH_OPTIONS: Final = (
    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
)
"""A worker's host key is new with every group, so there is nothing to pin it to; the workers are reached
by their names in the group's headless Service."""


def rank_env(sdep: SpeculativeDeployment) -> list[dict[str, str]]:
    """Every rank's environment: NCCL's network settings (`spec.placement.multiNode.nccl`), then
    `spec.serving.env` (which may not name NCCL's)."""
    multi_node = sdep.spec.placement.multi_node
    nccl = multi_node.nccl if multi_node is not None else NcclSpec()
    env = [{"name": "NCCL_SOCKET_IFNAME", "value": nccl.socket_interface}]
    if not nccl.infiniband:
        env.append({"name": "NCCL_IB_DISABLE", "value": "1"})
    return env + serving_env(sdep)


def _worker_script() -> str:
    return f"""#!/bin/sh
# A worker of a group: its host key, the leader's public key, then sshd as this (non-root) user.
set -eu
dir="${{TMPDIR:-/tmp}}/specdeploy-sshd"
mkdir -p "$dir" && chmod 700 "$dir"
ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
url="http://$LWS_LEADER_ADDRESS:{KEY_PORT}/id.pub"
echo "waiting for the leader's key at $url"
fetch='import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())'
key="$dir/authorized_keys.new"
until python3 -c "$fetch" "$url" > "$key" 2>/dev/null && [ -s "$key" ]; do
  sleep 2
done
mv "$key" "$dir/authorized_keys" && chmod 600 "$dir/authorized_keys"
cat > "$dir/sshd_config" <<EOF
Port {SSH_PORT}
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
StrictModes no
UsePAM no
EOF
echo "sshd on port {SSH_PORT}, rank host $(hostname)"
# sshd is in /usr/sbin, which a non-root user's PATH usually lacks.
exec "$(command -v sshd || echo /usr/sbin/sshd)" -D -e -f "$dir/sshd_config"
"""


def _leader_script(sdep: SpeculativeDeployment, server: list[str]) -> str:
    spec = sdep.spec
    slots = spec.gpus_per_pod
    world = spec.gpus_per_replica
    command = " ".join(shlex.quote(part) for part in ["trtllm-llmapi-launch", *server])
    # The ranks on the workers start under sshd, with its default environment: they get the leader's.
    forwarded = " ".join(
        f"-x {name}" for name in ("PATH", "LD_LIBRARY_PATH", *(e["name"] for e in rank_env(sdep)))
    )
    return f"""#!/bin/sh
# The leader of a group: rank 0 (the server) here, ranks {slots}..{world - 1} on the workers, {slots} a node.
set -eu
dir="${{TMPDIR:-/tmp}}/specdeploy-mpi"
mkdir -p "$dir/public" && chmod 700 "$dir"
ssh-keygen -q -t ed25519 -N '' -f "$dir/id"
cp "$dir/id.pub" "$dir/public/id.pub"
python3 -m http.server {KEY_PORT} --directory "$dir/public" > /dev/null 2>&1 &
# <group>.<subdomain>.<namespace>: the workers are <group>-1 ... <group>-N-1 under the same subdomain.
# This pod comes first, by its own host name: Open MPI knows it for the local node (rank 0 here, no SSH).
group="${{LWS_LEADER_ADDRESS%%.*}}"
domain="${{LWS_LEADER_ADDRESS#*.}}"
echo "$(hostname) slots={slots}" > "$dir/hostfile"
i=1
while [ "$i" -lt "$LWS_GROUP_SIZE" ]; do
  echo "$group-$i.$domain slots={slots}" >> "$dir/hostfile"
  i=$((i + 1))
done
ssh_command="ssh -p {SSH_PORT} -i $dir/id {_SSH_OPTIONS}"
for host in $(tail -n +2 "$dir/hostfile" | cut -d' ' -f1); do
  echo "waiting for $host"
  until $ssh_command -o ConnectTimeout=5 "$host" true; do sleep 2; done
done
echo "starting {world} ranks on $LWS_GROUP_SIZE nodes"
# mpirun by its absolute path: Open MPI then starts its daemons on the workers from the same prefix.
export LD_LIBRARY_PATH="${{LD_LIBRARY_PATH:-}}"
exec "$(command -v mpirun)" --hostfile "$dir/hostfile" -np {world} --bind-to none \\
  --mca plm_rsh_agent ssh --mca plm_rsh_args "-p {SSH_PORT} -i $dir/id {_SSH_OPTIONS}" \\
  --mca orte_keep_fqdn_hostnames true {forwarded} \\
  {command}
"""


def launch_scripts(sdep: SpeculativeDeployment, server: list[str]) -> dict[str, str]:
    """The leader's and the workers' scripts (file name -> text) of a replica that spans nodes, whose rank 0
    runs the `server` command line; none for a replica on one node."""
    if sdep.spec.nodes_per_replica == 1:
        return {}
    return {LEADER_SCRIPT: _leader_script(sdep, server), WORKER_SCRIPT: _worker_script()}
