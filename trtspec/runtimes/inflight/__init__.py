"""The torch runtime's serving engine: in-flight batching over a slot KV cache with prefix reuse across requests.

It implements the TensorRT-LLM backend's request semantics (generate N tokens, or verify draft tokens and return the
accepted ones plus one) for the ``tensorrt_llm`` / ``tensorrt_llm_draft`` Python models of a torch-runtime Triton
repository. Import submodules directly; importing this package does not import torch.
"""
