"""README commands that run on this machine without a cluster, as written (or, where they cannot run here,
what can be checked of them): tests/docs/readme_rows.py names each one's test."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import urllib.request
from pathlib import Path

import yaml
from specdeploy_localcluster.processes import PortTaken, free_port, port_taken, retry_on_taken_port
from specdeploy_operator.builders import OperatorSettings

from tests.chart.test_dockerfiles import DOCKERFILES
from tests.conftest import wait_for
from tests.docs.readme_rows import REPO, docker_tags, helm_install_sets, readme_command
from tests.docs.readme_shell import Shell, make_dry_run, make_target


def test_prerequisite_commands(shell: Shell) -> None:
    out = shell.run("go version").stdout
    version = re.match(r"go version go1\.(\d+)", out)
    assert version, out
    assert int(version.group(1)) >= 25, f"the README asks for Go >= 1.25: {out}"


def test_validate_and_render_commands(shell: Shell, tmp_path: Path) -> None:
    valid = shell.run(".venv/bin/specdeploy validate -f examples/01-draft-target-llama70b-8b-h100.yaml")
    assert valid.stdout.strip().endswith("(SpeculativeDeployment/llama-70b-8b-h100): valid"), valid.stdout

    rendered = shell.run(".venv/bin/specdeploy render -f examples/01-draft-target-llama70b-8b-h100.yaml")
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc}
    assert {"EngineBuild", "Job", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"} <= kinds, kinds

    broken = yaml.safe_load((REPO / "examples" / "01-draft-target-llama70b-8b-h100.yaml").read_text())
    broken["spec"]["target"]["tensorParalel"] = 2  # a typo
    broken["spec"]["speculative"]["draftLen"] = 64  # above maxDraftLen
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    invalid = shell.run(".venv/bin/specdeploy validate -f FILE", {"FILE": str(path)}, check=False)
    assert invalid.returncode == 1, invalid
    problems = [line.strip() for line in invalid.stderr.splitlines() if line.startswith("  ")]
    assert any("tensorParalel" in p for p in problems), invalid.stderr
    assert any("draftLen" in p for p in problems), invalid.stderr


def test_server_commands(shell: Shell, tmp_path: Path) -> None:
    from specdeploy_testkit import checkpoints

    usage = shell.run(".venv/bin/specdeploy-server --help").stdout
    assert usage.startswith("usage: specdeploy-server"), usage
    assert "--port" in usage
    assert "--debug" in usage

    models = tmp_path / "models"
    tokenizer = models / "tokenizer"
    tokenizer.mkdir(parents=True)
    checkpoints.train_tokenizer(tokenizer)
    checkpoints.save_tiny_llama(models / "target", tokenizer, seed=0)
    checkpoints.save_tiny_llama(
        models / "draft", tokenizer, seed=1, shape=checkpoints.TinyLlama(hidden_size=32, layers=1)
    )
    log = tmp_path / "server.log"

    def start_server() -> tuple[str, subprocess.Popen[bytes]]:
        """The server on a free port, ready (on another port if that one was taken before it bound it)."""
        port = str(free_port())
        server = shell.start(
            ".venv/bin/specdeploy-server /models/target /models/draft --port 8000 --debug &",
            log,
            {"/models/": f"{models}/", "8000": port},
        )

        def ready() -> bool:
            exited = server.poll() is not None
            if exited and port_taken(log.read_text()):
                raise PortTaken(f"port {port} was taken")
            assert not exited, f"the server exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        wait_for(ready, timeout=120, interval=0.3, what="the server's /health/ready")
        return port, server

    port, server = retry_on_taken_port(start_server)
    completion = shell.run(
        "curl -s localhost:8000/v1/completions -H 'Content-Type: application/json'"
        """ -d '{"model": "target", "prompt": "Speculative decoding is", "max_tokens": 16}'""",
        {"8000": port},
    )
    body = json.loads(completion.stdout)
    assert body["object"] == "text_completion", body
    assert body["model"] == "target", body
    assert body["choices"][0]["text"], body
    assert 1 <= body["usage"]["completion_tokens"] <= 16, body
    shell.stop(server)
    assert f"serving target on 0.0.0.0:{port}" in log.read_text(), log.read_text()[-3000:]


def test_make_test_unit_commands(shell: Shell) -> None:
    # Collected only, and without tests/server (whose imports alone take most of a full collection): the
    # directories whose tests need the cluster, or not, are all there.
    collected = shell.run(
        "make test-unit",
        append=" PYTEST_ARGS='--collect-only -q tests/unit tests/integration tests/chart tests/docs'",
        timeout=300,
    ).stdout
    ids = [line for line in collected.splitlines() if "::" in line]
    for expected in (
        "tests/unit/test_cli.py::test_several_files_at_once",
        "tests/chart/test_chart_render.py::",
        "tests/docs/test_readme_table.py::test_every_readme_command_has_a_row",
    ):
        assert any(i.startswith(expected) for i in ids), f"{expected} not collected:\n{collected[-3000:]}"
    needs_cluster = [
        i
        for i in ids
        if i.startswith(("tests/integration/", "tests/chart/test_chart_cluster.py"))
        or "test_helm_install_commands" in i
    ]
    assert not needs_cluster, f"make test-unit collects tests that need the cluster: {needs_cluster[:5]}"

    one_file = shell.run("make test-unit PYTEST_ARGS='-x tests/unit/test_cli.py'", timeout=300).stdout
    assert re.search(r"\b\d+ passed\b", one_file), one_file[-3000:]
    assert "test_readme_" not in one_file


def test_docker_commands() -> None:
    """Not run (no Docker engine): the operator's build names its Dockerfile and the repository as its
    context, hack/build-server-images.sh builds the two server images (printed, not run:
    tests/chart/test_dockerfiles.py checks their pins), each tagged as the README's `helm install` deploys it
    at the chart's appVersion; each push pushes a built tag."""
    build = argparse.ArgumentParser(prog="docker build", exit_on_error=False)
    build.add_argument("-f", "--file", required=True)
    build.add_argument("-t", "--tag", action="append", required=True)
    build.add_argument("--build-arg", action="append", default=[])
    build.add_argument("context")
    app_version = yaml.safe_load((REPO / "charts" / "specdeploy" / "Chart.yaml").read_text())["appVersion"]
    chart_repositories = helm_install_sets()
    args = build.parse_args(
        shlex.split(
            readme_command(
                "docker build -f Dockerfile.operator -t registry.example.com/specdeploy/operator:0.1.0 ."
            )
        )[2:]
    )
    assert (REPO / args.context).resolve() == REPO, "the README builds from the repository root"
    assert (REPO / args.context / args.file).is_file(), f"{args.file} does not exist"
    assert args.tag == [f"{chart_repositories['image.repository']}:{app_version}"]
    assert readme_command("hack/build-server-images.sh registry.example.com/specdeploy/server")
    tags = docker_tags()  # what that script builds (printed, not run)
    server = chart_repositories["settings.serverImage.repository"]
    assert chart_repositories["settings.engineServerImage.repository"] == server
    assert tags["server"] == f"{server}:{app_version}"
    assert tags["engine server"] == f"{server}:{OperatorSettings().engine_server_image.rpartition(':')[2]}"
    assert "settings.builderImage.repository" not in chart_repositories, "builds use the serving images"
    pushed = {
        shlex.split(readme_command(command))[2]
        for command in (
            "docker push registry.example.com/specdeploy/operator:0.1.0",
            "docker push registry.example.com/specdeploy/server:0.1.0",
            "docker push registry.example.com/specdeploy/server:0.1.0-trtllm1.2.1",
        )
    }
    assert pushed == set(tags.values())
    assert {"Dockerfile.operator", "Dockerfile.server"} <= set(DOCKERFILES)  # checked there


