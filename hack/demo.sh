#!/usr/bin/env bash
# `make demo`: the main job on the local simulated GPU cluster (started by `make cluster-up` first).
#
# For now (foundation issue) it shows the simulated GPU node pools the operator will deploy onto.
# The operator itself, and with it an example SpeculativeDeployment reaching Ready, lands with the operator
# issue; until then this is a placeholder that says so.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.cluster}"
bin="$(hack/cluster/build.sh)"
k() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
echo "== local control plane: $(k version -o json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
echo "== simulated node pools (kwok fake nodes; no real GPUs, no real containers):"
k get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,node.kubernetes.io/instance-type \
  -o custom-columns='NAME:.metadata.name,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.capacity.nvidia\.com/gpu,INSTANCE:.metadata.labels.node\.kubernetes\.io/instance-type,TAINTS:.spec.taints[*].key,READY:.status.conditions[?(@.type=="Ready")].status'
echo
echo "NOTE: the operator (SpeculativeDeployment -> engine builds -> GPU pods) is not implemented yet;"
echo "      this demo will apply an example and follow it to Ready once it lands."
echo "      Stop the cluster with: make cluster-down"
