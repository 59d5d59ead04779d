"""Shared by the serving tests: a noisy draft on disk (partial acceptance) and a torch-runtime spec for a pair."""

from __future__ import annotations

from pathlib import Path


def make_noisy_draft(target: Path, out: Path, scale: float = 0.0015, seed: int = 0) -> Path:
    """The target with small noise on its weights: it agrees with the target part of the time."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(target).save_pretrained(out)
    return out


def torch_spec_dict(target: Path, draft: Path, **overrides) -> dict:
    data = {
        "name": "tiny",
        "runtime": "torch",
        "target": {"model": str(target), "dtype": "float32"},
        "draft": {"model": str(draft), "dtype": "float32"},
        "speculative": {"max_draft_len": 4, "route_threshold": 8},
        "engine": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        "triton": {"orchestrator_instances": 1},
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return data
