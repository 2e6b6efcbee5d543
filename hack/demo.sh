#!/usr/bin/env bash
# `make demo`: the main job on the local simulated GPU cluster (started by `make cluster-up` first).
#
# For now it installs the CRDs, validates an example offline and has the real apiserver admit it (server-side
# dry run), and shows the simulated GPU node pools the operator will deploy onto. The operator itself, and with
# it the example reaching Ready, lands with the operator issue; until then this is a placeholder that says so.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.cluster}"
bin="$(hack/cluster/build.sh)"
k() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
echo "== local control plane: $(k version -o json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
echo "== simulated node pools (kwok fake nodes; no real GPUs, no real containers):"
k get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,node.kubernetes.io/instance-type \
  -o custom-columns='NAME:.metadata.name,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.capacity.nvidia\.com/gpu,INSTANCE:.metadata.labels.node\.kubernetes\.io/instance-type,TAINTS:.spec.taints[*].key,READY:.status.conditions[?(@.type=="Ready")].status'
example=examples/01-draft-target-llama70b-8b-h100.yaml
echo
echo "== CRDs (generated from the pydantic models):"
k apply --server-side --force-conflicts -f crds/
k wait --for=condition=Established --timeout=60s crd/speculativedeployments.specdeploy.dev crd/enginebuilds.specdeploy.dev
echo
echo "== $example: offline validation, then admission by the apiserver (server-side dry run):"
.venv/bin/specdeploy validate -f "$example"
k apply --server-side --dry-run=server -f "$example"
echo
echo "NOTE: the operator (SpeculativeDeployment -> engine builds -> GPU pods) is not implemented yet;"
echo "      this demo will apply an example and follow it to Ready once it lands."
echo "      Stop the cluster with: make cluster-down"
