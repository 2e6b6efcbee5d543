#!/usr/bin/env bash
# `make demo`: the main job on the local simulated GPU cluster (started by `make cluster-up` first).
#
# Installs the CRDs, starts the operator (python -m specdeploy_operator, in the background, its own identity),
# applies examples/01 and follows it: EngineBuilds -> build Jobs -> GPU pods -> Ready, then prints the
# engines, pods, endpoint and events. What is simulated: the GPU nodes (kwok), the containers (kwok marks build
# pods Succeeded after 2 s and serving pods Ready), and the storage (a hostPath volume per claim). The control
# plane (etcd, kube-apiserver, controller-manager, scheduler) and the operator are real.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.cluster}"
example="${2:-examples/01-draft-target-llama70b-8b-h100.yaml}"
namespace="${DEMO_NAMESPACE:-demo}"
bin="$(hack/cluster/build.sh)"
k() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
py=.venv/bin/python

echo "== local control plane: $(k version -o json | $py -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
echo "== simulated node pools (kwok fake nodes; no real GPUs, no real containers):"
k get nodes -o custom-columns='NAME:.metadata.name,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.capacity.nvidia\.com/gpu,TAINTS:.spec.taints[*].key,READY:.status.conditions[?(@.type=="Ready")].status'

echo
echo "== CRDs (generated from the pydantic models)"
k apply --server-side --force-conflicts -f crds/ >/dev/null
k wait --for=condition=Established --timeout=60s crd/speculativedeployments.specdeploy.dev crd/enginebuilds.specdeploy.dev

echo
echo "== operator: python -m specdeploy_operator (log: $dir/logs/operator.log)"
if [ -f "$dir/pids/operator" ] && kill -0 "$(cat "$dir/pids/operator")" 2>/dev/null; then
  kill "$(cat "$dir/pids/operator")"; sleep 1
fi
health_port="$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
metrics_port="$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
setsid $py -m specdeploy_operator --kubeconfig "$dir/kubeconfigs/operator.kubeconfig" \
  --health-port "$health_port" --metrics-port "$metrics_port" >>"$dir/logs/operator.log" 2>&1 &
echo $! >"$dir/pids/operator"
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$health_port/healthz" >/dev/null 2>&1 && break; sleep 0.2
done
curl -sf "http://127.0.0.1:$health_port/healthz" >/dev/null || { tail -20 "$dir/logs/operator.log"; exit 1; }
echo "   running (pid $(cat "$dir/pids/operator"), metrics http://127.0.0.1:$metrics_port/metrics)"

echo
echo "== namespace $namespace, its engine-cache volume (simulated storage), and $example"
k create namespace "$namespace" --dry-run=client -o yaml | k apply -f - >/dev/null
$py - "$dir" "$namespace" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "hack/cluster")
from localcluster import LocalCluster
print("   volume", LocalCluster(Path(sys.argv[1])).provide_volume(sys.argv[2], "specdeploy-engine-cache"))
EOF
.venv/bin/specdeploy validate -f "$example"
name="$(k apply --server-side -n "$namespace" -f "$example" -o jsonpath='{.metadata.name}')"
echo "   applied speculativedeployment/$name"

echo
echo "== following $name (phase, ready, engines)"
last=""
start=$SECONDS
while true; do
  line="$(k get sdep "$name" -n "$namespace" -o jsonpath='{.status.phase} {.status.readyText} target={.status.engines.target.phase} draft={.status.engines.draft.phase}' 2>/dev/null || true)"
  if [ "$line" != "$last" ]; then printf '   %3ss  %s\n' "$((SECONDS - start))" "$line"; last="$line"; fi
  case "$line" in Ready*) break ;; Failed*) echo "FAILED"; k describe sdep "$name" -n "$namespace"; exit 1 ;; esac
  if [ $((SECONDS - start)) -gt 180 ]; then echo "timed out"; k describe sdep "$name" -n "$namespace"; exit 1; fi
  sleep 0.5
done

echo
k get sdep -n "$namespace" -o wide
echo
k get enginebuilds,jobs -n "$namespace"
echo
k get pods -n "$namespace" -o custom-columns='POD:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName,GPUS:.spec.containers[0].resources.requests.nvidia\.com/gpu'
echo
echo "== endpoint: $(k get sdep "$name" -n "$namespace" -o jsonpath='{.status.endpoint}')"
echo "== events:"
k get events -n "$namespace" --field-selector source=specdeploy-operator --sort-by=.lastTimestamp \
  -o custom-columns='OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message' | cut -c1-150
echo
echo "Simulated: GPU nodes and containers (kwok), storage (hostPath volumes); real: the control plane and the operator."
echo "The operator keeps running (pid $(cat "$dir/pids/operator")); try: kubectl --kubeconfig $dir/kubeconfig scale sdep/$name -n $namespace --replicas=3"
echo "Stop everything with: make cluster-down"
