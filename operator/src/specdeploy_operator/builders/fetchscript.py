"""The download step's program: one POSIX shell script, the same for every checkpoint store, run as
`sh -c FETCH_SCRIPT specdeploy-fetch SCHEME URI DEST [REVISION]` by build, staging and serving pods.

It picks the Hugging Face command line by what the image has: `hf download` (huggingface_hub >= 1.0 ships
only `hf`), else the older `huggingface-cli download`. Its output goes to the pod's log as it runs. When the
download fails, it reads the output for the store's answer (401, 403 or 404 from the Hugging Face Hub, S3 or
GCS, by status code or by the error names the tools print) and writes one sentence that says what is wrong
and what to do, then the output's last lines, to the container's termination message
(`/dev/termination-log`, or `$SPECDEPLOY_TERMINATION_LOG` when set): the build's status message repeats it
(`kubectl describe enginebuild`), and exits with `REFUSED_EXIT_CODE`. No secret value is read or printed:
credentials stay files the tools read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = ["ANSWERS", "FETCH_PROGRAM", "FETCH_SCRIPT", "REFUSED_EXIT_CODE", "TAIL_BYTES", "fetch_argv"]

FETCH_PROGRAM: Final = "specdeploy-fetch"
"""`$0` of the script: the name its messages and `ps` show."""
REFUSED_EXIT_CODE: Final = 3
"""The script's exit code when the store refused the download (401, 403, 404): trying again cannot help, so
the build Job fails at once on it (its `podFailurePolicy`) instead of using up its retries."""
TAIL_BYTES: Final = 1500
"""Bytes of the failed download's output kept in the termination message (the kubelet keeps 4096)."""

_PATTERNS: Final = {
    "401": "unauthorized|unable to locate credentials|invalidaccesskeyid|signaturedoesnotmatch|"
    "expiredtoken|invalid_grant|anonymous caller",
    "403": "forbidden|accessdenied|access denied|gatedrepo|gated repo",
    "404": "repositorynotfound|revisionnotfound|repository not found|revision not found|nosuchbucket|"
    "nosuchkey|bucketnotfound|does not exist",
}
"""What a tool prints for each answer besides the status code itself (case-insensitive extended regexes),
checked in this order: an unauthenticated request to a gated model is a 401 whose text also says "gated".
Not a bare "not found": `hf` says "Local entry not found" for every failure to reach the Hub (offline,
connection refused), which is no answer of the Hub's."""

_ACCOUNT = "spec.serviceAccounts"
ANSWERS: Final[Mapping[str, str]] = {
    "hf:401": "The Hugging Face Hub answered 401 Unauthorized for $name: the download had no valid token. "
    "Put a token with read access in the HF_TOKEN key of the Secret named by the model's credentialsSecret.",
    "hf:403": "The Hugging Face Hub answered 403 Forbidden for $name: the token is valid but may not read "
    "this gated or private model. Accept the model's license on huggingface.co with the token's account, "
    "or use a token that has access.",
    "hf:404": "The Hugging Face Hub answered 404 Not Found for $name$at: check the model URI and revision "
    "(a private model also answers 404 to a download without a token).",
    "s3:401": "S3 refused the credentials for $uri (401: missing, invalid or expired). Give the downloading "
    f"pods a ServiceAccount bound to an IAM role that may read it ({_ACCOUNT}), or a credentialsSecret "
    "holding an AWS credentials file.",
    "s3:403": "S3 denied access to $uri (403 Forbidden): the IAM role or credentials in use need "
    "s3:ListBucket and s3:GetObject on it.",
    "s3:404": "S3 has no $uri (404 Not Found): check the bucket and prefix.",
    "gs:401": "GCS refused the credentials for $uri (401: missing, invalid or expired). Give the downloading "
    f"pods a ServiceAccount bound to a Google service account that may read it ({_ACCOUNT}), or a "
    "credentialsSecret holding a service account key.",
    "gs:403": "GCS denied access to $uri (403 Forbidden): the Google service account in use needs "
    "storage.objects.list and storage.objects.get on it (roles/storage.objectViewer).",
    "gs:404": "GCS has no $uri (404 Not Found): check the bucket and prefix.",
    "*": "The download of $uri failed (exit $rc); the last lines of its output follow.",
}
"""The sentence for each `<scheme>:<status>` (`*`: any other failure), in shell syntax: `$name` is the
repository or path, `$uri` the whole URI, `$at` " at revision R" when one is pinned, `$rc` the exit code."""

_HEAD: Final = r"""set -u
scheme=$1; uri=$2; dest=$3; revision=${4:-}
out=${SPECDEPLOY_TERMINATION_LOG:-/dev/termination-log}
name=${uri#*://}
at=${revision:+ at revision $revision}
log=$(mktemp) || exit 1
export NO_COLOR=1
# The image's huggingface_hub is pinned: no look for a newer one on PyPI from a build pod.
export HF_HUB_DISABLE_UPDATE_CHECK="${HF_HUB_DISABLE_UPDATE_CHECK:-1}"
esc=$(printf '\033')
tail_of_log() { tail -c __TAIL__ "$log" | tr '\r' '\n' | sed "s/$esc\[[0-9;]*[A-Za-z]//g"; }
tell() {
  printf '%s\n' "$1" >&2
  { printf '%s\n' "$1"; tail_of_log; } > "$out" 2>/dev/null || true
}
case $scheme in
hf)
  if command -v hf >/dev/null 2>&1; then
    set -- hf download
  elif command -v huggingface-cli >/dev/null 2>&1; then
    set -- huggingface-cli download
  else
    tell "The image has neither hf nor huggingface-cli: install huggingface_hub in the builder image."
    exit 127
  fi
  case $name in
  datasets/*) name=${name#datasets/}; set -- "$@" "$name" --repo-type dataset --local-dir "$dest" ;;
  *) set -- "$@" "$name" --local-dir "$dest" ;;
  esac
  if [ -n "$revision" ]; then set -- "$@" --revision "$revision"; fi ;;
s3) set -- aws s3 sync --only-show-errors "$uri" "$dest" ;;
gs) set -- gsutil -m rsync -r "$uri" "$dest" ;;
*) tell "Cannot download $uri: unknown scheme $scheme."; exit 2 ;;
esac
{ "$@" 2>&1; echo $? > "$log.rc"; } | tee "$log"
rc=$(cat "$log.rc" 2>/dev/null || echo 1)
[ "$rc" = 0 ] && exit 0
code=
"""


def _render() -> str:
    lines = [_HEAD.replace("__TAIL__", str(TAIL_BYTES)).rstrip("\n")]
    keyword = "if"
    for code, words in _PATTERNS.items():
        pattern = f"(^|[^0-9]){code}([^0-9]|$)|{words}"
        lines.append(f"{keyword} grep -Eqi -- '{pattern}' \"$log\"; then code={code}")
        keyword = "elif"
    lines += ["fi", "case $scheme:$code in"]
    lines += [f'{case}) tell "{sentence}" ;;' for case, sentence in ANSWERS.items()]
    lines += ["esac", f'if [ -n "$code" ]; then exit {REFUSED_EXIT_CODE}; fi', 'exit "$rc"', ""]
    return "\n".join(lines)


FETCH_SCRIPT: Final = _render()


def fetch_argv(scheme: str, uri: str, dest: str, revision: str | None = None) -> list[str]:
    """The download step's argv for `uri` (scheme `hf`, `s3` or `gs`) into `dest`."""
    argv = ["sh", "-c", FETCH_SCRIPT, FETCH_PROGRAM, scheme, uri, dest]
    if revision:
        argv.append(revision)
    return argv
