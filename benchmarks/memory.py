"""Resident memory of what runs here: a server started as the pod runner starts it (demo models, CPU), a bare
`import torch`, and every process of the local cluster; writes benchmarks/results/memory.json and the memory
block of docs/local-cluster.md rendered from it.

python -m benchmarks.memory              # about a minute
python -m benchmarks.memory --no-write   # print only

The server is `specdeploy-server <target> <draft> --device cpu` on the demo models (`demo_models.build`, a
short training: memory does not depend on how well they are trained), measured after a few completions; RSS,
anonymous and file-backed parts come from /proc/<pid>/status. The cluster is a fresh `LocalCluster`
(autoscaling and the LeaderWorkerSet controller on unless the environment switches them off, as `make test`
runs it), each process read from its pid file; the record's parameters say which were on, so the records check
can hold the processes it saw to those the cluster runs now.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specdeploy_localcluster.cluster import LocalCluster, autoscaling_from_env, lws_from_env
from specdeploy_localcluster.processes import PortTaken, free_port, port_taken, retry_on_taken_port

from benchmarks import records

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
REQUESTS = 4


def status_mib(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of `pid` in MiB."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def torch_import() -> dict[str, float]:
    code = (
        "import torch, pathlib\n"
        "for l in pathlib.Path('/proc/self/status').read_text().splitlines():\n"
        "    if l.startswith('VmRSS:'): print(int(l.split()[1]))\n"
    )
    kib = int(subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=True).stdout)
    return {"VmRSS": round(kib / 1024, 1)}


def _post(url: str, body: Mapping[str, Any]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def server(work: Path) -> dict[str, float]:
    from specdeploy_server.demo_models import TrainSettings, build  # noqa: PLC0415

    models = build(work / "models", TrainSettings(steps=20))
    log = work / "server.log"

    def start() -> tuple[subprocess.Popen[bytes], str]:
        """The server on a free port, ready (on another port if that one was taken before it bound it)."""
        port = free_port()
        argv = [PYTHON, "-m", "specdeploy_server", str(models.target), str(models.draft), "--device", "cpu"]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health/ready", timeout=2) as response:
                    if response.status == 200:
                        return proc, base
            except OSError:
                pass
            if proc.poll() is not None and port_taken(log.read_text(errors="replace")):
                raise PortTaken(f"port {port} was taken")
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                proc.wait()
                raise RuntimeError("the server did not become ready")
            time.sleep(0.5)

    proc, base = retry_on_taken_port(start)
    try:
        for i in range(REQUESTS):
            _post(
                f"{base}/v1/completions",
                {"model": models.target.name, "prompt": f"The story {i}", "max_tokens": 32},
            )
        return status_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def cluster(work: Path, autoscaling: bool, lws: bool) -> dict[str, dict[str, float]]:
    local = LocalCluster(work / "cluster", autoscaling=autoscaling, lws=lws)
    local.up(timeout=180)
    try:
        time.sleep(5)  # past start-up: the first list of every informer
        out: dict[str, dict[str, float]] = {}
        for pid_file in sorted(local.pids.glob("*.pid")):
            pid = int(pid_file.read_text().split(":", 1)[0])
            if Path(f"/proc/{pid}").exists():
                out[pid_file.stem] = status_mib(pid)
        return out
    finally:
        local.down()


def render(recs: Sequence[records.Record]) -> str:
    record = recs[0]
    figures = record["figures"]
    srv, torch = figures["server"], figures["torch_import"]
    lines = [
        f"{records.provenance(record)}",
        "",
        "| process | RSS (MiB) | anonymous (MiB) | file-backed (MiB) |",
        "|---|---:|---:|---:|",
        f"| `specdeploy-server` on the demo models, CPU, after {figures['requests']} completions | "
        f"{srv['VmRSS']:.0f} | {srv.get('RssAnon', 0):.0f} | {srv.get('RssFile', 0):.0f} |",
        f"| `python -c 'import torch'` ({record['machine'].get('torch', '?')}) | {torch['VmRSS']:.0f} | | |",
    ]
    for name, mem in sorted(figures["cluster"].items()):
        lines.append(
            f"| local cluster: `{name}` | {mem['VmRSS']:.0f} | {mem.get('RssAnon', 0):.0f} | "
            f"{mem.get('RssFile', 0):.0f} |"
        )
    total = sum(m["VmRSS"] for m in figures["cluster"].values())
    lines += ["", f"The local cluster's processes together: {total:.0f} MiB."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    args = parser.parse_args(argv)
    import torch as torch_module  # noqa: PLC0415

    started = records.now()
    autoscaling, lws = autoscaling_from_env(), lws_from_env()
    record = records.new_record(
        "memory",
        records.command_line(["python", "-m", "benchmarks.memory", *argv]),
        started,
        records.machine_facts(torch=torch_module.__version__),
        {"requests": REQUESTS, "train_steps": 20, "autoscaling": autoscaling, "lws": lws},
    )
    with tempfile.TemporaryDirectory(prefix="specdeploy-memory-") as tmp:
        work = Path(tmp)
        figures = {
            "requests": REQUESTS,
            "torch_import": torch_import(),
            "server": server(work),
            "cluster": cluster(work, autoscaling, lws),
        }
    records.finish(record, started, figures)
    print(render([record]))
    if not args.no_write:
        path = records.save(record)
        docs = records.update_docs(["memory"])
        print(f"wrote {path.relative_to(REPO)}; {', '.join(str(d) for d in docs) or 'docs current'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
