"""The container images, checked without a Docker engine: both Dockerfiles are read with a maintained
parser (dockerfile-parse), every COPY/ADD source exists in the build context and is not dropped by
.dockerignore, bases are pinned to a version, each image runs as the numeric non-root user the pods name, and
each entry point is a console script of the package the image installs. The install steps themselves run in
tests/chart/test_image_install.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from specdeploy_operator.api.trtllm import RELEASES
from specdeploy_operator.builders import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile.operator", "Dockerfile.server", "Dockerfile.trainer"]
PACKAGE_OF = {
    "Dockerfile.operator": "operator",
    "Dockerfile.server": "server",
    "Dockerfile.trainer": "server",
}
"""The package directory each image installs."""
INSTALL_SCRIPT_OF = {
    "Dockerfile.operator": "operator/image/install.sh",
    "Dockerfile.server": "server/image/install.sh",
    "Dockerfile.trainer": "server/image/install-trainer.sh",
}


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse(path: Path) -> list[Instruction]:
    """Instructions of a Dockerfile as dockerfile-parse reads them (comments dropped, continuations joined;
    `line` is 1-based)."""
    with path.open(encoding="utf-8") as dockerfile:
        structure = DockerfileParser(fileobj=dockerfile).structure
    return [
        Instruction(item["startline"] + 1, item["instruction"], item["value"].strip())
        for item in structure
        if item["instruction"] != "COMMENT"
    ]


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    defaults = {}
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, value = ins.args.partition("=")
            defaults[name] = value.strip("\"'")
    return defaults


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def copy_sources(ins: Instruction) -> list[str]:
    """Sources of a COPY/ADD from the build context ([] for COPY --from=stage)."""
    if ins.args.startswith("["):
        raise AssertionError(f"line {ins.line}: use the shell form of {ins.keyword}")
    words = shlex.split(ins.args)
    flags = [w for w in words if w.startswith("--")]
    if any(f.startswith("--from=") for f in flags):
        return []
    paths = [w for w in words if not w.startswith("--")]
    assert len(paths) >= 2, f"line {ins.line}: {ins.keyword} needs a source and a destination"
    return paths[:-1]


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    patterns = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(line):
            if line.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif line.startswith("**", i):
                regex += ".*"
                i += 2
            elif line[i] == "*":
                regex += "[^/]*"
                i += 1
            elif line[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(line[i])
                i += 1
        patterns.append((negate, re.compile(regex + "$")))
    return patterns


def ignored(relpath: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a directory excludes its contents."""
    parts = relpath.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for negate, pattern in patterns:
        if any(pattern.match(p) for p in prefixes):
            result = not negate
    return result


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copy_sources_exist_and_are_in_the_build_context(name: str) -> None:
    instructions = parse(REPO / name)
    args = arg_defaults(instructions)
    patterns = dockerignore_patterns()
    copies = [ins for ins in instructions if ins.keyword in ("COPY", "ADD")]
    assert copies, f"{name} copies nothing from the repository"
    for ins in copies:
        for raw in copy_sources(ins):
            source = expand(raw, args)
            assert not source.startswith(("/", "..")), f"{name}:{ins.line}: {source} is outside the context"
            matches = sorted(REPO.glob(source.rstrip("/")))
            assert matches, f"{name}:{ins.line}: COPY source {source} does not exist"
            for match in matches:
                rel = match.relative_to(REPO).as_posix()
                assert not ignored(rel, patterns), f"{name}:{ins.line}: {rel} is excluded by .dockerignore"
                files = [match] if match.is_file() else [p for p in match.rglob("*") if p.is_file()]
                shipped = [f for f in files if not ignored(f.relative_to(REPO).as_posix(), patterns)]
                assert shipped, f"{name}:{ins.line}: .dockerignore leaves nothing of {rel}"


def test_dockerignore_matcher() -> None:
    """The .dockerignore reading above can fail: it excludes what Docker excludes."""
    patterns = dockerignore_patterns()
    assert ignored(".git/HEAD", patterns)
    assert ignored("tests/chart/test_dockerfiles.py", patterns)
    assert ignored("operator/src/specdeploy_operator/__pycache__/cli.cpython-311.pyc", patterns)
    assert not ignored("operator/src/specdeploy_operator/cli.py", patterns)
    assert not ignored("server/pyproject.toml", patterns)


