"""The output tensors of a draft-target model (the orchestrator, or the torch runtime's in-process one).

Between preprocessing and postprocessing the contract is token level: ``output_ids`` [B, 1, L], ``sequence_length``,
``decoded_length`` and ``is_final`` (trtspec: a streamed response carries a few tokens of context before the new ones,
so that postprocessing decodes characters split across tokens exactly), and TensorRT-LLM's statistics outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trtspec.runtimes.inflight.contract import RowRequest
from trtspec.speculative.rules import SpecStats


class RowsOutput:
    """The generated tokens and statistics of one request's rows, and their response tensors."""

    def __init__(self, rows: Sequence[RowRequest], context_tokens: int) -> None:
        self.rows = list(rows)
        self.out: list[list[int]] = [[] for _ in rows]
        self.sent = [0 for _ in rows]
        self.stats = [SpecStats(num_input_tokens=len(r.tokens)) for r in rows]
        self.context = context_tokens
        # Per row with return_log_probs: the engine job's TokenLogprob list (trtspec.speculative.acceptance), one per
        # token of ``out``; set by the model when it makes the job.
        self.logprobs: list[list[Any] | None] = [None for _ in rows]

    def tensors(self, streaming: bool, final: bool) -> dict[str, np.ndarray]:
        """Every output tensor, as numpy: streamed (new tokens plus context) or whole (with the prompt unless
        excluded)."""
        batch = len(self.rows)
        seqs, decoded, starts = [], [], []
        for b, row in enumerate(self.rows):
            if streaming:
                start = max(0, self.sent[b] - self.context)
                seqs.append(self.out[b][start:])
                decoded.append(self.sent[b] - start)
                self.sent[b] = len(self.out[b])
            else:
                start = 0
                seqs.append(self.out[b] if row.exclude_input else row.tokens + self.out[b])
                decoded.append(0)
            starts.append(start)
        width = max(1, max(len(s) for s in seqs))
        ids = np.zeros((batch, 1, width), dtype=np.int32)
        for b, s in enumerate(seqs):
            ids[b, 0, : len(s)] = s

        def col(values: list, dtype: type) -> np.ndarray:
            return np.asarray(values, dtype=dtype).reshape(batch, 1)

        st = self.stats
        out = {
            "output_ids": ids,
            "sequence_length": col([len(s) for s in seqs], np.int32),
            "decoded_length": col(decoded, np.int32),
            "is_final": col([final] * batch, np.bool_),
            "acceptance_rate": col([s.acceptance_rate for s in st], np.float32),
            "total_accepted_draft_tokens": col([s.total_accepted_draft_tokens for s in st], np.int32),
            "total_draft_tokens": col([s.total_draft_tokens for s in st], np.int32),
            "num_input_tokens": col([len(r.tokens) for r in self.rows], np.int32),
            "num_output_tokens": col([len(o) for o in self.out], np.int32),
            "arrival_time_ns": col([s.arrival_time_ns for s in st], np.int64),
            "first_token_time_ns": col([s.first_token_time_ns for s in st], np.int64),
            "last_token_time_ns": col([s.last_token_time_ns for s in st], np.int64),
        }
        if any(lp is not None for lp in self.logprobs):
            out.update(self._logprob_tensors(seqs, starts))
        return out

    def _logprob_tensors(self, seqs: list[list[int]], starts: list[int]) -> dict[str, np.ndarray]:
        """output_log_probs [B, 1, L] aligned with output_ids (0 at prompt positions), cum_log_probs [B, 1] over the
        generated tokens so far, and with top_logprobs N: output_top_ids / output_top_log_probs [B, L, N]."""
        batch, width = len(self.rows), max(1, max(len(s) for s in seqs))
        top = max(r.top_logprobs for r in self.rows)
        lp = np.zeros((batch, 1, width), dtype=np.float32)
        cum = np.zeros((batch, 1), dtype=np.float32)
        ids = np.zeros((batch, width, top), dtype=np.int32)
        tops = np.full((batch, width, top), -np.inf, dtype=np.float32)
        for b, seq in enumerate(seqs):
            got = self.logprobs[b]
            if got is None:
                continue
            prompt = len(seq) - (len(self.out[b]) - starts[b])  # tokens of the prompt at the front (not excluded)
            mine = got[starts[b] : starts[b] + len(seq) - prompt]
            cum[b, 0] = sum(t.logprob for t in got[: len(self.out[b])])
            for j, t in enumerate(mine):
                lp[b, 0, prompt + j] = t.logprob
                for n, (tok, value) in enumerate(t.top):
                    ids[b, prompt + j, n], tops[b, prompt + j, n] = tok, value
        out: dict[str, np.ndarray] = {"output_log_probs": lp, "cum_log_probs": cum}
        if top:
            out |= {"output_top_ids": ids, "output_top_log_probs": tops}
        return out
