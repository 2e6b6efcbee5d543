"""Targeted builder tests: names, labels, credentials, settings, what rolls the pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import EngineBuild, SpeculativeDeployment, validate_object
from specdeploy_operator.builders import (
    OperatorSettings,
    build_cache_pvc,
    build_deployment,
    build_engine_builds,
    build_job,
    build_server_config,
    endpoint,
    engine_build_name,
    job_name,
    owner_reference,
    render_children,
    status_selector,
)

from tests.example_files import example_files
from tests.unit.builder_examples import (
    COLOCATED,
    DNS_LABEL,
    SETTINGS,
    deployment_of,
    example_body,
    parsed_example,
)

# --- names --------------------------------------------------------------------------------------------------


def test_names_are_deterministic_dns_labels_within_63() -> None:
    uri = "hf://some-organisation/" + "A-Very_Long.Model.Name-" * 6 + "Instruct"
    hash_ = "0123456789abcdef"
    name = engine_build_name(uri, "target", hash_)
    assert len(name) <= 63
    assert DNS_LABEL.match(name)
    assert name.endswith(f"-target-{hash_}")
    assert name == engine_build_name(uri, "target", hash_)
    body = example_body(COLOCATED)
    body["spec"]["target"]["model"]["uri"] = uri
    for engine in build_engine_builds(parsed_example(body), SETTINGS):
        for child in (engine["metadata"]["name"], job_name(engine)):
            assert len(child) <= 63
            assert DNS_LABEL.match(child), child


def test_every_child_name_is_a_dns_label() -> None:
    for path in example_files():
        for body in yaml.safe_load_all(path.read_text()):
            if not body or body.get("kind") != "SpeculativeDeployment":
                continue
            first = render_children(parsed_example(body), SETTINGS)
            assert first == render_children(parsed_example(body), SETTINGS)
            for obj in first:
                name = obj["metadata"]["name"]
                assert len(name) <= 63, name
                assert DNS_LABEL.match(name), name


def test_labels_selector_endpoint_and_owner() -> None:
    body = example_body(COLOCATED)
    body["metadata"].update(namespace="serving", uid="1234")
    sdep = parsed_example(body)
    deployment = build_deployment(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)
    assert deployment["metadata"]["labels"] == {
        "app.kubernetes.io/name": "specdeploy",
        "app.kubernetes.io/instance": "llama-70b-8b-h100",
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/managed-by": "specdeploy",
    }
    assert status_selector(sdep) == (
        "app.kubernetes.io/component=server,app.kubernetes.io/instance=llama-70b-8b-h100,"
        "app.kubernetes.io/name=specdeploy"
    )
    assert endpoint(sdep) == "http://llama-70b-8b-h100.serving.svc:8000/v1"
    assert deployment["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "specdeploy.dev/v1alpha1",
            "kind": "SpeculativeDeployment",
            "name": "llama-70b-8b-h100",
            "uid": "1234",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert owner_reference({"kind": "EngineBuild", "metadata": {"name": "e"}})["uid"] == ""


# --- credentials and settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "variable"),
    [
        ("hf://meta-llama/Llama-3.3-70B-Instruct", "HF_TOKEN_PATH"),
        ("s3://models-bucket/llama", "AWS_SHARED_CREDENTIALS_FILE"),
        ("gs://models-bucket/llama", "GOOGLE_APPLICATION_CREDENTIALS"),
    ],
)
def test_credentials_are_a_mounted_file(uri: str, variable: str) -> None:
    body = example_body(COLOCATED)
    body["spec"]["target"]["model"].update(uri=uri, credentialsSecret="model-token")
    engine = build_engine_builds(parsed_example(body), SETTINGS)[0]
    pod = build_job(engine, SETTINGS)["spec"]["template"]["spec"]
    download = pod["initContainers"][0]
    assert download["name"] == "download"
    assert [e["name"] for e in download["env"]] == [variable]
    assert download["env"][0]["value"].startswith("/var/run/secrets/specdeploy/model/")
    assert not any("valueFrom" in e for e in download["env"])
    assert "model-token" not in " ".join(download["command"])
    secret = next(v for v in pod["volumes"] if "secret" in v)
    assert secret["secret"]["secretName"] == "model-token"
    # Only the download step sees the secret.
    for container in pod["initContainers"][1:] + pod["containers"]:
        assert all(m["name"] != secret["name"] for m in container["volumeMounts"])


def test_settings_from_env() -> None:
    settings = OperatorSettings.from_env(
        {
            "SPECDEPLOY_SERVER_IMAGE": "r/server:1",
            "SPECDEPLOY_CACHE_PVC_NAME": "cache",
            "SPECDEPLOY_GC_GRACE_SECONDS": "60",
            "SPECDEPLOY_WATCH_NAMESPACES": "a, b,,c",
            "SPECDEPLOY_UNRELATED": "x",
            "HOME": "/root",
        }
    )
    assert settings.server_image == "r/server:1"
    assert settings.cache_pvc_name == "cache"
    assert settings.gc_grace_seconds == 60
    assert settings.watch_namespaces == ("a", "b", "c")
    assert OperatorSettings.from_env({}) == OperatorSettings()
    with pytest.raises(ValueError, match="gc_grace_seconds"):
        OperatorSettings.from_env({"SPECDEPLOY_GC_GRACE_SECONDS": "-1"})
    # status.engines.previous holds 32 names: 16 per model role at most.
    assert OperatorSettings.from_env({"SPECDEPLOY_KEEP_PREVIOUS_ENGINES": "16"}).keep_previous_engines == 16
    with pytest.raises(ValueError, match="keep_previous_engines"):
        OperatorSettings.from_env({"SPECDEPLOY_KEEP_PREVIOUS_ENGINES": "17"})


def test_runtime_change_rolls_pods_through_the_config_hash() -> None:
    body = example_body(COLOCATED)
    sdep = parsed_example(body)
    engines = build_engine_builds(sdep, SETTINGS)
    before = build_deployment(sdep, engines, SETTINGS)["spec"]["template"]
    body["spec"]["runtime"]["kvCacheFreeGpuMemFraction"] = 0.5
    after = build_deployment(parsed_example(body), engines, SETTINGS)["spec"]["template"]
    key = "specdeploy.dev/config-hash"
    assert after["metadata"]["annotations"][key] != before["metadata"]["annotations"][key]
    body["spec"]["replicas"] = 4  # scaling does not touch the pod template
    scaled = build_deployment(parsed_example(body), engines, SETTINGS)["spec"]["template"]
    assert scaled == after


def test_cache_claim_only_for_engine_cache_size() -> None:
    body = example_body(COLOCATED)
    assert build_cache_pvc(parsed_example(body), SETTINGS) is None
    body["spec"]["engineCache"] = {"size": "2Ti", "storageClassName": "fast-rwx"}
    sdep = parsed_example(body)
    pvc = build_cache_pvc(sdep, SETTINGS)
    assert pvc is not None
    assert pvc["metadata"]["name"] == "llama-70b-8b-h100-engine-cache"
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "2Ti"}},
        "storageClassName": "fast-rwx",
    }
    engines = build_engine_builds(sdep, SETTINGS)
    assert {e["spec"]["cache"]["pvcName"] for e in engines} == {"llama-70b-8b-h100-engine-cache"}
    assert render_children(sdep, SETTINGS)[0] == pvc
    body["spec"]["engineCache"] = {"pvcName": "shared-cache"}
    assert build_cache_pvc(parsed_example(body), SETTINGS) is None


def test_tensorrt_serving_needs_its_engines() -> None:
    sdep = parsed_example(example_body(COLOCATED))
    engines = build_engine_builds(sdep, SETTINGS)
    with pytest.raises(ValueError, match="draft engine"):
        build_deployment(sdep, engines[:1], SETTINGS)
    with pytest.raises(ValueError, match="target engine"):
        build_server_config(sdep, [], SETTINGS)


def test_rendered_engine_builds_are_valid_api_objects() -> None:
    for path in example_files():
        for body in yaml.safe_load_all(path.read_text()):
            if not body or body.get("kind") != "SpeculativeDeployment":
                continue
            for engine in build_engine_builds(parsed_example(body), SETTINGS):
                parsed, errors = validate_object(engine)
                assert errors == [], (path.name, errors)
                assert isinstance(parsed, EngineBuild)
                assert parsed.spec.hash == parsed.spec.content_hash()


def test_a_mig_deployment_builds_its_engines_on_the_mig_slices_it_serves_on() -> None:
    """Build pods and serving pods request the same extended resource: with `placement.gpuResource:
    nvidia.com/mig-3g.40gb`, a build that asked for `nvidia.com/gpu` would never schedule on the MIG pool."""
    from specdeploy_operator.builders import (
        OperatorSettings,
        build_deployment,
        build_engine_builds,
        build_job,
    )

    doc: dict[str, Any] = {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "mig", "namespace": "ns", "uid": "u"},
        "spec": {
            "backend": "tensorrt",
            "target": {"model": {"uri": "hf://org/target-8b"}},
            "speculative": {"method": "promptLookup"},
            "placement": {
                "gpuProduct": "NVIDIA-H100-80GB-HBM3",
                "gpuResource": "nvidia.com/mig-3g.40gb",
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
                ],
            },
        },
    }
    sdep = SpeculativeDeployment.model_validate(doc)
    settings = OperatorSettings()
    (engine,) = build_engine_builds(sdep, settings)
    job_pod = build_job({**engine, "metadata": {**engine["metadata"], "uid": "e"}}, settings)["spec"][
        "template"
    ]
    gpu_steps = [c for c in job_pod["spec"]["initContainers"] if "resources" in c]
    assert gpu_steps
    for step in gpu_steps:
        assert step["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
    serving = build_deployment(sdep, [engine], settings)["spec"]["template"]["spec"]
    assert serving["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
    # One helper: the same selector and tolerations for both kinds of pods.
    assert job_pod["spec"]["nodeSelector"] == serving["nodeSelector"]
    assert job_pod["spec"]["tolerations"] == serving["tolerations"]
    # Where the build runs is not what it builds: the same engine (hash) as on whole GPUs.
    whole = SpeculativeDeployment.model_validate(
        {**doc, "spec": {**doc["spec"], "placement": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"}}}
    )
    assert build_engine_builds(whole, settings)[0]["spec"]["hash"] == engine["spec"]["hash"]


def test_the_serving_env_is_the_server_containers_and_rolls_the_pods() -> None:
    body = example_body(COLOCATED)
    plain = deployment_of(parsed_example(body))
    assert "env" not in plain["spec"]["template"]["spec"]["containers"][0]
    body["spec"].setdefault("serving", {})["env"] = [
        {"name": "TLLM_WORKER_USE_SINGLE_PROCESS", "value": "1"},
        {"name": "EMPTY"},
    ]
    with_env = deployment_of(parsed_example(body))
    (container,) = with_env["spec"]["template"]["spec"]["containers"]
    assert container["env"] == [
        {"name": "TLLM_WORKER_USE_SINGLE_PROCESS", "value": "1"},
        {"name": "EMPTY", "value": ""},
    ]
    assert with_env["spec"]["template"] != plain["spec"]["template"]  # a changed env is a rollout


def test_the_pod_template_rolls_when_the_inline_chat_template_changes() -> None:
    from specdeploy_operator.builders import OperatorSettings, build_deployment

    def template_annotations(chat_template: str) -> dict[str, str]:
        sdep = SpeculativeDeployment.model_validate(
            {
                "apiVersion": "specdeploy.dev/v1alpha1",
                "kind": "SpeculativeDeployment",
                "metadata": {"name": "t", "namespace": "ns"},
                "spec": {
                    "backend": "transformers",
                    "target": {"model": {"uri": "pvc://models/target"}},
                    "speculative": {"method": "promptLookup"},
                    "placement": {"device": "cpu"},
                    "serving": {"chatTemplate": chat_template},
                },
            }
        )
        meta = build_deployment(sdep, [], OperatorSettings())["spec"]["template"]["metadata"]
        return dict(meta["annotations"])

    assert template_annotations("{{ a }}") != template_annotations("{{ b }}")


def test_the_serving_pod_checks_each_engines_completion_marker_before_the_server_starts(
    tmp_path: Path,
) -> None:
    """The script the `verify-engines` init container runs, run here by sh against a cache directory."""
    import subprocess

    from specdeploy_operator.builders.layout import COMPLETION_MARKER, CacheLayout, verify_script

    layout = CacheLayout(str(tmp_path))
    engines = [("target", "aaaa", "engines/aaaa"), ("draft", "bbbb", "engines/bbbb")]
    script = verify_script(layout, engines)

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)

    for _, _, relative in engines:
        (tmp_path / relative).mkdir(parents=True)
    (tmp_path / "engines/aaaa" / COMPLETION_MARKER).write_text("aaaa\n")
    result = check()
    assert result.returncode == 1
    assert "the draft engine bbbb is incomplete" in result.stderr
    (tmp_path / "engines/bbbb" / COMPLETION_MARKER).write_text("cccc\n")
    assert check().returncode == 1, "a marker of another build"
    (tmp_path / "engines/bbbb" / COMPLETION_MARKER).write_text("bbbb\n")
    assert check().returncode == 0


@pytest.mark.parametrize(
    ("stem", "serving"),
    [
        ("02-draft-target-llama8b-1b-h100", "ghcr.io/specdeploy/server:0.1.0"),
        ("10-transformers-gpu-llama8b-1b", "ghcr.io/specdeploy/server:0.1.0"),
        ("tensorrt/02-draft-target-llama8b-1b-h100", "ghcr.io/specdeploy/server:0.1.0-trtllm1.2.1"),
    ],
)
def test_serving_and_build_pods_take_the_image_of_their_backend(stem: str, serving: str) -> None:
    """pytorch and transformers run the maintained release's image, tensorrt the engine workflow's; builds use
    the serving image unless a builder image is set, and the spec's images win over the operator's."""

    def images(sdep: SpeculativeDeployment, settings: OperatorSettings = SETTINGS) -> tuple[str, set[str]]:
        engines = build_engine_builds(sdep, settings)
        deployment = build_deployment(sdep, engines, settings)
        builds = {
            build_job(e, settings)["spec"]["template"]["spec"]["containers"][0]["image"] for e in engines
        }
        assert engines, "the example builds or stages its checkpoints"
        return deployment["spec"]["template"]["spec"]["containers"][0]["image"], builds

    body = example_body(stem)
    assert images(parsed_example(body)) == (serving, {serving})
    builder = SETTINGS.model_copy(update={"builder_image": "registry.example/builder:1"})
    assert images(parsed_example(body), builder)[1] == {"registry.example/builder:1"}
    body["spec"]["images"] = {"server": "registry.example/server:2", "builder": "registry.example/builder:2"}
    assert images(parsed_example(body)) == ("registry.example/server:2", {"registry.example/builder:2"})
