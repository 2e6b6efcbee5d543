"""specdeploy server: paired draft/target executors behind an OpenAI-compatible API."""

__version__ = "0.1.0"
