"""Drafts that learn the target, on the local cluster: what a DraftTraining buys, measured; writes its record,
benchmarks/results/distill.json, and the block of docs/benchmarks.md rendered from it
(benchmarks/distill_report.py).

python -m benchmarks.distill              # ~15 min with the cluster start
python -m benchmarks.distill --no-write   # print only: no record, docs untouched

One run on its own local cluster. The CPU example (examples/09: the demo's models, made in the cluster by the
demo's Job, real servers in real pods) serves with a stale draft: the target was trained for the demo's 240
steps, its draft (same corpus, same tokenizer) for 60 only, as when a target is fine-tuned and its draft is
not. Three DraftTrainings learn from it, each through
the operator's generate and train Jobs (real processes): `draftModel` distils the example's draft on the
target's greedy answers, `draftModel-sampled` on answers sampled at temperature 1, `eagle3` trains a head with
ModelOpt. The prompts are the first words of each sentence of the demo corpus; the same
prompts are held out of both. Then each trained draft serves in a deployment of its own, and every deployment
(the example as it was: the reference) answers the held-out prompts at temperature 0 and 1. Acceptance
(accepted / drafted) and tokens per target step (generated / verify steps) come from the servers' own
counters, read before and after.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import config as k8s_config
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.demomodels import make_demo_models
from specdeploy_localcluster.operatorproc import OperatorProcess
from specdeploy_localcluster.servicegateway import ServiceGateway
from specdeploy_localcluster.serviceload import ServiceEndpoints
from specdeploy_server.demo_models import corpus_text

from benchmarks import records
from benchmarks.distill_report import render
from benchmarks.operator.cluster import GROUP_PATH, Bench, start_cluster, wait

REPO = Path(__file__).resolve().parents[1]
NS = "distill"
TRAINING_STEPS = 240  # what `make demo`'s 40 s of training reach on 2 CPU cores
STALE_DRAFT_STEPS = 60  # the draft the deployment serves was trained this far only: the target moved on
SAMPLES, HELD_OUT = 180, 24
MAX_TOKENS = 64  # of each measured answer
ANSWER_TOKENS = 128  # of each answer trained on
REPEATS = {0.0: 1, 1.0: 3}  # answers per held-out prompt and temperature (sampled ones vary)
TRAININGS: dict[str, dict[str, Any]] = {
    # label -> the DraftTraining's draft kind, the temperature the target answers at, its training settings
    "draftModel": {
        "draft": "draftModel",
        "temperature": 0.0,
        "training": {"steps": 100, "learningRate": 1e-4},
    },
    "draftModel-sampled": {
        "draft": "draftModel",
        "temperature": 1.0,
        "training": {"steps": 300, "learningRate": 2e-4},
    },
    "eagle3": {"draft": "eagle3", "temperature": 0.0, "training": {"steps": 300}},
}
COUNTERS = {
    "drafted": "specdeploy_draft_tokens_total",
    "accepted": "specdeploy_accepted_draft_tokens_total",
    "steps": "specdeploy_speculative_steps_total",
    "generated": "specdeploy_generation_tokens_total",
}


def prompts() -> list[str]:
    """The first four and the first seven words of each sentence of the demo corpus, each once."""
    sentences = [s.split() for s in re.split(r"(?<=[.?!])\s+", corpus_text())]
    out = [" ".join(words[:n]) for words in sentences if len(words) >= 9 for n in (4, 7)]
    return list(dict.fromkeys(out))


def example(name: str) -> dict[str, Any]:
    """The CPU example, serving the stale draft."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "09-transformers-cpu-tiny.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": NS}
    doc["spec"]["draft"]["model"]["uri"] = "pvc://demo-models/stale-draft"
    return doc


def trained_deployment(label: str, uri: str) -> dict[str, Any]:
    """The example serving the draft a training made: its draft model replaced, or an EAGLE-3 head instead."""
    doc = example(f"tiny-{label.lower()}")
    if TRAININGS[label]["draft"] == "draftModel":
        doc["spec"]["draft"]["model"]["uri"] = uri
    else:
        doc["spec"].pop("draft")
        speculative = doc["spec"]["speculative"]
        doc["spec"]["speculative"] = {
            "method": "eagle3",
            "draftLen": speculative["draftLen"],
            "maxDraftLen": speculative["maxDraftLen"],
            "eagle": {"model": {"uri": uri}},
        }
    return doc


def copy_as_owner(src: Path, dst: Path) -> None:
    """`src` copied to `dst` with its owner and modes, as the pods that wrote it would find it."""
    shutil.copytree(src, dst)
    for path in [dst, *dst.rglob("*")]:
        origin = src / path.relative_to(dst)
        stat = origin.stat()
        os.chown(path, stat.st_uid, stat.st_gid)


def apply(bench: Bench, doc: dict[str, Any]) -> None:
    bench.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))


def ready(bench: Bench, name: str) -> bool:
    status = bench.cluster.api("GET", f"{GROUP_PATH}/namespaces/{NS}/speculativedeployments/{name}").get(
        "status"
    )
    return bool(status and status.get("phase") == "Ready")


