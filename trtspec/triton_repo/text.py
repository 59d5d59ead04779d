"""Text <-> tokens for the ``preprocessing`` and ``postprocessing`` models, independent of Triton.

Preprocessing does what TRT-LLM's does (tokenize ``text_input``, word lists for ``stop_words`` / ``bad_words``, default
``end_id`` / ``pad_id`` from the tokenizer) and does not apply the chat template unless the request asks for it
(``apply_chat_template``): ``text_input`` stays the exact prompt, as existing Triton LLM clients expect.

Postprocessing is stateless, yet streams multi-byte characters correctly: each response carries the sequence's
recent tokens and how many of them earlier responses already covered (``decoded_length``); the text of a response is
what decoding all of them adds to decoding the covered ones, and an incomplete character at the end (one U+FFFD from
a partial UTF-8 sequence) is held back until a later response completes it, or the final one flushes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import GenerationError

REPLACEMENT = "\ufffd"


class FastTokenizer:
    """The subset of a transformers tokenizer that pre/postprocessing use, on the ``tokenizers`` library alone.

    Importing transformers costs seconds per Python stub; ``tokenizers`` loads in milliseconds and is what a
    transformers fast tokenizer runs underneath (same ids, same text). The chat template, when a request asks for
    it, loads the transformers tokenizer once.
    """

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        from trtspec.build.tokenizers import read_tokenizer

        self.path = Path(path)
        self._tok = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        info = read_tokenizer(self.path)
        self.eos_token_id = info.special_ids.get("eos")
        pad = info.special_ids.get("pad")
        self.pad_token_id = pad if pad is not None else self.eos_token_id
        cfg = self.path / "tokenizer_config.json"
        self.chat_template = None
        if cfg.is_file():
            import json

            self.chat_template = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
        if self.chat_template is None and (self.path / "chat_template.jinja").is_file():
            self.chat_template = (self.path / "chat_template.jinja").read_text(encoding="utf-8")
        self._hf: Any = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch releases the GIL while it works, encode does not (measured: a 1.8 MB text held it 1.8 s), so
        # a long prompt tokenized on a worker thread does not stop the OpenAI frontend's event loop.
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def decode(
        self, ids: list[int], skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = False
    ) -> str:
        text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if clean_up_tokenization_spaces else text

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tokenize: bool = True
    ) -> Any:
        if self._hf is None:
            from trtspec.runtimes.torch.loading import load_tokenizer as _load

            self._hf = _load(self.path)
        return self._hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize)


def _clean_up(text: str) -> str:
    for a, b in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(a, b)
    return text


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a model directory: the light FastTokenizer when tokenizer.json exists, else transformers'."""
    path = Path(path)
    if (path / "tokenizer.json").is_file():
        return FastTokenizer(path)
    from trtspec.runtimes.torch.loading import load_tokenizer as _load

    tok = _load(path)
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def decode_text(value: Any, what: str = "text_input") -> str:
    """A request's BYTES element as text; invalid UTF-8 is an error, not a guess."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GenerationError(
            f"{what} is not valid UTF-8 (byte {exc.start}: {exc.reason})", hint="send text encoded as UTF-8"
        ) from None


class Preprocessor:
    """Tokenize prompts and word lists with the target's tokenizer."""

    def __init__(self, tokenizer: Any, add_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.add_special_tokens = add_special_tokens
        self.end_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else -1
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.end_id

    def encode(self, text: str, chat: bool = False) -> list[int]:
        if chat:
            if not getattr(self.tok, "chat_template", None):
                raise GenerationError(
                    "apply_chat_template was requested but the tokenizer has no chat template",
                    hint="send the prompt as plain text (apply_chat_template false)",
                )
            ids = self.tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in some versions
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        ids = self.tok.encode(text, add_special_tokens=self.add_special_tokens)
        if not ids:
            raise GenerationError("text_input is empty after tokenization", hint="send a non-empty prompt")
        return [int(t) for t in ids]

    def words(self, items: Sequence[Any], what: str) -> list[list[int]]:
        """One token sequence per non-empty string (TRT-LLM's word-list input: one word or phrase per element)."""
        out = []
        for item in items:
            text = decode_text(item, what)
            if text:
                out.append([int(t) for t in self.tok.encode(text, add_special_tokens=False)])
        return out


def _stable(text: str) -> str:
    """Text without a trailing incomplete character.

    Lossy UTF-8 decoding (Rust's and Python's) turns an incomplete sequence at the end into exactly one U+FFFD, so
    only the last one can still change; earlier ones are invalid bytes for good and are delivered. An incomplete
    character is at most 3 bytes, so 3 tokens of context in a streamed response suffice (the orchestrator sends 32).
    """
    return text[:-1] if text.endswith(REPLACEMENT) else text


class Postprocessor:
    """Decode output tokens; incremental and multi-byte safe when streaming (see module docstring)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip_special_tokens = skip_special_tokens

    def decode(self, tokens: Sequence[int]) -> str:
        # No clean-up of spaces before punctuation: it would make a text's prefix differ from the prefix's text.
        return self.tok.decode(
            list(tokens), skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def delta(self, tokens: Sequence[int], decoded_length: int, final: bool) -> str:
        """The text ``tokens`` add after their first ``decoded_length`` (already delivered) tokens."""
        whole = self.decode(tokens)
        if not final:
            whole = _stable(whole)
        if decoded_length <= 0:
            return whole
        before = _stable(self.decode(tokens[:decoded_length]))
        if whole.startswith(before):
            return whole[len(before) :]
        # Decoding is not prefix-stable for this tokenizer here (rare normalizations): emit from the first difference.
        i = 0
        while i < min(len(whole), len(before)) and whole[i] == before[i]:
            i += 1
        return whole[i:]
