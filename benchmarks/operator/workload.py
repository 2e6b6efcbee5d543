"""The benchmark's workload: `count` SpeculativeDeployments, and what they need (engines, GPUs, the serving
objects of the reference path) rendered offline by the operator's own builders; the extra simulated nodes
that make every replica fit."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from specdeploy_localcluster.nodepools import DEFAULT_NODEPOOLS, MULTINODE_LABEL, NodePool, load_nodepools
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import (
    OperatorSettings,
    build_engine_builds,
    engine_builds,
    serving_children,
)

from benchmarks.operator import REPO

__all__ = ["Plan", "bench_pools", "multinode_workload", "plan", "workload"]

EXAMPLE_DRAFT = REPO / "examples" / "02-draft-target-llama8b-1b-h100.yaml"
EXAMPLE_LOOKUP = REPO / "examples" / "05-prompt-lookup-llama13b.yaml"
EXAMPLE_MULTINODE = REPO / "examples" / "11-mtp-deepseek-r1-2x8xh100.yaml"
H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"


def workload(count: int, namespace: str) -> list[dict[str, Any]]:
    """`count` SpeculativeDeployments: 60 % draft-target Llama 3.1 8B + 3.2 1B (example 02) in three engine
    variants (H100 with maxDraftLen 10 or 8, H200), 40 % prompt-lookup Llama 2 13B (example 05) in two
    (maxDraftLen 10 or 8). Per deployment: its own runtime (KV-cache fraction, batch size), draftLen, and
    every tenth one has 2 replicas. One GPU per replica."""
    draft_base = yaml.safe_load(EXAMPLE_DRAFT.read_text())
    lookup_base = yaml.safe_load(EXAMPLE_LOOKUP.read_text())
    n_draft = round(count * 0.6)
    docs: list[dict[str, Any]] = []
    for i in range(count):
        if i < n_draft:
            doc = copy.deepcopy(draft_base)
            variant = i % 3
            max_draft = 8 if variant == 1 else 10
            doc["metadata"] = {"name": f"llama-8b-1b-{i:03d}"}
            doc["spec"]["speculative"]["maxDraftLen"] = max_draft
            doc["spec"]["speculative"]["draftLen"] = 3 + i % 5
            doc["spec"]["placement"]["gpuProduct"] = H200 if variant == 2 else H100
            doc["spec"]["runtime"]["kvCacheFreeGpuMemFraction"] = (0.5, 0.6, 0.7, 0.8)[i % 4]
            doc["spec"]["runtime"]["maxBatchSize"] = (64, 128)[i % 2]
        else:
            doc = copy.deepcopy(lookup_base)
            variant = i % 2
            max_draft = 8 if variant else 10
            doc["metadata"] = {"name": f"llama2-13b-lookup-{i:03d}"}
            doc["spec"]["speculative"]["maxDraftLen"] = max_draft
            doc["spec"]["speculative"]["draftLen"] = max_draft - i % 3
            doc["spec"]["runtime"]["kvCacheFreeGpuMemFraction"] = (0.7, 0.8, 0.9)[i % 3]
        doc["metadata"]["namespace"] = namespace
        if i % 10 == 9:
            doc["spec"]["replicas"] = 2
        docs.append(doc)
    return docs


def multinode_workload(count: int, namespace: str) -> list[dict[str, Any]]:
    """`count` SpeculativeDeployments whose replicas span two 8-GPU H100 nodes (example 11: DeepSeek-R1 with
    MTP, TP16, backend pytorch), each with its own runtime and maximum draft length; every tenth has 2
    replicas. The checkpoint is an `hf://` download (simulated, like every container here) rather than the
    example's claim, so nothing but the serving objects is needed."""
    base = yaml.safe_load(EXAMPLE_MULTINODE.read_text())
    docs: list[dict[str, Any]] = []
    for i in range(count):
        doc = copy.deepcopy(base)
        doc["metadata"] = {"name": f"deepseek-r1-mtp-{i:03d}", "namespace": namespace}
        doc["spec"]["target"]["model"] = {"uri": "hf://deepseek-ai/DeepSeek-R1"}
        doc["spec"]["speculative"]["maxDraftLen"] = 1 + i % 3
        doc["spec"]["runtime"]["kvCacheFreeGpuMemFraction"] = (0.8, 0.85, 0.9)[i % 3]
        doc["spec"]["runtime"]["maxBatchSize"] = (32, 64)[i % 2]
        if i % 10 == 9:
            doc["spec"]["replicas"] = 2
        docs.append(doc)
    return docs


@dataclass(frozen=True)
class Plan:
    """What the workload needs, rendered offline by the operator's own builders."""

    engines: dict[str, int]  # EngineBuild name -> deployments using it
    gpus: dict[str, int]  # GPU product -> GPUs the serving pods request
    serving: list[dict[str, Any]]  # ConfigMap, Service, PDB, Deployment or LeaderWorkerSet (reference)
    workload_kind: str = "Deployment"  # LeaderWorkerSet when replicas span nodes
    nodes_per_replica: int = 1


def plan(docs: Iterable[dict[str, Any]], settings: OperatorSettings, ref_namespace: str) -> Plan:
    engines: Counter[str] = Counter()
    gpus: Counter[str] = Counter()
    serving: list[dict[str, Any]] = []
    for doc in docs:
        sdep = SpeculativeDeployment.model_validate(doc)
        builds = build_engine_builds(sdep, settings)
        engines.update(e["metadata"]["name"] for e in builds)
        product = sdep.spec.placement.gpu_product or settings.default_gpu_product
        gpus[product] += sdep.spec.replicas * sdep.spec.gpus_per_replica
        ref_doc = copy.deepcopy(doc)
        ref_doc["metadata"]["namespace"] = ref_namespace
        ref = SpeculativeDeployment.model_validate(ref_doc)
        children = serving_children(ref, engine_builds(ref, settings), settings)
        for obj in (children.configmap, children.service, children.pdb, children.workload):
            obj["metadata"].pop("ownerReferences", None)  # plain objects: nothing owns them
            serving.append(obj)
    kind = serving[-1]["kind"] if serving else "Deployment"
    size = int((serving[-1]["spec"].get("leaderWorkerTemplate") or {}).get("size") or 1) if serving else 1
    return Plan(dict(engines), dict(gpus), serving, kind, size)


def bench_pools(gpus: Mapping[str, int], builds: int) -> list[NodePool]:
    """Extra GPU nodes so that every replica fits next to the default pools (2 x 8 H100, 1 x 8 H200), with
    room for the build pods and a margin of one node."""
    defaults = {
        p.gpu.product: p
        for p in load_nodepools(DEFAULT_NODEPOOLS)
        # Whole GPUs: not the MIG pool of the same product, nor the multinode pools (their taint keeps these
        # replicas off them).
        if p.gpu and p.gpu.resource == "nvidia.com/gpu" and MULTINODE_LABEL not in p.labels
    }
    pools = []
    for product, needed in sorted(gpus.items()):
        base = defaults[product]
        assert base.gpu is not None
        have = base.nodes * base.gpu.count
        extra = max(0, -(-(needed + builds - have) // base.gpu.count)) + 1
        pools.append(
            NodePool(
                name=f"bench-{base.name}",
                nodes=extra,
                instance_type=base.instance_type,
                cpu=base.cpu,
                memory=base.memory,
                pods=base.pods,
                gpu=base.gpu,
            )
        )
    return pools
