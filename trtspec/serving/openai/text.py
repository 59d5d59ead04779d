"""Prompts for the OpenAI endpoints: the target tokenizer's chat template applied once, token counts, stop strings.

The frontend renders the chat template to text and sends it with ``apply_chat_template`` false, so the template is
applied exactly once, over the whole conversation. The models then tokenize that text with special tokens; where
that would add a BOS the template already wrote, the rendered BOS text is dropped so that the tokens Triton sees are
exactly ``apply_chat_template(messages, tokenize=True)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import ServerError


class PromptTokenizer:
    """The target's tokenizer as the frontend uses it."""

    def __init__(self, path: Path, add_special_tokens: bool = True) -> None:
        from trtspec.triton_repo.text import load_tokenizer

        if not Path(path).is_dir():
            raise ServerError(
                f"the served model's tokenizer directory {path} does not exist here",
                hint="serve the repository on the machine (or in the container) it was written for",
            )
        self.tok = load_tokenizer(path)
        self.add_special_tokens = add_special_tokens
        self.has_chat_template = bool(getattr(self.tok, "chat_template", None))

    def count(self, text: str) -> int:
        """Tokens the served model sees for ``text``."""
        return len(self.tok.encode(text, add_special_tokens=self.add_special_tokens))

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> tuple[str, int]:
        """(the text to send, its token count) for a conversation, with the generation prompt appended."""
        if not self.has_chat_template:
            raise ValueError("the served model's tokenizer has no chat template: use /v1/completions")
        text = self.tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        ids = _ids(self.tok.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True))
        sent = self.tok.encode(text, add_special_tokens=self.add_special_tokens)
        if sent != ids:
            text = _drop_duplicate_bos(self.tok, text, ids, sent)
        return text, len(ids)


def _ids(value: Any) -> list[int]:
    if isinstance(value, dict) or hasattr(value, "input_ids"):  # BatchEncoding in some transformers versions
        value = value["input_ids"]
    return [int(t) for t in value]


def _drop_duplicate_bos(tok: Any, text: str, ids: list[int], sent: list[int]) -> str:
    """The rendered text without its leading BOS when tokenizing it would add a second one."""
    bos_id = getattr(tok, "bos_token_id", None)
    bos = getattr(tok, "bos_token", None)
    if bos and bos_id is not None and sent[:2] == [bos_id, bos_id] and text.startswith(bos):
        return text[len(bos) :]
    return text


class StopMatcher:
    """OpenAI ``stop``: the text up to (not including) the first stop sequence; while streaming, text that could
    still begin a stop sequence is held back until it cannot."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """What may be emitted after ``text`` arrives (nothing once a stop sequence was seen)."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[: min(hits)], ""
            return out
        cut = len(self.pending) - self._partial()
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def _partial(self) -> int:
        """Length of the longest end of the pending text that begins a stop sequence."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """The held-back text at the end of generation."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out
