"""The operator's start-up wait for discovery (controller/discovery.py), against the local cluster's real
API server: the installed kinds are served at once; a group whose CRD does not exist yet is not, and the wait
returns once that CRD is created and its group served."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import yaml
from specdeploy_operator.api import ENGINE_BUILD, GROUP, SPECULATIVE_DEPLOYMENT, VERSION
from specdeploy_operator.controller.discovery import served_kinds, wait_until_served
from specdeploy_operator.controller.kube import Kube

from tests.conftest import Kubectl


def _crd(group: str) -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


def test_the_operator_waits_until_discovery_serves_its_kinds(
    kubeconfig: Path, kubectl: Kubectl, install_crds: list[str], tmp_path: Path
) -> None:
    group = f"late-{uuid.uuid4().hex[:8]}.specdeploy.dev"
    manifest = tmp_path / "crd.yaml"
    manifest.write_text(yaml.safe_dump(_crd(group)))

    async def scenario() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
        kube = Kube.from_environment(str(kubeconfig))
        try:
            await asyncio.wait_for(
                wait_until_served(kube, GROUP, VERSION, (SPECULATIVE_DEPLOYMENT.plural, ENGINE_BUILD.plural)),
                timeout=30,
            )
            before = await served_kinds(kube, group, "v1")
            waiting = asyncio.create_task(wait_until_served(kube, group, "v1", ["widgets"], interval=0.2))
            assert not waiting.done()
            await asyncio.to_thread(kubectl, "apply", "-f", str(manifest))
            await asyncio.wait_for(waiting, timeout=60)
            return before, await served_kinds(kube, group, "v1"), await served_kinds(kube, GROUP, VERSION)
        finally:
            await kube.close()

    try:
        before, after, specdeploy = asyncio.run(scenario())
    finally:
        kubectl("delete", "-f", str(manifest), "--ignore-not-found", "--wait=false")
    assert before == frozenset()
    assert after == {"widgets"}
    assert {SPECULATIVE_DEPLOYMENT.plural, ENGINE_BUILD.plural} <= specdeploy
