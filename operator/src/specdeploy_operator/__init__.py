"""specdeploy operator: reconciles SpeculativeDeployment and EngineBuild resources."""

__version__ = "0.1.0"
