"""Every command of README.md and docs/quickstart.md (COMMAND_PAGES, "the README's commands" below), and how
it is exercised: every command there is exercised by a test or by `make demo`.

The commands are read from the pages themselves (tests/docs/mdshell.py): every command of their fenced shell
blocks (`\\` continuations joined, comments and `$ ` prompts dropped), and every inline code span that is a
command (it starts with a program, or with an executable of the repository, and is not just a mention of a
command of a fenced block, such as `kubectl apply`). Each must have a row in COMMANDS saying how it is
exercised:

- `Here(test)`: run by `test`, a test function of one of the README test modules (TEST_MODULES:
  tests/docs/test_readme_{offline,cluster,table}.py), against the local cluster or on this machine. The
  function holds the command exactly as the README shows it and runs it with `bash`, after the substitutions
  listed below, then checks what the README says it does.
- `Demo(evidence)`: run by `make demo`. A `make` command is a target whose recipes are among those `make demo`
  runs (`make -n -B`); any other command is in hack/demo.sh, the script the demo target runs, as `evidence`.
- `Suite(test, evidence)`: run by a test elsewhere in the suite (`path::function`), whose source contains
  `evidence`; for a `make` command, `recipe` is in what the target runs.
- `MakeTest()`: run by `make test` itself: the target's recipes are among those of `make test`.
- `NotHere(test, why)`: cannot run here, for the reason `why`; `test` (a test function of TEST_MODULES,
  holding the command) checks what can be checked.

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
- `/models/target`, `/models/draft`, port 8000 -> tiny checkpoints (specdeploy_testkit), a free port.
- `make X` -> `make -o .venv/.installed -o .venv/.runtime X` (a test never reinstalls the virtualenv), with
  `CLUSTER_DIR=<tmp>` for the local-cluster targets, `my-pools.yaml` -> a pools file, and
  `PYTEST_ARGS='--collect-only -q ...'` (tests/server left out: its imports alone take most of a collection)
  added to the bare `make test-unit`.
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

import functools
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.docs.mdshell import commands, fenced_blocks, inline_code

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: The pages whose commands are all exercised: the README, and the quickstart the README's details moved to.
COMMAND_PAGES = (README, REPO / "docs" / "quickstart.md")
DOCS_TESTS = Path(__file__).resolve().parent
# The modules whose test functions `Here` and `NotHere` rows name.
TEST_MODULES = (
    DOCS_TESTS / "test_readme_offline.py",
    DOCS_TESTS / "test_readme_cluster.py",
    DOCS_TESTS / "test_readme_table.py",
)


# -- how a command is exercised ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Here:
    """(a) Run by `test`, a test function of TEST_MODULES, against the local cluster or on this machine."""

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
    """(d) Cannot run here, because `why`; `test`, a test function of TEST_MODULES, checks what can be
    checked."""

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
    "make demo AUTOSCALING=1": Here("test_demo_with_the_autoscaling_chain"),
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
    "hack/cluster/build.sh": Demo('bin="$(hack/cluster/build.sh core)"'),
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
    "hack/build-server-images.sh registry.example.com/specdeploy/server": NotHere(
        "test_docker_commands", DOCKER_WHY
    ),
    "docker push registry.example.com/specdeploy/operator:0.1.0": NotHere("test_docker_commands", DOCKER_WHY),
    "docker push registry.example.com/specdeploy/server:0.1.0": NotHere("test_docker_commands", DOCKER_WHY),
    "docker push registry.example.com/specdeploy/server:0.1.0-trtllm1.2.1": NotHere(
        "test_docker_commands", DOCKER_WHY
    ),
    (
        "helm install specdeploy charts/specdeploy -n specdeploy-system --create-namespace"
        " --set image.repository=registry.example.com/specdeploy/operator"
        " --set settings.serverImage.repository=registry.example.com/specdeploy/server"
        " --set settings.engineServerImage.repository=registry.example.com/specdeploy/server"
        " --set engineCache.storageClassName=efs-rwx"
    ): Here("test_helm_install_commands"),
    "kubectl -n specdeploy-system rollout status deployment/specdeploy": Here("test_helm_install_commands"),
    "make crds": Suite(
        "tests/unit/test_crdgen.py::test_committed_crds_are_current",
        "run `make crds`",
        recipe="-m specdeploy_operator.crdgen --out-dir crds --out-dir charts/specdeploy/crds",
    ),
    # Writing a SpeculativeDeployment
    "kubectl create secret generic hf-token --from-literal=HF_TOKEN=hf_your_token_here": Here(
        "test_hf_token_secret_command"
    ),
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
        "it runs `make test` (the suite inside the suite) and rewrites docs/development.md",
    ),
    "make measure NAME=demo-cold": NotHere(
        "test_benchmark_commands",
        "about 15 minutes (a fresh clone, empty caches: every build and download) and it rewrites the README",
    ),
    # Developing
    "make venv": MakeTest(),
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
    page: str = "README.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.line}{' (inline)' if self.inline else ''}: {self.text}"


@functools.cache
def readme_commands() -> tuple[Found, ...]:
    """Every command of COMMAND_PAGES: those of their fenced shell blocks, then their inline commands that are
    not a mention of a fenced one of any page (the command itself, or its first words)."""
    texts = {page.relative_to(REPO).as_posix(): page.read_text() for page in COMMAND_PAGES}
    fenced = [
        Found(c.text, c.line, False, page)
        for page, text in texts.items()
        for block in fenced_blocks(text)
        for c in commands(block)
    ]
    found = list(fenced)
    for page, text in texts.items():
        for span in inline_code(text):
            if not is_command(span.text):
                continue
            words = span.text.split()
            if any(f.text.split()[: len(words)] == words for f in fenced):
                continue
            found.append(Found(" ".join(words), span.line, True, page))
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
    assert command in texts, (
        f"not a command of {', '.join(p.name for p in COMMAND_PAGES)} (any more?): {command}"
    )
    return command


def helm_install_sets() -> dict[str, str]:
    """The `--set` values of the README's `helm install`."""
    [install] = [f.text for f in readme_commands() if f.text.startswith("helm install ")]
    words = shlex.split(install)
    sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    return dict(item.split("=", 1) for item in sets)


def docker_tags() -> dict[str, str]:
    """Image -> the tag the README's commands give it: `Dockerfile.operator` (its `docker build`), `server`
    and `engine server` (what hack/build-server-images.sh builds, in that order: run with
    `DOCKER="echo docker"`, which prints the builds instead of running them)."""
    tags = {}
    for found in readme_commands():
        words = shlex.split(found.text)
        if words[:2] == ["docker", "build"]:
            tags[words[words.index("-f") + 1]] = words[words.index("-t") + 1]
        elif words and words[0] == "hack/build-server-images.sh":
            printed = subprocess.run(
                ["bash", *words],
                cwd=REPO,
                env={**os.environ, "DOCKER": "echo docker"},
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()
            built = [shlex.split(line) for line in printed]
            tags["server"], tags["engine server"] = (argv[argv.index("-t") + 1] for argv in built)
    return tags
