#!/bin/sh
# The install step of the operator image (Dockerfile.operator), kept in a script so that it runs outside Docker
# too: tests/chart/test_image_install.py runs it in a fresh virtualenv. It installs the operator from the wheels
# in $1 (the image's build stage makes them), then checks the entry points the image and the chart call.
set -eu
wheels=$1
python -m pip install --no-index --find-links="$wheels" specdeploy-operator
command -v specdeploy-operator specdeploy >/dev/null
specdeploy-operator --help >/dev/null
specdeploy --help >/dev/null
