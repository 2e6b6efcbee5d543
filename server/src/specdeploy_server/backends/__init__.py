"""Model backends. Each is imported lazily so the package works without torch or TensorRT-LLM installed."""
