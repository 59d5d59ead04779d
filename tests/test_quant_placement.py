"""Where the quantize stage puts a model: across the GPUs as ModelOpt's hf_ptq.py does (device_map="auto", CPU memory
for what does not fit), all in CPU memory on a machine without a GPU; and the placement is reported."""

from __future__ import annotations

import pytest

from trtspec.build import ptq


class _Recorder:
    def __init__(self, model):
        self.model, self.kwargs = model, None

    def __call__(self, src, **kwargs):
        self.kwargs = kwargs
        return self.model


def _tiny(tiny_pair):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_pair[1], dtype=torch.float32)


@pytest.mark.parametrize("cuda", [True, False])
def test_gpu_machines_spread_the_model_over_every_gpu_and_cpus_keep_it_whole(tiny_pair, monkeypatch, cuda):
    import transformers

    recorder = _Recorder(_tiny(tiny_pair))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", recorder)
    model, placement = ptq.load_for_calibration(tiny_pair[1], "dtype", cuda)
    assert recorder.kwargs.get("device_map") == ("auto" if cuda else None)  # never one .to("cuda")
    assert recorder.kwargs["dtype"] == "dtype" and not model.training
    assert placement == {"cpu": 1}


def test_placement_counts_modules_per_device_from_the_device_map(tiny_pair):
    model = _tiny(tiny_pair)
    model.hf_device_map = {
        "model.embed_tokens": 0,
        "model.layers.0": 0,
        "model.layers.1": 1,
        "model.norm": "cpu",
        "lm_head": "cpu",
    }
    placement = ptq.placement_of(model)
    assert placement == {"cpu": 2, "cuda:0": 2, "cuda:1": 1}
    assert ptq.placement_summary(placement) == "cpu+cuda:0+cuda:1"


def test_a_model_too_large_for_gpus_and_cpu_memory_is_one_clear_error(tiny_pair, monkeypatch):
    import transformers

    from trtspec.errors import QuantizationError

    def refuse(src, **kwargs):
        raise ValueError("The current `device_map` had weights offloaded to the disk. Please provide an offload_folder")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    with pytest.raises(QuantizationError, match="fits neither the GPUs nor CPU memory"):
        ptq.load_for_calibration(tiny_pair[1], None, True)


@pytest.mark.gpu
def test_on_a_gpu_machine_calibration_runs_on_the_gpu_and_says_so(tmp_path, tiny_pair):
    import torch

    from tests.engine_helpers import engine_spec

    spec = engine_spec(
        tmp_path,
        tiny_pair,
        runtime="trtllm-llmapi",
        target={"dtype": "bfloat16"},
        calibration={"samples": 4, "seq_len": 32, "batch_size": 2},
    )
    c = ptq.calibrate(spec, "target")
    assert c.device.startswith("cuda:0") and c.placement.get("cuda:0", 0) > 0
    assert next(c.model.parameters()).device.type == "cuda" and torch.cuda.is_available()
