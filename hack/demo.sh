#!/usr/bin/env bash
# `make demo`: the main job on the local simulated GPU cluster (started by `make cluster-up` first).
#
# Installs the CRDs, starts the operator (python -m specdeploy_operator, in the background, its own identity),
# applies examples/01 and follows it: EngineBuilds -> build Jobs -> GPU pods -> Ready, then prints the
# engines, pods, endpoint and events. Then it serves for real: a Job makes the demo's tiny models in the
# cluster, examples/09 (backend transformers on the CPU pool) goes Ready once its real server is ready, and
# the official openai client sends a completion and a streamed chat through `kubectl port-forward`.
# What is simulated: the GPU nodes (kwok) and the GPU pods' containers (kwok marks build pods Succeeded after
# 2 s and serving pods Ready). Real: the control plane, the operator, storage (dynamic provisioning), and the
# CPU pods, which the local cluster's pod runner runs as local processes (docs/local-cluster.md).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.cluster}"
example="${2:-examples/01-draft-target-llama70b-8b-h100.yaml}"
namespace="${DEMO_NAMESPACE:-demo}"
bin="$(hack/cluster/build.sh core)"
k() { "$bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
py=.venv/bin/python

# follow NAME TIMEOUT JSONPATH: print the deployment's status line whenever it changes, until Ready.
follow() {
  local last="" line start=$SECONDS
  while true; do
    line="$(k get sdep "$1" -n "$namespace" -o jsonpath="$3" 2>/dev/null || true)"
    if [ "$line" != "$last" ]; then printf '   %3ss  %s\n' "$((SECONDS - start))" "$line"; last="$line"; fi
    case "$line" in Ready*) return ;; Failed*) echo "FAILED"; k describe sdep "$1" -n "$namespace"; exit 1 ;; esac
    if [ $((SECONDS - start)) -gt "$2" ]; then echo "timed out"; k describe sdep "$1" -n "$namespace"; exit 1; fi
    sleep 0.5
  done
}

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
free_port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The ports are free when picked, but another process may take one before the operator binds it: then the
# operator says "address already in use" (and never turns healthy), and it is started again on new ports.
touch "$dir/logs/operator.log"
for attempt in 1 2 3; do
  health_port="$(free_port)"
  metrics_port="$(free_port)"
  log_start=$(($(wc -c <"$dir/logs/operator.log") + 1))
  # status.speculation from 5 s windows (the default is 30 s), so the demo shows it within seconds.
  SPECDEPLOY_SPECULATION_INTERVAL_SECONDS=5 setsid $py -m specdeploy_operator --kubeconfig "$dir/kubeconfigs/operator.kubeconfig" \
    --health-port "$health_port" --metrics-port "$metrics_port" >>"$dir/logs/operator.log" 2>&1 &
  echo $! >"$dir/pids/operator"
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$health_port/healthz" >/dev/null 2>&1 && break
    tail -c "+$log_start" "$dir/logs/operator.log" | grep -q 'address already in use' && break
    sleep 0.2
  done
  curl -sf "http://127.0.0.1:$health_port/healthz" >/dev/null 2>&1 && break
  kill "$(cat "$dir/pids/operator")" 2>/dev/null || true
  tail -c "+$log_start" "$dir/logs/operator.log" | grep -q 'address already in use' || break
  echo "   a port was taken before the operator bound it (attempt $attempt); starting it again on new ports"
  sleep 1
done
curl -sf "http://127.0.0.1:$health_port/healthz" >/dev/null || { tail -20 "$dir/logs/operator.log"; exit 1; }
echo "   running (pid $(cat "$dir/pids/operator"), metrics http://127.0.0.1:$metrics_port/metrics)"

echo
echo "== namespace $namespace (its engine-cache claim is provisioned dynamically), and $example"
k create namespace "$namespace" --dry-run=client -o yaml | k apply -f - >/dev/null
.venv/bin/specdeploy validate -f "$example"
name="$(k apply --server-side -n "$namespace" -f "$example" -o jsonpath='{.metadata.name}')"
echo "   applied speculativedeployment/$name"

echo
echo "== following $name (phase, ready, engines)"
follow "$name" 180 '{.status.phase} {.status.readyText} target={.status.engines.target.phase} draft={.status.engines.draft.phase}'

