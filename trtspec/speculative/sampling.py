"""The one logits -> probabilities transform, applied identically to target and draft (SamplingParams lives in
trtspec.speculative.rules, torch-free)."""

from __future__ import annotations

import torch

from trtspec.speculative.rules import SamplingParams

__all__ = ["SamplingParams", "apply_penalties", "logits_to_probs", "sample", "token_counts"]


def token_counts(tokens: list[int], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """How often each of ``vocab`` token ids occurs in ``tokens`` (ids outside the vocabulary are not counted), [V]."""
    ids = torch.as_tensor(tokens, dtype=torch.long, device=device)
    return torch.bincount(ids[(ids >= 0) & (ids < vocab)], minlength=vocab)


def apply_penalties(logits: torch.Tensor, params: SamplingParams, counts: torch.Tensor) -> torch.Tensor:
    """TensorRT-LLM's penalties (penaltyKernels.cu) over the last dimension, for the occurrence ``counts`` [V] of
    the tokens so far: a token seen at least once has its logit divided by repetition_penalty (multiplied when
    negative), then lowered by presence_penalty, then by frequency_penalty times its count. A new tensor (float32)."""
    logits = logits.float()
    seen = counts > 0
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        logits = torch.where(seen, torch.where(logits < 0, logits * r, logits / r), logits)
    if params.presence_penalty != 0.0:
        logits = logits - params.presence_penalty * seen
    if params.frequency_penalty != 0.0:
        logits = logits - params.frequency_penalty * counts
    return logits


def logits_to_probs(logits: torch.Tensor, params: SamplingParams, counts: torch.Tensor | None = None) -> torch.Tensor:
    """Temperature, then the penalties (with the occurrence ``counts`` of the tokens so far; TensorRT-LLM's order),
    then top-k, then top-p (nucleus), then softmax, over the last dimension (float32)."""
    logits = logits.float() / max(params.temperature, 1e-6)
    if counts is not None and params.penalized:
        logits = apply_penalties(logits, params, counts)
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p; the top token always stays.
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id from a 1-D distribution, drawn on the generator's device (a CPU generator with a model on a GPU:
    the same draws as on a CPU, for the same seed)."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator).item())
