"""The controller: kopf handlers feed a work queue; the reconciler turns SpeculativeDeployments and
EngineBuilds into their children with the pure builders and writes status."""
