"""The output tensors of a draft-target model (the orchestrator, or the torch runtime's in-process one).

Between preprocessing and postprocessing the contract is token level: ``output_ids`` [B, 1, L], ``sequence_length``,
``decoded_length`` and ``is_final`` (trtspec: a streamed response carries a few tokens of context before the new ones,
so that postprocessing decodes characters split across tokens exactly), and TensorRT-LLM's statistics outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

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

    def tensors(self, streaming: bool, final: bool) -> dict[str, np.ndarray]:
        """Every output tensor, as numpy: streamed (new tokens plus context) or whole (with the prompt unless
        excluded)."""
        batch = len(self.rows)
        seqs, decoded = [], []
        for b, row in enumerate(self.rows):
            if streaming:
                start = max(0, self.sent[b] - self.context)
                seqs.append(self.out[b][start:])
                decoded.append(self.sent[b] - start)
                self.sent[b] = len(self.out[b])
            else:
                seqs.append(self.out[b] if row.exclude_input else row.tokens + self.out[b])
                decoded.append(0)
        width = max(1, max(len(s) for s in seqs))
        ids = np.zeros((batch, 1, width), dtype=np.int32)
        for b, s in enumerate(seqs):
            ids[b, 0, : len(s)] = s

        def col(values: list, dtype: type) -> np.ndarray:
            return np.asarray(values, dtype=dtype).reshape(batch, 1)

        st = self.stats
        return {
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
