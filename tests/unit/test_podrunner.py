"""The pod runner's pure parts: which pods run for real, how a container's command, environment and files are
made, and the kubelet's back-off and probe thresholds."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_localcluster.controlplane import kwok_stages
from specdeploy_localcluster.podrunner.container import _mount_script, command_line, expand
from specdeploy_localcluster.podrunner.probes import ProbeState
from specdeploy_localcluster.podrunner.process import backoff_seconds
from specdeploy_localcluster.podrunner.security import (
    ProcessIdentity,
    apply_fs_group,
    hidden_ancestors,
    identity,
    privilege_drop,
)
from specdeploy_localcluster.podrunner.selection import (
    DEFAULT_IMAGES,
    ImageDefaults,
    is_runnable,
    kwok_skip_expression,
)
from specdeploy_localcluster.podrunner.volumes import Mount, UnsupportedPod, field_value

SERVER = "ghcr.io/specdeploy/server:0.1.0"

NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0, reason="mount namespaces and setpriv need root (CI and the local cluster run as root)"
)


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": spec}


def test_cpu_pods_of_the_server_image_run_for_real_gpu_pods_and_other_images_do_not() -> None:
    images = DEFAULT_IMAGES
    assert is_runnable(pod({"name": "server", "image": SERVER}), images)
    assert is_runnable(pod({"name": "s", "image": SERVER, "resources": {"requests": {"cpu": "1"}}}), images)
    gpu = {"name": "s", "image": SERVER, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    assert not is_runnable(pod(gpu), images)
    mig = {"name": "s", "image": SERVER, "resources": {"requests": {"nvidia.com/mig-3g.40gb": "1"}}}
    assert not is_runnable(pod(mig), images)
    assert not is_runnable(pod({"name": "x", "image": "registry.invalid/other:1"}), images)
    # A build Job whose quantize step asks for a GPU stays simulated as a whole.
    assert not is_runnable(pod({"name": "complete", "image": SERVER}, init=[gpu]), images)
    assert not is_runnable({"metadata": {}, "spec": {}}, images)


def test_every_kwok_pod_stage_skips_runnable_pods_and_node_stages_are_unchanged() -> None:
    docs = list(yaml.safe_load_all(kwok_stages([SERVER])))
    skip = kwok_skip_expression([SERVER])
    pod_stages = [d for d in docs if d["spec"]["resourceRef"]["kind"] == "Pod"]
    node_stages = [d for d in docs if d["spec"]["resourceRef"]["kind"] == "Node"]
    assert pod_stages
    assert node_stages
    for stage in pod_stages:
        assert stage["spec"]["selector"]["matchExpressions"][-1] == skip
    for stage in node_stages:
        assert skip not in stage["spec"]["selector"]["matchExpressions"]
    # Without images (another cluster, e.g. kind) the Stages are kwok's plain ones.
    plain = yaml.safe_load_all(kwok_stages())
    assert all(skip not in d["spec"]["selector"]["matchExpressions"] for d in plain)
    assert skip["operator"] == "NotIn"
    assert skip["values"] == ["true"]
    assert '"ghcr.io/specdeploy/server:0.1.0"' in skip["key"]


def test_dollar_paren_variables_expand_like_kubernetes() -> None:
    env = {"PORT": "8000", "NAME": "x"}
    assert expand("--port=$(PORT)", env) == "--port=8000"
    assert expand("$(UNKNOWN)", env) == "$(UNKNOWN)"
    assert expand("$$(PORT)", env) == "$(PORT)"
    assert expand("$HOME", env) == "$HOME"


def test_command_falls_back_to_the_images_entrypoint_and_cmd() -> None:
    image = ImageDefaults(["specdeploy-server"], ["--help"])
    assert command_line({"name": "c"}, {}, image) == ["specdeploy-server", "--help"]
    assert command_line({"name": "c", "args": ["--config", "$(F)"]}, {"F": "/f"}, image) == [
        "specdeploy-server",
        "--config",
        "/f",
    ]
    assert command_line({"name": "c", "command": ["python", "-V"]}, {}, image) == ["python", "-V"]
    with pytest.raises(UnsupportedPod):
        command_line({"name": "c"}, {}, ImageDefaults([]))


def test_downward_api_fields() -> None:
    p = {
        "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"app": "a"}},
        "spec": {"nodeName": "cpu-0"},
        "status": {"podIP": "127.64.0.254"},
    }
    assert field_value(p, "status.podIP") == "127.64.0.254"
    assert field_value(p, "spec.nodeName") == "cpu-0"
    assert field_value(p, "metadata.labels['app']") == "a"
    with pytest.raises(UnsupportedPod):
        field_value(p, "spec.containers[0]")


@pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts in a private mount namespace need root")
def test_volumes_appear_at_their_mount_paths_read_only_where_asked_and_only_inside(tmp_path: Path) -> None:
    source = tmp_path / "config"
    source.mkdir()
    (source / "server.yaml").write_text("hello\n")
    target = tmp_path / "etc" / "specdeploy"
    script = tmp_path / "run.sh"
    script.write_text(_mount_script([Mount(source, str(target), read_only=True)], workdir=None))
    check = f"cat {target}/server.yaml && ! touch {target}/x 2>/dev/null && echo read-only"
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", str(script), "sh", "-c", check],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["hello", "read-only"]
    assert not (target / "server.yaml").exists()  # the mount existed only in the process's namespace


def test_crash_loop_back_off_doubles_from_ten_seconds_to_five_minutes() -> None:
    assert [backoff_seconds(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [10, 20, 40, 80, 160, 300, 300]


def test_probe_thresholds_and_initial_delay() -> None:
    state = ProbeState({"periodSeconds": 5, "failureThreshold": 2, "initialDelaySeconds": 3}, started=100.0)
    assert not state.due(102.0)
    assert state.due(103.0)
    assert state.record(False, 103.0) is None
    assert state.record(False, 108.0) is False
    assert state.record(True, 113.0) is True
    assert state.next_due == 118.0


# -- securityContext --------------------------------------------------------------------------------------

RESTRICTED_POD = {
    "metadata": {"name": "p"},
    "spec": {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "fsGroupChangePolicy": "OnRootMismatch",
            "supplementalGroups": [4242],
        },
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "cache", "persistentVolumeClaim": {"claimName": "c"}},
            {"name": "key", "secret": {"secretName": "s", "defaultMode": 0o400}},
        ],
    },
}
HARDENED = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True}


def test_the_process_runs_as_the_pods_user_with_fs_group_and_supplemental_groups() -> None:
    who = identity(RESTRICTED_POD, {"name": "server", "securityContext": HARDENED}, ImageDefaults([]))
    assert who == ProcessIdentity(10001, 10001, (10001, 4242), no_new_privs=True, read_only_root=True)
    assert privilege_drop(who) == [
        "setpriv", "--reuid=10001", "--regid=10001", "--groups=10001,4242",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
    ]  # fmt: skip


def test_the_container_context_wins_over_the_pod_and_the_pod_over_the_image() -> None:
    image = ImageDefaults([], user=(10001, 10001))
    assert identity({"spec": {}}, {"name": "c"}, image).uid == 10001
    pod = {"spec": {"securityContext": {"runAsUser": 2000}}}
    assert identity(pod, {"name": "c"}, image).uid == 2000
    assert identity(pod, {"name": "c", "securityContext": {"runAsUser": 3000}}, image).uid == 3000
    assert privilege_drop(identity({"spec": {}}, {"name": "c"}, ImageDefaults([]))) == []


def test_run_as_non_root_refuses_a_root_user_as_the_kubelet_does() -> None:
    pod = {"spec": {"securityContext": {"runAsNonRoot": True}}}
    with pytest.raises(UnsupportedPod, match="runAsNonRoot and image will run as root"):
        identity(pod, {"name": "c"}, ImageDefaults([]))


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's group needs root")
def test_fs_group_owns_the_volumes_and_empty_dirs_are_world_writable(tmp_path: Path) -> None:
    dirs = {name: tmp_path / name for name in ("tmp", "cache", "key")}
    for path in dirs.values():
        path.mkdir(mode=0o755)
    (dirs["cache"] / "engine").write_bytes(b"x")
    (dirs["cache"] / "engine").chmod(0o600)
    (dirs["key"] / "api-key").write_bytes(b"k")
    (dirs["key"] / "api-key").chmod(0o400)
    apply_fs_group(RESTRICTED_POD, dirs, claims={"cache"})
    assert stat.S_IMODE(dirs["tmp"].stat().st_mode) & 0o777 == 0o777
    engine = (dirs["cache"] / "engine").stat()
    assert engine.st_gid == 10001
    assert stat.S_IMODE(engine.st_mode) == 0o660
    assert dirs["cache"].stat().st_mode & stat.S_ISGID
    key = (dirs["key"] / "api-key").stat()
    assert (key.st_gid, stat.S_IMODE(key.st_mode)) == (10001, 0o440)  # group-readable, not writable
    # OnRootMismatch: a claim whose root already has the group is not walked again.
    (dirs["cache"] / "later").write_bytes(b"y")
    (dirs["cache"] / "later").chmod(0o600)
    apply_fs_group(RESTRICTED_POD, dirs, claims={"cache"})
    assert stat.S_IMODE((dirs["cache"] / "later").stat().st_mode) == 0o600


@pytest.fixture
def traversable_dir() -> Iterator[Path]:
    """A directory the pod's non-root user can reach (pytest's own are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="podrunner-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@NEEDS_ROOT
