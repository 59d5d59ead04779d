"""Training data for a draft: the target's own greedy answers to a prompt set, with its top-k next-token distributions.

The target answers each prompt greedily (batched, through the torch runtime's ``ModelState``) and, at every answer
position, the top-k log-probabilities of the forward pass that chose the token are kept: on-policy data (what the
draft must predict at decode time is exactly the target's greedy continuation) with soft labels for free, since the
logits were computed anyway. Batches are written as shards, so a killed run resumes from the last finished shard.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from trtspec.distill import DistillError


@dataclass
class Sample:
    """One prompt + the target's answer; teacher data covers the answer positions."""

    ids: torch.Tensor  # [L] int64: prompt then answer tokens
    start: int  # index of the first answer token; the input at start - 1 + j predicts answer token j
    topk_ids: torch.Tensor  # [n_answer, k] int64
    topk_logp: torch.Tensor  # [n_answer, k] float32: the target's log-probabilities (full-vocabulary softmax)

    @property
    def answer(self) -> torch.Tensor:
        return self.ids[self.start :]


def shipped_prompts() -> Path:
    """The prompt set that ships with trtspec (scripts/make_distill_prompts.py writes it)."""
    return Path(str(resources.files("trtspec") / "data" / "distill_prompts.txt"))


def load_prompts(path: Path | None) -> list[str]:
    """Prompts from a text file (one per line) or JSONL (``prompt`` or ``text`` field); the shipped set by default."""
    path = path or shipped_prompts()
    if not path.is_file():
        raise DistillError(f"{path}: prompt file not found", hint="pass --prompts FILE (one prompt per line, or JSONL)")
    out: list[str] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
                text = obj.get("prompt") or obj.get("text")
            except (json.JSONDecodeError, AttributeError):
                text = None
            if not isinstance(text, str):
                raise DistillError(
                    f"{path}:{n}: not a JSON object with a 'prompt' or 'text' string",
                    hint='one JSON object per line, e.g. {"prompt": "..."}',
                )
            out.append(text)
        else:
            out.append(line.strip())
    if len(out) < 2:
        raise DistillError(
            f"{path}: needs at least 2 prompts, found {len(out)}", hint="give a training and a held-out prompt at least"
        )
    return out


def load_texts(path: Path) -> list[str]:
    """Texts of a traffic file (the target's outputs as served): one per line, or JSONL with a ``response``,
    ``output``, ``completion`` or ``text`` string."""
    out: list[str] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
                text = next(
                    (obj[k] for k in ("response", "output", "completion", "text") if isinstance(obj.get(k), str)), None
                )
            except (json.JSONDecodeError, AttributeError):
                text = None
            if text is None:
                raise DistillError(
                    f"{path}:{n}: not a JSON object with a 'response', 'output', 'completion' or 'text' string",
                    hint='one JSON object per line, e.g. {"response": "..."}',
                )
            out.append(text)
        else:
            out.append(line.rstrip("\n"))
    if not out:
        raise DistillError(f"{path}: no texts", hint="one text per line, or JSONL with 'response'")
    return out


def split_prompts(prompts: Sequence[str], held_out: float) -> tuple[list[str], list[str]]:
    """(train, held-out) by a hash of each prompt's text: stable under reordering and additions."""

    def bucket(text: str) -> float:
        return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    train = [p for p in prompts if bucket(p) >= held_out]
    test = [p for p in prompts if bucket(p) < held_out]
    if not test:  # tiny prompt sets: hold out the last one rather than nothing
        train, test = train[:-1], train[-1:]
    if not train:
        train, test = test[:-1], test[-1:]
    return train, test


def encode_prompt(tokenizer: Any, text: str, chat: bool = True) -> list[int]:
    """Token ids of a prompt through the chat template when the tokenizer has one (as ``TorchSession.encode``)."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        return list(ids if isinstance(ids, list) else ids["input_ids"])
    ids = list(tokenizer.encode(text))
    return ids if ids else [tokenizer.bos_token_id or 0]


@torch.inference_mode()
def answer_batch(
    target: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    top_k: int,
    eos_ids: Sequence[int],
    pad_id: int = 0,
    temperatures: Sequence[float] | None = None,
    seed: int = 0,
) -> list[Sample]:
    """The target's answers to a batch of tokenized prompts, with its top-k log-probs at each answer token.

    Rows with temperature 0 (the default) answer greedily; the others sample at their temperature (seeded), which gives
    more distinct answers per prompt. The labels are the target's own distribution (temperature 1) either way: a
    sampled answer only changes which contexts the draft is taught at, not what it is taught.

    The target runs as loaded (see ``placement``: bfloat16 where the hardware has it). A bf16 teacher's greedy answers
    leave the float32 target's after ~30 tokens (median, SmolLM2) but stay the target's kind of text, and its labels
    agree with float32's top-1 at 98 % of positions; the report measures the draft against the target as it serves.
    ``target`` may sit on GPUs: its inputs move there (``placement.OnDevice``), samples come back on the CPU."""
    from trtspec.distill.placement import on_device
    from trtspec.engines.torch_runtime.state import ModelState

    state = ModelState(on_device(target), len(prompts), pad_id)
    if any(len(p) > 1 for p in prompts):
        state.forward([list(p[:-1]) for p in prompts], keep=1)
    active = list(range(len(prompts)))
    answers: list[list[int]] = [[] for _ in prompts]
    tk_ids: list[list[torch.Tensor]] = [[] for _ in prompts]
    tk_logp: list[list[torch.Tensor]] = [[] for _ in prompts]
    feed = [[int(p[-1])] for p in prompts]
    stops = set(eos_ids)
    temps = torch.tensor([float(t) for t in temperatures] if temperatures is not None else [0.0] * len(prompts))
    gen = torch.Generator().manual_seed(seed)
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(state.forward(feed, keep=1)[:, -1].float(), dim=-1)
        top_values, top_indices = (x.cpu() for x in logp.topk(top_k, dim=-1))
        nxt = top_indices[:, 0].tolist()  # the greedy token is the top-1
        t = temps[active]
        if bool((t > 0).any()):
            hot = (t > 0).nonzero().flatten()
            probs = torch.softmax(logp[hot.to(logp.device)].cpu() / t[hot, None], dim=-1)
            for i, x in zip(hot.tolist(), torch.multinomial(probs, 1, generator=gen).flatten().tolist()):
                nxt[i] = x
        keep = []
        for i, row in enumerate(active):
            answers[row].append(nxt[i])
            tk_ids[row].append(top_indices[i])
            tk_logp[row].append(top_values[i])
            if nxt[i] not in stops:
                keep.append(i)
        if not keep:
            break
        if len(keep) < len(active):
            state.select(torch.tensor(keep))
            active = [active[i] for i in keep]
        feed = [[nxt[i]] for i in keep]
    return [
        Sample(torch.tensor(list(p) + a, dtype=torch.long), len(p), torch.stack(ti), torch.stack(tl))
        for p, a, ti, tl in zip(prompts, answers, tk_ids, tk_logp)
    ]


def generate_teacher_data(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[str],
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
            ids = [encode_prompt(tokenizer, p) for p, _ in chunk]
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
