"""Who the operator's pods are: `imagePullSecrets` and the ServiceAccount of serving, build and staging
pods, from `spec.images.pullSecrets`, `spec.serviceAccounts` and the operator's defaults, and the
ServiceAccount token mounted only in pods that read a cloud store through it.

Golden files: every object `specdeploy render` prints for the specs in `tests/unit/identity/`, with operator
defaults set. Regenerate after an intended change with
`SPECDEPLOY_UPDATE_GOLDEN=1 pytest tests/unit/test_pod_identity.py` and review the diff."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import (
    OperatorSettings,
    build_job,
    dump_yaml,
    engine_builds,
    render_children,
)

from tests.pod_security_standards import pod_specs, violations

HERE = Path(__file__).resolve().parent
SPECS = sorted((HERE / "identity").glob("*.yaml"))
GOLDEN = HERE / "golden_identity"
UPDATE = os.environ.get("SPECDEPLOY_UPDATE_GOLDEN") == "1"
SETTINGS = OperatorSettings(
    image_pull_secrets=("cluster-registry",),
    serving_service_account="specdeploy-serving",
    build_service_account="specdeploy-build",
)


def _sdep(path: Path) -> SpeculativeDeployment:
    sdep = parse_object(yaml.safe_load(path.read_text()))
    assert isinstance(sdep, SpeculativeDeployment)
    return sdep


def _pods(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        for where, spec in pod_specs(obj):
            yield f"{obj['kind']}/{obj['metadata']['name']}{where}", dict(spec)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_golden(path: Path) -> None:
    golden = GOLDEN / f"{path.stem}.yaml"
    rendered = dump_yaml(render_children(_sdep(path), SETTINGS))
    if UPDATE:
        golden.write_text(rendered)
    assert golden.is_file(), f"no golden file {golden}; run with SPECDEPLOY_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(), f"{path.name} renders differently from {golden}"


def test_no_stale_golden_files() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.yaml")) == [p.stem for p in SPECS]


def test_every_pod_pulls_with_the_operators_secrets_then_the_specs() -> None:
    objects = render_children(_sdep(HERE / "identity" / "tensorrt-s3-target.yaml"), SETTINGS)
    pods = dict(_pods(objects))
    kinds = {where.split("/")[0] for where in pods}
    assert kinds == {"Job", "Deployment"}, kinds
    for where, spec in pods.items():
        assert spec["imagePullSecrets"] == [{"name": "cluster-registry"}, {"name": "team-a-registry"}], where


def test_serving_and_build_pods_run_as_their_service_accounts() -> None:
    objects = render_children(_sdep(HERE / "identity" / "tensorrt-s3-target.yaml"), SETTINGS)
    for where, spec in _pods(objects):
        expected = "model-reader" if where.startswith("Job/") else "llama-serving"
        assert spec["serviceAccountName"] == expected, where


def test_the_token_is_mounted_only_in_pods_that_read_a_cloud_store_through_their_account() -> None:
    objects = render_children(_sdep(HERE / "identity" / "tensorrt-s3-target.yaml"), SETTINGS)
    mounted = {where: spec["automountServiceAccountToken"] for where, spec in _pods(objects)}
    jobs = {where: token for where, token in mounted.items() if where.startswith("Job/")}
    # The target's build reads s3:// without a credentials Secret; the draft's reads the Hub with a token.
    assert sorted(jobs.values()) == [False, True], jobs
    assert next(token for where, token in jobs.items() if "-target-" in where) is True
    # The serving pods of backend tensorrt download nothing.
    assert all(not token for where, token in mounted.items() if where.startswith("Deployment/"))
    gcs = render_children(_sdep(HERE / "identity" / "pytorch-gs-direct.yaml"), SETTINGS)
    [(where, spec)] = list(_pods(gcs))
    assert spec["serviceAccountName"] == "specdeploy-serving"
    assert spec["automountServiceAccountToken"] is True, where
    # Without a named account the token stays unmounted, whatever the pod downloads.
    plain = render_children(_sdep(HERE / "identity" / "pytorch-gs-direct.yaml"), OperatorSettings())
    [(_, spec)] = list(_pods(plain))
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    assert "imagePullSecrets" not in spec


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_pods_with_accounts_and_tokens_still_pass_the_restricted_profile(path: Path) -> None:
    for where, spec in _pods(render_children(_sdep(path), SETTINGS)):
        assert violations(spec) == [], where


def test_pull_secrets_and_accounts_do_not_change_the_engine_hash() -> None:
    """How a pod pulls its image and whose identity reads the checkpoint change nothing in the engine's bytes:
    a deployment that adds them shares the engines built without them (no rebuild)."""
    sdep = _sdep(HERE / "identity" / "tensorrt-s3-target.yaml")
    bare = sdep.model_copy(
        update={
            "spec": sdep.spec.model_copy(
                update={
                    "service_accounts": None,
                    "images": sdep.spec.images.model_copy(update={"pull_secrets": None})
                    if sdep.spec.images
                    else None,
                }
            )
        }
    )
    with_identity = engine_builds(sdep, SETTINGS)
    without = engine_builds(bare, OperatorSettings())
    assert [e.metadata.name for e in with_identity] == [e.metadata.name for e in without]
    assert [e.spec.hash for e in with_identity] == [e.spec.content_hash() for e in without]
    assert all(e.spec.service_account_name == "model-reader" for e in with_identity)
    assert all(e.spec.image_pull_secrets == ["cluster-registry", "team-a-registry"] for e in with_identity)
    assert all(e.spec.service_account_name is None and e.spec.image_pull_secrets is None for e in without)


def test_the_build_job_reads_its_identity_from_the_engine_build() -> None:
    """The Job is rendered from the EngineBuild alone (the operator's settings of the day do not change an
    existing build's pod)."""
    [target, _] = engine_builds(_sdep(HERE / "identity" / "tensorrt-s3-target.yaml"), SETTINGS)
    pod = build_job(target, OperatorSettings())["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "model-reader"
    assert pod["imagePullSecrets"] == [{"name": "cluster-registry"}, {"name": "team-a-registry"}]


def test_settings_read_the_identity_defaults_from_the_environment() -> None:
    settings = OperatorSettings.from_env(
        {
            "SPECDEPLOY_IMAGE_PULL_SECRETS": "regcred, mirror-cred",
            "SPECDEPLOY_SERVING_SERVICE_ACCOUNT": "",
            "SPECDEPLOY_BUILD_SERVICE_ACCOUNT": "model-reader",
        }
    )
    assert settings.image_pull_secrets == ("regcred", "mirror-cred")
    assert settings.serving_service_account is None
    assert settings.build_service_account == "model-reader"


def test_a_bad_pull_secret_name_is_refused_naming_the_field() -> None:
    doc = yaml.safe_load((HERE / "identity" / "tensorrt-s3-target.yaml").read_text())
    doc["spec"]["images"]["pullSecrets"] = ["Not_A_Name"]
    with pytest.raises(ValueError, match=r"images\.pullSecrets"):
        parse_object(doc)
