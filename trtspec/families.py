"""Per-family facts, normalized: one vocabulary for configs of every supported architecture.

Register a family with ``@register_family``; unknown ``model_type`` values are rejected with the known ones listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import IncompatibleModelsError, ModelLoadError


@dataclass(frozen=True)
class Family:
    """What differs per model family: the TRT-LLM decoder type and checkpoint converter, and the MLP shape."""

    model_type: str
    decoder_type: str  # ModelOpt export_tensorrt_llm_checkpoint(decoder_type=...)
    convert_example: str  # TRT-LLM examples/... directory with convert_checkpoint.py
    gated_mlp: bool = True


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    _FAMILIES[family.model_type] = family
    return family


for _f in (
    Family("llama", "llama", "examples/models/core/llama"),
    Family("mistral", "llama", "examples/models/core/llama"),
    Family("qwen2", "qwen", "examples/models/core/qwen"),
    Family("qwen3", "qwen", "examples/models/core/qwen"),
    Family("gemma", "gemma", "examples/models/core/gemma"),
    Family("phi3", "phi3", "examples/models/core/phi"),
):
    register_family(_f)


def known_families() -> list[str]:
    return sorted(_FAMILIES)


def get_family(model_type: str) -> Family:
    try:
        return _FAMILIES[model_type]
    except KeyError:
        raise IncompatibleModelsError(
            f"model family '{model_type}' is not supported",
            hint=f"supported families: {', '.join(known_families())}",
        ) from None


@dataclass(frozen=True)
class NormalizedConfig:
    """A causal LM's config.json in one vocabulary, whatever the family calls its fields."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_theta: float | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    torch_dtype: str | None
    head_vocab_size: int | None = None  # a head over part of the vocabulary (trtspec's distilled drafts)

    @property
    def family(self) -> Family:
        return get_family(self.model_type)

    def param_counts(self) -> dict[str, int]:
        """Parameters by part: embedding, lm_head (0 when tied), decoder linears, norms."""
        h, L = self.hidden_size, self.num_layers
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h
        # Unknown families (runnable on the torch runtime) are counted as gated-MLP decoders.
        family = _FAMILIES.get(self.model_type)
        mlp = (3 if family is None or family.gated_mlp else 2) * h * self.intermediate_size
        return {
            "embedding": self.vocab_size * h,
            "lm_head": 0 if self.tie_word_embeddings else (self.head_vocab_size or self.vocab_size) * h,
            "linear": L * (attn + mlp),
            "norm": L * 2 * h + h,
        }

    @property
    def num_params(self) -> int:
        return sum(self.param_counts().values())


def _first(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _as_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


def normalize_config(cfg: dict[str, Any]) -> NormalizedConfig:
    """Normalize a config.json dict (raises ModelLoadError naming the missing field)."""
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    try:
        hidden = int(_first(cfg, "hidden_size", "n_embd", "d_model"))
        heads = int(_first(cfg, "num_attention_heads", "n_head"))
        layers = int(_first(cfg, "num_hidden_layers", "n_layer", "num_layers"))
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError) as exc:
        raise ModelLoadError(
            f"config.json lacks a required field ({exc})", hint="is this a causal LM config?"
        ) from None
    rope = _first(cfg, "rope_theta")
    if rope is None and isinstance(cfg.get("rope_parameters"), dict):
        rope = cfg["rope_parameters"].get("rope_theta")
    return NormalizedConfig(
        model_type=str(cfg.get("model_type", "unknown")),
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=int(_first(cfg, "num_key_value_heads", "n_head_kv", default=heads)),
        head_dim=int(_first(cfg, "head_dim", default=hidden // heads)),
        intermediate_size=int(_first(cfg, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)),
        max_position_embeddings=int(_first(cfg, "max_position_embeddings", "n_positions", "max_seq_len", default=2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=float(rope) if rope is not None else None,
        bos_token_id=(
            cfg.get("bos_token_id") if not isinstance(cfg.get("bos_token_id"), list) else cfg["bos_token_id"][0]
        ),
        eos_token_ids=_as_ids(cfg.get("eos_token_id")),
        pad_token_id=cfg.get("pad_token_id"),
        torch_dtype=_first(cfg, "dtype", "torch_dtype"),
        head_vocab_size=int(cfg["head_vocab_size"]) if cfg.get("head_vocab_size") else None,
    )


def read_config(model_dir: Path) -> NormalizedConfig:
    """Read and normalize ``model_dir/config.json`` without touching weights."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(
            f"{model_dir}: no such model directory",
            hint="point target.model / draft.model at a local HF model directory",
        )
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing", hint="a HF model directory needs config.json next to its weights")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})", hint="re-export or re-download the model") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: expected a JSON object", hint="re-export or re-download the model")
    return normalize_config(raw)
