#!/usr/bin/env bash
# Build (or find in the cache) every binary the local cluster needs, from published Go modules:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (one multi-call binary, k8s.io/kubernetes)
#   etcd (go.etcd.io/etcd/server/v3), kwok (sigs.k8s.io/kwok), helm (helm.sh/helm/v3)
#   prometheus (github.com/prometheus/prometheus, Kubernetes service discovery only),
#   prometheus-adapter (sigs.k8s.io/prometheus-adapter), cluster-autoscaler (k8s.io/autoscaler, -tags kwok)
#   lws-controller (sigs.k8s.io/lws), under a key of its own: bin/lws-<key>/, linked as bin/<key>/lws
#   promtool (cmd/promtool of the same Prometheus module version), under a key of its own: bin/promtool-<key>/,
#   linked as bin/<key>/promtool
# Binaries land in ${SPECDEPLOY_CACHE:-~/.cache/specdeploy}/bin/<key>/, key = hash of the pinned versions,
# the wrapper modules and the Go toolchain. A warm start builds nothing. Prints the bin directory on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}"
# The LeaderWorkerSet controller is keyed on its own (bin/lws-<key>/, from the versions.env lines after the
# "Keyed on their own" line, and gomod/lws): pinning or bumping it rebuilds it alone, not the other binaries.
own_key_marker='^# --- Keyed on their own'
main_versions() { sed "/$own_key_marker/,\$d" "$here/versions.env"; }
main_wrappers=()
for d in "$here"/gomod/*/; do [[ "$(basename "$d")" =~ ^(lws|promtool)$ ]] || main_wrappers+=("${d%/}"); done
key="$( { main_versions; for f in go.mod go.sum main.go; do for d in "${main_wrappers[@]}"; do
          [[ -f "$d/$f" ]] && cat "$d/$f"; done; done; go version; } | sha256sum | cut -c1-16)"
bin="$cache/bin/$key"
lws_key="$( { sed -n "/$own_key_marker/,\$p" "$here/versions.env"; cat "$here/gomod/lws/go.mod" "$here/gomod/lws/go.sum"
              go version; } | sha256sum | cut -c1-16)"
lws_bin="$cache/bin/lws-$lws_key"
# promtool is keyed on its own too (the PROMETHEUS_VERSION line, gomod/promtool, the Go version): adding or
# rebuilding it leaves the other binaries' key alone.
promtool_key="$( { grep '^PROMETHEUS_VERSION=' "$here/versions.env"; cat "$here/gomod/promtool/go.mod" "$here/gomod/promtool/go.sum"
                   go version; } | sha256sum | cut -c1-16)"
promtool_bin="$cache/bin/promtool-$promtool_key"
# KEDA's CRDs (its Go module ships them): the ScaledObject schema the tests validate against and install. Fetched
# here, with everything else this project downloads, so that no test reaches the module proxy. Not part of the key.
KEDA_VERSION="${KEDA_VERSION:-v2.18.1}"
log() { printf '[build] %s\n' "$*" >&2; }
# The LeaderWorkerSet controller (sigs.k8s.io/lws cmd, a tool of gomod/lws) with what the harness installs from
# the same module version: its CRDs, its ClusterRole and its webhook configurations (the harness points them
# at the controller on loopback). One build per key at a time, like the main one below.
if [[ ! -f "$lws_bin/.complete" ]]; then
  mkdir -p "$lws_bin"
  (
    exec 8>"$lws_bin.lock"
    flock 8
    [[ -f "$lws_bin/.complete" ]] && exit 0
    export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
    lws_start=$SECONDS
    grep -Eq "^(require )?[[:space:]]*sigs.k8s.io/lws $LWS_VERSION( // indirect)?\$" "$here/gomod/lws/go.mod" \
      || { log "gomod/lws/go.mod does not require sigs.k8s.io/lws $LWS_VERSION"; exit 1; }
    lws_info="$(go mod download -json "sigs.k8s.io/lws@$LWS_VERSION")"
    lws_src="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$lws_info")"
    lws_commit="$(sed -n 's/^[[:space:]]*"Hash": "\(.*\)",\{0,1\}$/\1/p' <<<"$lws_info")"
    log "lws $LWS_VERSION (LeaderWorkerSet controller)"
    lws_ldflags="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION"
    lws_ldflags+=" -X sigs.k8s.io/lws/pkg/version.GitCommit=${lws_commit:-unknown}"
    (cd "$here/gomod/lws" \
      && go build -trimpath -ldflags "$lws_ldflags" -o "$lws_bin/lws-controller.tmp" sigs.k8s.io/lws/cmd \
      && mv "$lws_bin/lws-controller.tmp" "$lws_bin/lws-controller")
    rm -rf "$lws_bin/crds" "$lws_bin/rbac" "$lws_bin/webhook" && mkdir -p "$lws_bin/crds" "$lws_bin/rbac" "$lws_bin/webhook"
    cp "$lws_src"/config/crd/bases/*.yaml "$lws_bin/crds/"
    cp "$lws_src/config/rbac/role.yaml" "$lws_bin/rbac/"
    cp "$lws_src"/config/webhook/{manifests,mutating-patch,validating-patch}.yaml "$lws_bin/webhook/"
    [[ -f "$lws_bin/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml" ]] || { log "no LWS CRD in $lws_src"; exit 1; }
    chmod -R u+w "$lws_bin"
    log "lws built in $((SECONDS - lws_start))s into $lws_bin"
    echo "$LWS_VERSION" > "$lws_bin/.complete"
  )
fi
# promtool from the Prometheus module version the local cluster's Prometheus is built from (the same pin, the
# same build tags): `promtool check rules` and `promtool test rules` on the chart's alerting rules.
if [[ ! -x "$promtool_bin/promtool" ]]; then
  mkdir -p "$promtool_bin"
  (
    exec 7>"$promtool_bin.lock"
    flock 7
    [[ -x "$promtool_bin/promtool" ]] && exit 0
    export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
    promtool_start=$SECONDS
    grep -Eq "^(require )?[[:space:]]*github.com/prometheus/prometheus $PROMETHEUS_VERSION( // indirect)?\$" \
      "$here/gomod/promtool/go.mod" \
      || { log "gomod/promtool/go.mod does not require github.com/prometheus/prometheus $PROMETHEUS_VERSION"; exit 1; }
    log "promtool $PROMETHEUS_VERSION"
    (cd "$here/gomod/promtool" \
      && go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
           -ldflags "-s -w -X github.com/prometheus/common/version.Version=3.${PROMETHEUS_VERSION#v0.3}" \
           -o "$promtool_bin/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool \
      && mv "$promtool_bin/promtool.tmp" "$promtool_bin/promtool")
    log "promtool built in $((SECONDS - promtool_start))s into $promtool_bin"
  )
fi
# The main bin directory names the LeaderWorkerSet and promtool builds it goes with (relative links: the cache
# can move).
link_lws() {
  [[ "$(readlink "$bin/lws" 2>/dev/null)" == "../lws-$lws_key" ]] || ln -sfn "../lws-$lws_key" "$bin/lws"
  [[ "$(readlink "$bin/promtool" 2>/dev/null)" == "../promtool-$promtool_key/promtool" ]] \
    || ln -sfn "../promtool-$promtool_key/promtool" "$bin/promtool"
}
# Caches made before helm got its release ldflags, or before kwok's CRDs were kept, complete those alone.
if [[ -f "$bin/.complete" && -f "$bin/.helm-release-ldflags" && -f "$bin/kwok-crds/.complete" ]] \
  && [[ "$(cat "$bin/keda-crds/.complete" 2>/dev/null)" == "$KEDA_VERSION" ]]; then
  link_lws
  echo "$bin"
  exit 0
fi
mkdir -p "$bin"
# One build per cache key at a time (two checkouts, or a test that calls this while `make` does).
exec 9>"$bin.lock"
flock 9
if [[ -f "$bin/.complete" && -f "$bin/.helm-release-ldflags" && -f "$bin/kwok-crds/.complete" ]] \
  && [[ "$(cat "$bin/keda-crds/.complete" 2>/dev/null)" == "$KEDA_VERSION" ]]; then
  link_lws
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
link_lws
echo "$bin"