def test_a_read_only_root_leaves_only_the_writable_volumes_writable_to_the_pods_user(
    traversable_dir: Path,
) -> None:
    base = traversable_dir
    writable, read_only = base / "tmp-volume", base / "config"
    for path in (writable, read_only):
        path.mkdir()
        path.chmod(0o777)
    target = base / "mnt"
    mounts = [
        Mount(writable, f"{target}/tmp", read_only=False),
        Mount(read_only, f"{target}/etc", read_only=True),
    ]
    private = base / "private"  # like /root, where pyenv keeps the virtualenv's interpreter
    (private / "shown").mkdir(parents=True)
    (private / "shown" / "python").write_text("interpreter\n")
    (private / "secret").write_text("not for the pod\n")
    private.chmod(0o700)
    exposed = hidden_ancestors([private / "shown" / "python"])
    assert exposed == {private: {"shown"}}
    script = base / "run.sh"
    script.write_text(_mount_script(mounts, workdir=None, read_only_root=True, exposed=exposed))
    who = ProcessIdentity(10001, 10001, (10001,), no_new_privs=True, read_only_root=True)
    check = (
        f"id -u; touch {target}/tmp/ok && echo volume-writable; "
        f"touch {target}/etc/x 2>/dev/null || echo ro-volume-refused; "
        f"touch {base}/config/../elsewhere 2>/dev/null || echo root-refused; "
        "touch /tmp/podrunner-test-probe 2>/dev/null || echo host-tmp-refused; "
        f"cat {private}/shown/python; cat {private}/secret 2>/dev/null || echo hidden"
    )
    argv = ["unshare", "--mount", "--propagation", "private", "sh", str(script), *privilege_drop(who)]
    out = subprocess.run([*argv, "sh", "-c", check], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        "10001", "volume-writable", "ro-volume-refused", "root-refused", "host-tmp-refused",
        "interpreter", "hidden",
    ]  # fmt: skip
    assert (writable / "ok").stat().st_uid == 10001
    # Outside the container the machine's file systems stayed writable.
    (base / "outside").write_text("still writable")


