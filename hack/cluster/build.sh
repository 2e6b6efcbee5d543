#!/usr/bin/env bash
# Build (or find in the cache) the binaries of the local cluster and the tools of the tests, from published Go
# modules, and print their directory:
#
#   hack/cluster/build.sh [core|autoscaling|cluster|promtool|keda-crds|all]...   (no argument: all)
#   hack/cluster/build.sh --units [what]...                     (the units that is, one a line; builds nothing)
#
# core: the control plane and its agents (`make demo`'s cluster):
#   k8s        kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (one multi-call binary of
#              k8s.io/kubernetes) and helm (with its release ldflags): one go build of gomod/k8s
#   etcd       go.etcd.io/etcd/server/v3 (gomod/etcd)
#   kwok-lws   kwok and the LeaderWorkerSet controller (sigs.k8s.io/lws) of gomod/addons, with kwok's
#              Logs/Exec/PortForward CRDs and LWS's CRDs, ClusterRole and webhook configurations
# autoscaling: the metrics stack and the Cluster Autoscaler (`make cluster-up` runs them unless AUTOSCALING=0):
#   prometheus (Kubernetes service discovery only, of gomod/addons), prometheus-adapter (gomod/prometheus-adapter),
#   cluster-autoscaler (gomod/cluster-autoscaler, -tags kwok)
# cluster: core and autoscaling. promtool (of gomod/addons) and keda-crds (KEDA's CRDs from its Go module) only
# the tests use. all: every one.
#
# Binaries land in ${SPECDEPLOY_CACHE:-~/.cache/specdeploy}/bin/<key>/, key = hash of the pinned versions, the
# wrapper modules and the Go toolchain; a warm start builds nothing. gomod/addons' units that are missing build
# in one go build (unit `addons`), so that what they share compiles once (the Go build cache shares it with a
# later one). Two builds run at a time (one `go build` keeps both cores busy only while it compiles, not while
# it downloads or links); each logs "[build] <unit> <version>" when it starts and "[build] <unit> built in
# <N>s" when it is done. Debug information is neither generated nor kept (-gcflags=all=-dwarf=false, -s -w).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
KEDA_VERSION="${KEDA_VERSION:-v2.18.1}"  # not part of the key: its CRDs are copied, not built
cache="${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}"
key="$( { cat "$here/versions.env"; for d in "$here"/gomod/*/; do for f in go.mod go.sum main.go; do
          [[ -f "$d/$f" ]] && cat "$d/$f"; done; done; go version; } | sha256sum | cut -c1-16)"
bin="$cache/bin/$key"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
GCFLAGS="-gcflags=all=-dwarf=false"
log() { printf '[build] %s\n' "$*" >&2; }

# -- what each unit leaves in $bin once it is built --------------------------------------------------------
built() {
  case "$1" in
    k8s) [[ -x "$bin/k8s" && -x "$bin/helm" && -f "$bin/.helm-release-ldflags" ]] ;;
    kwok-lws) [[ -x "$bin/kwok" && -f "$bin/lws/.complete" && -f "$bin/kwok-crds/.complete" ]] ;;
    etcd | prometheus | promtool | prometheus-adapter | cluster-autoscaler) [[ -x "$bin/$1" ]] ;;
    keda-crds) [[ "$(cat "$bin/keda-crds/.complete" 2>/dev/null)" == "$KEDA_VERSION" ]] ;;
    *) log "unknown unit $1"; return 2 ;;
  esac
}

# A main package of another module is built as a tool of a wrapper module that pins it (gomod/<name>).
require_pin() { # wrapper-dir module version
  grep -Eq "^(require )?[[:space:]]*$2 $3( // indirect)?\$" "$here/gomod/$1/go.mod" \
    || { log "gomod/$1/go.mod does not require $2 $3"; exit 1; }
}
module_dir() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }

# -- the units ---------------------------------------------------------------------------------------------
# helm is built as helm's release build makes it: besides its own version, the Kubernetes version it assumes
# when no cluster is asked (`helm template`, `helm lint`, the chart's `kubeVersion` check) is that of the
# client-go its release requires; without these ldflags it would claim v1.20.
build_k8s() {
  require_pin k8s helm.sh/helm/v3 "$HELM_VERSION"
  local major="${K8S_VERSION#v}" minor ldflags="-s -w" p helm_gomod client_go helm_minor
  major="${major%%.*}"; minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  helm_gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" { print $2 }' "$helm_gomod")"
  [[ "$client_go" =~ ^v0\.([0-9]+)\. ]] || { log "no k8s.io/client-go version in $helm_gomod"; exit 1; }
  helm_minor="${BASH_REMATCH[1]}"
  ldflags+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$helm_minor"
  done
  rm -rf "$bin/k8s.tmp" && mkdir -p "$bin/k8s.tmp"
  (cd "$here/gomod/k8s" && go build -trimpath "$GCFLAGS" -ldflags "$ldflags" -o "$bin/k8s.tmp/" . helm.sh/helm/v3/cmd/helm)
  mv "$bin/k8s.tmp/helm" "$bin/helm"
  mv "$bin/k8s.tmp/k8s" "$bin/k8s"
  rmdir "$bin/k8s.tmp"
  local name
  for name in kube-apiserver kube-controller-manager kube-scheduler kubectl; do ln -sf k8s "$bin/$name"; done
  echo "1.$helm_minor" > "$bin/.helm-release-ldflags"
}

