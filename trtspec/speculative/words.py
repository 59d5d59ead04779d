"""Stop words and bad words on token sequences (TRT-LLM semantics); no torch, so the orchestrator stays light."""

from __future__ import annotations

from collections.abc import Sequence


def hits_stop_word(seq: Sequence[int], stop_words: Sequence[Sequence[int]]) -> bool:
    return any(len(w) and len(seq) >= len(w) and list(seq[-len(w) :]) == list(w) for w in stop_words)


def banned_tokens(seq: Sequence[int], bad_words: Sequence[Sequence[int]]) -> list[int]:
    """Tokens that would complete a bad word after ``seq`` (TRT-LLM bad_words_list semantics)."""
    out = []
    for w in bad_words:
        if not len(w):
            continue
        prefix = list(w[:-1])
        if not prefix or (len(seq) >= len(prefix) and list(seq[-len(prefix) :]) == prefix):
            out.append(int(w[-1]))
    return out
