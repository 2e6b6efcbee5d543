"""What the specdeploy server's tests and benchmarks share: pseudo-text (``sample_text``), tiny random-weight
checkpoints with a tokenizer trained on it (``checkpoints``) and JSON schemas (``json_schemas``). Development
only: the server package never imports it."""
