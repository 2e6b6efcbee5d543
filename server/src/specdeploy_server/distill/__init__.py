"""Self-distillation: drafts made from the target's own outputs (``specdeploy-distill``: generate, train)."""
