#!/usr/bin/env bash
# Build the two server images from Dockerfile.server, each on the TensorRT-LLM release pinned for its backend in
# operator/src/specdeploy_operator/trtllm-releases.env (the one place the pins live):
#   REPOSITORY:VERSION                    backends pytorch and transformers: TensorRT-LLM $PYTORCH
#   REPOSITORY:VERSION-trtllm$TENSORRT    backend tensorrt: TensorRT-LLM $TENSORRT, with the engine tools
# These are the tags the chart's settings.serverImage and settings.engineServerImage default to.
#
#   hack/build-server-images.sh REPOSITORY [VERSION]    VERSION defaults to the chart's appVersion
#   DOCKER="echo docker" hack/build-server-images.sh …  prints the commands instead of running them
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repository="${1:?usage: hack/build-server-images.sh REPOSITORY [VERSION]}"
version="${2:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$root/charts/specdeploy/Chart.yaml")}"
pins="$root/operator/src/specdeploy_operator/trtllm-releases.env"
pin() {
  local value
  value="$(sed -n "s/^$1=//p" "$pins")"
  [[ -n "$value" ]] || { echo "no $1= line in $pins" >&2; exit 1; }
  echo "$value"
}
pytorch="$(pin PYTORCH)"
tensorrt="$(pin TENSORRT)"
read -r -a docker <<<"${DOCKER:-docker}"

cd "$root"
"${docker[@]}" build -f Dockerfile.server --build-arg "TRTLLM_VERSION=$pytorch" -t "$repository:$version" .
"${docker[@]}" build -f Dockerfile.server --build-arg "TRTLLM_VERSION=$tensorrt" --build-arg ENGINE_WORKFLOW=true \
  -t "$repository:$version-trtllm$tensorrt" .
