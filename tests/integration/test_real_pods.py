"""Pods that really serve: `kubectl apply` → operator → pod (the pod runner's real process) → server → client.

The CPU example (examples/09) is applied in a fresh namespace the session's operator watches; its models are
made inside the cluster by the same Job `make demo` runs (hack/demo-models.yaml, a short training run here).
Clients reach the Service as kube-proxy would (specdeploy_localcluster.serviceload) or through `kubectl
port-forward`; nothing retries.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from openai import OpenAI
from specdeploy_localcluster.demomodels import make_demo_models
from specdeploy_localcluster.serviceload import ServiceEndpoints, StreamingLoad
from specdeploy_server.config import ServerConfig, config_digest

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for
from tests.server.conftest import hf_greedy_outputs

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "09-transformers-cpu-tiny.yaml"
GROUP, VERSION = "specdeploy.dev", "v1alpha1"
TRAINING_STEPS = 60  # a short run: these tests check serving, not the models' quality
PROMPTS = ["Speculative decoding", "The operator", "A pod"]
STREAMS = 64  # kept in flight on a pod while it is deleted

pytestmark = pytest.mark.usefixtures("operator")


class Served:
    """The CPU example, served for real in its own namespace."""

    def __init__(
        self, kubectl: Kubectl, api: client.ApiClient, namespace: str, doc: dict[str, Any] | None = None
    ) -> None:
        self.kubectl = kubectl
        self.api = api
        self.namespace = namespace
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.doc: dict[str, Any] = doc or yaml.safe_load(EXAMPLE.read_text())
        self.name: str = self.doc["metadata"]["name"]
        self.endpoints = ServiceEndpoints(api, namespace, self.name)

    def apply(self, spec_patch: dict[str, Any] | None = None) -> None:
        doc = json.loads(json.dumps(self.doc))
        doc["metadata"]["namespace"] = self.namespace
        doc["spec"].update(spec_patch or {})
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))

    def status(self) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "speculativedeployments", self.name
        )
        return dict(obj.get("status") or {})

    def wait_ready(self, timeout: float = 420) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            status = self.status()
            return status if status.get("phase") == "Ready" else None

        result: dict[str, Any] = wait_for(
            ready, timeout=timeout, interval=0.5, what=f"{self.name} Ready", describe=self.describe
        )
        # The Service's EndpointSlices are another controller's, written after the pods it saw ready.
        wait_for(self.endpoints.ready, timeout=60, what=f"a ready endpoint of {self.name}")
        return result

    def describe(self) -> str:
        """The deployment's status, its namespace's pods and events, and each pod's last log lines."""
        ns = ("-n", self.namespace)
        parts = [f"status: {json.dumps(self.status())}"]
        for what in (("get", "pods,jobs", "-o", "wide"), ("get", "events", "--sort-by=.lastTimestamp")):
            parts.append(self.kubectl(*what, *ns, check=False).stdout)
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            logs = self.kubectl("logs", pod.metadata.name, "--all-containers", "--tail=20", *ns, check=False)
            parts.append(f"--- logs of {pod.metadata.name}:\n{logs.stdout}{logs.stderr}")
        return "\n".join(parts)

    def pods(self) -> list[client.V1Pod]:
        selector = self.status()["selector"]
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def openai(self) -> OpenAI:
        return OpenAI(
            base_url=f"{self.endpoints.base_url()}/v1", api_key="unused", max_retries=0, timeout=120
        )


@pytest.fixture(scope="module")
def served(kubectl: Kubectl, api_client: client.ApiClient) -> Iterator[tuple[Served, Path]]:
    """The CPU example Ready in a fresh namespace, and the claim's directory (the demo's models)."""
    with fresh_namespace(client.CoreV1Api(api_client), OPERATOR_NAMESPACE_PREFIX) as namespace:
        served = Served(kubectl, api_client, namespace)
        models = make_demo_models(kubectl, namespace, TRAINING_STEPS)
        served.apply()
        served.wait_ready()
        yield served, models


def transformers_greedy(model_dir: Path, prompt: str, max_tokens: int) -> str:
    """transformers' own greedy continuation of `prompt` (the reference the server tests use), as text."""
    from transformers import AutoTokenizer

    [ids] = hf_greedy_outputs(model_dir, [prompt], max_tokens)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def test_the_cpu_example_is_ready_only_with_real_servers_behind_its_endpoints(
    served: tuple[Served, Path],
) -> None:
    s, _ = served
    pods = s.pods()
    assert len(pods) == 1
    pod = pods[0]
    assert pod.status.container_statuses[0].container_id.startswith("podrunner://")
    ready = s.endpoints.ready()
    assert ready == [f"{pod.status.pod_ip}:8000"]
    with urllib.request.urlopen(f"http://{ready[0]}/health/ready", timeout=10) as resp:
        assert json.loads(resp.read())["status"] == "ready"


