"""What the OpenAI frontend refuses before it does any work for a request: a body over the size limit (413), JSON that
does not parse, nests too deeply or holds a string that is not Unicode (400), and a prompt so long in characters
that it cannot fit the model's input in tokens (400, before tokenizing).

The character bound is exact, not a guess: no token of the tokenizer spells more than ``longest_token_chars``
characters, so a text of more than ``max_input_len * longest_token_chars`` characters has more than
``max_input_len`` tokens (a factor 2 covers normalizers that compose characters). Parsing and tokenizing run on
worker threads (trtspec.serving.openai.app), so the event loop keeps answering /health while a large body is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trtspec.serving.openai.protocol import OpenAIError, bad_field

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # a 32k-token prompt is ~130 kB of text; JSON escapes may take 6x
DEFAULT_MAX_JSON_DEPTH = 32  # OpenAI's own bodies nest 5 deep (messages -> content parts -> text)


@dataclass(frozen=True)
class Limits:
    """The frontend's request limits."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_prompt_chars: int = 0  # 0: no character bound (the token check still applies)


def too_large(limit: int, size: int | None = None) -> OpenAIError:
    said = f" ({size} bytes)" if size is not None else ""
    return OpenAIError(
        413,
        f"the request body{said} is larger than this server's limit of {limit} bytes",
        code="request_too_large",
    )


async def read_body(request: Any, limit: int) -> bytes:
    """The request's body, or a 413 as soon as it is known to exceed ``limit`` (from Content-Length, or while
    reading a body sent without one), before the rest is read."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise OpenAIError(400, "the Content-Length header is not a number", code="invalid_request") from None
        if size > limit:
            raise too_large(limit, size)
    parts: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def parse_body(raw: bytes, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Any:
    """The JSON body, checked: nesting at most ``max_depth`` deep, every string (keys too) valid Unicode.
    Raises OpenAIError 400 in OpenAI's words otherwise. Runs on a worker thread (it may take a while)."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OpenAIError(
            400, f"We could not parse the JSON body of your request ({exc.msg}).", code="invalid_json"
        ) from None
    except UnicodeDecodeError:
        raise OpenAIError(400, "the request body is not UTF-8 (nor UTF-16/32) text", code="invalid_json") from None
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError:  # an integer of more than 4300 digits (Python's limit for reading one)
        raise OpenAIError(
            400,
            "the JSON body holds a number of more than 4300 digits, which this server does not read",
            code="invalid_json",
        ) from None
    check_tree(body, max_depth)
    return body


def _too_deep(max_depth: int) -> OpenAIError:
    return OpenAIError(400, f"the JSON body nests deeper than {max_depth} levels", code="invalid_json")


def check_tree(body: Any, max_depth: int) -> None:
    """Depth and Unicode of a parsed JSON value, without recursion."""
    stack: list[tuple[Any, int, str]] = [(body, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            _check_text(value, where)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > max_depth:
            raise _too_deep(max_depth)
        if isinstance(value, dict):
            for key, item in value.items():
                path = f"{where}.{key}" if where else str(key)
                _check_text(key, where or "body")
                stack.append((item, depth + 1, path))
        else:
            stack.extend((item, depth + 1, f"{where}.{i}") for i, item in enumerate(value))


def _check_text(s: str, where: str) -> None:
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = s[exc.start]
        raise bad_field(
            where or "body",
            f"the text holds a lone surrogate (U+{ord(bad):04X} at character {exc.start}), which is not valid "
            "Unicode: encode the text as UTF-8, or send the character's surrogate pair",
            code="invalid_unicode",
        ) from None


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` spells (its vocabulary's longest entry: byte-level and
    SentencePiece entries spell at least as many characters as they match)."""
    vocab = tokenizer.get_vocab()
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    longest = max((len(t) for t in vocab), default=1)
    longest = max([longest, *(len(str(getattr(t, "content", t))) for t in added.values())])
    return max(1, longest)


def prompt_char_limit(tokenizer: Any, max_input_len: int) -> int:
    """Characters beyond which a prompt cannot fit ``max_input_len`` tokens (0: no bound known)."""
    if max_input_len <= 0:
        return 0
    return 2 * max_input_len * longest_token_chars(tokenizer)


def check_prompt_chars(where: str, chars: int, limits: Limits, max_input_len: int) -> None:
    """A 400 ``context_length_exceeded`` for a prompt too long in characters to fit in tokens, before tokenizing."""
    if limits.max_prompt_chars and chars > limits.max_prompt_chars:
        raise bad_field(
            where,
            f"the prompt has {chars} characters, more than the {max_input_len} tokens of this model's maximum input "
            f"can hold (at most {limits.max_prompt_chars} characters)",
            code="context_length_exceeded",
        )
