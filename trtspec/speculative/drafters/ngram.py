"""N-gram drafting: prompt lookup over the request's own tokens, plus a pool of n-grams from the target's answers.

Prompt lookup (Saxena 2023; TensorRT-LLM's NGram drafter, vLLM's ngram proposer) finds the longest suffix of the
context (up to ``max_match`` tokens) that occurred earlier in the same context and proposes what followed it. The pool
does the same over a corpus: the target's own teacher answers from `trtspec distill` (or a user's traffic), where each
n-gram maps to the token the target chose most often after it; the pool proposes a chain, one lookup per token.

On disk the pool is its corpus (``ngram_pool.npz``: token ids and, where known, the target's greedy next token at each
position); the lookup tables are built from it at load time (about a second for 300k tokens). Keys are 64-bit
polynomial hashes of the n-gram: a collision only makes a proposal wrong, which verification rejects.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.speculative.drafters import UNLIMITED, DrafterKind, Proposal, StatelessLocalDrafter, in_vocab

POOL_FILE = "ngram_pool.npz"
MAX_MATCH = 4  # longest n-gram looked up (TensorRT-LLM: max_matching_ngram_size)
MIN_MATCH = 1
_MULT_INT = 0x9E3779B97F4A7C15
_MULT = np.uint64(_MULT_INT)
_MASK = (1 << 64) - 1
_SEP = -1


def _hash_windows(tokens: np.ndarray, n: int) -> np.ndarray:
    """uint64 hash of every window of ``n`` tokens (len(tokens) - n + 1 of them)."""
    h = np.zeros(len(tokens) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            h = h * _MULT + (tokens[i : len(tokens) - n + 1 + i].astype(np.uint64) + np.uint64(1))
    return h


def _hash(seq: Sequence[int]) -> np.uint64:
    """The hash of :func:`_hash_windows` for one n-gram, in Python integers (the same value mod 2**64; a lookup
    hashes a few n-grams per proposed token, where numpy's scalar arithmetic cost microseconds per operation)."""
    h = 0
    for t in seq:
        h = (h * _MULT_INT + int(t) + 1) & _MASK
    return np.uint64(h)


@dataclass
class _Table:
    keys: np.ndarray  # sorted uint64 hashes of n-grams
    next: np.ndarray  # int32: the most frequent next token after each
    count: np.ndarray  # int32: how often it followed

    def lookup(self, key: np.uint64) -> tuple[int, int] | None:
        i = int(np.searchsorted(self.keys, key))
        if i < len(self.keys) and self.keys[i] == key:
            return int(self.next[i]), int(self.count[i])
        return None


class NgramPool:
    """N-gram -> most frequent next token, for n in 1..max_match, over a corpus of token sequences."""

    def __init__(
        self,
        tokens: np.ndarray,
        labels: np.ndarray | None = None,
        *,
        vocab_size: int,
        max_match: int = MAX_MATCH,
        meta: dict | None = None,
    ) -> None:
        self.tokens = np.asarray(tokens, dtype=np.int32)  # documents separated by -1
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int32)
        self.vocab_size = int(vocab_size)
        self.max_match = int(max_match)
        self.meta = dict(meta or {})
        self.tables = {n: self._build(n) for n in range(1, self.max_match + 1)}

    # -- building ---------------------------------------------------------------------------------------------
    @classmethod
    def from_sequences(
        cls,
        sequences: Iterable[Sequence[int]],
        labels: Iterable[Sequence[int]] | None = None,
        *,
        vocab_size: int,
        max_match: int = MAX_MATCH,
        meta: dict | None = None,
    ) -> NgramPool:
        """A pool over token sequences. ``labels[i][j]``, when given, is the target's greedy choice after
        ``sequences[i][:j + 1]`` (a sampled answer's next token is not): the pool then predicts those."""
        toks: list[int] = []
        labs: list[int] = []
        label_iter = iter(labels) if labels is not None else None
        for seq in sequences:
            seq = [int(t) for t in seq]
            lab = [int(t) for t in next(label_iter)] if label_iter is not None else seq[1:] + [_SEP]
            if len(lab) != len(seq):
                raise ValueError("labels must be as long as their sequence")
            toks += seq + [_SEP]
            labs += lab + [_SEP]
        return cls(
            np.array(toks, dtype=np.int32),
            np.array(labs, dtype=np.int32) if labels is not None else None,
            vocab_size=vocab_size,
            max_match=max_match,
            meta=meta,
        )

    def _build(self, n: int) -> _Table:
        t = self.tokens
        if len(t) <= n:
            return _Table(np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.int32))
        # window i covers t[i:i+n]; what follows it: the label at its last token, else the next corpus token
        nxt = (self.labels[n - 1 :] if self.labels is not None else t[n:])[: len(t) - n + 1 - (self.labels is None)]
        keys = _hash_windows(t, n)[: len(nxt)]
        win_ok = np.ones(len(nxt), dtype=bool)
        sep = (t == _SEP).astype(np.int32)
        csum = np.concatenate([[0], np.cumsum(sep)])
        win_ok &= (csum[n : n + len(nxt)] - csum[: len(nxt)]) == 0  # no separator inside the window
        win_ok &= nxt != _SEP
        keys, nxt = keys[win_ok], nxt[win_ok]
        if not len(keys):
            return _Table(np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.int32))
        order = np.lexsort((nxt, keys))
        k, x = keys[order], nxt[order]
        new = np.concatenate([[True], (k[1:] != k[:-1]) | (x[1:] != x[:-1])])
        starts = np.flatnonzero(new)
        rk, rx = k[starts], x[starts]
        rc = np.diff(np.concatenate([starts, [len(k)]])).astype(np.int32)
        best = np.lexsort((rx, -rc, rk))  # per key: highest count first, ties to the lower token id
        rk, rx, rc = rk[best], rx[best], rc[best]
        first = np.concatenate([[True], rk[1:] != rk[:-1]])
        return _Table(rk[first], rx[first].astype(np.int32), rc[first])

    # -- lookups ----------------------------------------------------------------------------------------------
    def next_token(self, context: Sequence[int], min_match: int = MIN_MATCH) -> tuple[int, int] | None:
        """(token, match length) for the longest suffix of ``context`` in the pool, or None."""
        for n in range(min(self.max_match, len(context)), min_match - 1, -1):
            hit = self.tables[n].lookup(_hash(context[-n:]))
            if hit is not None:
                return hit[0], n
        return None

    def chain(self, context: Sequence[int], k: int, min_match: int = MIN_MATCH) -> Proposal:
        """Up to ``k`` tokens, each the pool's next token after the context extended by the ones before it."""
        ctx = list(context[-self.max_match :])
        out: list[int] = []
        first = 0
        for _ in range(k):
            hit = self.next_token(ctx, min_match)
            if hit is None:
                break
            tok, n = hit
            first = first or n
            out.append(tok)
            ctx = (ctx + [tok])[-self.max_match :]
        return Proposal(out, first, "pool" if out else "none")

    @property
    def n_tokens(self) -> int:
        return int((self.tokens != _SEP).sum())

    # -- files ------------------------------------------------------------------------------------------------
    def save(self, path: Path) -> Path:
        """Write the corpus (and labels) as ``.npz``; the tables are rebuilt on load."""
        path = Path(path)
        dtype = np.uint16 if self.vocab_size <= 0xFFFF else np.int32
        arrays = {"tokens": np.where(self.tokens == _SEP, self.vocab_size, self.tokens).astype(dtype)}
        if self.labels is not None:
            arrays["labels"] = np.where(self.labels == _SEP, self.vocab_size, self.labels).astype(dtype)
        meta = {**self.meta, "vocab_size": self.vocab_size, "max_match": self.max_match, "format": 1}
        arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(tmp, **arrays)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path, max_match: int | None = None) -> NgramPool:
        """A pool written by :meth:`save` (ValueError when it is not one)."""
        try:
            with np.load(Path(path)) as data:
                meta = json.loads(bytes(data["meta"]).decode())
                vocab = int(meta["vocab_size"])
                tokens = data["tokens"].astype(np.int32)
                labels = data["labels"].astype(np.int32) if "labels" in data else None
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not an n-gram pool ({exc})") from None
        tokens[tokens == vocab] = _SEP
        if labels is not None:
            labels[labels == vocab] = _SEP
        return cls(
            tokens, labels, vocab_size=vocab, max_match=max_match or int(meta.get("max_match", MAX_MATCH)), meta=meta
        )


