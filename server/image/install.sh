#!/bin/sh
# The install step of the server image (Dockerfile.server), kept in a script so that it runs outside Docker too:
# tests/chart/test_image_install.py runs it in a fresh virtualenv. It installs the server package from $1 with
# its [trtllm] extra (TensorRT-LLM itself comes with the base image) and the download tools of the build Jobs
# ($SPECDEPLOY_DOWNLOAD_TOOLS, default awscli and gsutil), then checks every command the operator's pods call:
# the server, aws, gsutil, and hf or the older huggingface-cli (builders/fetchscript.py takes either).
set -eu
src=$1
tools=${SPECDEPLOY_DOWNLOAD_TOOLS-awscli gsutil}
# shellcheck disable=SC2086 # the tools are separate words
python -m pip install "$src[trtllm]" $tools
command -v specdeploy-server specdeploy-quantize aws gsutil >/dev/null
command -v hf >/dev/null || command -v huggingface-cli >/dev/null
specdeploy-server --help >/dev/null
specdeploy-quantize --help >/dev/null
