"""The torch runtime: draft-target speculative decoding over Hugging Face causal LMs, on any machine.

Import submodules directly (``from trtspec.runtimes.torch.decoder import SpeculativeDecoder``); importing this
package does not import torch.
"""
