#!/usr/bin/env bash
# Every GPU measurement of the server in one run (benchmarks/server/gpu_day.py; about 7 minutes on an H100 or
# H200), for a machine with a GPU, Python, PyTorch and transformers, and maybe nothing else of ours.
#
#   bash benchmarks/gpu_day.sh [--wheels DIR] [--results DIR] [gpu_day.py's options: --only, --smoke ...]
#
# --wheels DIR   install these wheels first, into a folder of their own (no package index needed): the
#                server's dependencies the machine lacks (fastapi, uvicorn, pydantic, llguidance, jsonschema
#                and what they need), built for its Python
# --results DIR  where the records go (default benchmarks/results); copy them into benchmarks/results and
#                run `python -m benchmarks.records` to render docs/benchmarks-server.md "On a GPU"
#
# Writes DIR/gpu-day.log too (the run's output, with the GPU's nvidia-smi line), and DIR/gpu-llmapi-drafter.log
# (benchmarks/server/gpu_llmapi_drafter.py, where TensorRT-LLM is installed). Exits non-zero when a section
# failed; the others' records are written all the same.
set -euo pipefail
cd "$(dirname "$0")/.."

wheels=""
results="benchmarks/results"
passed=()
while (($#)); do
	case "$1" in
	--wheels) wheels="$2"; shift 2 ;;
	--results) results="$2"; shift 2 ;;
	*) passed+=("$1"); shift ;;
	esac
done
python="${PYTHON:-python3}"
mkdir -p "$results"
log="$results/gpu-day.log"

if [[ -n "$wheels" ]]; then
	site="$(mktemp -d)/site"
	"$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl
	export PYTHONPATH="$site"
fi
export PYTHONPATH="server/src:server/testkit/src:.${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TQDM_DISABLE=1

{
	date -u +"started %Y-%m-%dT%H:%M:%SZ"
	if command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
	fi
	"$python" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'
} 2>&1 | tee "$log"
set +e
"$python" -m benchmarks.server.gpu_day --results "$results" "${passed[@]}" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
# Our drafter inside TensorRT-LLM's PyTorch flow (only where tensorrt_llm is installed; says "skipped" else):
# greedy identity, tokens per step with predictions, the drafter's cost per iteration. Its own log; a
# failure here fails the run at the end, after everything else ran.
"$python" -m benchmarks.server.gpu_llmapi_drafter 2>&1 | tee "$results/gpu-llmapi-drafter.log" | tee -a "$log"
drafter_status=${PIPESTATUS[0]}
((status == 0)) && status=$drafter_status
date -u +"ended %Y-%m-%dT%H:%M:%SZ" | tee -a "$log"
exit "$status"