def build_script_commands() -> list[list[str]]:
    """The `docker build` argv hack/build-server-images.sh runs (printed, not run)."""
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "build-server-images.sh"), "registry.example.com/specdeploy/server"],
        env={**os.environ, "DOCKER": "echo docker"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [shlex.split(line) for line in out.splitlines()]


def test_the_server_images_are_built_on_the_pinned_releases_with_the_charts_tags() -> None:
    """The build script reads both pins from trtllm-releases.env (the Dockerfile has no default to drift) and
    tags each image as the chart's settings (and the operator's defaults) name it."""
    assert "TRTLLM_VERSION" not in arg_defaults(parse(REPO / "Dockerfile.server"))
    defaults = OperatorSettings()
    repository = "registry.example.com/specdeploy/server"
    built = {}
    for argv in build_script_commands():
        assert argv[:4] == ["docker", "build", "-f", "Dockerfile.server"], argv
        build_args = dict(a.split("=", 1) for a in argv[argv.index("--build-arg") :: 1] if "=" in a)
        tag = argv[argv.index("-t") + 1]
        built[tag] = build_args
    maintained = f"{repository}:{defaults.server_image.rpartition(':')[2]}"
    engine = f"{repository}:{defaults.engine_server_image.rpartition(':')[2]}"
    assert built == {
        maintained: {"TRTLLM_VERSION": RELEASES.pytorch.text},
        engine: {"TRTLLM_VERSION": RELEASES.tensorrt.text, "ENGINE_WORKFLOW": "true"},
    }


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_images_are_pinned(name: str) -> None:
    instructions = parse(REPO / name)
    args = arg_defaults(instructions)
    if name == "Dockerfile.server":  # the pin comes from trtllm-releases.env (the test above)
        args["TRTLLM_VERSION"] = RELEASES.pytorch.text
    stages: set[str] = set()
    froms = [ins for ins in instructions if ins.keyword == "FROM"]
    assert froms
    for ins in froms:
        words = [w for w in ins.args.split() if not w.startswith("--platform")]
        image = expand(words[0], args)
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2])
        if image in stages:
            continue
        assert "$" not in image, f"{name}:{ins.line}: {image} has an unresolved ARG"
        if "@sha256:" in image:
            continue
        repo, _, tag = image.rpartition(":")
        assert repo, f"{name}:{ins.line}: {image} has no tag"
        assert "/" not in tag, f"{name}:{ins.line}: {image} has no tag"
        assert re.search(r"\d+\.\d+\.\d+", tag), f"{name}:{ins.line}: {image} is not pinned"


