"""The download step's script (`builders/fetchscript.py`), run here with `sh`: it picks `hf` or the older
`huggingface-cli` by what the image has, and a 401/403/404 from the Hugging Face Hub, S3 or GCS becomes one
sentence plus the output's last lines in the termination message, which the EngineBuild's status repeats.

The Hub is a fake one on loopback answering every request with the status under test, downloaded from by the
real `hf` of this virtualenv; `aws`, `gsutil` and the CLI-choice cases use stand-in programs that print what
those tools print (they are not installed here)."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
from specdeploy_operator.api import ModelSource
from specdeploy_operator.builders.download import fetch_checkpoint
from specdeploy_operator.builders.fetchscript import (
    ANSWERS,
    FETCH_PROGRAM,
    FETCH_SCRIPT,
    REFUSED_EXIT_CODE,
    fetch_argv,
)
from specdeploy_operator.builders.job import build_job
from specdeploy_operator.controller.buildstatus import engine_build_status

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
REPO = "meta-llama/Llama-3.2-1B-Instruct"
HF = Path(sys.executable).with_name("hf")
assert HF.exists(), "huggingface_hub's hf (a test dependency of the server) is missing: run `make venv`"


class _Hub(http.server.BaseHTTPRequestHandler):
    status = 401
    messages: ClassVar[dict[int, str]] = {
        401: "Invalid credentials in Authorization header",
        403: "Access to model is restricted",
        404: "Repository not found",
    }

    def do_GET(self) -> None:
        body = f'{{"error": "{self.messages[self.status]}"}}'.encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Message", self.messages[self.status])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def hub() -> Iterator[tuple[str, type[_Hub]]]:
    handler = type("Hub", (_Hub,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def _bin(tmp_path: Path, programs: dict[str, str]) -> Path:
    """A PATH directory with `programs` (name -> shell body, or "" for this virtualenv's `hf`) plus the
    POSIX tools the script uses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("sh", "cat", "grep", "tail", "tr", "sed", "tee", "mktemp", "printf"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    for name, body in programs.items():
        path = bin_dir / name
        if not body:
            path.symlink_to(HF)
            continue
        path.write_text(f"#!{shutil.which('sh')}\n{body}\n")
        path.chmod(0o755)
    return bin_dir


def _run(tmp_path: Path, argv: list[str], bin_dir: Path, **env: str) -> tuple[int, str | None]:
    """(exit code, termination message or None) of the download step `argv`."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    term = tmp_path / "termination-log"
    term.unlink(missing_ok=True)
    environ = {"PATH": str(bin_dir), "HOME": str(home), "TMPDIR": str(home),
               "SPECDEPLOY_TERMINATION_LOG": str(term), **env}  # fmt: skip
    proc = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, term.read_text() if term.exists() else None


def _sentence(case: str, **values: str) -> str:
    text = ANSWERS[case]
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"${name}", value)
    return text


def _failed_build(message: str) -> dict[str, Any]:
    job = {
        "metadata": {"name": "llama-3-2-1b-instruct-draft-0123456789abcdef-build"},
        "status": {
            "failed": 1,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                }
            ],
        },
    }
    terminated = {"exitCode": 1, "reason": "Error", "message": message}
    pod = {
        "metadata": {"name": "build-pod", "creationTimestamp": "2026-11-21T11:00:00Z"},
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [{"name": "download", "state": {"terminated": terminated}}],
        },
    }
    return engine_build_status(job, [pod], None, NOW)


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_hub_refusal_reaches_the_engine_build_status_as_a_sentence_and_the_log_tail(
    tmp_path: Path, hub: tuple[str, type[_Hub]], status: int
) -> None:
    endpoint, handler = hub
    handler.status = status
    argv = fetch_argv("hf", f"hf://{REPO}", str(tmp_path / "model"))
    bin_dir = _bin(tmp_path, {"hf": ""})
    code, message = _run(tmp_path, argv, bin_dir, HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1")
    assert code == REFUSED_EXIT_CODE
    assert message is not None
    first, _, tail = message.partition("\n")
    assert first == _sentence(f"hf:{status}", name=REPO, at="")
    assert str(status) in tail, tail
    assert handler.messages[status] in tail, tail
    assert "\x1b" not in message
    build = _failed_build(message)
    assert build["phase"] == "Failed"
    assert first in build["message"]
    assert handler.messages[status] in build["message"]
    assert build["conditions"][0]["message"] == build["message"]


def test_hf_is_used_where_the_image_has_it_and_the_older_cli_only_where_it_does_not(tmp_path: Path) -> None:
    record = tmp_path / "called"
    stub = f'echo "${{0##*/}} $*" > {record}'
    dest = str(tmp_path / "model")
    argv = fetch_argv("hf", f"hf://{REPO}", dest, "abc123")
    both = _bin(tmp_path / "both", {"hf": stub, "huggingface-cli": stub})
    assert _run(tmp_path, argv, both) == (0, None)
    assert record.read_text().split() == ["hf", "download", REPO, "--local-dir", dest, "--revision", "abc123"]
    old = _bin(tmp_path / "old", {"huggingface-cli": stub})
    assert _run(tmp_path, argv, old) == (0, None)
    assert record.read_text().split()[:3] == ["huggingface-cli", "download", REPO]
    # a dataset repository (a DraftTraining's prompts) is named without its prefix, with its repository type
    assert _run(tmp_path, fetch_argv("hf", "hf://datasets/org/chats", dest), both) == (0, None)
    assert record.read_text().split() == [
        "hf",
        "download",
        "org/chats",
        "--repo-type",
        "dataset",
        "--local-dir",
        dest,
    ]
    code, message = _run(tmp_path, argv, _bin(tmp_path / "none", {}))
    assert code == 127
    assert message is not None
    assert "neither hf nor huggingface-cli" in message


@pytest.mark.parametrize(
    ("scheme", "tool", "printed", "case"),
    [
        ("s3", "aws", "fatal error: Unable to locate credentials", "s3:401"),
        ("s3", "aws", "fatal error: An error occurred (AccessDenied) when calling the ListObjectsV2 "
         "operation: Access Denied", "s3:403"),
        ("s3", "aws", "fatal error: An error occurred (NoSuchBucket) when calling the ListObjectsV2 "
         "operation: The specified bucket does not exist", "s3:404"),
        ("gs", "gsutil", "ServiceException: 401 Anonymous caller does not have storage.objects.list "
         "access to the Google Cloud Storage bucket.", "gs:401"),
        ("gs", "gsutil", "AccessDeniedException: 403 reader@proj.iam.gserviceaccount.com does not have "
         "storage.objects.list access to the Google Cloud Storage bucket.", "gs:403"),
        ("gs", "gsutil", "BucketNotFoundException: 404 gs://models bucket does not exist.", "gs:404"),
        ("s3", "aws", "fatal error: Connection was closed before we received a valid response", "*"),
    ],
)  # fmt: skip
def test_cloud_store_refusals_become_one_sentence_each(
    tmp_path: Path, scheme: str, tool: str, printed: str, case: str
) -> None:
    uri = f"{scheme}://models/llama-3.1-8b"
    bin_dir = _bin(tmp_path, {tool: f"echo '{printed}' >&2; exit 1"})
    code, message = _run(tmp_path, fetch_argv(scheme, uri, str(tmp_path / "model")), bin_dir)
    assert code == (1 if case == "*" else REFUSED_EXIT_CODE)
    assert message is not None
    first, _, tail = message.partition("\n")
    assert first == _sentence(case, uri=uri, rc="1")
    assert printed in tail


def test_the_rendered_download_steps_run_the_script_with_credentials_only_as_files() -> None:
    source = ModelSource(uri=f"hf://{REPO}", revision="abc123", credentials_secret="hf-token")
    fetch = fetch_checkpoint(source, "/cache/work/x/model")
    dest = "/cache/work/x/model"
    assert fetch.argv == ["sh", "-c", FETCH_SCRIPT, FETCH_PROGRAM, "hf", f"hf://{REPO}", dest, "abc123"]
    assert fetch.env == [{"name": "HF_TOKEN_PATH", "value": "/var/run/secrets/specdeploy/model/HF_TOKEN"}]
    assert "hf-token" not in " ".join(fetch.argv)


def test_the_script_is_posix_sh() -> None:
    sh = shutil.which("dash") or shutil.which("sh")
    assert sh is not None
    proc = subprocess.run([sh, "-n", "-c", FETCH_SCRIPT], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert os.linesep not in FETCH_PROGRAM


def test_a_refused_download_fails_the_build_job_without_retries() -> None:
    """The build Job's podFailurePolicy fails it on the script's refusal code from the download step; other
    failures (a flaky network, a full disk) keep the Job's retries."""
    source = ModelSource(uri=f"hf://{REPO}", credentials_secret="hf-token")
    engine: dict[str, Any] = {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "EngineBuild",
        "metadata": {"name": "llama-3-2-1b-instruct-draft-0123456789abcdef", "namespace": "team"},
        "spec": {
            "model": source.to_dict(),
            "role": "draft",
            "quantization": {"format": "fp8"},
            "buildFlags": ["--gemm_plugin", "fp8"],
            "hash": "0123456789abcdef",
            "builderImage": "ghcr.io/specdeploy/server:0.1.0",
            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            "cache": {"pvcName": "cache", "path": "engines/0123456789abcdef"},
        },
    }
    spec = build_job(engine)["spec"]
    assert spec["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "download", "operator": "In", "values": [REFUSED_EXIT_CODE]},
            }
        ]
    }
    assert spec["backoffLimit"] == 3
    pvc = {**engine, "spec": {**engine["spec"], "model": {"uri": "pvc://models/llama"}}}
    assert "podFailurePolicy" not in build_job(pvc)["spec"]  # no download step, nothing to refuse


def test_a_hub_that_cannot_be_reached_is_no_refusal(tmp_path: Path) -> None:
    """`hf` says "Local entry not found" when it cannot reach the Hub at all: that is the generic failure
    (with the tool's own words in the tail and the tool's exit code, so the Job retries), not a 404."""
    argv = fetch_argv("hf", f"hf://{REPO}", str(tmp_path / "model"))
    bin_dir = _bin(tmp_path, {"hf": ""})
    code, message = _run(
        tmp_path, argv, bin_dir, HF_ENDPOINT="http://127.0.0.1:1", HF_HUB_DISABLE_TELEMETRY="1"
    )
    assert code not in (0, REFUSED_EXIT_CODE)
    assert message is not None
    first, _, tail = message.partition("\n")
    assert first == _sentence("*", uri=f"hf://{REPO}", rc=str(code))
    assert "Connection refused" in tail, tail
