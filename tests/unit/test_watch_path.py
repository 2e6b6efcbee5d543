"""What the operator does at every watch event (every status write, every pod that becomes ready, at 1 000
deployments): copy the parts the reconciler reads, look up which engines a deployment uses, and nothing kopf
would compute for handlers the operator does not have."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Sized
from typing import Any

import kopf
from specdeploy_operator.__main__ import build_settings
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import OperatorSettings, build_engine_builds
from specdeploy_operator.controller.engineusers import EngineNames, engines_used
from specdeploy_operator.controller.handlers import NoEssence, _snapshot, register

from tests.unit.test_reconciler import gpu_deployment


def rendered(doc: dict[str, Any]) -> set[str]:
    sdep = SpeculativeDeployment.model_validate(doc)
    return {e["metadata"]["name"] for e in build_engine_builds(sdep, OperatorSettings())}


def with_status_engines(doc: dict[str, Any], *previous: str) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["status"] = {"phase": "Ready", "engines": {"previous": list(previous)}}
    return doc


def test_a_spec_is_rendered_once_however_often_its_status_changes() -> None:
    names = EngineNames(OperatorSettings())
    doc = gpu_deployment("a")
    assert names.used(doc) == rendered(doc)
    assert names.used(with_status_engines(doc, "old-target-1")) == rendered(doc) | {"old-target-1"}
    assert names.used(with_status_engines(doc, "old-target-2")) == rendered(doc) | {"old-target-2"}
    assert names.renderings == 1


def test_another_spec_or_another_deployment_is_rendered_anew() -> None:
    names = EngineNames(OperatorSettings())
    doc = gpu_deployment("a")
    names.used(doc)
    changed = copy.deepcopy(doc)
    changed["spec"]["placement"]["gpuProduct"] = "NVIDIA-H200"
    assert names.used(changed) == rendered(changed) != rendered(doc)
    names.used(gpu_deployment("b"))
    assert names.renderings == 3
    assert names.used(doc) == engines_used(doc, OperatorSettings())  # still remembered
    assert names.renderings == 3


def test_the_oldest_renderings_are_forgotten_beyond_the_limit() -> None:
    names = EngineNames(OperatorSettings(), kept=2)
    for name in ("a", "b", "c", "a"):
        names.used(gpu_deployment(name))
    assert names.renderings == 4


def test_a_spec_the_model_rejects_uses_only_the_engines_its_status_lists() -> None:
    doc = with_status_engines(gpu_deployment("a"), "kept-target")
    doc["spec"]["replicas"] = "many"
    assert EngineNames(OperatorSettings()).used(doc) == {"kept-target"}


def test_snapshots_are_deep_copies_without_the_servers_managed_fields() -> None:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": {"app": "x"},
            "managedFields": [{"manager": "kube-scheduler", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"containers": [{"name": "c"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    snap = _snapshot(body, "metadata", "status")
    assert snap == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "x"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    body["status"]["conditions"][0]["status"] = "False"
    body["metadata"]["labels"]["app"] = "y"
    assert snap["status"]["conditions"][0]["status"] == "True"
    assert snap["metadata"]["labels"] == {"app": "x"}


def test_no_handler_reads_kopfs_diffs_so_none_are_built() -> None:
    """kopf would deep-copy every watched object at every event to diff it for change handlers; the
    operator registers only indexes and event handlers, so its settings build no such copy."""
    registry = kopf.OperatorRegistry()
    register(registry)
    assert registry._indexing.get_all_handlers()  # the operator's read cache
    assert registry._watching.get_all_handlers()  # its event handlers
    assert not registry._changing.get_all_handlers()  # nothing on.create/update/delete/resume/field
    assert not registry._spawning.get_all_handlers()  # no daemons or timers
    settings = kopf.OperatorSettings()
    build_settings(settings, None)
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, NoEssence)
    body = kopf.Body({"metadata": {"name": "a"}, "spec": {"replicas": 1}})
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None


def test_a_failed_api_request_is_retried_without_end_not_escalated() -> None:
    """An API server away for minutes must not stop the operator: kopf raises after the last backoff, and
    a watch that raises ends the process."""
    settings = kopf.OperatorSettings()
    build_settings(settings, None)
    backoffs = settings.networking.error_backoffs
    assert isinstance(backoffs, Iterable)
    assert not isinstance(backoffs, Sized)  # kopf then retries until a request succeeds
    for _ in range(2):  # every request iterates anew
        pauses = list(itertools.islice(iter(backoffs), 1000))
        assert pauses[:8] == [1, 1, 2, 3, 5, 8, 13, 21]
        assert len(pauses) == 1000
        assert max(pauses) == 21