def check_greedy_completions(s: Served, target: Path) -> None:
    """Greedy completions of `PROMPTS` through the Service equal transformers' own of `target`."""
    api = s.openai()
    model = api.models.list().data[0].id
    for prompt in PROMPTS:
        got = api.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
        assert got.choices[0].text == transformers_greedy(target, prompt, 24), prompt


def test_greedy_completions_through_the_service_equal_transformers_greedy_output(
    served: tuple[Served, Path],
) -> None:
    s, models = served
    check_greedy_completions(s, models / "target")


def test_kubectl_port_forward_reaches_the_server(
    served: tuple[Served, Path], kubectl_bin: str, kubeconfig: Path
) -> None:
    s, models = served
    forward = subprocess.Popen(
        [
            kubectl_bin,
            f"--kubeconfig={kubeconfig}",
            "port-forward",
            "-n",
            s.namespace,
            f"svc/{s.name}",
            ":8000",  # a local port kubectl binds itself
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        assert "Forwarding from 127.0.0.1" in line, line
        port = int(line.split("127.0.0.1:", 1)[1].split()[0])
        api = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        model = api.models.list().data[0].id
        got = api.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0)
        assert got.choices[0].text == transformers_greedy(models / "target", PROMPTS[0], 16)
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_kubectl_logs_shows_the_requests_and_exec_runs_with_the_pod_environment(
    served: tuple[Served, Path], kubectl: Kubectl
) -> None:
    s, _ = served
    api = s.openai()
    api.completions.create(model=api.models.list().data[0].id, prompt="A pod", max_tokens=4, temperature=0)
    pod = s.pods()[0].metadata.name

    def logged() -> str | None:
        out = kubectl("logs", "-n", s.namespace, pod).stdout
        return out if "/v1/completions" in out else None

    logs = wait_for(logged, timeout=20, what="the request in kubectl logs")
    assert "serving" in logs  # the server's own start-up line
    out = kubectl(
        "exec", "-n", s.namespace, pod, "--", "sh", "-c", "echo $HOSTNAME; command -v specdeploy-server"
    )
    hostname, program = out.stdout.split()
    assert hostname == pod
    assert program.endswith("/specdeploy-server")


def test_the_config_the_server_loaded_is_the_config_the_operator_rendered(
    served: tuple[Served, Path],
) -> None:
    s, _ = served
    configmap = s.core.read_namespaced_config_map(f"{s.name}-server-config", s.namespace)
    rendered = ServerConfig.model_validate(yaml.safe_load(configmap.data["server.yaml"])).dump()
    with urllib.request.urlopen(f"{s.endpoints.base_url()}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    info = next(line for line in metrics.splitlines() if line.startswith("specdeploy_server_config_info{"))
    assert f'config_sha256="{config_digest(rendered)}"' in info


def test_a_killed_server_is_restarted_and_the_service_resumes(
    served: tuple[Served, Path], kubectl: Kubectl
) -> None:
    s, models = served
    pod = s.pods()[0]
    pid = int(pod.status.container_statuses[0].container_id.removeprefix("podrunner://"))
    before = pod.status.container_statuses[0].restart_count
    os.kill(pid, signal.SIGKILL)

    def restarted() -> client.V1Pod | None:
        live = s.core.read_namespaced_pod(pod.metadata.name, s.namespace)
        statuses = live.status.container_statuses or []
        return live if statuses and statuses[0].restart_count > before else None

    live = wait_for(restarted, timeout=60, what="restartCount to rise")
    last = live.status.container_statuses[0].last_state.terminated
    assert last is not None
    assert last.exit_code == 128 + signal.SIGKILL

    def reported() -> dict[str, Any] | None:  # the back-off and the restart take >= 10 s: status says so
        status = s.status()
        return status if status.get("readyText") == "0/1" and status.get("phase") != "Ready" else None

    outage = wait_for(reported, timeout=30, interval=0.2, what="the deployment's status to show 0/1 ready")
    print(f"status while the server restarts: phase {outage['phase']}, ready {outage['readyText']}")
    s.wait_ready(timeout=180)
    # The killed run's log is `--previous`; the current log is the restarted process's alone.
    previous = kubectl("logs", "-n", s.namespace, pod.metadata.name, "--previous").stdout
    assert "serving target on 0.0.0.0:8000" in previous, previous[-2000:]
    current = kubectl("logs", "-n", s.namespace, pod.metadata.name).stdout
    assert current.count("serving target on 0.0.0.0:8000") == 1, current[-2000:]
    wait_for(s.endpoints.ready, timeout=60, what="a ready endpoint again")
    api = s.openai()
    got = api.completions.create(
        model=api.models.list().data[0].id, prompt=PROMPTS[1], max_tokens=12, temperature=0
    )
    assert got.choices[0].text == transformers_greedy(models / "target", PROMPTS[1], 12)
    assert s.status()["readyText"] == "1/1"


def test_a_staging_job_that_needs_a_model_hub_runs_for_real_and_fails_with_the_download_error(
    kubectl: Kubectl, api_client: client.ApiClient
) -> None:
    """examples/10 stages hf:// checkpoints: its Job runs for real (a CPU pod of the server image), no model
    hub answers from this machine (`HF_HUB_OFFLINE=1`), and the EngineBuild says so instead of waiting."""
    doc = yaml.safe_load((REPO / "examples" / "10-transformers-gpu-llama8b-1b.yaml").read_text())
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    with fresh_namespace(core, OPERATOR_NAMESPACE_PREFIX) as namespace:
        doc["metadata"]["namespace"] = namespace
        secret = doc["spec"]["target"]["model"].get("credentialsSecret")
        if secret:
            kubectl("create", "secret", "generic", secret, "-n", namespace, "--from-literal=HF_TOKEN=unused")
        kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))

        def failed() -> dict[str, Any] | None:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "enginebuilds")["items"]
            target = [b for b in items if b["spec"]["role"] == "target"]
            return target[0] if target and (target[0].get("status") or {}).get("phase") == "Failed" else None

        build = wait_for(failed, timeout=180, interval=1, what="the target's staging to fail")
        assert build["status"].get("message"), build["status"]
        pods = core.list_namespaced_pod(namespace, label_selector="specdeploy.dev/engine-role=target").items
        assert pods
        statuses = [s for p in pods for s in p.status.init_container_statuses or []]
        assert any(s.container_id and s.container_id.startswith("podrunner://") for s in statuses), statuses
        assert any(s.state.terminated and s.state.terminated.exit_code != 0 for s in statuses), statuses