def test_benchmark_commands(shell: Shell) -> None:
    """Not run (minutes each, and they rewrite docs/benchmarks*.md or docs/local-cluster.md): each target runs
    its benchmark module, and that module starts and parses its arguments; `make measure` runs
    hack/measure.py, which knows the measurement."""
    for command, module in (
        ("make bench-server", "benchmarks.server"),
        ("make bench-operator", "benchmarks.operator"),
        ("make bench-autoscaling", "benchmarks.autoscaling"),
        ("make bench-memory", "benchmarks.memory"),
        ("make chaos", "benchmarks.reliability"),
    ):
        recipe = make_dry_run(shell, *make_target(readme_command(command)))
        assert f".venv/bin/python -m {module}" in recipe, recipe
        usage = shell.tool(".venv/bin/python", "-m", module, "--help").stdout
        assert usage.startswith(f"usage: python -m {module}"), usage
    sweep = shlex.split(readme_command("python -m benchmarks.server --only 7"))
    usage = shell.tool(".venv/bin/python", *sweep[1:3], "--help").stdout
    assert "--only 7" in usage, usage
    assert "load sweep" in usage, usage
    listing = shell.tool("python3", "hack/measure.py", "--list").stdout
    for command, name, what in (
        ("make measure NAME=test-warm", "test-warm", "warm `make test`"),
        ("make measure NAME=demo-cold", "demo-cold", "`make demo` on a fresh clone"),
    ):
        recipe = make_dry_run(shell, *make_target(readme_command(command)))
        assert f"python3 hack/measure.py {name}" in recipe, recipe
        assert re.search(rf"^{name} +{re.escape(what)}", listing, re.MULTILINE), listing


def test_demo_with_the_autoscaling_chain(shell: Shell) -> None:
    """`make demo` starts its cluster without the autoscaling chain (nor builds it); AUTOSCALING=1 builds and
    starts it. The chain itself runs in tests/integration/test_autoscaling*.py."""
    plain = make_dry_run(shell, *make_target(readme_command("make demo")))
    [build] = [line for line in plain if line.startswith("what=core;")]
    assert '[ "${SPECDEPLOY_AUTOSCALING:-1}" = 0 ] || what="core autoscaling"' in build, build
    [up] = [line for line in plain if "-m specdeploy_localcluster up" in line]
    assert "SPECDEPLOY_AUTOSCALING" not in up, up  # the target's export (0) decides
    database = shell.tool("make", "--no-print-directory", "-p", "-n", "demo").stdout  # its variables
    assert re.search(r"^demo: SPECDEPLOY_AUTOSCALING \??= 0$", database, re.MULTILINE), "no 0 for make demo"
    assert "demo: export SPECDEPLOY_AUTOSCALING" in (REPO / "Makefile").read_text()  # exported to its recipes

    chain = make_dry_run(shell, *make_target(readme_command("make demo AUTOSCALING=1")))
    [build] = [line for line in chain if line.startswith("what=core;")]
    assert '[ "1" = 0 ] || what="core autoscaling"' in build, build
    [up] = [line for line in chain if "-m specdeploy_localcluster up" in line]
    assert up.startswith("SPECDEPLOY_AUTOSCALING=1 "), up


def test_ci_entry_point(shell: Shell) -> None:
    """Not run (it is `make test`): it parses and its one command is `make test`."""
    path = REPO / readme_command(".ci/run")
    assert os.access(path, os.X_OK), f"{path} is not executable"
    shell.tool("bash", "-n", str(path))
    code = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert code[-1] == "make test", code
