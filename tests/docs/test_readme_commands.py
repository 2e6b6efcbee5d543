"""Every command of README.md, and how it is exercised (issue #7: "Every command in the README is exercised by
a test or by `make demo`").

The commands are read from the README itself (tests/docs/mdshell.py): every command of its fenced shell blocks
(`\\` continuations joined, comments and `$ ` prompts dropped), and every inline code span that is a command
(it starts with a program, or with an executable of the repository, and is not just a mention of a command of
a fenced block, such as `kubectl apply`). Each must have a row in COMMANDS saying how it is exercised:

- `Here(test)`: run by `test`, a function of this module, against the local cluster or on this machine. The
  function holds the command exactly as the README shows it and runs it with `bash`, after the substitutions
  listed below, then checks what the README says it does.
- `Demo(evidence)`: run by `make demo`. A `make` command is a target whose recipes are among those `make demo`
  runs (`make -n -B`); any other command is in hack/demo.sh, the script the demo target runs, as `evidence`.
- `Suite(test, evidence)`: run by a test elsewhere in the suite (`path::function`), whose source contains
  `evidence`; for a `make` command, `recipe` is in what the target runs.
- `MakeTest()`: run by `make test` itself: the target's recipes are among those of `make test`.
- `NotHere(test, why)`: cannot run here, for the reason `why`; `test` (a function of this module, holding the
  command) checks what can be checked.

A README command without a row fails `test_every_readme_command_has_a_row`, naming the command and its line; a
row whose command is no longer in the README fails `test_every_row_is_a_readme_command`. A new README section
gets a new group of rows in COMMANDS.

What runs differs from what the README shows only by these substitutions, each asserted to be in the command:

- `$PWD/.cluster/kubeconfig` -> a copy of the session cluster's kubeconfig. The `export` line of "The local
  cluster" then runs as written and gives every other command its KUBECONFIG and its PATH (the harness's
  `kubectl` and `helm`); helm keeps its cache and configuration in a temporary directory.
- `--namespace=demo` -> a fresh `op-readme-*` namespace, which the session's operator watches (its
  engine-cache claim is provisioned dynamically, as in `make demo`).
- `specdeploy-system` -> a fresh namespace for the Helm release.
- `NAME`, `ENGINE`, `FILE` -> the deployment, one of its EngineBuilds, a manifest with mistakes.
- `/models/target`, `/models/draft`, port 8000 -> tiny checkpoints (specdeploy_server.testing), a free port.
- `make X` -> `make -o .venv/.installed X` (a test never reinstalls the virtualenv), with `CLUSTER_DIR=<tmp>`
  for the local-cluster targets, `my-pools.yaml` -> a pools file, and `PYTEST_ARGS='--collect-only -q ...'`
  (tests/server left out: its imports alone take most of a collection) added to the bare `make test-unit`.
  Nested make and pytest runs inherit neither the outer make's MAKEFLAGS nor the outer pytest's base
  temporary directory.

Not runnable here: `kubectl logs` of the README's GPU examples (their pods are simulated: kwok answers that it
has no log; the test proves the Job or Deployment, the pod and the container name resolve), `docker build`
and `docker push` (no Docker engine, no registry), the benchmarks and `make measure` (minutes each; they
write records and rewrite docs/benchmarks*.md, docs/local-cluster.md), an existing cluster
(`USE_EXISTING_CLUSTER=1 ... make test` would run the suite inside the suite; the test runs one integration
module that way against the session cluster) and `.ci/run` (it is `make test`).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import tomllib
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from demomodels import make_demo_models
from kubernetes import client
from localcluster import LocalCluster

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for
from tests.docs.mdshell import SHELL_LANGUAGES, commands, fenced_blocks, inline_code

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
THIS = Path(__file__).resolve()
SDEP = "llama-8b-1b-h100"  # metadata.name of examples/02, the README's example


# -- how a command is exercised ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Here:
    """(a) Run by `test`, a function of this module, against the local cluster or on this machine."""

    test: str


@dataclass(frozen=True)
class Demo:
    """(b) Run by `make demo`: a target among its recipes, or `evidence` in hack/demo.sh."""

    evidence: str = ""


@dataclass(frozen=True)
class Suite:
    """(c) Run by the test `path::function` elsewhere in the suite, whose source contains `evidence`."""

    test: str
    evidence: str
    recipe: str = ""  # for a `make` command: text of what the target runs


@dataclass(frozen=True)
class MakeTest:
    """Run by `make test` itself: the target's recipes are among those of `make test`."""


