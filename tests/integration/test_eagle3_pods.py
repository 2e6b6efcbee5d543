"""EAGLE-3 on the local cluster: a head in ModelOpt's export format, in the demo's claim beside the target,
served by a real pod on the reference backend's own loop (`backend: transformers`, `method: eagle3`).

The head is exported by ModelOpt itself from the demo's target (random head weights: this checks serving, not
a trained head's acceptance), written into the claim from this machine as a model store would hold it.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from tests.conftest import Kubectl
from tests.integration.test_real_pods import Served, check_greedy_completions, served
from tests.server.modelopt_eagle3 import convert, export

pytestmark = pytest.mark.usefixtures("operator")
__all__ = ["served"]  # the CPU example's fixture: its namespace and models


@pytest.fixture(scope="module")
def eagle3(
    served: tuple[Served, Path], kubectl: Kubectl, api_client: client.ApiClient
) -> tuple[Served, Path]:
    plain, models = served
    head = export(convert(models / "target", seed=3), models / "eagle3")
    for item in head.iterdir():  # readable by the pod's user, as a model store's files are (ModelOpt: 0600)
        item.chmod(0o644)
    doc = json.loads(json.dumps(plain.doc))
    doc["metadata"]["name"] = "tiny-cpu-eagle3"
    doc["spec"].pop("draft")
    doc["spec"]["speculative"] = {
        "method": "eagle3",
        "draftLen": 3,
        "maxDraftLen": 8,
        "eagle": {"model": {"uri": "pvc://demo-models/eagle3"}},
    }
    deployment = Served(kubectl, api_client, plain.namespace, doc)
    deployment.apply()
    deployment.wait_ready()
    return deployment, models


def test_an_eagle3_head_serves_for_real_and_changes_no_greedy_token(eagle3: tuple[Served, Path]) -> None:
    s, models = eagle3
    check_greedy_completions(s, models / "target")
    with urllib.request.urlopen(f"{s.endpoints.base_url()}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    drafted = [line for line in metrics.splitlines() if line.startswith("specdeploy_draft_tokens_total")]
    assert drafted, metrics
    assert float(drafted[0].split()[-1]) > 0, drafted