def test_operator_image() -> None:
    instructions = parse(REPO / "Dockerfile.operator")
    final = instructions[max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM") :]
    # Only the operator package enters the image.
    sources = [s for ins in instructions if ins.keyword in ("COPY", "ADD") for s in copy_sources(ins)]
    assert sources
    assert all(s.startswith("operator/") for s in sources), sources
    project = tomllib.loads((REPO / "operator" / "pyproject.toml").read_text())["project"]
    heavy = [d for d in project["dependencies"] if re.match(r"(torch|tensorrt|transformers)\b", d)]
    assert not heavy, f"the operator image must stay light: {heavy}"
    # Non-root, numerically (runAsNonRoot can only verify a numeric USER).
    users = [ins.args for ins in final if ins.keyword == "USER"]
    assert users, "the final stage has no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), users[-1]
    assert int(uid) != 0, users[-1]
    from specdeploy_operator.builders.podsecurity import IMAGE_USER

    assert int(uid) == IMAGE_USER, "the operator image's user is the one every specdeploy pod runs as"
    chart_values = (REPO / "charts" / "specdeploy" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in chart_values, "the chart's runAsUser must be the image's user"
    # The entry point (a console script, test_entry_points_are_the_packages_console_scripts) gets the health
    # and metrics ports.
    cmd = [ins.args for ins in final if ins.keyword == "CMD"][-1]
    assert "--health-port" in cmd
    assert "--metrics-port" in cmd
    labels = " ".join(ins.args for ins in final if ins.keyword == "LABEL")
    for key in ("title", "description", "version", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_install_docs_show_the_docker_build_commands() -> None:
    docs = (REPO / "docs" / "install.md").read_text()
    assert "docker build -f Dockerfile.operator" in docs
    assert "hack/build-server-images.sh" in docs  # both server images (Dockerfile.server)


def test_server_image_runs_as_the_numeric_user_the_operators_pods_name() -> None:
    """The serving and build pods say `runAsUser: 10001` and `runAsNonRoot: true`: the image must define
    that user numerically (the kubelet refuses runAsNonRoot for a named USER it cannot check), and its HOME
    must be the pods' writable /tmp emptyDir, since their root filesystem is read-only."""
    from specdeploy_localcluster.podrunner.selection import DEFAULT_IMAGES
    from specdeploy_operator.builders.podsecurity import IMAGE_USER, TMP_MOUNT

    instructions = parse(REPO / "Dockerfile.server")
    users = [ins.args for ins in instructions if ins.keyword == "USER"]
    assert users, "Dockerfile.server has no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), users[-1]
    assert gid.isdigit(), users[-1]
    assert (int(uid), int(gid)) == (IMAGE_USER, IMAGE_USER)
    runs = " ".join(ins.args for ins in instructions if ins.keyword == "RUN")
    assert f"useradd --uid {uid} --gid {gid}" in runs
    env = " ".join(ins.args for ins in instructions if ins.keyword == "ENV")
    assert f"HOME={TMP_MOUNT}" in env
    # The pod runner plays this image on the local cluster: same user, same HOME.
    image = DEFAULT_IMAGES["ghcr.io/specdeploy/server:0.1.0"]
    assert image.user == (IMAGE_USER, IMAGE_USER)
    assert image.env["HOME"] == TMP_MOUNT


def _console_scripts(package: str) -> dict[str, str]:
    project = tomllib.loads((REPO / package / "pyproject.toml").read_text())["project"]
    scripts: dict[str, str] = project["scripts"]
    return scripts


@pytest.mark.parametrize("name", DOCKERFILES)
def test_entry_points_are_the_packages_console_scripts(name: str) -> None:
    """The image starts a console script of the package it installs (exec form), so the image and `pip
    install` start the same code; the install script checks the script exists (test_image_install.py)."""
    instructions = parse(REPO / name)
    entrypoint = [ins.args for ins in instructions if ins.keyword == "ENTRYPOINT"][-1]
    assert entrypoint.startswith("["), f"{name}: use the exec form of ENTRYPOINT"
    argv = json.loads(entrypoint)
    scripts = _console_scripts(PACKAGE_OF[name])
    assert argv[0] in scripts, f"{name}: ENTRYPOINT {argv} is not one of {sorted(scripts)}"
    assert len(argv) == 1, argv
    module, _, function = scripts[argv[0]].partition(":")
    source = REPO / PACKAGE_OF[name] / "src" / Path(*module.split("."))
    text = (source / "__init__.py" if source.is_dir() else source.with_suffix(".py")).read_text()
    assert f"def {function}(" in text, f"{scripts[argv[0]]} does not exist"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_install_step_is_the_packages_install_script(name: str) -> None:
    """The RUN that installs the package runs the script the tests run outside Docker, copied from the
    package's own directory."""
    instructions = parse(REPO / name)
    script = INSTALL_SCRIPT_OF[name]
    assert (REPO / script).is_file()
    copied = [s for ins in instructions if ins.keyword == "COPY" for s in copy_sources(ins)]
    assert any(script.startswith(source.rstrip("/")) for source in copied), (name, copied)
    runs = [ins.args for ins in instructions if ins.keyword == "RUN"]
    name_of_script = script.rpartition("/")[2]
    assert any(
        name_of_script in run and run.lstrip().startswith(("sh ", "--mount", "MODELOPT_VERSION="))
        for run in runs
    ), runs
    assert not any("pip install" in run for run in runs), f"{name}: pip runs in {script}, not beside it"


def test_the_trainer_image_pins_the_modelopt_the_tests_run() -> None:
    """Dockerfile.trainer's MODELOPT_VERSION is the version hack/constraints.txt holds the test virtualenv to,
    so the EAGLE-3 export the tests load is the one the image's trainer writes; the image runs as the pods'
    numeric user with HOME on their writable /tmp."""
    from importlib.metadata import version

    from specdeploy_operator.builders.podsecurity import IMAGE_USER, TMP_MOUNT

    instructions = parse(REPO / "Dockerfile.trainer")
    pinned = arg_defaults(instructions)["MODELOPT_VERSION"]
    constraints = (REPO / "hack" / "constraints.txt").read_text().splitlines()
    assert f"nvidia-modelopt=={pinned}" in constraints
    assert version("nvidia-modelopt") == pinned
    users = [ins.args for ins in instructions if ins.keyword == "USER"]
    assert users[-1] == f"{IMAGE_USER}:{IMAGE_USER}"
    assert f"HOME={TMP_MOUNT}" in " ".join(ins.args for ins in instructions if ins.keyword == "ENV")