@dataclass(frozen=True)
class NotHere:
    """(d) Cannot run here, because `why`; `test`, a function of this module, checks what can be checked."""

    test: str
    why: str


Row = Here | Demo | Suite | MakeTest | NotHere

LOGS_WHY = (
    "the GPU pods of these examples are simulated (no container runs), so kwok has no log to give; the pod"
    " runner's CPU pods do have logs (tests/integration/test_real_pods.py)"
)
DOCKER_WHY = "no Docker engine and no registry here (tests/chart/test_dockerfiles.py checks the Dockerfiles)"
BENCH_WHY = "minutes long, and it writes its records and rewrites its docs/benchmarks*.md"

COMMANDS: dict[str, Row] = {
    # The two commands
    "make demo": Demo(),
    "make test": MakeTest(),
    ".ci/run": NotHere(
        "test_ci_entry_point", "it is `make test`: run here it would run the suite inside itself"
    ),
    # Prerequisites
    "go version": Here("test_prerequisite_commands"),
    # The local cluster
    "make cluster-up": Demo(),
    "export KUBECONFIG=$PWD/.cluster/kubeconfig PATH=$(hack/cluster/build.sh):$PATH": Here(
        "test_local_cluster_commands"
    ),
    "kubectl get nodes -o wide": Here("test_local_cluster_commands"),
    "make cluster-down": Here("test_local_cluster_commands"),
    "hack/cluster/build.sh": Demo('bin="$(hack/cluster/build.sh)"'),
    "make cluster-up NODEPOOLS=my-pools.yaml": Here("test_local_cluster_commands"),
    # The operator
    "python -m specdeploy_operator --kubeconfig PATH": Demo("$py -m specdeploy_operator --kubeconfig"),
    ".venv/bin/specdeploy render -f examples/01-draft-target-llama70b-8b-h100.yaml": Here(
        "test_validate_and_render_commands"
    ),
    # Installing on a GPU cluster (Helm)
    "docker build -f Dockerfile.operator -t registry.example.com/specdeploy/operator:0.1.0 .": NotHere(
        "test_docker_commands", DOCKER_WHY
    ),
    "docker build -f Dockerfile.server -t registry.example.com/specdeploy/server:0.1.0 .": NotHere(
        "test_docker_commands", DOCKER_WHY
    ),
    "docker push registry.example.com/specdeploy/operator:0.1.0": NotHere("test_docker_commands", DOCKER_WHY),
    "docker push registry.example.com/specdeploy/server:0.1.0": NotHere("test_docker_commands", DOCKER_WHY),
    (
        "helm install specdeploy charts/specdeploy -n specdeploy-system --create-namespace"
        " --set image.repository=registry.example.com/specdeploy/operator"
        " --set settings.serverImage.repository=registry.example.com/specdeploy/server"
        " --set settings.builderImage.repository=registry.example.com/specdeploy/server"
    ): Here("test_helm_install_commands"),
    "kubectl -n specdeploy-system rollout status deployment/specdeploy": Here("test_helm_install_commands"),
    "make crds": Suite(
        "tests/unit/test_crdgen.py::test_committed_crds_are_current",
        "run `make crds`",
        recipe="-m specdeploy_operator.crdgen --out-dir crds --out-dir charts/specdeploy/crds",
    ),
    # Writing a SpeculativeDeployment
    ".venv/bin/specdeploy validate -f examples/01-draft-target-llama70b-8b-h100.yaml": Here(
        "test_validate_and_render_commands"
    ),
    "kubectl explain sdep.spec.placement": Here("test_kubectl_explain_command"),
    # Watching it, calling it
    "kubectl config set-context --current --namespace=demo": Here(
        "test_watch_scale_and_troubleshoot_commands"
    ),
    "kubectl apply -f examples/02-draft-target-llama8b-1b-h100.yaml": Here(
        "test_watch_scale_and_troubleshoot_commands"
    ),
    "kubectl get sdep -w": Here("test_watch_scale_and_troubleshoot_commands"),
    "kubectl get enginebuilds": Here("test_watch_scale_and_troubleshoot_commands"),
    "kubectl describe sdep llama-8b-1b-h100": Here("test_watch_scale_and_troubleshoot_commands"),
    "kubectl scale sdep/llama-8b-1b-h100 --replicas=3": Here("test_watch_scale_and_troubleshoot_commands"),
    "ENDPOINT=$(kubectl get sdep llama-8b-1b-h100 -o jsonpath='{.status.endpoint}')": Here(
        "test_watch_scale_and_troubleshoot_commands"
    ),
    # Troubleshooting
    "kubectl describe sdep NAME": Here("test_watch_scale_and_troubleshoot_commands"),
    "kubectl describe enginebuild ENGINE": Here("test_watch_scale_and_troubleshoot_commands"),
    "kubectl logs job/ENGINE-build -c quantize": NotHere(
        "test_watch_scale_and_troubleshoot_commands", LOGS_WHY
    ),
    "kubectl logs deployment/NAME -c server": NotHere("test_watch_scale_and_troubleshoot_commands", LOGS_WHY),
    "kubectl annotate eb ENGINE specdeploy.dev/retry=2 --overwrite": NotHere(
        "test_the_retry_command_sets_the_operators_retry_annotation",
        "it needs a failed build; tests/integration/test_operator_live_state.py retries one with it",
    ),
    # ... and calling make demo's CPU deployment, served for real
    "kubectl port-forward svc/tiny-cpu 8000:8000 &": Here("test_calling_the_cpu_deployment_commands"),
    (
        "curl -s localhost:8000/v1/completions -H 'Content-Type: application/json'"
        """ -d '{"model": "target", "prompt": "Speculative decoding", "max_tokens": 24, "temperature": 0}'"""
    ): Here("test_calling_the_cpu_deployment_commands"),
    "curl -s localhost:8000/metrics | grep -E '^specdeploy_(accepted_)?draft_tokens_total'": Here(
        "test_calling_the_cpu_deployment_commands"
    ),
    "kubectl logs deploy/tiny-cpu --tail=3": Here("test_calling_the_cpu_deployment_commands"),
    ".venv/bin/specdeploy validate -f FILE": Here("test_validate_and_render_commands"),
    # The server
    ".venv/bin/specdeploy-server --help": Here("test_server_commands"),
    ".venv/bin/specdeploy-server /models/target /models/draft --port 8000 --debug &": Here(
        "test_server_commands"
    ),
    (
        "curl -s localhost:8000/v1/completions -H 'Content-Type: application/json'"
        """ -d '{"model": "target", "prompt": "Speculative decoding is", "max_tokens": 16}'"""
    ): Here("test_server_commands"),
    # Using an existing cluster
    "USE_EXISTING_CLUSTER=1 KUBECONFIG=~/.kube/config make test": NotHere(
        "test_existing_cluster_commands",
        "the suite inside the suite; the test runs one integration module that way, on the session cluster",
    ),
    "hack/kind-up.sh": NotHere("test_existing_cluster_commands", "needs Docker and kind"),
    # Benchmarks
    "make bench-server": NotHere("test_benchmark_commands", BENCH_WHY),
    "python -m benchmarks.server --only 7": NotHere("test_benchmark_commands", BENCH_WHY),
    "make bench-operator": NotHere("test_benchmark_commands", BENCH_WHY),
    "make bench-autoscaling": NotHere("test_benchmark_commands", BENCH_WHY),
    "make bench-memory": NotHere("test_benchmark_commands", BENCH_WHY),
    "make chaos": NotHere(
        "test_benchmark_commands", "about 16 minutes; it writes its record and rewrites docs/reliability.md"
    ),
    "make measure NAME=test-warm": NotHere(
        "test_benchmark_commands",
        "it runs `make test` (the suite inside the suite) and rewrites docs/local-cluster.md",
    ),
    # Developing
    "make venv": Demo(),
    "make lint": MakeTest(),
    "make test-unit": Here("test_make_test_unit_commands"),
    "make test-unit PYTEST_ARGS='-x tests/unit/test_cli.py'": Here("test_make_test_unit_commands"),
}

