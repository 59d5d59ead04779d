"""Engines: trtllm-build commands per TensorRT-LLM version, and the torch speculative decoding runtime."""