def train(bench: Bench, label: str, endpoint: str, timeout: float) -> dict[str, Any]:
    name = f"learn-{label.lower()}"
    settings = TRAININGS[label]
    doc = {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "deployment": "tiny-cpu",
            "draft": settings["draft"],
            "prompts": {"configMap": {"name": "prompts"}},
            "samples": SAMPLES,
            "heldOut": HELD_OUT,
            "sampling": {
                "maxTokens": ANSWER_TOKENS,
                "concurrency": 4,
                "temperature": settings["temperature"],
            },
            "training": settings["training"],
            "outputPvcName": "demo-models",
            "endpoint": endpoint,
        },
    }
    started = time.monotonic()
    apply(bench, doc)
    path = f"{GROUP_PATH}/namespaces/{NS}/drafttrainings/{name}"

    def finished() -> dict[str, Any] | None:
        status = bench.cluster.api("GET", path).get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status: dict[str, Any] = wait(finished, timeout, f"{name} finished", interval=2)
    if status["phase"] != "Succeeded":
        raise RuntimeError(f"{name} failed: {status.get('message')}")
    return {"status": status, "wall_seconds": round(time.monotonic() - started, 1)}


def counters(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        for key, name in COUNTERS.items():
            if line.startswith(name):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def measure(base_url: str, held_out: list[str], temperature: float) -> dict[str, float]:
    """The held-out prompts answered at `temperature` (four at a time); the counters' difference."""
    before = counters(base_url)

    def ask(i_prompt: tuple[int, str]) -> None:
        i, prompt = i_prompt
        body = {
            "model": "target",
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": temperature,
            "seed": i,
        }
        request = urllib.request.Request(
            f"{base_url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as resp:
            resp.read()

    asked = [p for p in held_out for _ in range(REPEATS[temperature])]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(ask, enumerate(asked)))
    after = counters(base_url)
    delta = {key: after[key] - before[key] for key in COUNTERS}
    return {
        "temperature": temperature,
        "acceptance": round(delta["accepted"] / delta["drafted"], 3) if delta["drafted"] else 0.0,
        "tokens_per_step": round(delta["generated"] / delta["steps"], 3) if delta["steps"] else 0.0,
        "drafted": int(delta["drafted"]),
        "generated": int(delta["generated"]),
    }


def run(timeout: float, keep: bool) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="specdeploy-bench-distill-"))
    cluster = LocalCluster(state, autoscaling=False, lws=False)
    operator: OperatorProcess | None = None
    try:
        print(f"cluster in {state} ...", flush=True)
        bench = start_cluster(cluster, [])
        bench.namespace(NS)

        def kubectl(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.CompletedProcess(list(args), 0, bench.kubectl(*args, input=input), "")

        # The same corpus and tokenizer, trained for fewer steps: a draft made for an earlier target.
        bench.namespace(f"{NS}-stale")
        stale = make_demo_models(kubectl, f"{NS}-stale", STALE_DRAFT_STEPS)
        models = make_demo_models(kubectl, NS, TRAINING_STEPS)
        copy_as_owner(stale / "draft", models / "stale-draft")
        operator = OperatorProcess(cluster.operator_kubeconfig, cluster.logs)
        operator.start()
        apply(bench, example("tiny-cpu"))
        wait(lambda: ready(bench, "tiny-cpu"), timeout, "tiny-cpu Ready", interval=1)
        lines = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts())
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "prompts", "namespace": NS},
            "data": {"prompts.jsonl": lines},
        }
        apply(bench, configmap)
        api = k8s_config.new_client_from_config(str(cluster.kubeconfig))
        trainings: dict[str, dict[str, Any]] = {}
        with ServiceGateway(api, NS, "tiny-cpu") as gateway:
            for label in TRAININGS:
                print(f"training {label} ...", flush=True)
                trainings[label] = train(bench, label, f"{gateway.url}/v1", timeout * 4)
        first = trainings["draftModel"]["status"]
        held_path = models / "drafts" / first["hash"] / "data" / "heldout.jsonl"
        held_out = [json.loads(line)["prompt"] for line in held_path.read_text().splitlines()]
        served = {"reference": "tiny-cpu"}
        for label, result in trainings.items():
            doc = trained_deployment(label, result["status"]["uri"])
            apply(bench, doc)
            served[label] = doc["metadata"]["name"]
        measurements = []
        for label, name in served.items():
            wait(functools.partial(ready, bench, name), timeout, f"{name} Ready", interval=1)
            base = ServiceEndpoints(api, NS, name).base_url()
            for temperature in (0.0, 1.0):
                figures = measure(base, held_out, temperature)
                print(f"  {label} T={temperature}: {figures}", flush=True)
                measurements.append({"draft": label, **figures})
        return {
            "prompts": len(prompts()),
            "held_out": len(held_out),
            "trainings": {
                label: {
                    "generated": r["status"]["generated"],
                    "trained": r["status"]["trained"],
                    "wall_seconds": r["wall_seconds"],
                }
                for label, r in trainings.items()
            },
            "measurements": measurements,
        }
    finally:
        if operator is not None:
            operator.stop()
        cluster.down()
        if keep:
            print(f"kept {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.distill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed per wait")
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory (logs)")
    args = parser.parse_args(argv)
    started = records.now()
    parameters = {
        "demo_training_steps": TRAINING_STEPS,
        "stale_draft_steps": STALE_DRAFT_STEPS,
        "samples": SAMPLES,
        "held_out": HELD_OUT,
        "max_tokens": MAX_TOKENS,
        "answer_tokens": ANSWER_TOKENS,
        "repeats": {str(t): n for t, n in REPEATS.items()},
        "trainings": TRAININGS,
    }
    record = records.new_record(
        "distill",
        records.command_line(["python", "-m", "benchmarks.distill", *argv]),
        started,
        records.machine_facts(),
        parameters,
    )
    figures = run(args.timeout, args.keep)
    records.finish(record, started, figures)
    print(render([record]))
    if not args.no_write:
        path = records.save(record)
        docs = records.update_docs([record["name"]])
        print(f"wrote {path.relative_to(REPO)} and {', '.join(str(d.relative_to(REPO)) for d in docs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