# Inline code that starts with one of these (or with an executable file of the repository) is a command.
PROGRAMS = frozenset(
    {
        "bash",
        "curl",
        "docker",
        "export",
        "git",
        "go",
        "helm",
        "kind",
        "kubectl",
        "make",
        "pip",
        "python",
        "sh",
    }
    | {"python3", "specdeploy", "specdeploy-server"}
)


# -- the README's commands -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    text: str
    line: int
    inline: bool


@functools.cache
def readme_commands() -> tuple[Found, ...]:
    """Every command of the README: those of its fenced shell blocks, then its inline commands that are not a
    mention of a fenced one (the command itself, or its first words)."""
    text = README.read_text()
    fenced = [Found(c.text, c.line, False) for block in fenced_blocks(text) for c in commands(block)]
    found = list(fenced)
    for span in inline_code(text):
        if not is_command(span.text):
            continue
        words = span.text.split()
        if any(f.text.split()[: len(words)] == words for f in fenced):
            continue
        found.append(Found(" ".join(words), span.line, True))
    return tuple(found)


def is_command(code: str) -> bool:
    words = code.split()
    if not words:
        return False
    first = words[0]
    path = REPO / first
    executable = "/" in first and path.is_file() and os.access(path, os.X_OK)
    return executable or (first in PROGRAMS and len(words) > 1)


