"""The images' install steps (operator/image/install.sh, server/image/install.sh and install-trainer.sh: the
scripts the Dockerfiles RUN), run here in a fresh virtualenv as far as they can run without the base image
and without a network:

- the fresh virtualenv has no package of its own; the dependencies the image would get from PyPI (or, for the
  server, from TensorRT-LLM's release image) are this checkout's virtualenv, put on its path by a `.pth` file,
  and pip runs with `--no-index` and without build isolation, so nothing is downloaded;
- the operator's script installs the operator from a wheel built from `operator/`, exactly as in the image,
  and runs both console scripts;
- the server's script installs `server/` with its `[trtllm]` extra and checks every command the operator's
  pods call. awscli and gsutil come from PyPI in the image: here the tool list is empty and two stand-ins
  named `aws` and `gsutil` are on PATH, so only their presence check runs;
- the trainer's script installs `server/` with `[train]` and ModelOpt at the pinned version (this checkout's).

What stays unchecked without Docker: the base images themselves, `apt-get`, `useradd`, and TensorRT-LLM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _fresh_venv(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A new virtualenv that sees this checkout's virtualenv's distributions but not the project's own (via
    a .pth), and the environment that runs the install scripts in it offline."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # The dependencies: every distribution of this checkout's virtualenv but the project's own packages (which
    # are editable installs there), linked into one directory the fresh virtualenv's path ends with.
    deps = tmp_path / "dependencies"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(("specdeploy", "__editable__", "_specdeploy")):
            (deps / entry.name).symlink_to(entry)
    Path(site, "project-dependencies.pth").write_text(f"{deps}\n")
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PIP_NO_INDEX": "1",
        # pip reads this switch inverted: "0" turns build isolation off (the build backend is already here).
        "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
    }
    return venv, env


def _run(argv: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _installed_from(venv: Path, package: str) -> Path:
    """Where `package` is imported from in the fresh virtualenv."""
    code = f"import {package}, pathlib; print(pathlib.Path({package}.__file__).resolve())"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return Path(out.stdout.strip())


def test_the_operator_images_install_script_installs_the_wheel_and_its_entry_points(tmp_path: Path) -> None:
    venv, env = _fresh_venv(tmp_path)
    wheels = tmp_path / "wheels"
    # The image's build stage: `pip wheel` of the operator package (its dependencies are already here).
    _run(
        [str(venv / "bin" / "python"), "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), "./operator"],
        env,
    )
    assert [p.name for p in wheels.glob("specdeploy_operator-*.whl")]
    _run(["sh", "operator/image/install.sh", str(wheels)], env)
    for script in ("specdeploy-operator", "specdeploy"):
        assert (venv / "bin" / script).is_file(), script
    # The installed copy, not this checkout's editable one, is what runs.
    assert str(_installed_from(venv, "specdeploy_operator")).startswith(str(venv))
    help_text = _run([str(venv / "bin" / "specdeploy-operator"), "--help"], env).stdout
    assert "--health-port" in help_text
    assert "--metrics-port" in help_text


def test_the_server_images_install_script_installs_the_server_and_checks_the_pods_commands(
    tmp_path: Path,
) -> None:
    venv, env = _fresh_venv(tmp_path)
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("aws", "gsutil"):  # from PyPI in the image; stand-ins here (see the module's docstring)
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
        (tools / name).chmod(0o755)
    hf = Path(sys.executable).with_name("hf")
    assert hf.exists(), "huggingface_hub's hf (a test dependency of the server) is missing: run `make venv`"
    (tools / "hf").symlink_to(hf)
    env = {**env, "PATH": f"{env['PATH']}:{tools}", "SPECDEPLOY_DOWNLOAD_TOOLS": ""}
    src = tmp_path / "src" / "server"
    # The image copies server/ to /tmp/src/server/ and installs from there.
    ignored = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "testkit")  # as .dockerignore
    shutil.copytree(REPO / "server", src, ignore=ignored)
    _run(["sh", str(src / "image" / "install.sh"), str(src)], env, cwd=tmp_path)
    assert (venv / "bin" / "specdeploy-server").is_file()
    assert str(_installed_from(venv, "specdeploy_server")).startswith(str(venv))
    help_text = _run([str(venv / "bin" / "specdeploy-server"), "--help"], env).stdout
    assert "--config" in help_text


def test_a_missing_command_fails_the_server_install_script(tmp_path: Path) -> None:
    """The script's checks can fail: without gsutil the image build would stop there."""
    venv, env = _fresh_venv(tmp_path)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "aws").write_text("#!/bin/sh\nexit 0\n")
    (tools / "aws").chmod(0o755)
    env = {**env, "PATH": f"{env['PATH']}:{tools}", "SPECDEPLOY_DOWNLOAD_TOOLS": ""}
    proc = subprocess.run(
        ["sh", "server/image/install.sh", str(REPO / "server")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode != 0
    assert os.path.exists(venv / "bin" / "specdeploy-server"), "the install itself ran before the check"


def test_the_trainer_images_install_script_installs_the_pinned_modelopt_and_the_distill_steps(
    tmp_path: Path,
) -> None:
    venv, env = _fresh_venv(tmp_path)
    src = tmp_path / "src" / "server"
    ignored = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "testkit")  # as .dockerignore
    shutil.copytree(REPO / "server", src, ignore=ignored)
    script = ["sh", str(src / "image" / "install-trainer.sh"), str(src)]
    refused = subprocess.run(
        script, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode != 0
    assert "set MODELOPT_VERSION" in refused.stderr
    from importlib.metadata import version

    _run(script, {**env, "MODELOPT_VERSION": version("nvidia-modelopt")}, cwd=tmp_path)
    assert str(_installed_from(venv, "specdeploy_server")).startswith(str(venv))
    help_text = _run([str(venv / "bin" / "specdeploy-distill"), "--help"], env).stdout
    assert "train-eagle3" in help_text
