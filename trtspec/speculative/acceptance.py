"""The acceptance rules that keep draft-target decoding lossless, and the one routine that applies them.

Greedy: accept draft tokens while they equal the target's argmax; emit the target's token at the first disagreement
(or the bonus token after K acceptances). Sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft token x
with probability min(1, p(x) / q(x)); on rejection sample from norm(max(0, p - q)); after K acceptances sample the
bonus token from p. The emitted tokens are then distributed exactly as target-only sampling. A proposal without a
distribution (an n-gram, or a draft sent without logits) is a point mass: accepted with probability p(x), and on
rejection p without x. With no draft tokens the routine is plain decoding: argmax, or a sample from p.

``decide`` is used by every path that verifies tokens (the in-flight engine, in process and in the torch runtime's
Triton models); it takes the target's hidden states and applies the vocabulary head in at most two multiplies, to
every first row and then to the later rows of the sequences whose first proposal was accepted
(trtspec.runtimes.inflight.head), or full logits with the identity as head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trtspec.speculative.rules import SamplingParams, TokenLogprob
from trtspec.speculative.sampling import apply_penalties, logits_to_probs, sample, token_counts
from trtspec.speculative.words import banned_tokens


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


@dataclass
class Candidate:
    """One sequence's step: the draft tokens to verify (possibly none) and what deciding them needs."""

    draft: Sequence[int]
    sampling: SamplingParams
    generator: torch.Generator | None = None
    q: torch.Tensor | None = None  # [len(draft), V] the draft's distributions; None: point masses
    history: Sequence[int] = ()  # tokens before the draft, prompt included (bad words and penalties look at them)
    bad_words: Sequence[Sequence[int]] = ()
    keep_logits: bool = False  # return the target's logits at the decided positions
    logprobs: int | None = None  # return each emitted token's log-probability and this many top alternatives
    end_ids: Sequence[int] = ()  # banned while fewer than sampling.min_tokens tokens have been generated
    generated: int = 0  # tokens the sequence generated before this step

    def bans_end(self, j: int) -> bool:
        """Whether the end tokens are banned at draft position ``j`` (min_tokens not reached there)."""
        return bool(self.end_ids) and self.generated + j < self.sampling.min_tokens

    def counts(self, j: int, vocab: int, device: torch.device) -> torch.Tensor | None:
        """The occurrences of each token before draft position ``j`` (prompt, output, draft[:j]) when a penalty
        applies, else None: a verified position sees the tokens it would follow if accepted, as decoding would."""
        if not self.sampling.penalized:
            return None
        return token_counts([*self.history, *self.draft[:j]], vocab, device)


@dataclass
class Decision:
    accepted: int  # draft tokens accepted
    token: int  # the target's own token after them (correction or bonus)
    logits: list[torch.Tensor]  # the target's logits at positions 0..accepted (when keep_logits)
    logprobs: list[TokenLogprob] | None = None  # of the emitted tokens draft[:accepted] + [token] (when asked)


