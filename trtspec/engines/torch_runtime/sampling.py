"""Sampling settings and the one logits -> probabilities transform applied identically to target and draft."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtspec.errors import GenerationError


@dataclass(frozen=True)
class SamplingParams:
    """Temperature 0 means greedy; top_k 0 and top_p 1.0 mean no filtering; seed makes sampled runs reproducible."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise GenerationError(f"temperature must be >= 0, got {self.temperature}", hint="0 means greedy")
        if self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0, got {self.top_k}", hint="0 disables top-k filtering")
        if not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p}", hint="1.0 disables top-p filtering")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, offset: int = 0) -> torch.Generator:
        """A CPU generator for one sequence (seed + offset), or a nondeterministically seeded one without a seed."""
        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed + offset)
        return g


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), then softmax, over the last dimension (float32)."""
    logits = logits.float() / max(params.temperature, 1e-6)
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
    """One token id from a 1-D distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
