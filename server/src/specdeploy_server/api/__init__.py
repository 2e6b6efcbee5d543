"""OpenAI-compatible HTTP API: thin routers (``app``), request models (``protocol``), logic (``serving``)."""
