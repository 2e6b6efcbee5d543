#!/usr/bin/env bash
# Build (or find in the cache) every binary the local cluster needs, from published Go modules:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (one multi-call binary, k8s.io/kubernetes)
#   etcd (go.etcd.io/etcd/server/v3), kwok (sigs.k8s.io/kwok), helm (helm.sh/helm/v3)
#   prometheus (github.com/prometheus/prometheus, Kubernetes service discovery only),
#   prometheus-adapter (sigs.k8s.io/prometheus-adapter), cluster-autoscaler (k8s.io/autoscaler, -tags kwok)
# Binaries land in ${SPECDEPLOY_CACHE:-~/.cache/specdeploy}/bin/<key>/, key = hash of the pinned versions,
# the wrapper modules and the Go toolchain. A warm start builds nothing. Prints the bin directory on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}"
key="$( { cat "$here/versions.env" "$here"/gomod/*/go.mod "$here"/gomod/*/go.sum "$here"/gomod/*/main.go; go version; } \
        | sha256sum | cut -c1-16)"
bin="$cache/bin/$key"
# KEDA's CRDs (its Go module ships them): the ScaledObject schema the tests validate against and install. Fetched
# here, with everything else this project downloads, so that no test reaches the module proxy. Not part of the key.
KEDA_VERSION="${KEDA_VERSION:-v2.18.1}"
# Caches made before helm got its release ldflags, or before kwok's CRDs were kept, complete those alone.
if [[ -f "$bin/.complete" && -f "$bin/.helm-release-ldflags" && -f "$bin/kwok-crds/.complete" ]] \
  && [[ "$(cat "$bin/keda-crds/.complete" 2>/dev/null)" == "$KEDA_VERSION" ]]; then
  echo "$bin"
  exit 0
fi
log() { printf '[build] %s\n' "$*" >&2; }
mkdir -p "$bin"
# One build per cache key at a time (two checkouts, or a test that calls this while `make` does).
exec 9>"$bin.lock"
flock 9
if [[ -f "$bin/.complete" && -f "$bin/.helm-release-ldflags" && -f "$bin/kwok-crds/.complete" ]] \
  && [[ "$(cat "$bin/keda-crds/.complete" 2>/dev/null)" == "$KEDA_VERSION" ]]; then
  echo "$bin"
  exit 0
fi
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
start=$SECONDS
k8s_major="${K8S_VERSION#v}"; k8s_major="${k8s_major%%.*}"
k8s_minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
vpkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
ldflags="-s -w"
for p in "${vpkgs[@]}"; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$k8s_major -X $p.gitMinor=$k8s_minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

if [[ ! -x "$bin/k8s" ]]; then
  log "kube-apiserver/controller-manager/scheduler/kubectl $K8S_VERSION (slow on a cold cache)"
  (cd "$here/gomod/k8s" && go build -trimpath -ldflags "$ldflags" -o "$bin/k8s.tmp" . && mv "$bin/k8s.tmp" "$bin/k8s")