def read_pool_meta(path: Path) -> dict:
    """The metadata of a pool file without building its tables (for `trtspec check`)."""
    with np.load(Path(path)) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        meta["tokens"] = int((data["tokens"] != int(meta["vocab_size"])).sum())
    return meta


def vocab_fingerprint(vocab: dict[str, int]) -> str:
    """SHA-256 of a tokenizer's token-to-id mapping: a pool only fits the tokenizer it was built with."""
    return hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest()


def prompt_lookup(context: Sequence[int], k: int, max_match: int = MAX_MATCH, min_match: int = MIN_MATCH) -> Proposal:
    """Prompt lookup: the longest suffix (``max_match``..``min_match`` tokens, ``min_match`` >= 1) that occurred
    earlier in ``context``, and up to ``k`` tokens that followed its most recent earlier occurrence.

    Every earlier occurrence of a suffix ends with the context's last token: those positions are the candidates, and
    each one's match is extended backwards (vectorized over the candidates), so a lookup costs one comparison over
    the context and a few over the candidates."""
    n_ctx = len(context)
    if n_ctx < 2 or k <= 0:
        return Proposal()
    ctx = np.asarray(context, dtype=np.int64)
    top = min(max_match, n_ctx - 1)
    ends = np.flatnonzero(ctx[: n_ctx - 1] == ctx[-1])  # where an earlier occurrence would end
    if not len(ends) or top < max(1, min_match):
        return Proposal()
    length = np.ones(len(ends), dtype=np.int64)  # each candidate's match, up to ``top`` tokens
    alive = np.ones(len(ends), dtype=bool)
    for j in range(1, top):
        pos = ends - j
        alive &= pos >= 0
        alive[alive] = ctx[pos[alive]] == ctx[n_ctx - 1 - j]
        if not alive.any():
            break
        length += alive
    n = int(length.max())
    if n < min_match:
        return Proposal()
    end = int(ends[np.flatnonzero(length >= n)[-1]])  # the most recent of the longest
    return Proposal([int(t) for t in ctx[end + 1 : end + 1 + k]], n, "prompt")


