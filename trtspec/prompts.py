"""Prompt sets: the one that ships with trtspec (the distillation set, whose held-out part `trtspec tune` and the
benchmarks measure on), prompt and traffic files, a stable train/held-out split, and encoding through the chat
template. No torch: the CLI validates prompt files with it first."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from trtspec.errors import DistillError

Prompt = str | Sequence[dict[str, str]]  # a user turn, or a conversation (chat messages ending with a user turn)

HELD_OUT = 0.06  # the fraction of a prompt set `trtspec distill` holds out by default (``split_prompts``)


def shipped_prompts() -> Path:
    """The prompt set that ships with trtspec (scripts/make_distill_prompts.py writes it)."""
    return Path(str(resources.files("trtspec") / "data" / "distill_prompts.jsonl"))


def _read_texts(path: Path, keys: tuple[str, ...], prompts: bool) -> list[Prompt]:
    """One text per non-empty line, or per JSONL object (the first of ``keys`` holding a string; for ``prompts``, a
    non-empty one, and lines are stripped, or ``messages``: a conversation ending with a user turn)."""
    out: list[Prompt] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            out.append(line.strip() if prompts else line)
            continue
        try:
            obj = json.loads(line)
            text = next((obj[k] for k in keys if isinstance(obj.get(k), str) and (obj[k] or not prompts)), None)
        except (json.JSONDecodeError, AttributeError):
            obj, text = None, None
        conversation = _conversation(obj) if prompts and text is None else None
        if text is None and conversation is None:
            names = ", ".join(f"'{k}'" for k in keys)
            also = " or a 'messages' conversation ending with a user turn" if prompts else ""
            raise DistillError(
                f"{path}:{n}: not a JSON object with a {names} string{also}",
                hint=f'one JSON object per line, e.g. {{"{keys[0]}": "..."}}',
            )
        out.append(text if text is not None else conversation)  # type: ignore[arg-type]
    return out


def _conversation(obj: Any) -> list[dict[str, str]] | None:
    """A JSONL object's ``messages`` when they are a conversation that ends with a user turn, else None."""
    messages = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(messages, list) or not messages or messages[-1].get("role") != "user":
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages):
        return None
    return [{"role": str(m["role"]), "content": m["content"]} for m in messages]


def load_prompts(path: Path | None) -> list[Prompt]:
    """Prompts from a text file (one per line) or JSONL (a ``prompt`` or ``text`` string, or ``messages``: a
    conversation ending with a user turn); the shipped set by default."""
    path = path or shipped_prompts()
    if not path.is_file():
        raise DistillError(f"{path}: prompt file not found", hint="pass --prompts FILE (one prompt per line, or JSONL)")
    out = _read_texts(path, ("prompt", "text"), prompts=True)
    if len(out) < 2:
        raise DistillError(
            f"{path}: needs at least 2 prompts, found {len(out)}", hint="give a training and a held-out prompt at least"
        )
    return out


def load_texts(path: Path) -> list[str]:
    """Texts of a traffic file (the target's outputs as served): one per line, or JSONL with a ``response``,
    ``output``, ``completion`` or ``text`` string."""
    keys = ("response", "output", "completion", "text")
    out = [t for t in _read_texts(path, keys, prompts=False) if isinstance(t, str)]
    if not out:
        raise DistillError(f"{path}: no texts", hint="one text per line, or JSONL with 'response'")
    return out


def prompt_key(prompt: Prompt) -> str:
    """A prompt's identity as text: the user turn itself, or a conversation's messages as JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(list(prompt), ensure_ascii=False, sort_keys=True)


def split_prompts(prompts: Sequence[Prompt], held_out: float) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held-out) by a hash of each prompt's text (:func:`prompt_key`): stable under reordering and additions."""

    def bucket(prompt: Prompt) -> float:
        return int(hashlib.sha256(prompt_key(prompt).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF

    train = [p for p in prompts if bucket(p) >= held_out]
    test = [p for p in prompts if bucket(p) < held_out]
    if not test:  # tiny prompt sets: hold out the last one rather than nothing
        train, test = train[:-1], train[-1:]
    if not train:
        train, test = test[:-1], test[-1:]
    return train, test


def encode_prompt(tokenizer: Any, text: str, chat: bool = True) -> list[int]:
    """Token ids of a prompt, through the chat template when the tokenizer has one and ``chat`` is set (what
    ``TorchSession.encode`` runs, so distillation, tune and serving in process tokenize alike)."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        return list(ids if isinstance(ids, list) else ids["input_ids"])
    ids = list(tokenizer.encode(text))
    return ids if ids else [tokenizer.bos_token_id or 0]


def encode(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of a user turn (:func:`encode_prompt`) or of a conversation (:func:`encode_messages`)."""
    return encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else encode_messages(tokenizer, prompt)


def encode_messages(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a conversation through the chat template (a generation prompt for the assistant's next turn);
    without a template, the turns' texts joined by newlines."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])
    return encode_prompt(tokenizer, "\n".join(m["content"] for m in messages), chat=False)


WORKLOAD_CATEGORIES = ("chat", "code", "summarization", "rag", "translation", "math")


def workloads(path: Path | None = None) -> dict[str, list[list[dict[str, str]]]]:
    """The workload prompt set per category (``trtspec/data/workloads.jsonl``, written for trtspec: multi-turn chat,
    code, summarization, retrieval-grounded QA, translation, math reasoning): conversations as chat messages. The
    benchmarks and `trtspec tune --workloads` measure drafters on it; distillation never trains on it."""
    path = path or Path(str(resources.files("trtspec") / "data" / "workloads.jsonl"))
    out: dict[str, list[list[dict[str, str]]]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            category, messages = str(obj["category"]), list(obj["messages"])
            if not messages or not all(isinstance(m.get("content"), str) for m in messages):
                raise ValueError("empty conversation")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DistillError(
                f"{path}:{n}: not a workload line ({exc})",
                hint='one JSON object per line: {"category": "chat", "messages": [{"role": "user", "content": "..."}]}',
            ) from None
        out.setdefault(category, []).append(messages)
    return out


def held_out_prompts(n: int, held_out: float = HELD_OUT) -> list[Prompt]:
    """The first ``n`` held-out prompts of the shipped set (the ones `trtspec distill` never trains on by default)."""
    return split_prompts(load_prompts(None), held_out)[1][:n]
