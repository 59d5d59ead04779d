"""The embedded SmolLM2-135M-Instruct target quantized for real (fp8, int8_wo), reloaded as the torch runtime loads
it."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"


def _load_for_torch_runtime(path):
    """The torch runtime's loader when it exists on this branch, else the quantized loader it delegates to."""
    try:
        from trtspec.runtimes.torch.loading import load_model
    except ImportError:
        from trtspec.runtimes.torch.quantized_loader import load_modelopt_checkpoint as load_model
    return load_model(path, "float32")


def _greedy_answer(model, tokenizer, prompt: str, max_new_tokens: int = 12) -> str:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.parametrize("fmt, min_top1", [("fp8", 0.85), ("int8_wo", 0.85)])
def test_smollm2_target_quantized_reloads_and_still_answers(fmt, min_top1, example_paths, tmp_path):
    from transformers import AutoTokenizer

    from trtspec.pipeline import quantize_stage
    from trtspec.runtimes.torch.quantized_loader import is_modelopt_checkpoint
    from trtspec.spec import spec_from_dict

    spec = spec_from_dict(
        {
            "runtime": "torch",
            "target": {"model": str(example_paths.target), "dtype": "float32", "quantization": fmt},
            "draft": {"model": str(example_paths.draft), "dtype": "float32", "quantization": "none"},
            "calibration": {"samples": 16, "seq_len": 128, "batch_size": 4},
        },
        base_dir=tmp_path,
        environ={},
    )
    outcome = quantize_stage(spec, "target")
    manifest = outcome.manifest
    assert outcome.status == "built" and manifest["format"] == fmt
    assert manifest["quality"]["top1_agreement"] >= min_top1, manifest["quality"]
    assert abs(manifest["quality"]["perplexity_change_pct"]) < 10, manifest["quality"]
    out = tmp_path / "build" / "target"
    assert is_modelopt_checkpoint(out)
    assert json.loads((out / "config.json").read_text())["rope_theta"] == 100000.0
    model = _load_for_torch_runtime(out)
    answer = _greedy_answer(model, AutoTokenizer.from_pretrained(out), PROMPT)
    assert "Paris" in answer, answer
