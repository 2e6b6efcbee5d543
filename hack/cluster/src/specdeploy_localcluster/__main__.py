"""`python -m specdeploy_localcluster up|down|status|manifests|kwok-config` (cli.py)."""

import sys

from specdeploy_localcluster.cli import main

sys.exit(main())