# kwok-lws, prometheus and promtool, those of them in $ADDONS: one go build of gomod/addons.
build_addons() {
  local units=" $ADDONS " tools=() out="$bin/addons.tmp" lws_commit lws_src kwok_src
  local ldflags="-s -w -X github.com/prometheus/common/version.Version=3.${PROMETHEUS_VERSION#v0.3}"
  if [[ "$units" == *" kwok-lws "* ]]; then
    require_pin addons sigs.k8s.io/kwok "$KWOK_VERSION"
    require_pin addons sigs.k8s.io/lws "$LWS_VERSION"
    lws_commit="$(go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" | sed -n 's/^[[:space:]]*"Hash": "\(.*\)",\{0,1\}$/\1/p')"
    ldflags+=" -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION"
    ldflags+=" -X sigs.k8s.io/lws/pkg/version.GitCommit=${lws_commit:-unknown}"
    tools+=(sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/lws/cmd)
  fi
  [[ "$units" == *" prometheus "* || "$units" == *" promtool "* ]] \
    && require_pin addons github.com/prometheus/prometheus "$PROMETHEUS_VERSION"
  [[ "$units" == *" prometheus "* ]] && tools+=(github.com/prometheus/prometheus/cmd/prometheus)
  [[ "$units" == *" promtool "* ]] && tools+=(github.com/prometheus/prometheus/cmd/promtool)
  rm -rf "$out" && mkdir -p "$out"
  (cd "$here/gomod/addons" && go build -trimpath -tags remove_all_sd,enable_kubernetes_sd "$GCFLAGS" \
    -ldflags "$ldflags" -o "$out/" "${tools[@]}")
  if [[ "$units" == *" kwok-lws "* ]]; then
    # kwok serves logs/exec/port-forward rules from its CRDs (`--enable-crds`) but does not install them; the
    # LeaderWorkerSet controller's CRDs, ClusterRole and webhook configurations come from its module too.
    kwok_src="$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")"
    lws_src="$(module_dir "sigs.k8s.io/lws@$LWS_VERSION")"
    rm -rf "$bin/kwok-crds" "$bin/lws" && mkdir -p "$bin/kwok-crds" "$bin/lws/crds" "$bin/lws/rbac" "$bin/lws/webhook"
    for kind in logs execs portforwards; do
      cp "$kwok_src/kustomize/crd/bases/kwok.x-k8s.io_$kind.yaml" "$bin/kwok-crds/"
    done
    cp "$lws_src"/config/crd/bases/*.yaml "$bin/lws/crds/"
    cp "$lws_src/config/rbac/role.yaml" "$bin/lws/rbac/"
    cp "$lws_src"/config/webhook/{manifests,mutating-patch,validating-patch}.yaml "$bin/lws/webhook/"
    [[ -f "$bin/lws/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml" ]] || { log "no LWS CRD in $lws_src"; exit 1; }
    chmod -R u+w "$bin/kwok-crds" "$bin/lws"
    mv "$out/cmd" "$bin/lws/lws-controller"
    mv "$out/kwok" "$bin/kwok"
    touch "$bin/kwok-crds/.complete" "$bin/lws/.complete"
  fi
  local name
  for name in prometheus promtool; do
    if [[ -x "$out/$name" ]]; then mv "$out/$name" "$bin/$name"; fi
  done
  rm -rf "$out"
}

build_etcd() {
  (cd "$here/gomod/etcd" && go build -trimpath "$GCFLAGS" -ldflags "-s -w" -o "$bin/etcd.tmp" .)
  mv "$bin/etcd.tmp" "$bin/etcd"
}

build_prometheus-adapter() {
  require_pin prometheus-adapter sigs.k8s.io/prometheus-adapter "$PROMETHEUS_ADAPTER_VERSION"
  (cd "$here/gomod/prometheus-adapter" && go build -trimpath "$GCFLAGS" -ldflags "-s -w" \
    -o "$bin/prometheus-adapter.tmp" sigs.k8s.io/prometheus-adapter/cmd/adapter)
  mv "$bin/prometheus-adapter.tmp" "$bin/prometheus-adapter"
}

build_cluster-autoscaler() {
  local pin
  for pin in "cluster-autoscaler $CLUSTER_AUTOSCALER_VERSION" "cluster-autoscaler/apis $CLUSTER_AUTOSCALER_APIS_VERSION"; do
    grep -Eq "k8s.io/autoscaler/$pin( // indirect)?\$" "$here/gomod/cluster-autoscaler/go.mod" \
      || { log "gomod/cluster-autoscaler/go.mod does not require k8s.io/autoscaler/$pin"; exit 1; }
  done
  # The module's main package is built as a tool of the wrapper module (a main package cannot be imported).
  (cd "$here/gomod/cluster-autoscaler" && go build -trimpath -tags kwok "$GCFLAGS" -ldflags "-s -w" \
    -o "$bin/cluster-autoscaler.tmp" k8s.io/autoscaler/cluster-autoscaler)
  mv "$bin/cluster-autoscaler.tmp" "$bin/cluster-autoscaler"
}

build_keda-crds() {
  local src
  src="$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")"
  [[ -f "$src/config/crd/bases/keda.sh_scaledobjects.yaml" ]] || { log "no KEDA CRDs in $src"; exit 1; }
  rm -rf "$bin/keda-crds" && mkdir -p "$bin/keda-crds"
  cp "$src"/config/crd/bases/*.yaml "$bin/keda-crds/"
  echo "$KEDA_VERSION" > "$bin/keda-crds/.complete"
}

version_of() {
  case "$1" in
    k8s) echo "$K8S_VERSION, helm $HELM_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    addons) echo "($ADDONS): kwok $KWOK_VERSION, lws $LWS_VERSION, prometheus $PROMETHEUS_VERSION" ;;
    prometheus-adapter) echo "$PROMETHEUS_ADAPTER_VERSION" ;;
    cluster-autoscaler) echo "$CLUSTER_AUTOSCALER_VERSION, the kwok cloud provider" ;;
    keda-crds) echo "$KEDA_VERSION" ;;
  esac
}

# One unit, in a process of its own (the parallel runner below starts these).
if [[ "${1:-}" == "--unit" ]]; then
  start=$SECONDS
  log "$2 $(version_of "$2")"
  "build_$2"
  log "$2 built in $((SECONDS - start))s"
  exit 0
fi

# -- which units ----------------------------------------------------------------------------------------------
CORE=(k8s etcd kwok-lws)
AUTOSCALING=(prometheus prometheus-adapter cluster-autoscaler)
list_only=""
if [[ "${1:-}" == "--units" ]]; then list_only=1; shift; fi
wanted=()
for what in "${@:-all}"; do
  case "$what" in
    core) wanted+=("${CORE[@]}") ;;
    autoscaling) wanted+=("${AUTOSCALING[@]}") ;;
    cluster) wanted+=("${CORE[@]}" "${AUTOSCALING[@]}") ;;
    promtool | keda-crds) wanted+=("$what") ;;
    all) wanted+=("${CORE[@]}" "${AUTOSCALING[@]}" promtool keda-crds) ;;
    *) log "usage: build.sh [core|autoscaling|cluster|promtool|keda-crds|all]..."; exit 2 ;;
  esac
done
mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | awk '!seen[$0]++')
if [[ -n "$list_only" ]]; then printf '%s\n' "${wanted[@]}"; exit 0; fi
missing() { local u; for u in "${wanted[@]}"; do built "$u" || echo "$u"; done; }
if [[ -z "$(missing)" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$bin"
# One build per cache key at a time (two checkouts, or a test that calls this while `make` does).
exec 9>"$bin.lock"
flock 9
todo="$(missing)"
if [[ -n "$todo" ]]; then
  start=$SECONDS
  ADDONS="$(grep -xE 'kwok-lws|prometheus|promtool' <<<"$todo" | tr '\n' ' ' | sed 's/ $//' || true)"
  export ADDONS
  # The builds, longest first so that the two lanes end together; xargs -P 2 runs two at a time and fails
  # (123) when any failed.
  jobs=()
  for unit in k8s addons cluster-autoscaler prometheus-adapter etcd keda-crds; do
    if [[ "$unit" == addons ]]; then [[ -n "$ADDONS" ]] && jobs+=(addons); continue; fi
    grep -qx "$unit" <<<"$todo" && jobs+=("$unit")
  done
  printf '%s\n' "${jobs[@]}" | xargs -P 2 -I{} "$0" --unit {} \
    || { log "a build failed (see above); what did build is kept in $bin"; exit 1; }
  log "built in $((SECONDS - start))s into $bin"
fi
echo "$bin"