class PromptIndex:
    """Prompt lookup over one sequence that only grows (an engine job's history), learned incrementally: every
    n-gram (1..``max_match`` tokens) mapped to the most recent position it ended at with a token after it. A lookup is
    then up to ``max_match`` dictionary reads, and each step indexes only its new tokens, where :func:`prompt_lookup`
    compares over the whole context every step (measured in the engine, one sequence of the workloads: the n-gram
    proposal was 0.2 ms of a 12 ms step, 1.6 %, about half of it prompt lookup). The answers are
    :func:`prompt_lookup`'s (tests/test_drafters.py). A context that is not the indexed one grown (shorter, or another
    token where one was indexed) is indexed anew."""

    def __init__(self, max_match: int = MAX_MATCH) -> None:
        self.max_match = max_match
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> the last position it ended at, before ``_done``
        self._done = 0  # positions 0.._done - 1 are indexed as ends
        self._last = -1  # the token at position _done - 1 when it was indexed

    def lookup(self, context: Sequence[int], k: int, min_match: int = MIN_MATCH) -> Proposal:
        """:func:`prompt_lookup` (``context``, ``k``, this index's ``max_match``, ``min_match``)."""
        n_ctx = len(context)
        if n_ctx < 2 or k <= 0:
            return Proposal()
        done, ends, top = self._done, self._ends, self.max_match
        if done > n_ctx - 1 or (done and context[done - 1] != self._last):
            ends.clear()
            done = 0
        for e in range(done, n_ctx - 1):  # every position with a token after it ends an n-gram for each n
            for n in range(1, min(top, e + 1) + 1):
                ends[tuple(context[e - n + 1 : e + 1])] = e
        self._done, self._last = n_ctx - 1, context[n_ctx - 2]
        for n in range(min(top, n_ctx - 1), max(1, min_match) - 1, -1):
            end = ends.get(tuple(context[n_ctx - n :]))
            if end is not None:
                return Proposal([int(t) for t in context[end + 1 : end + 1 + k]], n, "prompt")
        return Proposal()


class JobIndexes:
    """The :class:`PromptIndex` of each engine job's history (which only grows), from its admission to its release."""

    def __init__(self, max_match: int = MAX_MATCH) -> None:
        self.max_match = max_match
        self._of: dict[int, PromptIndex] = {}

    def track(self, job: Any) -> None:
        self._of[id(job)] = PromptIndex(self.max_match)

    def untrack(self, job: Any) -> None:
        self._of.pop(id(job), None)

    def of(self, job: Any) -> PromptIndex | None:
        """``job``'s index (None for a job not tracked)."""
        return self._of.get(id(job))


