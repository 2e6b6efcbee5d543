"""README commands run against a cluster, as written: the local-cluster block (its own cluster), the rest on
the session's cluster and operator (tests/docs/readme_rows.py names each one's test)."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.demomodels import make_demo_models

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for
from tests.docs.readme_rows import REPO, docker_tags, readme_command
from tests.docs.readme_shell import Shell, wait_for_text

SDEP = "llama-8b-1b-h100"  # metadata.name of examples/02, the README's example


@pytest.mark.integration
def test_local_cluster_commands(shell: Shell, tmp_path: Path) -> None:
    """The local-cluster block as written (its own cluster, in a temporary CLUSTER_DIR), with node pools of
    our own: up, the export, the nodes, down leaving no process behind."""
    state = tmp_path / "cluster"
    pools = tmp_path / "my-pools.yaml"
    pools.write_text(
        yaml.safe_dump(
            {
                "pools": [
                    {
                        "name": "a100",
                        "nodes": 2,
                        "instanceType": "p4d.24xlarge",
                        "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 8},
                    },
                    {"name": "cpu", "nodes": 1, "instanceType": "m7i.8xlarge"},
                ]
            }
        )
    )
    # The binaries first, with no time limit (a cold cache takes many minutes), as `make test` builds them
    # before any test and the session's cluster fixture does: then `make cluster-up` below finds them.
    bin_dir = LocalCluster(state).bin_dir
    try:
        shell.run(
            "make cluster-up NODEPOOLS=my-pools.yaml",
            {"my-pools.yaml": str(pools)},
            append=f" CLUSTER_DIR={state}",
            timeout=300,
        )
        after = shell.export(
            "export KUBECONFIG=$PWD/.cluster/kubeconfig PATH=$(hack/cluster/build.sh):$PATH",
            {"$PWD/.cluster/kubeconfig": str(state / "kubeconfig")},
        )
        assert after.tool("bash", "-c", "command -v kubectl helm").stdout.split() == [
            str(bin_dir / "kubectl"),
            str(bin_dir / "helm"),
        ]
        nodes = after.run("kubectl get nodes -o wide").stdout.splitlines()
        assert nodes[0].split()[:2] == ["NAME", "STATUS"], nodes
        assert "INTERNAL-IP" in nodes[0], nodes
        assert sorted(line.split()[0] for line in nodes[1:]) == ["a100-0", "a100-1", "cpu-0"], nodes
        assert all(line.split()[1] == "Ready" for line in nodes[1:]), nodes
        labels = json.loads(after.tool("kubectl", "get", "node", "a100-0", "-o", "json").stdout)["metadata"][
            "labels"
        ]
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
        running = processes_naming(state)
        programs = {Path(argv[0]).name for argv in running.values()}
        assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"} <= programs

        shell.run("make cluster-down", append=f" CLUSTER_DIR={state}", timeout=120)
        left = processes_naming(state)
        assert not left, f"make cluster-down left processes: {left}"
        assert not (state / "kubeconfig").exists()
    finally:
        LocalCluster(state).down()


def processes_naming(directory: Path) -> dict[int, list[str]]:
    """pid -> argv of the live processes with `directory` in their command line (a cluster's processes all
    take their data, certificates or kubeconfigs from its directory)."""
    found: dict[int, list[str]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone meanwhile
        if state != "Z" and any(str(directory) in arg for arg in argv):
            found[int(proc.name)] = [a for a in argv if a]
    return found


@pytest.mark.integration
def test_kubectl_explain_command(cluster_shell: Shell, install_crds: list[str]) -> None:
    # Established CRDs reach the apiserver's discovery a moment later.
    wait_for(
        lambda: (
            "speculativedeployments" in cluster_shell.tool("kubectl", "api-resources", "-o", "name").stdout
        ),
        timeout=30,
        what="speculativedeployments in discovery",
    )
    # Its OpenAPI schema, which `kubectl explain` reads, is published a moment after that again (the
    # apiserver's CRD OpenAPI controller runs on its own): until then explain fails or shows no fields.
    expected = ("KIND: SpeculativeDeployment", "FIELD: placement", "gpuProduct", "draft")
    last: list[str] = []

    def explained() -> bool:
        proc = cluster_shell.run("kubectl explain sdep.spec.placement", check=False)
        last[:] = [" ".join(proc.stdout.split()), proc.stderr]
        return proc.returncode == 0 and all(text in last[0] for text in expected)

    try:
        wait_for(explained, timeout=30, what="kubectl explain showing the placement fields")
    except pytest.fail.Exception:
        pytest.fail(f"kubectl explain never showed {expected} in 30 s; its last stdout and stderr: {last}")


@pytest.mark.integration
def test_helm_install_commands(cluster_shell: Shell, kubectl: Kubectl, install_crds: list[str]) -> None:
    """`helm install` with the README's `--set` flags, in a fresh namespace: the chart installs the CRDs, one
    operator replica running the image the README builds (with the two server images for serving pods and
    builds), a ServiceAccount bound to its RBAC, and a metrics Service; `rollout status` waits for it."""
    namespace = f"readme-helm-{os.urandom(4).hex()}"
    release_ns = {"specdeploy-system": namespace}
    try:
        install = cluster_shell.run(
            "helm install specdeploy charts/specdeploy -n specdeploy-system --create-namespace"
            " --set image.repository=registry.example.com/specdeploy/operator"
            " --set settings.serverImage.repository=registry.example.com/specdeploy/server"
            " --set settings.engineServerImage.repository=registry.example.com/specdeploy/server"
            " --set engineCache.storageClassName=efs-rwx",
            release_ns,
            timeout=300,
        )
        assert "STATUS: deployed" in install.stdout, install.stdout
        rollout = cluster_shell.run(
            "kubectl -n specdeploy-system rollout status deployment/specdeploy", release_ns
        )
        assert 'deployment "specdeploy" successfully rolled out' in rollout.stdout, rollout.stdout

        def get(*args: str) -> Any:
            return json.loads(kubectl("get", *args, "-o", "json").stdout)

        for crd in ("speculativedeployments.specdeploy.dev", "enginebuilds.specdeploy.dev"):
            get("crd", crd)
        deployment = get("deployment", "specdeploy", "-n", namespace)
        assert deployment["spec"]["replicas"] == 1
        assert deployment["status"]["readyReplicas"] == 1
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "specdeploy"
        [container] = pod["containers"]
        images = docker_tags()
        assert container["image"] == images["Dockerfile.operator"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SPECDEPLOY_SERVER_IMAGE"] == images["server"]
        assert env["SPECDEPLOY_ENGINE_SERVER_IMAGE"] == images["engine server"]
        assert not env["SPECDEPLOY_BUILDER_IMAGE"]  # empty: builds use each deployment's serving image
        # The engine cache's class reaches the operator (here a name only: the operator pod is kwok's).
        assert env["SPECDEPLOY_CACHE_STORAGE_CLASS_NAME"] == "efs-rwx"
        subject = {"kind": "ServiceAccount", "name": "specdeploy", "namespace": namespace}
        bindings = [b for b in get("clusterrolebindings")["items"] if subject in (b.get("subjects") or [])]
        assert bindings, "no ClusterRoleBinding for the operator's ServiceAccount"
        for binding in bindings:
            role = get("clusterrole", binding["roleRef"]["name"])
            for rule in role["rules"]:
                assert "*" not in rule.get("verbs", []) + rule.get("resources", []), rule
                assert "secrets" not in rule.get("resources", []), rule
        service = get("service", "specdeploy-metrics", "-n", namespace)
        assert [p["port"] for p in service["spec"]["ports"]] == [8081]
    finally:
        cluster_shell.tool("helm", "uninstall", "specdeploy", "-n", namespace, "--wait", check=False)
        kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)


@pytest.mark.integration
@pytest.mark.usefixtures("operator", "install_crds")
def test_hf_token_secret_command(cluster_shell: Shell, kubectl: Kubectl, core: client.CoreV1Api) -> None:
    """The README's one command for a Hugging Face token makes the Secret a model's `credentialsSecret` names;
    the operator's build Job of a deployment naming it mounts it, as a file, in the download step only."""
    sh = cluster_shell
    with fresh_namespace(core, f"{OPERATOR_NAMESPACE_PREFIX}-readme") as namespace:
        sh.run(
            "kubectl config set-context --current --namespace=demo",
            {"--namespace=demo": f"--namespace={namespace}"},
        )
        created = sh.run("kubectl create secret generic hf-token --from-literal=HF_TOKEN=hf_your_token_here")
        assert created.stdout.strip() == "secret/hf-token created", created.stdout
        secret = core.read_namespaced_secret("hf-token", namespace)
        assert base64.b64decode(secret.data["HF_TOKEN"]) == b"hf_your_token_here"

        doc = yaml.safe_load((REPO / "examples" / "02-draft-target-llama8b-1b-h100.yaml").read_text())
        doc["metadata"]["namespace"] = namespace
        doc["spec"]["target"]["model"]["credentialsSecret"] = "hf-token"
        kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))

        def target_job() -> dict[str, Any] | None:
            jobs = json.loads(kubectl("get", "jobs", "-n", namespace, "-o", "json").stdout)["items"]
            labels = "specdeploy.dev/engine-role"
            return next((j for j in jobs if j["metadata"]["labels"].get(labels) == "target"), None)

        job = wait_for(target_job, timeout=120, interval=1, what="the target's build Job")
        pod = job["spec"]["template"]["spec"]
        secret_volumes = [
            v["name"] for v in pod["volumes"] if (v.get("secret") or {}).get("secretName") == "hf-token"
        ]
        assert len(secret_volumes) == 1, pod["volumes"]
        for step in pod["initContainers"] + pod["containers"]:
            mounted = any(m["name"] in secret_volumes for m in step.get("volumeMounts") or [])
            assert mounted == (step["name"] == "download"), step["name"]
        download = next(c for c in pod["initContainers"] if c["name"] == "download")
        assert {"name": "HF_TOKEN_PATH", "value": "/var/run/secrets/specdeploy/model/HF_TOKEN"} in download[
            "env"
        ]
        assert "hf_your_token_here" not in json.dumps(job)


