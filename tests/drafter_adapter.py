"""TEST ADAPTER (tests only, never shipped): a token drafter seen by today's ``SpeculativeDecoder`` as a draft model.

Until the decoding core calls ``trtspec.engines.drafters`` itself (issue 15 phase 2), this is how n-gram proposals
reach the real decoder's verification unchanged: at the first draft forward of a step the adapter asks the drafter
for its proposal from the row's tokens (rebuilt from the position ids ``ModelState`` passes), and returns it one token
per forward as logits peaked on that token. It checks nothing and decides nothing about acceptance: the decoder's own
verification does. Batch 1 only (it cannot see ``ModelState.select``).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

PEAK = 40.0  # logit of the proposed token (0 elsewhere): q is a point mass to float precision


class DrafterAsDraftModel(torch.nn.Module):
    def __init__(self, drafter, vocab_size: int, k: int) -> None:
        super().__init__()
        self.drafter = drafter
        self.k = k
        self.vocab_size = vocab_size
        self.config = SimpleNamespace(vocab_size=vocab_size, max_position_embeddings=1 << 20)
        self.head = torch.nn.Embedding(vocab_size, 1)  # only its shape is read (vocabulary check)
        self.history: list[int] = []
        self.queue: list[int] = []
        self.last: int | None = None
        self.next_pos = 0
        self.proposals = 0  # steps where the drafter proposed something

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def _logits(self, tok: int, keep: int) -> SimpleNamespace:
        logits = torch.zeros(1, keep, self.vocab_size)
        logits[0, -1, tok] = PEAK
        return SimpleNamespace(logits=logits)

    def forward(self, input_ids, position_ids=None, attention_mask=None, cache=None, use_cache=True,
                logits_to_keep=1, **_):
        assert input_ids.shape[0] == 1, "the test adapter decodes batch 1 only"
        fed = input_ids[0].tolist()
        pos = int(position_ids[0, 0]) if position_ids is not None else len(self.history)
        own = (len(fed) == 1 and pos == self.next_pos and fed[0] == self.last and self.queue)
        self.history = self.history[:pos] + fed
        self.next_pos = pos + len(fed)
        if own:
            tok = self.queue.pop(0)
        else:
            proposal = self.drafter.propose(self.history, self.k)
            self.queue = list(proposal.tokens)
            self.proposals += bool(self.queue)
            tok = self.queue.pop(0) if self.queue else 0
        self.last = tok
        return self._logits(tok, logits_to_keep if isinstance(logits_to_keep, int) and logits_to_keep else 1)
