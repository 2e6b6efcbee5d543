"""Speculative decoding core: drafters, acceptance rules, draft-length control and the step scheduler.

Nothing here knows about HTTP or about a particular model backend. Backends plug in through the executor
protocols in :mod:`specdeploy_server.core.executors`.
"""
