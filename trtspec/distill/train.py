"""The training loop: the draft learns the target's next-token distributions on the target's own answers.

Loss (``TrainSettings.loss``): ``fkl``, cross-entropy of the draft's distribution over its head tokens against the
target's top-k distribution renormalized over the head tokens (forward KL up to a constant; the target's greedy token
is its top-1, so the greedy label is the heaviest term and the rest of the top-k adds the target's ranking of
alternatives, a denser signal per token than the greedy label alone); ``tvd``, the total variation distance between
the two (DistillSpec, Zhou et al. 2023: it bounds the acceptance rate directly); ``fkl+ce``, fkl plus cross-entropy
on the greedy label (greedy acceptance counts the top-1 only). Only answer positions are trained: those are what the
draft proposes. The draft trains where its parameters are (a GPU when the placement put it there).

Checkpoints (trainable weights, optimizer, step, RNG) are written atomically every ``checkpoint_every`` steps;
``train`` resumes from one when its settings match.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trtspec.distill.settings import TrainSettings
from trtspec.runtimes.torch.answers import Sample


@dataclass
class StepLog:
    step: int
    loss: float
    top1: float  # fraction of answer positions where the draft's argmax is the target's greedy token


def _lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _collate(batch: Sequence[Sample], sub_index: torch.Tensor, pad_id: int, temperature: float):
    """Right-padded input ids (causal attention never sees the padding of later positions), the answer positions to
    train, and the teacher distributions over head tokens at those positions."""
    length = max(len(s.ids) for s in batch)
    ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    rows, cols, t_ids, t_logp = [], [], [], []
    for b, s in enumerate(batch):
        ids[b, : len(s.ids)] = s.ids
        n = len(s.answer)
        rows.append(torch.full((n,), b, dtype=torch.long))
        cols.append(torch.arange(s.start - 1, s.start - 1 + n))
        t_ids.append(s.topk_ids)
        t_logp.append(s.topk_logp)
    t_sub = sub_index[torch.cat(t_ids)]  # [M, k] head index of each teacher token, -1 where the head lacks it
    logits = torch.cat(t_logp) / temperature
    logits = logits.masked_fill(t_sub < 0, float("-inf"))
    usable = torch.isfinite(logits).any(-1)  # positions whose top-k has at least one head token
    probs = torch.softmax(logits[usable], dim=-1)
    greedy = t_sub[usable, 0]  # -1 when the target's greedy token is outside the head
    return ids, torch.cat(rows)[usable], torch.cat(cols)[usable], t_sub[usable].clamp_min(0), probs, greedy


def distill_loss(
    kind: str, log_q: torch.Tensor, t_sub: torch.Tensor, probs: torch.Tensor, greedy: torch.Tensor
) -> torch.Tensor:
    """The training loss over M answer positions: ``log_q`` [M, N] the draft's log-probabilities over its head,
    ``t_sub`` [M, k] head indices of the target's top-k, ``probs`` [M, k] their renormalized probabilities, ``greedy``
    [M] the head index of the target's greedy token (-1 outside the head)."""
    picked = log_q.gather(-1, t_sub)
    if kind == "tvd":
        q = picked.exp() * (probs > 0)  # top-k entries outside the head were masked to p = 0 (and index 0)
        # 0.5 * sum |p - q| over the vocabulary: the top-k terms, plus the draft's mass outside the top-k (p = 0 there)
        return (0.5 * ((probs - q).abs().sum(-1) + (1 - q.sum(-1)).clamp_min(0))).mean()
    loss = -(probs * picked).sum(-1).mean()
    if kind == "fkl+ce":
        ok = greedy >= 0
        if bool(ok.any()):
            loss = loss - log_q[ok].gather(-1, greedy[ok, None]).mean()
    return loss


def train(
    draft: Any,
    samples: Sequence[Sample],
    settings: TrainSettings,
    checkpoint: Path,
    *,
    pad_id: int = 0,
    on_step: Callable[[StepLog], None] | None = None,
) -> tuple[list[StepLog], float]:
    """Train ``draft`` in place for ``settings.steps`` steps (resuming from ``checkpoint`` when it exists); return the
    step logs and the seconds spent training (summed over resumed runs)."""
    vocab = draft.config.vocab_size
    sub_index = torch.full((vocab,), -1, dtype=torch.long)
    head_ids = draft.head_token_ids.cpu()  # the batches are built on the CPU (the draft may be on a GPU)
    sub_index[head_ids] = torch.arange(head_ids.numel())
    device = next(draft.parameters()).device
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    start, logs, order, seconds = 0, [], [], 0.0  # order: sample indices left in the current epoch
    t0 = time.perf_counter()
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False, map_location="cpu")
        if state["settings"] == asdict(settings):
            draft.load_state_dict(state["model"], strict=False)
            opt.load_state_dict(state["optimizer"])
            rng.setstate(state["rng"])
            start, logs = state["step"], [StepLog(**d) for d in state["logs"]]
            order, seconds = list(state["order"]), float(state["seconds"])
    draft.train()
    for step in range(start, settings.steps):
        if len(order) < settings.batch_size:
            perm = list(range(len(samples)))
            rng.shuffle(perm)
            order += perm
        batch = [samples[i] for i in order[: settings.batch_size]]
        del order[: settings.batch_size]
        ids, rows, cols, t_sub, probs, greedy = (
            x.to(device) for x in _collate(batch, sub_index, pad_id, settings.teacher_temperature)
        )
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, settings)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(settings.bf16)):
            hidden = draft.model(input_ids=ids, use_cache=False).last_hidden_state[rows, cols]
            logits = draft.subset_logits(hidden)
        log_q = torch.log_softmax(logits.float(), dim=-1)
        loss = distill_loss(settings.loss, log_q, t_sub, probs, greedy)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        top1 = float((log_q.argmax(-1) == greedy).float().mean())
        log = StepLog(step + 1, float(loss.detach()), top1)
        logs.append(log)
        if on_step is not None:
            on_step(log)
        if (step + 1) % settings.checkpoint_every == 0 or step + 1 == settings.steps:
            elapsed = seconds + time.perf_counter() - t0
            _save_checkpoint(checkpoint, draft, opt, rng, step + 1, settings, logs, order, elapsed)
    draft.eval()
    return logs, seconds + time.perf_counter() - t0


def _save_checkpoint(
    path: Path,
    draft: Any,
    opt: Any,
    rng: random.Random,
    step: int,
    settings: TrainSettings,
    logs: list[StepLog],
    order: list[int],
    seconds: float,
) -> None:
    trainable = {k: v for k, v in draft.state_dict().items() if not k.startswith("model.embed_tokens")}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(
        {
            "model": trainable,
            "optimizer": opt.state_dict(),
            "rng": rng.getstate(),
            "step": step,
            "settings": asdict(settings),
            "logs": [asdict(x) for x in logs],
            "order": order,
            "seconds": seconds,
        },
        tmp,
    )
    tmp.replace(path)
