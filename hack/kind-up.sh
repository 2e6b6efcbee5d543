#!/usr/bin/env bash
# For users who DO have Docker: a kind cluster with the same simulated GPU node pools, then the same tests.
#
#   hack/kind-up.sh                      # creates kind cluster "specdeploy", fake GPU nodes, starts kwok
#   USE_EXISTING_CLUSTER=1 KUBECONFIG=.cluster-kind/kubeconfig make test
#   hack/kind-up.sh down                 # stops kwok and deletes the kind cluster
#
# kind runs the real control plane in a container; kwok (our build, with our Stages) runs here as a local
# process and plays the kubelet of the fake GPU nodes, exactly as in the Docker-free local cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
name="${KIND_CLUSTER_NAME:-specdeploy}"
state=.cluster-kind
py=.venv/bin/python
make venv >/dev/null  # also brings an older virtualenv up to date (the harness package)
bin="$(hack/cluster/build.sh)"
mkdir -p "$state"

if [[ "${1:-up}" == "down" ]]; then
  if [[ -f $state/kwok.pid ]]; then kill "$(cat $state/kwok.pid)" 2>/dev/null || true; rm -f $state/kwok.pid; fi
  kind delete cluster --name "$name"
  exit 0
fi

command -v kind >/dev/null || { echo "kind is not installed (https://kind.sigs.k8s.io)" >&2; exit 1; }
kind get clusters | grep -qx "$name" || kind create cluster --name "$name" --wait 120s
kind get kubeconfig --name "$name" > "$state/kubeconfig"
export KUBECONFIG="$PWD/$state/kubeconfig"
$py -m specdeploy_localcluster manifests --nodepools "${NODEPOOLS:-hack/cluster/nodepools.yaml}" \
  | "$bin/kubectl" apply --server-side -f -
$py -m specdeploy_localcluster kwok-config > "$state/kwok-stages.yaml"
if [[ ! -f $state/kwok.pid ]] || ! kill -0 "$(cat $state/kwok.pid)" 2>/dev/null; then
  nohup "$bin/kwok" --kubeconfig="$KUBECONFIG" --config="$state/kwok-stages.yaml" \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake --node-lease-duration-seconds=40 \
    --cidr=10.244.0.0/16 --node-ip=10.250.0.1 > "$state/kwok.log" 2>&1 &
  echo $! > "$state/kwok.pid"
fi
"$bin/kubectl" wait --for=condition=Ready node -l type=kwok --timeout=120s
"$bin/kubectl" get nodes -o wide
echo
echo "export KUBECONFIG=$KUBECONFIG USE_EXISTING_CLUSTER=1"
