"""trtspec: draft-target speculative decoding, from a spec to a Triton model repository that serves it."""

__version__ = "0.1.0"
