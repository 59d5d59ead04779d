"""Read a tokenizer's token-to-id mapping and special tokens from its files, without importing transformers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import ModelLoadError


@dataclass(frozen=True)
class TokenizerInfo:
    vocab: dict[str, int]
    special_ids: dict[str, int | None]  # bos / eos / pad / unk as the tokenizer config names them
    source: str


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})", hint="re-export or re-download the tokenizer") from None


def _vocab_from_tokenizer_json(data: dict[str, Any]) -> dict[str, int]:
    model = data.get("model") or {}
    raw = model.get("vocab")
    vocab: dict[str, int] = {}
    if isinstance(raw, dict):
        vocab.update({str(k): int(v) for k, v in raw.items()})
    elif isinstance(raw, list):  # Unigram: [[piece, score], ...], id = position
        vocab.update({str(item[0]): i for i, item in enumerate(raw)})
    for added in data.get("added_tokens") or []:
        vocab[str(added["content"])] = int(added["id"])
    return vocab


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def read_tokenizer(model_dir: Path) -> TokenizerInfo:
    """Token-to-id mapping from tokenizer.json (or vocab.json + added_tokens.json) and its special tokens."""
    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").is_file():
        vocab = _vocab_from_tokenizer_json(_load_json(model_dir / "tokenizer.json"))
        source = "tokenizer.json"
    elif (model_dir / "vocab.json").is_file():
        vocab = {str(k): int(v) for k, v in _load_json(model_dir / "vocab.json").items()}
        if (model_dir / "added_tokens.json").is_file():
            vocab.update({str(k): int(v) for k, v in _load_json(model_dir / "added_tokens.json").items()})
        source = "vocab.json"
    else:
        raise ModelLoadError(
            f"{model_dir}: no tokenizer.json or vocab.json",
            hint="save the tokenizer next to the model (tokenizer.save_pretrained(dir))",
        )
    if not vocab:
        raise ModelLoadError(f"{model_dir / source}: empty vocabulary", hint="re-export the tokenizer")
    special: dict[str, int | None] = {}
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = _load_json(cfg_path) if cfg_path.is_file() else {}
    for name in ("bos", "eos", "pad", "unk"):
        text = _token_text(cfg.get(f"{name}_token"))
        special[name] = vocab.get(text) if text is not None else None
    return TokenizerInfo(vocab=vocab, special_ids=special, source=source)


def first_vocab_difference(a: dict[str, int], b: dict[str, int]) -> str | None:
    """Describe the lowest token id at which two token-to-id mappings differ; None when identical."""
    if a == b:
        return None
    inv_a = {v: k for k, v in a.items()}
    inv_b = {v: k for k, v in b.items()}
    for i in sorted(set(inv_a) | set(inv_b)):
        ta, tb = inv_a.get(i), inv_b.get(i)
        if ta != tb:
            return f"token id {i}: target {ta!r}, draft {tb!r}"
    return "the same ids map to different token sets"  # unreachable for well-formed vocabularies
