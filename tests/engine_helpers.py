"""Helpers for engine-runtime tests: real ModelOpt checkpoints, and small stage bodies standing in for the
quantize and repo stages of other branches (the real ones are wired at merge)."""

from __future__ import annotations

import shutil
from pathlib import Path

from trtspec.spec import BuildSpec, spec_from_dict


def export_trtllm_checkpoint(hf_dir: Path, out: Path) -> Path:
    """A real TensorRT-LLM checkpoint (config.json + rank0.safetensors) written by ModelOpt's exporter."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float16)
    export_tensorrt_llm_checkpoint(
        model, decoder_type="llama", dtype=torch.float16, export_dir=out, inference_tensor_parallel=1
    )
    return out


def copy_tokenizer(model_dir: Path, out: Path) -> Path:
    """The tokenizer files of ``model_dir`` into ``out``, as the quantize stage saves them with a checkpoint."""
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy2(f, out / f.name)
    return out


def engine_spec(tmp_path: Path, tiny_pair, **overrides) -> BuildSpec:
    data = {
        "name": "tiny-engines",
        "runtime": "trtllm-engine",
        "target": {"model": str(tiny_pair[0]), "dtype": "float16", "quantization": "fp8"},
        "draft": {"model": str(tiny_pair[1]), "dtype": "float16", "quantization": "fp8"},
        "speculative": {"max_draft_len": 4},
        "engine": {"max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512, "trtllm_version": "1.0.0"},
        "gpu": {"memory_gib": 80, "count": 1},
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    return spec_from_dict(data, source="test", base_dir=tmp_path, environ={})


class TinyStageBodies:
    """Quantize = copy a prebuilt ModelOpt checkpoint; repo = the engine-backed configs (its inputs, and so the
    version guard, are the real writer's). Counts calls."""

    def __init__(self, checkpoints: dict[str, Path]):
        self.checkpoints = checkpoints
        self.calls: list[str] = []

    def quantize_inputs(self, spec, role):
        model = getattr(spec, role)
        return {"source": spec.model_path(role)}, {
            "stage": "quantize",
            "role": role,
            "quantization": model.quantization.value,
            "dtype": model.dtype.value,
        }

    def quantize_into(self, spec, role, out_dir, progress=None):
        self.calls.append(f"quantize:{role}")
        for f in self.checkpoints[role].iterdir():
            shutil.copy2(f, out_dir / f.name)
        copy_tokenizer(spec.model_path(role), out_dir)  # as the real stage exports it with the checkpoint
        return {"format": "tensorrt_llm checkpoint (test body)"}

    def write_repo_into(self, spec, out_dir):
        from trtspec.spec import Runtime

        self.calls.append("repo")
        if spec.runtime is Runtime.TRTLLM_ENGINE:
            from trtspec.triton_repo.engine_definitions import engine_model_configs
            from trtspec.triton_repo.pbtxt import serialize

            for name, cfg in engine_model_configs(spec).items():
                (out_dir / name / "1").mkdir(parents=True)
                (out_dir / name / "config.pbtxt").write_text(serialize(cfg))
        else:
            (out_dir / "README").write_text("test repo body\n")
        return {"models": sorted(p.name for p in out_dir.iterdir())}

    def bodies(self):
        from trtspec.pipeline import StageBodies

        return StageBodies(
            quantize_inputs=self.quantize_inputs, quantize_into=self.quantize_into, write_repo_into=self.write_repo_into
        )
