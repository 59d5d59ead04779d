"""OpenAI's ``logprobs`` objects from the target's token log-probabilities (trtspec.speculative.rules.TokenLogprob).

Chat completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
"refusal": null}``; completions (legacy): ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
"text_offset"}``. A token's text is the tokenizer's own string for that one token (a token that ends inside a
multi-byte character shows the replacement character, as in OpenAI's API; ``bytes`` are that text's UTF-8).
The values are the target's log-softmax at each position, before temperature, top-k and top-p: the same with and
without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtspec.speculative.rules import TokenLogprob


class TokenTexts:
    """Token id -> its text, with the served tokenizer (cached)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self.cache.get(token)
        if text is None:
            text = self.tok.decode([int(token)], skip_special_tokens=False)
            self.cache[token] = text
        return text


def _entry(texts: TokenTexts, token: int, logprob: float) -> dict[str, Any]:
    text = texts(token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(items: Sequence[TokenLogprob], texts: TokenTexts) -> dict[str, Any]:
    """A chat choice's (or chunk's) ``logprobs`` for ``items``."""
    content = [
        {**_entry(texts, t.token, t.logprob), "top_logprobs": [_entry(texts, i, v) for i, v in t.top]} for t in items
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(items: Sequence[TokenLogprob], texts: TokenTexts, offset: int = 0) -> dict[str, Any]:
    """A completion choice's (or chunk's) ``logprobs``; ``offset``: characters of text before the first token."""
    tokens = [texts(t.token) for t in items]
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    return {
        "tokens": tokens,
        "token_logprobs": [t.logprob for t in items],
        "top_logprobs": [{texts(i): v for i, v in t.top} for t in items],
        "text_offset": offsets,
    }
