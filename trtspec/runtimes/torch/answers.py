"""The target's answers to tokenized prompts, with its top-k log-probabilities at each answer token: the teacher data of
`trtspec distill` (trtspec.distill.data) and the held-out references that `trtspec tune` and the distill report
measure drafts on (``profiling``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


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


class OnDevice:
    """A causal LM seen through CPU-built inputs: tensors passed to it move to the device of its input embeddings.

    The torch runtime's ``ModelState`` builds ids, positions and masks on the CPU; with this adapter it drives a
    teacher spread over GPUs (``device_map="auto"``) unchanged. Outputs stay on the model's device."""

    def __init__(self, model: Any) -> None:
        self.inner = model
        self.config = model.config
        self.device = model.get_input_embeddings().weight.device

    def __call__(self, **kwargs: Any) -> Any:
        moved = {k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        return self.inner(**moved)


def on_device(model: Any) -> Any:
    """``model`` itself on a CPU, else wrapped in :class:`OnDevice`."""
    device = model.get_input_embeddings().weight.device
    return model if device.type == "cpu" else OnDevice(model)


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
    ``target`` may sit on GPUs: its inputs move there (:class:`OnDevice`), samples come back on the CPU."""
    from trtspec.runtimes.torch.state import ModelState

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
