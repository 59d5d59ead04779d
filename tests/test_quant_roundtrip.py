"""Every CPU-capable format on a tiny random Llama (hidden 128): calibrate with real ModelOpt, export both checkpoint
kinds, read each back, and compare its logits with the calibrated in-memory model.

Tolerances (max |logit difference| relative to max |logit|, and top-1 agreement over 8 x 48 positions), with the
values measured when they were set:
- unified HF checkpoint, float32. int8_wo is exact up to float rounding (measured 6e-7). AWQ formats: the export folds
  the pre-quant scale into the preceding norm, and the float products differ in the last bit, which can flip a 4-bit
  weight at a rounding boundary (1.2e-3). Formats that quantize activations (fp8, int8_sq, w4a8_awq) store
  ``input_scale = amax / bound`` in float32, so the reloaded amax can differ in its last bit and an activation on an
  FP8/INT8 rounding boundary rounds the other way (up to 1.5e-2, top-1 >= 98.7 %).
- TRT-LLM checkpoint: float16 for the unquantized tensors (TRT-LLM has no float32 checkpoints), one shared FP8 weight
  scale for the fused q/k/v and gate/up layers, float16 smoothing factors: weight-only formats 1.2e-3 and 100 %;
  fp8 9e-2 and 90 %, the others 4e-2 and >= 96 %. A wrong scale, layout or layer mapping gives ~0 % instead.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

from trtspec.spec import spec_from_dict

# format: (hf rel tol, hf top-1, trtllm rel tol, trtllm top-1)
TOLERANCES = {
    "int8_wo": (1e-5, 0.999, 5e-3, 0.98),
    "int4_awq": (5e-3, 0.99, 5e-3, 0.98),
    "fp8": (5e-2, 0.97, 0.15, 0.85),
    "int8_sq": (5e-2, 0.97, 0.06, 0.93),
    "w4a8_awq": (5e-2, 0.97, 0.08, 0.90),
}
CALIBRATION = {"samples": 4, "seq_len": 32, "batch_size": 2}


def _spec(target, tmp_path, runtime="torch", quantization="fp8", kv_cache="auto"):
    return spec_from_dict(
        {
            "runtime": runtime,
            "target": {"model": str(target), "dtype": "float32", "quantization": quantization, "kv_cache": kv_cache},
            "draft": {"model": str(target), "dtype": "float32", "quantization": "none"},
            "calibration": CALIBRATION,
        },
        base_dir=tmp_path,
        environ={},
    )


@pytest.fixture(scope="module")
def probe() -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    return torch.randint(4, 420, (8, 48), generator=g)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def _compare(got, ref, rel_tol, top1_min, what):
    got = got[..., : ref.shape[-1]]  # AWQ TRT-LLM checkpoints pad the vocabulary to a multiple of 64
    rel = float((got - ref).abs().max() / ref.abs().max())
    top1 = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
    assert rel <= rel_tol and top1 >= top1_min, f"{what}: relative max diff {rel:.2e} (<= {rel_tol}), top-1 {top1:.3f}"
    return rel, top1


@pytest.fixture(scope="module", params=sorted(TOLERANCES))
def calibrated(request, tiny_pair, tmp_path_factory, probe):
    """(format, spec, Calibrated, reference logits) for the tiny target, calibrated once per format."""
    from trtspec.build.ptq import calibrate

    tmp = tmp_path_factory.mktemp(f"cal-{request.param}")
    spec = _spec(tiny_pair[0], tmp, quantization=request.param)
    c = calibrate(spec, "target")
    return request.param, spec, c, _logits(c.model, probe)


def test_hf_export_reloads_with_the_calibrated_numbers(calibrated, tmp_path, probe):
    from trtspec.build.ptq import export_calibrated
    from trtspec.runtimes.torch.quantized_loader import is_modelopt_checkpoint, load_modelopt_checkpoint

    fmt, spec, c, ref = calibrated
    out = tmp_path / "hf"
    out.mkdir()
    fields = export_calibrated(spec, dataclasses.replace(c, model=copy.deepcopy(c.model)), out)
    assert fields["format"] == fmt and fields["export"] == "hf-checkpoint"
    assert (
        json.loads((out / "hf_quant_config.json").read_text())["quantization"]["quant_algo"]
        == fields["trtllm_quant_algo"]
    )
    assert (out / "tokenizer.json").is_file() and is_modelopt_checkpoint(out)
    assert json.loads((out / "config.json").read_text())["rope_theta"] == 100000.0  # for transformers-4 readers
    loaded = load_modelopt_checkpoint(out, "float32")
    _compare(_logits(loaded, probe), ref, *TOLERANCES[fmt][:2], f"{fmt} HF reload")


def test_trtllm_export_reads_back_with_the_calibrated_numbers(calibrated, tmp_path, probe, tiny_pair):
    from tests.trtllm_checkpoint import load_trtllm_checkpoint
    from trtspec.build.ptq import export_calibrated

    fmt, _, c, ref = calibrated
    spec = _spec(tiny_pair[0], tmp_path, runtime="trtllm-engine", quantization=fmt)
    out = tmp_path / "trt"
    out.mkdir()
    fields = export_calibrated(spec, dataclasses.replace(c, model=copy.deepcopy(c.model)), out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["quant_algo"] == fields["trtllm_quant_algo"] and cfg["dtype"] == "float16"
    assert cfg["rotary_base"] == 100000.0 and (out / "rank0.safetensors").is_file()
    _compare(_logits(load_trtllm_checkpoint(out), probe), ref, *TOLERANCES[fmt][2:], f"{fmt} TRT-LLM read-back")


@pytest.fixture(scope="module")
def fp8_kv_export(tiny_pair, tmp_path_factory):
    """The tiny target quantized to fp8 with an fp8 KV cache, exported as a unified HF checkpoint by the stage body."""
    from trtspec.build.quantize import quantize_into

    tmp = tmp_path_factory.mktemp("fp8kv")
    out = tmp / "out"
    out.mkdir()
    quantize_into(_spec(tiny_pair[0], tmp, quantization="fp8", kv_cache="fp8"), "target", out)
    return out


def test_naive_from_pretrained_of_an_fp8_export_is_wrong_and_the_loader_fixes_it(fp8_kv_export, tiny_pair, probe):
    """Plain from_pretrained ignores the *_scale tensors. This is why the torch runtime needs the loader."""
    from transformers import AutoModelForCausalLM

    from trtspec.runtimes.torch.quantized_loader import load_modelopt_checkpoint

    out = fp8_kv_export
    assert json.loads((out / "hf_quant_config.json").read_text())["quantization"]["kv_cache_quant_algo"] == "FP8"
    source = _logits(AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32), probe)
    naive = _logits(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), probe)
    ours = load_modelopt_checkpoint(out)
    top1 = lambda a: float((a.argmax(-1) == source.argmax(-1)).float().mean())  # noqa: E731
    assert top1(naive) < 0.2 < 0.8 < top1(_logits(ours, probe))
    kv_attn = ours.model.layers[0].self_attn
    assert kv_attn._trtspec_kv_kind == "FP8" and 0 < float(kv_attn.trtspec_k_amax) < 448


def test_fp8_kv_cache_model_decodes_over_a_cache_exactly_like_a_full_pass(fp8_kv_export, probe):
    """Verifying K draft tokens is a multi-token step over a cache: it needs the causal mask of the base attention
    (a custom attention implementation gets none from transformers unless its mask builder is registered too)."""
    from transformers import DynamicCache

    from trtspec.runtimes.torch.quantized_loader import load_modelopt_checkpoint

    model = load_modelopt_checkpoint(fp8_kv_export)
    with torch.no_grad():
        full = model(input_ids=probe).logits
        cache = DynamicCache(config=model.config)
        head = model(input_ids=probe[:, :40], past_key_values=cache, use_cache=True).logits
        tail = model(input_ids=probe[:, 40:], past_key_values=cache, use_cache=True).logits
    torch.testing.assert_close(torch.cat([head, tail], dim=1), full, rtol=1e-4, atol=1e-4)


def test_unquantized_trtllm_checkpoint_is_a_plain_conversion(tiny_pair, tmp_path, probe):
    from transformers import AutoModelForCausalLM

    from tests.trtllm_checkpoint import load_trtllm_checkpoint
    from trtspec.build.quantize import quantize_into

    spec = _spec(tiny_pair[0], tmp_path, runtime="trtllm-engine", quantization="none")
    out = tmp_path / "out"
    out.mkdir()
    fields = quantize_into(spec, "target", out)
    assert fields["calibration"] is None and fields["warnings"] == [
        "target.dtype float32 is not a TensorRT-LLM checkpoint dtype: exported as float16"
    ]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["quant_algo"] is None and cfg["rotary_base"] == 100000.0
    ref = _logits(AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32), probe)
    _compare(_logits(load_trtllm_checkpoint(out), probe), ref, 2e-3, 0.98, "none TRT-LLM")
