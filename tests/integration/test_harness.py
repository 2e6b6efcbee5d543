"""The harness itself: `up` twice is harmless, `down` leaves no process and no listening port behind."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.processes import pid_alive


def _listening(port: int) -> bool:
    """Whether any socket on this machine is in LISTEN state on ``port`` (read from /proc, no connecting)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def test_up_twice_is_harmless_and_down_leaves_no_process_or_port() -> None:
    state = Path(tempfile.mkdtemp(prefix="specdeploy-harness-"))
    cluster = LocalCluster(state)
    try:
        cluster.up(timeout=180)
        pids = cluster._running()
        ports = cluster.state()["ports"]
        assert sorted(pids) == sorted(cluster.components)
        assert set(cluster.components) >= {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        }
        assert _listening(ports["apiserver"])
        assert _listening(ports["etcd"])
        if cluster.autoscaling:  # a second cluster beside the session's: its adapter has ports of its own
            assert {"prometheus", "metrics-adapter", "cluster-autoscaler"} <= set(pids)
            for port in ("prometheus", "metrics_adapter", "cluster_autoscaler"):
                assert _listening(ports[port]), port
        if cluster.lws:  # its webhook server, which the apiserver reaches on 127.0.0.1
            assert "lws-controller" in pids
            assert _listening(ports["lws_webhook"])

        cluster.up(timeout=60)  # already healthy: nothing restarts
        assert cluster._running() == pids
        assert cluster.healthy()

        cluster.down()
        assert not any(pid_alive(pid) for pid in pids.values())
        assert not any(_listening(port) for port in ports.values())
        assert not cluster.kubeconfig.exists()
        assert (state / "logs" / "kube-apiserver.log").exists()  # logs are kept for post-mortems
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)
