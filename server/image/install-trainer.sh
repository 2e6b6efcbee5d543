#!/bin/sh
# The install step of the trainer image (Dockerfile.trainer), kept in a script so that it runs outside Docker
# too: tests/chart/test_image_install.py runs it in a fresh virtualenv. It installs the server package from $1
# with its [train] extra and NVIDIA ModelOpt at exactly $MODELOPT_VERSION (the image's one pin of the trainer),
# then checks the command the training Jobs call and that ModelOpt's EAGLE-3 trainer and exporter import.
set -eu
src=$1
: "${MODELOPT_VERSION:?the trainer image pins ModelOpt: set MODELOPT_VERSION}"
python -m pip install "$src[train]" "nvidia-modelopt==$MODELOPT_VERSION"
command -v specdeploy-distill >/dev/null
specdeploy-distill --help >/dev/null
python -c "import modelopt.torch.speculative, modelopt.torch.export; from importlib.metadata import version; \
assert version('nvidia-modelopt') == '$MODELOPT_VERSION', version('nvidia-modelopt')"
