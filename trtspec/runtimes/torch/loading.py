"""Load a causal LM and its tokenizer for the torch runtime (quantized ModelOpt exports with their scales applied;
a distilled draft's frequent-token head applied, see ``frequent_head``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.errors import ModelLoadError


def _torch_dtype(dtype: str) -> Any:
    import torch

    try:
        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}", hint="one of float32, float16, bfloat16") from None


def load_model(
    path: Path | str, dtype: str = "float32", device_map: str | None = None, frequent_head: bool = True
) -> Any:
    """An eval-mode causal LM from a local directory; ModelOpt exports go through the quantized loader.

    ``device_map`` ("auto": spread over the GPUs) goes to ``from_pretrained``; ``frequent_head=False`` keeps a
    distilled draft's full vocabulary head (what every other runtime computes)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path}: not a model directory (no config.json)", hint="point at a local HF model dir")
    try:
        from trtspec.runtimes.torch import quantized_loader
    except ImportError:
        quantized_loader = None  # type: ignore[assignment]
    if quantized_loader is not None and quantized_loader.is_modelopt_checkpoint(path):
        model = quantized_loader.load_modelopt_checkpoint(path, dtype)
    else:
        from transformers import AutoModelForCausalLM

        from trtspec.runtimes.torch.draft_model import register as register_draft

        register_draft()  # drafts of older trtspec versions (model type trtspec_draft) load like any HF model
        extra = {"device_map": device_map} if device_map else {}
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=_torch_dtype(dtype), **extra)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(
                f"{path}: cannot load model ({str(exc).splitlines()[0]})",
                hint="is it a complete HF causal-LM directory?",
            ) from None
    if frequent_head:
        from trtspec.runtimes.torch.frequent_head import apply_frequent_head

        apply_frequent_head(model)
    model.eval()
    return model


def load_tokenizer(path: Path | str) -> Any:
    """The tokenizer saved next to a model."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(Path(path))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{path}: cannot load tokenizer ({str(exc).splitlines()[0]})", hint="save the tokenizer next to the model"
        ) from None