echo
k get sdep -n "$namespace" -o wide
echo
k get enginebuilds,jobs -n "$namespace"
echo
pods_table() {
  # GPUS: the pod's effective request, as the scheduler counts it: max(any init container, sum of containers).
  k get pods -n "$namespace" -o json | $py hack/demo_pods.py
}
pods_table
echo
echo "== endpoint: $(k get sdep "$name" -n "$namespace" -o jsonpath='{.status.endpoint}')"
echo "== events:"
k get events -n "$namespace" --field-selector source=specdeploy-operator --sort-by=.lastTimestamp \
  -o custom-columns='OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message' | cut -c1-150
echo
echo "== served for real: the demo's models, made in the cluster (hack/demo-models.yaml: a claim and a Job)"
k apply -n "$namespace" -f hack/demo-models.yaml >/dev/null
if ! k wait -n "$namespace" --for=condition=complete job/demo-models --timeout=600s >/dev/null; then
  k logs -n "$namespace" job/demo-models --tail=30 || true
  exit 1
fi
k logs -n "$namespace" job/demo-models --tail=1 | cut -c1-300 | sed 's/^/   /'
cpu_example=examples/09-transformers-cpu-tiny.yaml
.venv/bin/specdeploy validate -f "$cpu_example"
cpu="$(k apply --server-side -n "$namespace" -f "$cpu_example" -o jsonpath='{.metadata.name}')"
echo "   applied speculativedeployment/$cpu ($cpu_example: backend transformers on the CPU pool)"
follow "$cpu" 300 '{.status.phase} {.status.readyText}'
echo
pods_table
echo
echo "== kubectl port-forward -n $namespace svc/$cpu :8000 (it picks a free local port), then the official openai client"
k port-forward -n "$namespace" "svc/$cpu" ":8000" >"$dir/logs/demo-port-forward.log" 2>&1 &
forward=$!
trap 'kill $forward 2>/dev/null || true' EXIT
port=""
for _ in $(seq 1 100); do
  port="$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) -> 8000$/\1/p' "$dir/logs/demo-port-forward.log" | head -n 1)"
  [ -n "$port" ] && break
  sleep 0.2
done
[ -n "$port" ] || { cat "$dir/logs/demo-port-forward.log"; exit 1; }
echo "   forwarding 127.0.0.1:$port -> 8000"
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break
  sleep 0.2
done
$py hack/demo_client.py "http://127.0.0.1:$port"
echo
body='{"model": "target", "prompt": "Speculative decoding", "max_tokens": 24, "temperature": 0}'
echo "== the same completion with curl:"
echo "   curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d '$body'"
curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' -d "$body" | cut -c1-400 | sed 's/^/   /'
echo
echo "== kubectl logs -n $namespace deploy/$cpu (the server's lines for these requests):"
k logs -n "$namespace" "deploy/$cpu" --tail=200 | grep -E '/v1/|serving' | tail -n 8 | cut -c1-200 | sed 's/^/   /'
echo
echo "== does speculation pay? 15 s of traffic, then the operator's figures from the servers' own counters"
end=$((SECONDS + 15))
while [ $SECONDS -lt $end ]; do
  curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "target", "prompt": "The operator", "max_tokens": 32}' >/dev/null
done
for _ in $(seq 1 60); do
  [ -n "$(k get sdep "$cpu" -n "$namespace" -o jsonpath='{.status.speculation.acceptanceRate}')" ] && break
  sleep 0.5
done
k get sdep "$cpu" -n "$namespace"
k get sdep "$cpu" -n "$namespace" -o jsonpath='{.status.speculation}' | $py -m json.tool | sed 's/^/   /'
k get sdep "$cpu" -n "$namespace" \
  -o jsonpath='{range .status.conditions[?(@.type=="SpeculationEffective")]}   {.type}={.status} {.reason}: {.message}{"\n"}{end}'
kill $forward 2>/dev/null || true
echo
echo "Simulated: GPU nodes and the GPU pods' containers (kwok). Real: the control plane, the operator, storage,"
echo "and the CPU pods ($cpu, the model Job), which the pod runner runs as local processes."
echo "The operator keeps running (pid $(cat "$dir/pids/operator")); try: kubectl --kubeconfig $dir/kubeconfig scale sdep/$name -n $namespace --replicas=3"
echo "Stop everything with: make cluster-down"