fi
for name in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  ln -sf k8s "$bin/$name"
done
if [[ ! -x "$bin/etcd" ]]; then
  log "etcd $ETCD_VERSION"
  (cd "$here/gomod/etcd" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" . && mv "$bin/etcd.tmp" "$bin/etcd")
fi
if [[ ! -x "$bin/kwok" ]]; then
  log "kwok $KWOK_VERSION"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
# kwok serves logs/exec/port-forward rules from its CRDs (`--enable-crds`) but does not install them: take the
# CRDs the pod runner uses from the same module version (the module cache, where `go install` put it).
if [[ ! -f "$bin/kwok-crds/.complete" ]]; then
  kwok_src="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  mkdir -p "$bin/kwok-crds"
  for kind in logs execs portforwards; do
    cp "$kwok_src/kustomize/crd/bases/kwok.x-k8s.io_$kind.yaml" "$bin/kwok-crds/"
  done
  touch "$bin/kwok-crds/.complete"
fi
# helm as helm's release build makes it: besides its own version, the Kubernetes version it assumes when no
# cluster is asked (`helm template`, `helm lint`, the chart's `kubeVersion` check) is that of the client-go it
# is built with; without these ldflags it would claim v1.20. The marker rebuilds a helm cached without them.
if [[ ! -x "$bin/helm" || ! -f "$bin/.helm-release-ldflags" ]]; then
  log "helm $HELM_VERSION"
  helm_gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" { print $2 }' "$helm_gomod")"
  [[ "$client_go" =~ ^v0\.([0-9]+)\. ]] || { log "no k8s.io/client-go version in $helm_gomod"; exit 1; }
  helm_k8s_minor="${BASH_REMATCH[1]}"
  helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    helm_ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$helm_k8s_minor"
  done
  GOBIN="$bin" go install -trimpath -ldflags "$helm_ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  echo "1.$helm_k8s_minor" > "$bin/.helm-release-ldflags"
fi
# A main package of another module is built as a tool of a wrapper module that pins it (gomod/<name>).
require_pin() { # wrapper-dir module version
  grep -Eq "^(require )?[[:space:]]*$2 $3( // indirect)?\$" "$here/gomod/$1/go.mod" \
    || { log "gomod/$1/go.mod does not require $2 $3"; exit 1; }
}
if [[ ! -x "$bin/prometheus" ]]; then
  log "prometheus $PROMETHEUS_VERSION (Kubernetes service discovery only)"
  require_pin prometheus github.com/prometheus/prometheus "$PROMETHEUS_VERSION"
  prom_release="3.${PROMETHEUS_VERSION#v0.3}"
  (cd "$here/gomod/prometheus" \
    && go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
         -ldflags "-s -w -X github.com/prometheus/common/version.Version=$prom_release" \
         -o "$bin/prometheus.tmp" github.com/prometheus/prometheus/cmd/prometheus \
    && mv "$bin/prometheus.tmp" "$bin/prometheus")
fi
if [[ ! -x "$bin/prometheus-adapter" ]]; then
  log "prometheus-adapter $PROMETHEUS_ADAPTER_VERSION"
  require_pin prometheus-adapter sigs.k8s.io/prometheus-adapter "$PROMETHEUS_ADAPTER_VERSION"
  (cd "$here/gomod/prometheus-adapter" \
    && go build -trimpath -ldflags "-s -w" -o "$bin/prometheus-adapter.tmp" sigs.k8s.io/prometheus-adapter/cmd/adapter \
    && mv "$bin/prometheus-adapter.tmp" "$bin/prometheus-adapter")
fi
if [[ ! -x "$bin/cluster-autoscaler" ]]; then
  log "cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION with the kwok cloud provider (slow on a cold cache)"
  for pin in "cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION" "cluster-autoscaler/apis $CLUSTER_AUTOSCALER_APIS_VERSION"; do
    grep -Eq "k8s.io/autoscaler/$pin( // indirect)?\$" "$here/gomod/cluster-autoscaler/go.mod" \
      || { log "gomod/cluster-autoscaler/go.mod does not require k8s.io/autoscaler/$pin"; exit 1; }
  done
  # The module's main package is built as a tool of the wrapper module (a main package cannot be imported).
  (cd "$here/gomod/cluster-autoscaler" \
    && go build -trimpath -tags kwok -ldflags "-s -w" -o "$bin/cluster-autoscaler.tmp" k8s.io/autoscaler/cluster-autoscaler \
    && mv "$bin/cluster-autoscaler.tmp" "$bin/cluster-autoscaler")
fi
if [[ "$(cat "$bin/keda-crds/.complete" 2>/dev/null)" != "$KEDA_VERSION" ]]; then
  log "KEDA $KEDA_VERSION CRDs"
  keda_src="$(go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -f "$keda_src/config/crd/bases/keda.sh_scaledobjects.yaml" ]] || { log "no KEDA CRDs in $keda_src"; exit 1; }
  rm -rf "$bin/keda-crds" && mkdir -p "$bin/keda-crds"
  cp "$keda_src"/config/crd/bases/*.yaml "$bin/keda-crds/"
  echo "$KEDA_VERSION" > "$bin/keda-crds/.complete"
fi
log "built in $((SECONDS - start))s into $bin"
touch "$bin/.complete"
echo "$bin"
