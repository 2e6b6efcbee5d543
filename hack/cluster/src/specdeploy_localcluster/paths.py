"""Where the harness is: hack/cluster, the project that holds this package (under src/) with its
pyproject.toml, build.sh, versions.env, the kwok Stages and the default node pools; and the checkout around it
(the chart, the demo's manifests). The harness is installed editable from its checkout, whose files it reads
and runs."""

from __future__ import annotations

from pathlib import Path
from typing import Final

HARNESS_DIR: Final = Path(__file__).resolve().parents[2]
CHECKOUT: Final = HARNESS_DIR.parents[1]
