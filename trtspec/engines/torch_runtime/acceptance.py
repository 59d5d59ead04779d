"""Acceptance rules that keep draft-target decoding lossless.

Greedy: accept draft tokens while they equal the target's argmax; emit the target's token at the first disagreement
(or the bonus token after K acceptances). Sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft token x with
probability min(1, p(x) / q(x)); on rejection sample from norm(max(0, p - q)); after K acceptances sample the bonus
token from p. The emitted tokens are then distributed exactly as target-only sampling.
"""

from __future__ import annotations

import torch

from trtspec.engines.torch_runtime.sampling import sample


def accept_greedy(draft_tokens: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """(number of draft tokens accepted, the target's next token) from the target's argmax at K + 1 positions."""
    n = 0
    for d, t in zip(draft_tokens, target_argmax):
        if d != t:
            break
        n += 1
    return n, target_argmax[n]


def accepts(u: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Whether draft tokens with draft probability q and target probability p are accepted, for u ~ U(0, 1): u < p / q,
    written u * q < p (no division, and q == 0, never proposed, cannot be accepted by accident)."""
    return u * q < p


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What to sample from after a rejection: norm(max(0, p - q)); p itself when p == q (rejection then has
    probability 0 in theory)."""
    r = (p - q).clamp_min(0)
    total = r.sum()
    if total <= 0:
        return p / p.sum()
    return r / total


def accept_sampled(
    draft_tokens: list[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Rejection sampling: draft_probs [K, V] (q), target_probs [K + 1, V] (p), both after the same sampling transform."""
    k = len(draft_tokens)
    if k:
        idx = torch.tensor(draft_tokens).unsqueeze(-1)
        p = target_probs[:k].gather(-1, idx).squeeze(-1)
        q = draft_probs[:k].gather(-1, idx).squeeze(-1)
        u = torch.rand(k, generator=generator)
        accepted = accepts(u, q, p).tolist()
    for i in range(k):
        if not accepted[i]:
            return i, sample(residual(target_probs[i], draft_probs[i]), generator)
    return k, sample(target_probs[k], generator)
