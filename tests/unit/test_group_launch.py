"""The scripts that start the ranks of a replica that spans nodes, run for real by `sh` with the
LeaderWorkerSet environment of a group, against stand-ins for ssh-keygen, python3, ssh, sshd and mpirun that
record how they were called (the real ones need the pods of a group)."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from specdeploy_operator.api import EnvVar, SpeculativeDeployment, parse_object
from specdeploy_operator.builders.grouplaunch import LEADER_SCRIPT, WORKER_SCRIPT, launch_scripts, rank_env

ROOT = Path(__file__).resolve().parents[2]
LEADER = "deepseek-r1-mtp-lws-0.deepseek-r1-mtp-lws.models"
SERVER = ["specdeploy-server", "--config", "/etc/specdeploy/server.yaml"]


def _sdep(**placement: object) -> SpeculativeDeployment:
    body = yaml.safe_load((ROOT / "examples/11-mtp-deepseek-r1-2x8xh100.yaml").read_text())
    body["spec"]["placement"].update(placement)
    sdep = parse_object(body)
    assert isinstance(sdep, SpeculativeDeployment)
    return sdep


def _tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run(script: str, tmp_path: Path, tools: dict[str, str], **env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # ssh-keygen -q -t ed25519 -N '' -f FILE: writes FILE and FILE.pub
    keygen = (
        'while [ "$#" -gt 0 ]; do [ "$1" = -f ] && f="$2"; shift; done; '
        'echo private > "$f"; echo "ssh-ed25519 AAAA test" > "$f.pub"'
    )
    _tool(bin_dir, "ssh-keygen", keygen)
    for name, body in tools.items():
        _tool(bin_dir, name, body)
    (tmp_path / "script.sh").write_text(script)
    full_env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "TMPDIR": str(tmp_path / "run"),
        "HOME": str(tmp_path),
        **env,
    }
    (tmp_path / "run").mkdir()
    return subprocess.run(
        ["sh", str(tmp_path / "script.sh")],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_replica_on_one_node_has_no_launch_scripts() -> None:
    assert launch_scripts(_sdep(gpusPerNode=16), SERVER) == {}


@pytest.mark.parametrize("size", [2, 3])
def test_the_leader_lists_itself_first_waits_for_every_worker_and_starts_every_rank(
    tmp_path: Path, size: int
) -> None:
    script = launch_scripts(_sdep(), SERVER)[LEADER_SCRIPT]
    calls = tmp_path / "calls"
    result = _run(
        script,
        tmp_path,
        {
            "python3": 'echo "python3 $*" >> ' + str(calls),  # the key server: recorded, not served
            "ssh": 'echo "ssh $*" >> ' + str(calls),
            "mpirun": f'echo "mpirun $*" >> {calls}; cp "$2" {tmp_path}/hostfile.seen',
            "hostname": "echo deepseek-r1-mtp-lws-0",  # a StatefulSet pod's host name is its name
        },
        LWS_LEADER_ADDRESS=LEADER,
        LWS_GROUP_SIZE=str(size),
        NCCL_SOCKET_IFNAME="eth0",
    )
    assert result.returncode == 0, result.stderr
    workers = [f"deepseek-r1-mtp-lws-0-{i}.deepseek-r1-mtp-lws.models" for i in range(1, size)]
    assert (tmp_path / "hostfile.seen").read_text().splitlines() == [
        f"{host} slots=8" for host in ["deepseek-r1-mtp-lws-0", *workers]
    ]
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("python3 -m http.server 2223 --directory ")
    assert (tmp_path / "run/specdeploy-mpi/public/id.pub").read_text() == "ssh-ed25519 AAAA test\n"
    assert not (tmp_path / "run/specdeploy-mpi/public/id").exists(), "the private key is not published"
    waited = [line.split()[-2] for line in lines if line.startswith("ssh ")]
    assert waited == workers
    mpirun = next(line for line in lines if line.startswith("mpirun "))
    assert " -np 16 " in mpirun
    assert "-x PATH -x LD_LIBRARY_PATH -x NCCL_SOCKET_IFNAME" in mpirun
    assert mpirun.endswith("trtllm-llmapi-launch specdeploy-server --config /etc/specdeploy/server.yaml")
    assert "plm_rsh_args -p 2222 -i " in mpirun


def test_nccl_settings_reach_every_rank() -> None:
    script = launch_scripts(
        _sdep(multiNode={"nccl": {"socketInterface": "net1", "infiniband": False}}), SERVER
    )
    assert "-x NCCL_SOCKET_IFNAME -x NCCL_IB_DISABLE" in script[LEADER_SCRIPT]


def test_the_serving_env_reaches_every_rank_after_nccls() -> None:
    base = _sdep()
    serving = base.spec.serving.model_copy(update={"env": [EnvVar(name="TLLM_LOG_LEVEL", value="INFO")]})
    sdep = base.model_copy(update={"spec": base.spec.model_copy(update={"serving": serving})})
    script = launch_scripts(sdep, SERVER)[LEADER_SCRIPT]
    assert "-x NCCL_SOCKET_IFNAME -x TLLM_LOG_LEVEL" in script  # (this example keeps InfiniBand)
    assert rank_env(sdep)[-1] == {"name": "TLLM_LOG_LEVEL", "value": "INFO"}


def test_a_worker_authorizes_only_the_leaders_key_then_runs_sshd_as_its_own_user(tmp_path: Path) -> None:
    script = launch_scripts(_sdep(), SERVER)[WORKER_SCRIPT]
    tries = tmp_path / "tries"
    # The leader's key server answers on the second try (the leader starts after the worker).
    fetch = f'echo "$*" >> {tries}; [ "$(wc -l < {tries})" -ge 2 ] || exit 1; echo "ssh-ed25519 LEADER key"'
    sshd = f'echo "$*" > {tmp_path}/sshd.args; cat "$4" > {tmp_path}/sshd.config'
    result = _run(script, tmp_path, {"python3": fetch, "sshd": sshd}, LWS_LEADER_ADDRESS=LEADER)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "run/specdeploy-sshd"
    assert (run_dir / "authorized_keys").read_text() == "ssh-ed25519 LEADER key\n"
    fetched = tries.read_text().splitlines()
    assert len(fetched) == 2
    assert fetched[0].endswith(f"http://{LEADER}:2223/id.pub")
    config = (run_dir / "sshd_config").read_text().splitlines()
    assert "Port 2222" in config
    assert f"AuthorizedKeysFile {run_dir}/authorized_keys" in config
    assert "PasswordAuthentication no" in config
    assert "PermitRootLogin no" in config
    assert (tmp_path / "sshd.args").read_text().split() == ["-D", "-e", "-f", f"{run_dir}/sshd_config"]
    assert (tmp_path / "sshd.config").read_text().splitlines() == config