def token_logprobs(rows: Sequence[torch.Tensor], tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """Each token's log-probability under the logits row of its position, and the ``top`` best tokens there."""
    out = []
    for lg, tok in zip(rows, tokens):
        lp = torch.log_softmax(lg.float(), -1)
        best: tuple[tuple[int, float], ...] = ()
        if top > 0:
            values, ids = lp.topk(min(top, lp.shape[-1]))
            best = tuple(zip((int(i) for i in ids.tolist()), (float(v) for v in values.tolist())))
        out.append(TokenLogprob(int(tok), float(lp[tok]), best))
    return out


def _constrain(logits: torch.Tensor, c: Candidate, j: int) -> torch.Tensor:
    """The logits at draft position ``j`` with the tokens banned there at -inf: those that would complete a bad word,
    and the end tokens before min_tokens."""
    banned = banned_tokens(list(c.history) + list(c.draft[:j]), c.bad_words) if c.bad_words else []
    if c.bans_end(j):
        banned.extend(int(t) for t in c.end_ids)
    if not banned:
        return logits
    logits = logits.clone()
    logits[banned] = float("-inf")
    return logits


def decide(
    cands: Sequence[Candidate],
    states: Sequence[torch.Tensor],
    head: Callable[[torch.Tensor], torch.Tensor],
    flat_rows: int = 0,
    argmax: Callable[[torch.Tensor], list[int]] | None = None,
) -> list[Decision]:
    """One Decision per candidate. ``states[i]`` is [len(draft_i) + 1, D]: the target's hidden states (``head`` its
    lm_head) or logits (``head`` the identity) at the positions of the draft tokens' predecessors and the bonus.

    The head is applied to every sequence's first row (each is decided), then once to all the later rows of the
    sequences whose first proposal was accepted. Position by position (once the rule with one speculating
    sequence) it reads the whole vocabulary matrix once per position decided: measured in the engine on one thread,
    bfloat16, 6.2 ms per row computed, so a K 4 step that accepted 3 paid 25 ms for its head, where one multiply over
    its 4 later rows costs about as much as one over 1. Every row at once (once the rule with several) computed every
    row after each rejection for nothing: at 8 sequences x 5 rows the head over 40 rows took 33 ms against 10 ms
    over 8. ``flat_rows``: up to how many rows a multiply of ``head`` costs about one row (trtspec's float32 CPU
    kernel reads the weights once for up to 8 rows): a step with at most that many rows in all computes every row in
    one multiply, where the second multiply would read the whole head again (8.8 ms of a 40 ms float32 step on
    SmolLM2-135M). ``argmax``: each row's argmax of a block of logits, as ``block.argmax(-1)`` gives it (the
    runtime's kernel; default torch's, in float32)."""
    out: list[Decision | None] = [None] * len(cands)
    every_row = sum(len(s) for s in states) <= flat_rows
    kept: list[list[torch.Tensor]] = [[] for _ in cands]
    # Each sequence's uniforms are drawn first (then the residual / bonus sample), as a one-sequence sampler would.
    u = [torch.rand(len(c.draft), generator=c.generator) if c.draft and not c.sampling.greedy else None for c in cands]
    # A greedy candidate without bad words and without logits to return needs only each row's argmax: one argmax over
    # every row of a multiply (no per-row gather and argmax: at 8 sequences x 5 rows the gathers alone copied 4 MB a
    # position), in float32 (exact for bfloat16 logits, the same first maximum, and twice as fast on a CPU).
    plain = [
        c.sampling.greedy
        and not c.bad_words
        and not c.keep_logits
        and c.logprobs is None
        and not c.sampling.penalized
        and not c.bans_end(0)
        for c in cands
    ]
    rows: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}  # (candidate, position) -> (logits, row in them)
    ids: dict[tuple[int, int], int] = {}  # (candidate, position) -> argmax, for the plain candidates

    def compute(pairs: list[tuple[int, int]]) -> None:
        """The head over the rows ``pairs`` (candidate, position), in one multiply."""
        block = head(torch.cat([states[i][j : j + n] for i, j, n in _runs(pairs)]))
        am = (argmax or _argmax)(block) if any(plain[i] for i, _ in pairs) else None
        for r, (i, j) in enumerate(pairs):
            rows[(i, j)] = (block, r)
            if am is not None and plain[i]:
                ids[(i, j)] = am[r]

    undecided = list(range(len(cands)))
    j = 0
    while undecided:
        need = [i for i in undecided if (i, j) not in rows]
        if need:  # every first row; then every later row of the sequences still going on, at once
            compute([(i, jj) for i in need for jj in (range(j, len(states[i])) if j or every_row else (0,))])
        going_on = []
        for i in undecided:
            c = cands[i]
            k = len(c.draft)
            if plain[i]:
                t = ids[(i, j)]
                if j < k and c.draft[j] == t:
                    going_on.append(i)
                else:
                    out[i] = Decision(j, t, kept[i])
                continue
            block, r = rows[(i, j)]
            lg = _constrain(block[r], c, j)
            if c.keep_logits or c.logprobs is not None:  # what the token was drawn from (a draft's q is exactly that)
                kept[i].append(lg)
            counts = c.counts(j, lg.shape[-1], lg.device)
            if c.sampling.greedy:
                t = int((lg if counts is None else apply_penalties(lg, c.sampling, counts)).argmax())
                if j < k and c.draft[j] == t:
                    going_on.append(i)
                else:
                    out[i] = Decision(j, t, kept[i])
                continue
            p = logits_to_probs(lg, c.sampling, counts)
            gen = c.generator
            if j == k:  # every draft token accepted (or none proposed): the bonus token from p
                out[i] = Decision(j, sample(p, gen), kept[i])  # type: ignore[arg-type]
                continue
            tok = int(c.draft[j])
            if c.q is not None:
                q = c.q[j]
            else:
                q = torch.zeros_like(p)
                q[tok] = 1.0
            if bool(accepts(u[i][j], q[tok], p[tok])):  # type: ignore[index]
                going_on.append(i)
                continue
            out[i] = Decision(j, sample(residual(p, q), gen), kept[i])  # type: ignore[arg-type]
        undecided = going_on
        j += 1
    for c, d in zip(cands, out):
        assert d is not None
        if c.logprobs is not None:
            d.logprobs = token_logprobs(d.logits, [*c.draft[: d.accepted], d.token], c.logprobs)
            if not c.keep_logits:
                d.logits = []
    return out  # type: ignore[return-value]


def _argmax(block: torch.Tensor) -> list[int]:
    return block.float().argmax(-1).tolist()


def _runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``pairs`` (candidate, position), in order, as runs (candidate, first position, count) of consecutive
    positions of one candidate: the slices of its states to stack."""
    runs: list[list[int]] = []
    for i, j in pairs:
        if runs and runs[-1][0] == i and runs[-1][1] + runs[-1][2] == j:
            runs[-1][2] += 1
        else:
            runs.append([i, j, 1])
    return [(i, j, n) for i, j, n in runs]
