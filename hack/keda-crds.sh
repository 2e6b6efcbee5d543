#!/usr/bin/env bash
# Print the directory holding KEDA's CRDs (config/crd/bases of the KEDA Go module, KEDA_VERSION, default in
# hack/cluster/build.sh), which `hack/cluster/build.sh keda-crds` (and `make bins`) fetches from the Go module
# proxy. Used to validate the ScaledObjects the operator renders against KEDA's own schema, and to
# install the ScaledObject CRD into the local cluster. Warm, this downloads nothing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$("$here/cluster/build.sh" keda-crds)"
crds="$bin/keda-crds"
if [[ ! -f "$crds/keda.sh_scaledobjects.yaml" ]]; then
  echo "keda-crds: no keda.sh_scaledobjects.yaml under $crds" >&2
  exit 1
fi
echo "$crds"
