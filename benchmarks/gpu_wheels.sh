#!/usr/bin/env bash
# Download the wheels benchmarks/gpu_day.sh --wheels installs on a GPU machine that has Python, PyTorch and
# transformers but not the server's other dependencies, and no package index: the server's web stack
# (fastapi, starlette, uvicorn, pydantic), its grammar engine (llguidance), jsonschema (the structured
# section checks its outputs with it) and what they need, at the versions installed in this checkout's .venv
# (the versions the tests ran with).
#
#   bash benchmarks/gpu_wheels.sh DIR [PYTHON_VERSION]     # default 3.12; x86-64 Linux wheels
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:?usage: gpu_wheels.sh DIR [PYTHON_VERSION]}"
pyver="${2:-3.12}"
packages=(
	annotated-doc annotated-types fastapi jsonschema jsonschema-specifications llguidance opentelemetry-api
	pydantic pydantic-core referencing rpds-py starlette typing-extensions typing-inspection uvicorn
)
platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64; do
	platforms+=(--platform "$p")
done
mkdir -p "$dir"
for name in "${packages[@]}"; do
	version="$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')"
	if [[ -z "$version" ]]; then
		echo "gpu_wheels.sh: $name is not installed in .venv (run make venv)" >&2
		exit 1
	fi
	python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" \
		--implementation cp "${platforms[@]}" -d "$dir" "$name==$version"
done
ls "$dir"