@pytest.mark.integration
@pytest.mark.usefixtures("operator", "install_crds")
def test_watch_scale_and_troubleshoot_commands(
    cluster_shell: Shell, kubectl: Kubectl, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """ "Watching it" and "Troubleshooting" as written, in a namespace of the session's operator: examples/02
    goes to Ready under `kubectl get sdep -w`, scales to 3 ready replicas, and reports its endpoint."""
    sh = cluster_shell
    with fresh_namespace(core, f"{OPERATOR_NAMESPACE_PREFIX}-readme") as namespace:
        sh.run(
            "kubectl config set-context --current --namespace=demo",
            {"--namespace=demo": f"--namespace={namespace}"},
        )
        applied = sh.run("kubectl apply -f examples/02-draft-target-llama8b-1b-h100.yaml").stdout
        assert applied.strip() == f"speculativedeployment.specdeploy.dev/{SDEP} created", applied
        sh.tool("kubectl", "get", "sdep", SDEP, "-n", namespace)  # the context's namespace was used

        log = tmp_path / "watch.log"
        watch = sh.start("kubectl get sdep -w", log)
        ready_row = (
            rf"^{SDEP}\s+Ready\s+draftTarget\s+hf://meta-llama/Llama-3.1-8B-Instruct"
            # ACCEPTANCE and TOKENS/STEP stay empty here: the simulated GPU pods run no server to measure.
            r"\s+hf://meta-llama/Llama-3.2-1B-Instruct\s+1/1\s+(?:<none>\s+<none>\s+)?1\s+\S+$"
        )
        watched = wait_for_text(log, ready_row, watch, timeout=240).splitlines()
        sh.stop(watch)
        assert watched[0].split() == [
            "NAME",
            "PHASE",
            "METHOD",
            "TARGET",
            "DRAFT",
            "READY",
            "ACCEPTANCE",
            "TOKENS/STEP",
            "GPUS/REPLICA",
            "AGE",
        ]
        phases = [
            row.split()[1] for row in watched[1:] if row.startswith(SDEP) and len(row.split()) in (8, 10)
        ]
        assert phases[-1] == "Ready", watched
        assert len(set(phases)) > 1, f"the watch printed no progress: {watched}"

        builds = json.loads(sh.tool("kubectl", "get", "enginebuilds", "-o", "json").stdout)["items"]
        by_role = {b["spec"]["role"]: b["metadata"]["name"] for b in builds}
        assert sorted(by_role) == ["draft", "target"], by_role
        listed = sh.run("kubectl get enginebuilds").stdout.splitlines()
        assert listed[0].split()[0] == "NAME", listed
        assert {"ROLE", "PHASE"} <= set(listed[0].split()), listed
        assert sorted(line.split()[0] for line in listed[1:]) == sorted(by_role.values()), listed
        assert all("Succeeded" in line.split() for line in listed[1:]), listed

        texts: tuple[str, ...] = (
            "Conditions:",
            "Type: EnginesReady",
            "Reason:",
            "Events:",
            "Building",
            "RolloutStarted",
        )
        texts += ("RolloutFinished",)  # posted after the status write that said Ready

        def described() -> str | None:
            text = " ".join(sh.run("kubectl describe sdep llama-8b-1b-h100").stdout.split())
            return text if all(t in text for t in texts) else None

        wait_for(described, timeout=30, what=f"kubectl describe sdep showing {texts}")

        scaled = sh.run("kubectl scale sdep/llama-8b-1b-h100 --replicas=3").stdout
        assert scaled.strip() == f"speculativedeployment.specdeploy.dev/{SDEP} scaled", scaled

        def ready_text() -> str | None:
            text = sh.tool("kubectl", "get", "sdep", SDEP, "-o", "jsonpath={.status.readyText}").stdout
            return text if text == "3/3" else None

        wait_for(ready_text, timeout=120, interval=0.5, what="3/3 ready replicas after kubectl scale")
        replicas = sh.tool(
            "kubectl", "get", "deployment", SDEP, "-o", "jsonpath={.status.readyReplicas}"
        ).stdout
        assert replicas == "3"

        endpoint = sh.run(
            "ENDPOINT=$(kubectl get sdep llama-8b-1b-h100 -o jsonpath='{.status.endpoint}')",
            then='printf %s "$ENDPOINT"',
        ).stdout
        assert endpoint == f"http://{SDEP}.{namespace}.svc:8000/v1"

        # Troubleshooting
        again = " ".join(sh.run("kubectl describe sdep NAME", {"NAME": SDEP}).stdout.split())
        assert "Phase: Ready" in again, again
        assert "Type: EnginesReady" in again, again
        engine = by_role["target"]
        build = " ".join(sh.run("kubectl describe enginebuild ENGINE", {"ENGINE": engine}).stdout.split())
        for text in (
            "Phase: Succeeded",
            f"Job Name: {engine}-build",
            "Attempts:",
            "BuildStarted",
            "BuildSucceeded",
        ):
            assert text in build, f"{text!r} not in kubectl describe enginebuild:\n{build}"
        steps = sh.tool(
            "kubectl",
            "get",
            "job",
            f"{engine}-build",
            "-o",
            "jsonpath={.spec.template.spec.initContainers[*].name}",
        ).stdout.split()
        assert "quantize" in steps, steps
        assert_no_log_but_names_resolve(
            sh.run("kubectl logs job/ENGINE-build -c quantize", {"ENGINE": engine}, check=False),
            pods_of(sh, f"job-name={engine}-build"),
        )
        assert_no_log_but_names_resolve(
            sh.run("kubectl logs deployment/NAME -c server", {"NAME": SDEP}, check=False),
            pods_of(sh, f"app.kubernetes.io/instance={SDEP},app.kubernetes.io/component=server"),
        )
        sh.tool("kubectl", "delete", "sdep", SDEP, "--wait=false")


@pytest.mark.integration
@pytest.mark.usefixtures("operator", "install_crds")
def test_calling_the_cpu_deployment_commands(
    cluster_shell: Shell, kubectl: Kubectl, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """What `make demo` serves for real, called as the README says: the demo's models and examples/09 in a
    namespace of the session's operator, then port-forward, curl, /metrics and kubectl logs as written."""
    sh = cluster_shell
    with fresh_namespace(core, f"{OPERATOR_NAMESPACE_PREFIX}-readme") as namespace:
        sh.run(
            "kubectl config set-context --current --namespace=demo",
            {"--namespace=demo": f"--namespace={namespace}"},
        )
        make_demo_models(kubectl, namespace, steps=40)
        sh.tool("kubectl", "apply", "-f", "examples/09-transformers-cpu-tiny.yaml")

        def ready() -> bool:
            text = sh.tool("kubectl", "get", "sdep", "tiny-cpu", "-o", "jsonpath={.status.phase}").stdout
            return text == "Ready"

        wait_for(ready, timeout=240, interval=1, what="tiny-cpu Ready")
        log = tmp_path / "port-forward.log"
        # kubectl binds a local port of its own choosing and says which.
        forward = sh.start("kubectl port-forward svc/tiny-cpu 8000:8000 &", log, {"8000:8000": ":8000"})
        forwarding = wait_for_text(log, r"^Forwarding from 127\.0\.0\.1:\d+", forward, timeout=30)
        port = re.findall(r"^Forwarding from 127\.0\.0\.1:(\d+)", forwarding, re.MULTILINE)[0]
        completion = sh.run(
            "curl -s localhost:8000/v1/completions -H 'Content-Type: application/json'"
            """ -d '{"model": "target", "prompt": "Speculative decoding", "max_tokens": 24,"""
            """ "temperature": 0}'""",
            {"8000": port},
        )
        body = json.loads(completion.stdout)
        assert body["model"] == "target", body
        assert body["choices"][0]["text"], body
        figures = sh.run(
            "curl -s localhost:8000/metrics | grep -E '^specdeploy_(accepted_)?draft_tokens_total'",
            {"8000": port},
        ).stdout.splitlines()
        assert [line.split("{")[0] for line in figures] == [
            "specdeploy_draft_tokens_total",
            "specdeploy_accepted_draft_tokens_total",
        ], figures
        assert float(figures[0].rsplit(" ", 1)[1]) > 0, figures
        sh.stop(forward)
        logged = sh.run("kubectl logs deploy/tiny-cpu --tail=3").stdout
        assert "/v1/completions" in logged or "/metrics" in logged, logged
        sh.tool("kubectl", "delete", "sdep", "tiny-cpu", "--wait=false")


def pods_of(sh: Shell, selector: str) -> list[str]:
    pods = sh.tool(
        "kubectl", "get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}"
    ).stdout.split()
    assert pods, f"no pod with {selector}"
    return pods


def assert_no_log_but_names_resolve(proc: subprocess.CompletedProcess[str], pods: list[str]) -> None:
    """kubectl found the pod and the container (a wrong name fails before), the apiserver reached the
    simulated node's kubelet API (kwok, on loopback), and kwok had no log to give for one of `pods`."""
    assert proc.returncode != 0, f"kwok served a log? {proc.stdout}"
    message = re.search(r'no logs found for container "[^"]+" in pod "[^/"]+/([^"]+)"', proc.stderr)
    assert message, proc.stderr
    assert message.group(1) in pods, proc.stderr


@pytest.mark.integration
def test_existing_cluster_commands(
    cluster_shell: Shell, kubeconfig: Path, install_crds: list[str], tmp_path: Path
) -> None:
    """Not run as written (`make test` inside `make test`, and kind needs Docker). The variables do what the
    README says: one integration module run with them against the session cluster passes and starts no cluster
    of its own. hack/kind-up.sh parses, is executable and tells the user the same two variables."""
    command = readme_command("USE_EXISTING_CLUSTER=1 KUBECONFIG=~/.kube/config make test")
    assignments = dict(word.split("=", 1) for word in shlex.split(command)[:2])
    assert sorted(assignments) == ["KUBECONFIG", "USE_EXISTING_CLUSTER"]
    assert command.endswith(" make test")
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    # The harness's kubectl on PATH (the export line of the README), the session cluster as the existing one.
    env = cluster_shell.env | {"USE_EXISTING_CLUSTER": assignments["USE_EXISTING_CLUSTER"]}
    env["KUBECONFIG"] = str(kubeconfig)
    run = subprocess.run(
        [".venv/bin/python", "-m", "pytest", "-q", "tests/integration/test_api_explain.py"],
        cwd=REPO,
        env=env | {"TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"\b\d+ passed\b", run.stdout), run.stdout[-3000:]
    started = list(scratch.glob("specdeploy-cluster-*"))
    assert not started, f"USE_EXISTING_CLUSTER=1 still started a cluster: {started}"

    kind_up = REPO / readme_command("hack/kind-up.sh")
    assert os.access(kind_up, os.X_OK)
    cluster_shell.tool("bash", "-n", str(kind_up))
    assert "USE_EXISTING_CLUSTER=1 KUBECONFIG=" in kind_up.read_text()
