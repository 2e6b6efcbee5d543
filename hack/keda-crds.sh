#!/usr/bin/env bash
# Print the directory holding KEDA's CRDs (config/crd/bases) at the pinned release, fetched from the Go module
# proxy (the KEDA module ships its CRDs). Used to validate the ScaledObjects the operator renders against KEDA's
# own schema, and to install the ScaledObject CRD into the local cluster. Needs only `go` and the module proxy.
set -euo pipefail
KEDA_VERSION="${KEDA_VERSION:-v2.18.1}"
dir="$(GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
crds="$dir/config/crd/bases"
if [[ ! -f "$crds/keda.sh_scaledobjects.yaml" ]]; then
  echo "keda-crds: no keda.sh_scaledobjects.yaml under $crds" >&2
  exit 1
fi
echo "$crds"