class NgramDrafter(StatelessLocalDrafter):
    """Prompt lookup over the request's tokens, else (or for a longer match) the pool; the pool extends a short
    prompt-lookup continuation to ``k`` tokens. Draft cost: a few array lookups per step."""

    def __init__(
        self,
        pool: NgramPool | None = None,
        max_match: int = MAX_MATCH,
        min_match: int = MIN_MATCH,
        use_prompt: bool = True,
    ) -> None:
        self.pool = pool
        self.max_match = max_match if pool is None else min(max_match, pool.max_match)
        self.min_match = min_match
        self.use_prompt = use_prompt

    def propose(self, context: Sequence[int], k: int, index: PromptIndex | None = None) -> Proposal:
        """Up to ``k`` tokens after ``context`` (``index``: that context's :class:`PromptIndex`, which then answers
        the prompt lookup)."""
        if k <= 0 or not context:
            return Proposal()
        if not self.use_prompt:
            local = Proposal()
        elif index is not None:
            local = index.lookup(context, k, self.min_match)
        else:
            local = prompt_lookup(context, k, self.max_match, self.min_match)
        # the pool's chain only where it could win: a longer match than the prompt's, or the prompt has none
        pooled = Proposal()
        if self.pool is not None and (local.match_len < self.pool.max_match or not local.tokens):
            pooled = self.pool.chain(context, k, self.min_match)
        if pooled.match_len > local.match_len:
            return pooled
        if local.tokens and len(local.tokens) < k and self.pool is not None:
            more = self.pool.chain(list(context) + local.tokens, k - len(local.tokens), self.min_match)
            return Proposal(local.tokens + more.tokens, local.match_len, local.source)
        return local if local.tokens else pooled

    # -- as the BLS orchestrator's drafter (trtspec.speculative.drafters.LocalDrafter) ---------------------------
    def new_state(self, sampling: Any = None) -> PromptIndex | None:
        """A request's prompt-lookup index (its sequence only grows from step to step)."""
        return PromptIndex(self.max_match) if self.use_prompt else None

    def plan(self, state: Any, seq: Sequence[int], k: int) -> tuple[list[int] | None, int]:
        """This step's n-gram tokens (possibly none: the target steps alone); the draft engine is never asked."""
        return self.propose(seq, k, state).tokens[:k], 0  # state: new_state's index, or None


class NgramEngineDrafter:
    """The in-flight engine's n-gram drafter (trtspec.speculative.drafters.EngineDrafter): prompt lookup + the pool
    per job and step; no KV cache, so it takes any number of jobs."""

    kind = DrafterKind.NGRAM

    def __init__(self, ngram: NgramDrafter, vocab: int) -> None:
        self.ngram = ngram
        self.vocab = vocab
        self.passes = 0
        self.proposals = 0  # proposals with at least one token
        self.indexes = JobIndexes(ngram.max_match)

    @property
    def free(self) -> int:
        return UNLIMITED

    def admit(self, job: Any) -> None:
        job.draft_state = self.kind
        self.indexes.track(job)

    def release(self, job: Any, keep: bool = True) -> None:
        job.draft_state = None
        self.indexes.untrack(job)

    def propose(self, jobs: list[Any], ks: list[int], batch_tokens: int = 0, batch_seqs: int = 0) -> list[Proposal]:
        t0 = time.perf_counter()
        out = [self.propose_one(job, k) for job, k in zip(jobs, ks)]
        dt = time.perf_counter() - t0
        for job in jobs:
            job.stats.draft_s += dt
        return out

    def propose_one(self, job: Any, k: int) -> Proposal:
        """The n-gram proposal after ``job``'s history (through its index when the job is tracked)."""
        found = self.ngram.propose(job.history(), k, self.indexes.of(job))
        tokens = in_vocab(found.tokens[:k], self.vocab)
        self.proposals += bool(tokens)
        return Proposal(tokens, found.match_len, found.source)

    def commit(self, job: Any, history_before: int, proposed: int, accepted: int) -> None:
        pass

    def observe_pass(self, tokens: int, seconds: float, rows: int = 0, verify_s: float = 0.0, seqs: int = 1) -> None:
        pass


def pool_for_spec(spec: Any, target_vocab: int | None = None) -> NgramPool | None:
    """The n-gram pool the spec's ngram / hybrid drafter reads (``speculative.ngram_pool``, else the draft's
    ``ngram_pool.npz``); None (prompt lookup only) when the default file is absent. GenerationError when a pool named
    in the spec is missing, or a pool is not one or was built for another vocabulary."""
    from trtspec.errors import GenerationError

    path = spec.ngram_pool_path
    if not path.is_file():
        if spec.speculative.ngram_pool is None:
            return None
        raise GenerationError(
            f"speculative.ngram_pool {path}: file not found",
            hint="trtspec distill writes ngram_pool.npz next to the draft",
        )
    try:
        pool = NgramPool.load(path)
    except ValueError as exc:
        raise GenerationError(
            str(exc), hint="trtspec distill writes ngram_pool.npz; set speculative.ngram_pool"
        ) from exc
    if target_vocab is not None and pool.vocab_size != target_vocab:
        raise GenerationError(
            f"{path}: built for a vocabulary of {pool.vocab_size}, the target has {target_vocab}",
            hint="rebuild the pool with trtspec distill for this target",
        )
    return pool
