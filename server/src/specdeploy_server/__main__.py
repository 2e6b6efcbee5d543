"""``python -m specdeploy_server``: the same as the ``specdeploy-server`` command."""

from specdeploy_server.cli import main

main()
