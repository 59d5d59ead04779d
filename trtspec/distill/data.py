"""Training data for a draft: the target's own greedy answers to a prompt set, with its top-k next-token distributions.

The target answers each prompt greedily (batched, through the torch runtime's ``ModelState``) and, at every answer
position, the top-k log-probabilities of the forward pass that chose the token are kept: on-policy data (what the
draft must predict at decode time is exactly the target's greedy continuation) with soft labels for free, since the
logits were computed anyway. Batches are written as shards, so a killed run resumes from the last finished shard.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trtspec.prompts import Prompt, encode
from trtspec.runtimes.torch.answers import Sample, answer_batch


def generate_teacher_data(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    shard_dir: Path,
    *,
    max_new_tokens: int,
    tokens: int,
    batch_size: int,
    top_k: int,
    eos_ids: Sequence[int],
    answers_per_prompt: int = 1,
    sample_temperature: float = 0.8,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[list[Sample], float]:
    """Answer ``prompts`` in batches until ``tokens`` answer tokens exist; shards in ``shard_dir`` make it resumable.

    Every prompt is first answered greedily (what the draft meets at decode time); with ``answers_per_prompt`` > 1
    the prompt set is answered again, sampled at ``sample_temperature``, while the token budget lasts.

    Returns the samples and the seconds spent making them (summed over resumed runs). ``on_batch(n_tokens)`` reports
    progress after each batch.
    """
    shard_dir.mkdir(parents=True, exist_ok=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    samples: list[Sample] = []
    total, seconds = 0, 0.0
    jobs = [(p, 0.0 if round_ == 0 else sample_temperature) for round_ in range(answers_per_prompt) for p in prompts]
    for b, start in enumerate(range(0, len(jobs), batch_size)):
        if total >= tokens:
            break
        shard = shard_dir / f"shard-{b:05d}.pt"
        if shard.is_file():
            saved = torch.load(shard)
            batch, dt = [Sample(**d) for d in saved["samples"]], float(saved["seconds"])
        else:
            t0 = time.perf_counter()
            chunk = jobs[start : start + batch_size]
            ids = [encode(tokenizer, p) for p, _ in chunk]
            batch = answer_batch(target, ids, max_new_tokens, top_k, eos_ids, pad, [t for _, t in chunk], seed=b)
            dt = time.perf_counter() - t0
            records = [
                {"ids": s.ids, "start": s.start, "topk_ids": s.topk_ids, "topk_logp": s.topk_logp.half()} for s in batch
            ]
            _save_atomic({"samples": records, "seconds": dt}, shard)
        for s in batch:
            s.topk_logp = s.topk_logp.float()
        n = sum(len(s.answer) for s in batch)
        samples += batch
        total += n
        seconds += dt
        if on_batch is not None:
            on_batch(n)
    return samples, seconds


def _save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def token_counts(samples: Sequence[Sample], vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in the target's answers (what the draft has to propose)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in samples:
        counts += torch.bincount(s.answer, minlength=vocab_size)
    return counts


def select_head_tokens(counts: torch.Tensor, n: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The ``n`` token ids the draft's head scores: ``always`` (stop tokens), then the most frequent in the target's
    answers; ties and unseen tokens go by lower id first (BPE ids roughly follow merge order, i.e. frequency)."""
    vocab = counts.numel()
    n = min(n, vocab)
    # Stable ordering by (-count, id): scale counts above any id so that one sort does both keys.
    key = -counts.double() * vocab + torch.arange(vocab, dtype=torch.double)
    key[torch.tensor(list(always), dtype=torch.long)] = float("-inf")
    return torch.sort(torch.argsort(key)[:n]).values