def readme_command(command: str) -> str:
    texts = {f.text for f in readme_commands()}
    assert command in texts, f"not a command of README.md (any more?): {command}"
    return command


# -- running them --------------------------------------------------------------------------------------------


@dataclass
class Shell:
    """Runs README commands with `bash` in the repository root, in `env`."""

    env: dict[str, str]
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def script(self, command: str, subs: Mapping[str, str], append: str) -> str:
        text = readme_command(command)
        if text.startswith("make "):
            text = "make -o .venv/.installed " + text.removeprefix("make ")
        for old, new in subs.items():
            assert old in text, f"{old!r} is not in the README command {command!r} any more"
            text = text.replace(old, new)
        return text + append

    def run(
        self,
        command: str,
        subs: Mapping[str, str] | None = None,
        *,
        append: str = "",
        then: str = "",
        check: bool = True,
        timeout: float = 180,
    ) -> subprocess.CompletedProcess[str]:
        script = self.script(command, subs or {}, append)
        with subprocess.Popen(
            ["bash", "-c", f"set -euo pipefail\n{script}\n{then}"],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as child:
            try:
                stdout, stderr = child.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)  # what the command started too (make, its recipes)
                child.communicate()
                raise
        proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
        if check:
            assert proc.returncode == 0, (
                f"`{script}` failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
        return proc

    def start(
        self, command: str, log: Path, subs: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """The command in the background (its own process group), its output in `log`."""
        script = self.script(command, subs or {}, "")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", f"{script}\nwait"],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def export(self, command: str, subs: Mapping[str, str]) -> Shell:
        """A shell whose environment is this one after the README's `export` command."""
        out = self.run(command, subs, then="env -0").stdout
        env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
        return Shell(env, self.started)

    def tool(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command that is not the README's (to look at what one did), in the same environment."""
        proc = subprocess.run(
            argv, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120, check=False
        )
        if check:
            assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    env = {k: v for k, v in os.environ.items() if k not in {"KUBECONFIG", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    helm_home = tmp_path / "helm"
    env |= {
        "HELM_CACHE_HOME": str(helm_home / "cache"),
        "HELM_CONFIG_HOME": str(helm_home / "config"),
        "HELM_DATA_HOME": str(helm_home / "data"),
        "PYTEST_ADDOPTS": f"--basetemp={tmp_path / 'nested-pytest'} -p no:cacheprovider",
        # kubectl's discovery cache is per host:port: one an earlier cluster left on the same port lacks the
        # CRDs for a while.
        "KUBECACHEDIR": str(tmp_path / "kube-cache"),
    }
    sh = Shell(env)
    yield sh
    for proc in sh.started:
        sh.stop(proc)


EXPORT = "export KUBECONFIG=$PWD/.cluster/kubeconfig PATH=$(hack/cluster/build.sh):$PATH"


@pytest.fixture
def cluster_shell(shell: Shell, kubectl: Kubectl, tmp_path: Path) -> Shell:
    """The shell after the README's `export` line, pointed at a copy of the session cluster's kubeconfig."""
    copy = tmp_path / "kubeconfig"
    copy.write_text(kubectl("config", "view", "--flatten", "--raw").stdout)
    copy.chmod(0o600)
    after = shell.export("export KUBECONFIG=$PWD/.cluster/kubeconfig PATH=$(hack/cluster/build.sh):$PATH", {
        "$PWD/.cluster/kubeconfig": str(copy)
    })  # fmt: skip
    assert after.env["KUBECONFIG"] == str(copy)
    bins = Path(after.env["PATH"].split(":")[0])
    assert (bins / "kubectl").is_file(), f"no kubectl in {bins}"
    assert (bins / "helm").is_file(), f"no helm in {bins}"
    return after


def make_dry_run(shell: Shell, *args: str) -> list[str]:
    """What `make` would run for `args`, every recipe of every prerequisite included (`-n -B`)."""
    out = shell.tool("make", "--no-print-directory", "-n", "-B", *args).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def wait_for_text(path: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The output in `path` once `pattern` matches a line of it; fails after `timeout` or if `proc` exits."""

    def matched() -> str | None:
        text = path.read_text(errors="replace")
        if re.search(pattern, text, re.MULTILINE):
            return text
        assert proc.poll() is None, f"exited ({proc.returncode}):\n{text[-3000:]}"
        return None

    found: str = wait_for(matched, timeout=timeout, interval=0.3, what=f"{pattern!r} in {path.name}")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- the table -----------------------------------------------------------------------------------------------


def test_every_fenced_block_names_its_language() -> None:
    """A block without a language could hold commands that nothing checks."""
    unnamed = [block.line for block in fenced_blocks(README.read_text()) if not block.language]
    assert not unnamed, (
        f"README.md: fenced blocks without a language (```bash, ```text, ...) at lines {unnamed}"
    )


def test_the_two_commands_come_first() -> None:
    first = next(b for b in fenced_blocks(README.read_text()) if b.language in SHELL_LANGUAGES)
    assert [c.text for c in commands(first)] == ["make demo", "make test"]


def test_every_readme_command_has_a_row() -> None:
    missing = [f for f in readme_commands() if f.text not in COMMANDS]
    assert not missing, (
        "README.md commands with no row in COMMANDS (say how each is exercised):\n"
        + "\n".join(f"  line {f.line}{' (inline)' if f.inline else ''}: {f.text}" for f in missing)
    )


def test_every_row_is_a_readme_command() -> None:
    texts = {f.text for f in readme_commands()}
    stale = [command for command in COMMANDS if command not in texts]
    assert not stale, "rows of COMMANDS whose command is not in README.md:\n" + "\n".join(stale)


def function_node(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert nodes, f"{path.relative_to(REPO)} has no function {name}"
    return nodes[0]


def string_constants(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def make_target(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0] == "make", command
    return words[1:]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_row_evidence(command: str, shell: Shell) -> None:
    """What each row claims: the test it names holds the command, or the demo or `make test` runs it."""
    row = COMMANDS[command]
    if isinstance(row, Here | NotHere):
        constants = string_constants(function_node(THIS, row.test))
        assert command in constants, f"{row.test} does not run the README command {command!r}"
        if isinstance(row, NotHere):
            assert row.why.strip(), f"say why {command!r} cannot run here"
    elif isinstance(row, Demo):
        demo = make_dry_run(shell, "demo")
        assert "hack/demo.sh .cluster" in demo, f"`make demo` no longer runs hack/demo.sh: {demo}"
        if command.startswith("make "):
            extra = [line for line in make_dry_run(shell, *make_target(command)) if line not in demo]
            assert not extra, f"`make demo` does not run all of `{command}`; it lacks: {extra}"
        else:
            assert row.evidence, f"name what in hack/demo.sh runs {command!r}"
            assert row.evidence in (REPO / "hack" / "demo.sh").read_text(), (
                f"hack/demo.sh lacks {row.evidence!r}"
            )
    elif isinstance(row, Suite):
        path, _, name = row.test.partition("::")
        node = function_node(REPO / path, name)
        source = ast.get_source_segment((REPO / path).read_text(), node) or ""
        assert row.evidence in source, f"{row.test} does not contain {row.evidence!r}"
        if command.startswith("make "):
            assert row.recipe, f"name what `{command}` runs"
            assert any(row.recipe in line for line in make_dry_run(shell, *make_target(command)))
    else:
        assert isinstance(row, MakeTest)
        everything = make_dry_run(shell, "test")
        extra = [line for line in make_dry_run(shell, *make_target(command)) if line not in everything]
        assert not extra, f"`make test` does not run all of `{command}`; it lacks: {extra}"
        assert any(" -m pytest" in line for line in everything), everything
        config = tomllib.loads((REPO / "pyproject.toml").read_text())
        testpaths = config["tool"]["pytest"]["ini_options"]["testpaths"]
        assert any(THIS.is_relative_to(REPO / p) for p in testpaths), f"pytest does not collect {THIS}"


# -- (a) and (d): offline ------------------------------------------------------------------------------------


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
    from specdeploy_server import testing

    usage = shell.run(".venv/bin/specdeploy-server --help").stdout
    assert usage.startswith("usage: specdeploy-server"), usage
    assert "--port" in usage
    assert "--debug" in usage

    models = tmp_path / "models"
    tokenizer = models / "tokenizer"
    tokenizer.mkdir(parents=True)
    testing.train_tokenizer(tokenizer)
    testing.save_tiny_llama(models / "target", tokenizer, seed=0)
    testing.save_tiny_llama(
        models / "draft", tokenizer, seed=1, shape=testing.TinyLlama(hidden_size=32, layers=1)
    )
    port = str(free_port())
    log = tmp_path / "server.log"
    server = shell.start(
        ".venv/bin/specdeploy-server /models/target /models/draft --port 8000 --debug &",
        log,
        {"/models/": f"{models}/", "8000": port},
    )

    def ready() -> bool:
        assert server.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    wait_for(ready, timeout=120, interval=0.3, what="the server's /health/ready")
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
        "tests/docs/test_readme_commands.py::test_every_readme_command_has_a_row",
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
    assert "test_readme_commands" not in one_file


def test_docker_commands() -> None:
    """Not run (no Docker engine): each build names an existing Dockerfile and the repository as its context,
    and tags the image the README's `helm install` deploys, at the chart's appVersion; each push pushes a
    built tag."""
    build = argparse.ArgumentParser(prog="docker build", exit_on_error=False)
    build.add_argument("-f", "--file", required=True)
    build.add_argument("-t", "--tag", action="append", required=True)
    build.add_argument("--build-arg", action="append", default=[])
    build.add_argument("context")
    app_version = yaml.safe_load((REPO / "charts" / "specdeploy" / "Chart.yaml").read_text())["appVersion"]
    chart_repositories = helm_install_sets()
    repositories = {
        "Dockerfile.operator": chart_repositories["image.repository"],
        "Dockerfile.server": chart_repositories["settings.serverImage.repository"],
    }
    assert chart_repositories["settings.builderImage.repository"] == repositories["Dockerfile.server"]
    tags = set()
    for command in (
        "docker build -f Dockerfile.operator -t registry.example.com/specdeploy/operator:0.1.0 .",
        "docker build -f Dockerfile.server -t registry.example.com/specdeploy/server:0.1.0 .",
    ):
        args = build.parse_args(shlex.split(readme_command(command))[2:])
        assert (REPO / args.context).resolve() == REPO, "the README builds from the repository root"
        assert (REPO / args.context / args.file).is_file(), f"{args.file} does not exist"
        [tag] = args.tag
        assert tag == f"{repositories[args.file]}:{app_version}", f"{tag}: not the image the chart deploys"
        tags.add(tag)
    pushed = {
        shlex.split(readme_command(command))[2]
        for command in (
            "docker push registry.example.com/specdeploy/operator:0.1.0",
            "docker push registry.example.com/specdeploy/server:0.1.0",
        )
    }
    assert pushed == tags
    checks = (REPO / "tests" / "chart" / "test_dockerfiles.py").read_text()
    assert 'DOCKERFILES = ["Dockerfile.operator", "Dockerfile.server"]' in checks


def helm_install_sets() -> dict[str, str]:
    """The `--set` values of the README's `helm install`."""
    [install] = [f.text for f in readme_commands() if f.text.startswith("helm install ")]
    words = shlex.split(install)
    sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    return dict(item.split("=", 1) for item in sets)


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
    recipe = make_dry_run(shell, *make_target(readme_command("make measure NAME=test-warm")))
    assert "python3 hack/measure.py test-warm" in recipe, recipe
    listing = shell.tool("python3", "hack/measure.py", "--list").stdout
    assert re.search(r"^test-warm +warm `make test`", listing, re.MULTILINE), listing


def test_ci_entry_point(shell: Shell) -> None:
    """Not run (it is `make test`): it parses and its one command is `make test`."""
    path = REPO / readme_command(".ci/run")
    assert os.access(path, os.X_OK), f"{path} is not executable"
    shell.tool("bash", "-n", str(path))
    code = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert code[-1] == "make test", code


# -- (a) and (d): against a cluster --------------------------------------------------------------------------


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
    operator replica running the image the README builds (the server image for serving pods and builds), a
    ServiceAccount bound to its RBAC, and a metrics Service; `rollout status` waits for it."""
    namespace = f"readme-helm-{os.urandom(4).hex()}"
    release_ns = {"specdeploy-system": namespace}
    try:
        install = cluster_shell.run(
            "helm install specdeploy charts/specdeploy -n specdeploy-system --create-namespace"
            " --set image.repository=registry.example.com/specdeploy/operator"
            " --set settings.serverImage.repository=registry.example.com/specdeploy/server"
            " --set settings.builderImage.repository=registry.example.com/specdeploy/server",
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
        assert env["SPECDEPLOY_SERVER_IMAGE"] == images["Dockerfile.server"]
        assert env["SPECDEPLOY_BUILDER_IMAGE"] == images["Dockerfile.server"]
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


def docker_tags() -> dict[str, str]:
    """Dockerfile -> the tag the README's `docker build` gives its image."""
    tags = {}
    for found in readme_commands():
        words = shlex.split(found.text)
        if words[:2] == ["docker", "build"]:
            tags[words[words.index("-f") + 1]] = words[words.index("-t") + 1]
    return tags


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

        described = " ".join(sh.run("kubectl describe sdep llama-8b-1b-h100").stdout.split())
        for text in (
            "Conditions:",
            "Type: EnginesReady",
            "Reason:",
            "Events:",
            "Building",
            "RolloutStarted",
            "RolloutFinished",
        ):
            assert text in described, f"{text!r} not in kubectl describe sdep:\n{described}"

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
        port = str(free_port())
        log = tmp_path / "port-forward.log"
        forward = sh.start(
            "kubectl port-forward svc/tiny-cpu 8000:8000 &", log, {"8000:8000": f"{port}:8000"}
        )
        wait_for_text(log, rf"^Forwarding from 127\.0\.0\.1:{port}", forward, timeout=30)
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


# -- the parser ----------------------------------------------------------------------------------------------

PARSER_CASES: list[tuple[str, list[str]]] = [
    ("```bash\nmake demo    # comment\n\n# only a comment\nmake test\n```\n", ["make demo", "make test"]),
    (
        "```sh\nhelm install a b \\\n  --set x=1 \\\n  --set y=2\n```\n",
        ["helm install a b --set x=1 --set y=2"],
    ),
    (
        "```console\n$ kubectl get sdep\nNAME   PHASE\nx      Ready\n$ echo 'a  # b'\n```\n",
        ["kubectl get sdep", "echo 'a  # b'"],
    ),
    ("```console\n$ helm install a \\\n> --set b=1\n```\n", ["helm install a --set b=1"]),
    ("```bash\n$ make demo\n```\n```yaml\nkey: value\n```\n", ["make demo"]),
    ("~~~~bash\n```\nnot a fence end\n~~~~\n", ["```", "not a fence end"]),
    ("  ```bash\n  make x   y\n  ```\n", ["make x y"]),
    ("```bash\nfoo # a comment \\\nbar\n```\n", ["foo", "bar"]),
]


@pytest.mark.parametrize(("markdown", "expected"), PARSER_CASES)
def test_commands_of_fenced_blocks(markdown: str, expected: list[str]) -> None:
    assert [c.text for b in fenced_blocks(markdown) for c in commands(b)] == expected


@pytest.mark.parametrize(
    ("markdown", "message"),
    [
        ("```bash\nmake demo\n", "never closed"),
        ("```bash\ncat <<EOF\nx\nEOF\n```\n", "heredocs"),
        ("```bash\necho 'open\n```\n", "quote is still open"),
        ("```bash\nmake \\\n```\n", "continuation"),
    ],
)
def test_what_the_parser_refuses(markdown: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        [c for b in fenced_blocks(markdown) for c in commands(b)]


def test_inline_code_spans_lines_and_fences() -> None:
    markdown = "Run `make\ndemo` or ``a ` b``.\n\n```bash\n`not inline`\n```\nAnd `kubectl get x`.\n"
    spans = [(s.text, s.line) for s in inline_code(markdown)]
    assert spans == [("make demo", 1), ("a ` b", 2), ("kubectl get x", 7)]


def test_inline_commands_are_told_from_mentions() -> None:
    assert is_command("kubectl describe enginebuild ENGINE")
    assert is_command(".ci/run")
    assert is_command("hack/kind-up.sh")
    assert not is_command("kubectl")
    assert not is_command("specdeploy")
    assert not is_command("crds/")
    assert not is_command("nvidia.com/gpu=present:NoSchedule")
    assert not is_command("--set 'a={b}'")


def test_the_retry_command_sets_the_operators_retry_annotation() -> None:
    """The README's retry of a failed build sets the annotation the operator reads (`builders.job`)."""
    from specdeploy_operator.builders.job import RETRY_ANNOTATION

    words = shlex.split(readme_command("kubectl annotate eb ENGINE specdeploy.dev/retry=2 --overwrite"))
    assert words[:3] == ["kubectl", "annotate", "eb"]
    assert any(word.startswith(f"{RETRY_ANNOTATION}=") for word in words)
