"""Ship a distilled draft small: without the embeddings it shares with its target, weights in float16.

A draft made by `trtspec distill` keeps its target's input embeddings frozen and its full-vocabulary ``lm_head`` is
zero outside the frequent tokens, so a package only needs the trained tensors (decoder layers, norm, the non-zero head
rows and their token ids) and a fingerprint of the target's embeddings; ``unpack_draft`` rebuilds the complete
standard checkpoint from the packed weights and the target, refusing a target whose embeddings differ. The n-gram
pool (``ngram_pool.npz``) travels with it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from trtspec.distill import DistillError

EMBEDDINGS = "model.embed_tokens.weight"
PACK_FILE = "packed.json"
CARRIED = ("config.json", "distill_report.json", "ngram_pool.npz")
HEAD = "lm_head.weight"
ROWS, ROW_IDS = "packed.lm_head.rows", "packed.lm_head.token_ids"
FORMAT = 2


def embedding_fingerprint(weight: torch.Tensor) -> str:
    """SHA-256 of the embedding matrix as float32 bytes."""
    return hashlib.sha256(weight.detach().float().contiguous().numpy().tobytes()).hexdigest()


def _target_embeddings(target_dir: Path) -> torch.Tensor:
    from trtspec.runtimes.torch.loading import load_model

    return load_model(target_dir).get_input_embeddings().weight.detach()


def pack_draft(draft_dir: Path, target_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Write ``out_dir``: the draft's config and report, its weights in float16 minus the target's embeddings."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(Path(draft_dir) / "model.safetensors"))
    if EMBEDDINGS not in weights:
        raise DistillError(f"{draft_dir}: no {EMBEDDINGS} in the draft", hint="pack a draft made by trtspec distill")
    fingerprint = embedding_fingerprint(_target_embeddings(Path(target_dir)))
    if embedding_fingerprint(weights[EMBEDDINGS]) != fingerprint:
        raise DistillError(
            f"{draft_dir}: its embeddings differ from the target's in {target_dir}",
            hint="pack with the target the draft was distilled from",
        )
    del weights[EMBEDDINGS]
    if HEAD in weights:  # a standard checkpoint: keep the non-zero (frequent-token) rows only
        from trtspec.runtimes.torch.frequent_head import frequent_rows

        head = weights.pop(HEAD)
        ids = frequent_rows(head)
        weights[ROWS], weights[ROW_IDS] = head[ids], ids.long()
    packed = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(packed, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name in CARRIED:
        if (Path(draft_dir) / name).is_file():
            shutil.copy2(Path(draft_dir) / name, out_dir / name)
    info = {
        "format": FORMAT,
        "embeddings_from_target": EMBEDDINGS,
        "target_embedding_sha256": fingerprint,
        "dtype": "float16",
        "lm_head": "non-zero rows only" if ROWS in packed else "as trained",
    }
    (out_dir / PACK_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return info


def unpack_draft(packed_dir: Path, target_dir: Path, out_dir: Path, dtype: torch.dtype = torch.float32) -> None:
    """Write the complete draft directory into ``out_dir`` from a packed draft and its target (tokenizer included)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    packed_dir, target_dir = Path(packed_dir), Path(target_dir)
    info = json.loads((packed_dir / PACK_FILE).read_text())
    if info.get("format") != FORMAT:
        raise DistillError(
            f"{packed_dir}: packed by an older trtspec (format {info.get('format', 1)})",
            hint="re-pack the draft with scripts/pack_example_draft.py",
        )
    embeddings = _target_embeddings(target_dir)
    if embedding_fingerprint(embeddings) != info["target_embedding_sha256"]:
        raise DistillError(
            f"{target_dir}: its embeddings are not the ones {packed_dir} was distilled against",
            hint="unpack with the draft's own target model",
        )
    config = AutoConfig.from_pretrained(packed_dir)
    state = {
        k: v.to(dtype) if v.is_floating_point() else v
        for k, v in load_file(str(packed_dir / "model.safetensors")).items()
    }
    if ROWS in state:
        rows, ids = state.pop(ROWS), state.pop(ROW_IDS)
        head = rows.new_zeros(int(config.vocab_size), rows.shape[1])
        head[ids] = rows
        state[HEAD] = head
    state[EMBEDDINGS] = embeddings.to(dtype)
    draft = AutoModelForCausalLM.from_config(config)
    draft.load_state_dict(state, strict=True)
    draft.to(dtype)
    draft.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out_dir)
    for name in ("generation_config.json", "distill_report.json", "ngram_pool.npz"):
        src = (target_dir if name == "generation_config.json" else packed_dir) / name
        if src.is_file():
            shutil.copy2(src, out_dir / name)
