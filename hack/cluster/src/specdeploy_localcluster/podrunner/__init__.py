"""The local cluster's pod runner: real processes for the pods it can run (see runner.py)."""
