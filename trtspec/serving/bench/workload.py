"""What a benchmark sends: prompts with their output lengths, from the built-in set, a prompt file, or synthetic
length distributions."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import GenerationError

BUILTIN_PROMPTS = [
    "What is speculative decoding, in two sentences?",
    "Write a short poem about the sea.",
    "Explain what a hash table is to a ten-year-old.",
    "List three uses of a GPU besides graphics.",
    "What is the capital of France, and why is it famous?",
    "Give me a recipe for pancakes.",
    "Describe the water cycle.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "What are the benefits of regular exercise?",
    "How does a bicycle stay upright?",
]
# Common English words, each one token in the usual BPE vocabularies: synthetic prompts of about N tokens.
WORDS = (
    "the of and to in is was for on that with as by at from his an were are which this be have had one "
    "not but all or when they there first time been who more will into up about out so some people year "
    "can new two only also after other most work world over state many day city long life part way then "
    "these water system school three great house home place small number high show large old might same "
    "under team play music family food light story model early"
).split()


@dataclass(frozen=True)
class Item:
    """One request of the workload."""

    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    """The items (cycled through in order) and how they were made."""

    name: str
    items: list[Item]

    def describe(self) -> dict[str, Any]:
        outs = [i.max_tokens for i in self.items]
        words = [len(i.prompt.split()) for i in self.items]
        return {
            "name": self.name,
            "prompts": len(self.items),
            "max_tokens": {"min": min(outs), "mean": round(statistics.fmean(outs), 1), "max": max(outs)},
            "prompt_words": {"min": min(words), "mean": round(statistics.fmean(words), 1), "max": max(words)},
        }

    def label(self) -> str:
        outs = sorted({i.max_tokens for i in self.items})
        out = str(outs[0]) if len(outs) == 1 else f"{outs[0]}-{outs[-1]}"
        return f"{self.name}, {len(self.items)} prompts, max_tokens {out}"


def _spread(rng: random.Random, mean: int, spread: float) -> int:
    lo, hi = max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))
    return rng.randint(lo, hi)


def synthetic(input_len: int, output_len: int, n: int = 32, spread: float = 0.25, seed: int = 0) -> Workload:
    """``n`` prompts of about ``input_len`` words (about as many tokens) asking for about ``output_len`` tokens, each
    length uniform within +-``spread`` of its mean."""
    if input_len < 1 or output_len < 1:
        raise GenerationError(f"synthetic lengths must be >= 1 (got {input_len},{output_len})", hint="e.g. 128,64")
    if not 0 <= spread < 1:
        raise GenerationError(f"--length-spread must be in [0, 1) (got {spread})", hint="e.g. 0.25")
    rng = random.Random(seed)
    items = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(_spread(rng, input_len, spread))]
        items.append(Item(f"{i}: " + " ".join(words), _spread(rng, output_len, spread)))
    label = f"synthetic in~{input_len} out~{output_len}" + (f" +-{round(spread * 100)}%" if spread else "")
    return Workload(label, items)


def load_workload(path: Path | None, max_tokens: int) -> Workload:
    """Prompts from a text file (one a line) or JSONL (``text`` or ``prompt``, optional ``max_tokens`` or
    ``output_len`` per prompt); None: the built-in set. Prompts without a length ask for ``max_tokens``."""
    if path is None:
        return Workload("built-in", [Item(p, max_tokens) for p in BUILTIN_PROMPTS])
    if not path.is_file():
        raise GenerationError(f"{path}: no such prompts file", hint="one prompt a line, or JSONL with 'text'")
    items = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not line.startswith("{"):
            items.append(Item(line, max_tokens))
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GenerationError(f"{path}:{i}: not valid JSON ({exc.msg})", hint="one object a line") from None
        text = obj.get("text") or obj.get("prompt")
        if not isinstance(text, str):
            raise GenerationError(f"{path}:{i}: no 'text' or 'prompt' string", hint="one object a line")
        n = obj.get("max_tokens", obj.get("output_len", max_tokens))
        if not isinstance(n, int) or n < 1:
            raise GenerationError(
                f"{path}:{i}: max_tokens must be a positive integer (got {n!r})",
                hint="or leave it out to use --max-tokens",
            )
        items.append(Item(text, n))
    if not items:
        raise GenerationError(f"{path}: no prompts", hint="one prompt a line")
    return Workload(str(path), items)


def load_prompts(path: Path | None) -> list[str]:
    """The prompts alone (built-in set when ``path`` is None)."""
    return [i.prompt for i in load_workload(path, 1).items]