@NEEDS_ROOT
def test_the_image_stays_visible_under_a_volume_mounted_over_its_parent(traversable_dir: Path) -> None:
    """A checkout under /tmp and a pod with an emptyDir at /tmp: the programs must still be there (they are
    the image), next to the volume's own files; a real runtime mounts volumes over the image the same way."""
    base = traversable_dir
    parent = base / "tmp"
    checkout = parent / "private" / "checkout"
    (checkout / "bin").mkdir(parents=True)
    (checkout / "bin" / "program").write_text("the image's program\n")
    (parent / "private").chmod(0o700)  # like mkdtemp: the pod's user cannot enter it
    volume = base / "empty-dir"
    volume.mkdir()
    volume.chmod(0o777)
    mounts = [Mount(volume, str(parent), read_only=False)]
    exposed = hidden_ancestors([checkout / "bin" / "program"])
    script = base / "run.sh"
    script.write_text(
        _mount_script(mounts, workdir=None, read_only_root=True, exposed=exposed, image=[checkout])
    )
    who = ProcessIdentity(10001, 10001, (10001,), no_new_privs=True, read_only_root=True)
    check = f"cat {checkout}/bin/program; touch {parent}/scratch && echo volume-writable"
    argv = ["unshare", "--mount", "--propagation", "private", "sh", str(script), *privilege_drop(who)]
    out = subprocess.run([*argv, "sh", "-c", check], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["the image's program", "volume-writable"]
    assert (volume / "scratch").exists(), "the volume is the pod's emptyDir"
    assert not (parent / "scratch").exists(), "and only inside the container"


@NEEDS_ROOT
def test_a_checkout_and_cluster_in_one_private_directory(traversable_dir: Path) -> None:
    """A fresh clone and its cluster's directory side by side in a directory only root may enter (mkdtemp's,
    or a private home): a non-root pod whose mount script and volumes live in the cluster's directory sees
    the checkout and its volumes, and nothing else of that directory."""
    private = traversable_dir / "scratch"
    checkout = private / "clone"
    (checkout / "bin").mkdir(parents=True)
    (checkout / "bin" / "program").write_text("the image's program\n")
    pod_dir = private / "cluster" / "pods" / "ns_pod"
    pod_dir.mkdir(parents=True)
    claim = private / "cluster" / "volumes" / "pvc-1"
    claim.mkdir(parents=True)
    claim.chmod(0o777)
    (private / "cluster" / "secret").write_text("not for the pod\n")
    private.chmod(0o700)
    exposed = hidden_ancestors([checkout / "bin" / "program"])
    assert exposed == {private: {"clone"}}
    models = traversable_dir / "models"
    script = pod_dir / "run.sh"
    script.write_text(
        _mount_script(
            [Mount(claim, str(models), read_only=False)],
            workdir=None,
            read_only_root=True,
            exposed=exposed,
            image=[checkout],
        )
    )
    who = ProcessIdentity(10001, 10001, (10001,), no_new_privs=True, read_only_root=True)
    check = (
        f"cat {checkout}/bin/program; touch {models}/weights && echo volume-writable; "
        f"cat {private}/cluster/secret 2>/dev/null || echo hidden"
    )
    argv = ["unshare", "--mount", "--propagation", "private", "sh", str(script), *privilege_drop(who)]
    out = subprocess.run([*argv, "sh", "-c", check], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["the image's program", "volume-writable", "hidden"]
    assert (claim / "weights").exists(), "the claim's directory is the volume"