def _config_info(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    line: str = next(x for x in metrics.splitlines() if x.startswith("specdeploy_server_config_info{"))
    return line


def _wait_rolled_out(s: Served, replicas: int, timeout: float = 300) -> None:
    def done() -> bool:
        status = s.status()
        obj = s.custom.get_namespaced_custom_object(
            GROUP, VERSION, s.namespace, "speculativedeployments", s.name
        )
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        pods = [p for p in s.pods() if p.metadata.deletion_timestamp is None]
        return bool(
            current
            and status.get("phase") == "Ready"
            and status.get("readyText") == f"{replicas}/{replicas}"
            and len(pods) == replicas
            and len(s.endpoints.ready()) == replicas
        )

    wait_for(done, timeout=timeout, interval=1, what=f"{s.name} rolled out with {replicas} ready replicas")


def _wait_served_by(load: StreamingLoad, endpoints: list[str], what: str, streams: int = 2) -> None:
    wait_for(
        lambda: load.completed_on(endpoints) >= streams,
        timeout=120,
        interval=0.2,
        what=f"{streams} streams completed on each of {what} ({', '.join(endpoints)})",
    )


def test_a_rolling_update_under_streaming_load_fails_and_truncates_nothing(
    served: tuple[Served, Path],
) -> None:
    """2 replicas, the default rollout settings, 8 clients streaming back to back while `draftLen` changes:
    every stream ends with a finish reason and [DONE], and the new pods serve the new configuration."""
    s, _ = served
    s.apply({"replicas": 2})
    _wait_rolled_out(s, 2)
    old = {p.metadata.uid for p in s.pods()}
    load = StreamingLoad(s.endpoints, clients=8, max_tokens=24).start()
    _wait_served_by(load, s.endpoints.ready(), "the old pods")
    s.apply({"replicas": 2, "speculative": {**s.doc["spec"]["speculative"], "draftLen": 3}})
    _wait_rolled_out(s, 2)
    _wait_served_by(load, s.endpoints.ready(), "the new pods")
    report = load.stop()
    print(
        f"rolling update under load: {report.sent} streams sent, {report.completed} completed, "
        f"{len(report.failed)} failed, {len(report.truncated)} truncated, "
        f"endpoints {sorted(report.endpoints)}"
    )
    assert report.failed == []
    assert report.truncated == []
    assert report.completed == report.sent > 8
    assert not {p.metadata.uid for p in s.pods()} & old, "the pods were not replaced"
    for endpoint in s.endpoints.ready():
        assert 'draft_len="3"' in _config_info(f"http://{endpoint}")


def test_a_deleted_pod_finishes_its_streams_in_flight_and_scaling_down_under_load_fails_nothing(
    served: tuple[Served, Path], kubectl: Kubectl
) -> None:
    """A pod is deleted while clients keep its queue full (a feeder holds `STREAMS` streams in flight on it,
    whatever the machine's speed): it serves through the preStop sleep, gets SIGTERM, refuses new work, and
    every stream it accepted ends with a finish reason and [DONE], some of them after the SIGTERM (the drain
    finished them). Meanwhile other clients stream through the scale-down from 2 replicas to 1 without an
    error."""
    s, _ = served
    spec = {"replicas": 2, "speculative": {**s.doc["spec"]["speculative"], "draftLen": 3}}
    s.apply(spec)
    _wait_rolled_out(s, 2)
    victim = s.pods()[0]
    url = f"http://{victim.status.pod_ip}:8000/v1/completions"
    body = {"model": "target", "prompt": PROMPTS[0], "max_tokens": 400, "temperature": 0, "stream": True}
    accepted: list[tuple[str | None, bool, float]] = []
    refused: list[str] = []
    in_flight = [0]  # streams the victim is answering
    lock = threading.Lock()
    closed = threading.Event()  # the pod stopped taking work: feed no more
    closed_at = [float("inf")]  # when the feeder first saw it refuse
    slots = threading.Semaphore(STREAMS)

    def refuse(why: str) -> None:
        refused.append(why)
        closed_at[0] = min(closed_at[0], time.monotonic())
        closed.set()

    def stream() -> None:
        finish, done, answered = None, False, False
        try:
            with httpx.Client() as http, http.stream("POST", url, json=body, timeout=180) as resp:
                answered = True
                if resp.status_code != 200:  # draining: 503 shutting_down, before any work is accepted
                    with lock:
                        refuse(f"HTTP {resp.status_code}: {resp.read()[:120]!r}")
                    return
                with lock:
                    in_flight[0] += 1
                for line in resp.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        finish = json.loads(line[6:])["choices"][0].get("finish_reason") or finish
            with lock:
                accepted.append((finish, done, time.monotonic()))
                in_flight[0] -= 1
        except httpx.TransportError as err:
            with lock:
                if answered:  # a stream the pod accepted was cut: the failure the test is about
                    accepted.append((f"{type(err).__name__}: {err}", False, time.monotonic()))
                else:
                    # Nothing was answered on this connection: the process is gone (connect refused), or the
                    # listener closed with the connection still in its backlog (reset before any response).
                    refuse(f"{type(err).__name__}: {err}")
        finally:
            slots.release()

    def feed() -> None:
        threads = []
        deadline = time.monotonic() + 120
        while not closed.is_set() and time.monotonic() < deadline:
            if slots.acquire(timeout=0.5):
                thread = threading.Thread(target=stream)
                thread.start()
                threads.append(thread)
        for thread in threads:
            thread.join(timeout=180)

    feeder = threading.Thread(target=feed)
    feeder.start()
    wait_for(lambda: in_flight[0] > 0, timeout=60, interval=0.1, what="a stream in flight on the pod")
    deleted = time.monotonic()
    kubectl("delete", "pod", "-n", s.namespace, victim.metadata.name, "--wait=false")
    load = StreamingLoad(s.endpoints, clients=4, max_tokens=16).start()
    feeder.join(timeout=300)
    assert not feeder.is_alive()
    assert closed.is_set(), "the deleted pod never stopped taking requests"
    assert accepted, "no stream was accepted"
    assert all(done and finish in ("length", "stop") for finish, done, _ in accepted), accepted
    last = max(at for _, _, at in accepted) - deleted
    print(
        f"deleted pod: {len(accepted)} accepted streams all completed, the last {last:.1f} s after the "
        f"deletion; {len(refused)} refused while draining ({refused[:1]})"
    )
    # Streams still ran when the pod first refused work (SIGTERM had come, after the preStop sleep): the
    # drain finished them.
    drained = [at for _, _, at in accepted if at > closed_at[0]]
    assert drained, "no stream was in flight at SIGTERM: the drain was not exercised"
    s.apply({**spec, "replicas": 1})
    _wait_rolled_out(s, 1)
    report = load.stop()
    assert report.failed == []
    assert report.truncated == []
    assert report.completed == report.sent > 4
