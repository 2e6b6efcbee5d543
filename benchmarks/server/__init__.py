"""Server benchmarks: ``python -m benchmarks.server`` (see docs/benchmarks-server.md)."""
