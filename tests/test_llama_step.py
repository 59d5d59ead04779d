"""The fused Llama step (trtspec.runtimes.inflight.llama_step) computes what transformers' modules compute, on the
slot KV cache, and the engine's cost measurement runs through it."""

from __future__ import annotations

import pytest
import torch

from tests.tiny import make_llama, make_tokenizer
from trtspec.runtimes.inflight.kv_pool import KVGeometry, SlotKVPool
from trtspec.runtimes.inflight.llama_step import LlamaStep, step_of, supports
from trtspec.runtimes.inflight.packed import packed_forward, prepare_model
from trtspec.runtimes.torch.costs import measure_step_costs, step_cost_ratios


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("step")
    tok = make_tokenizer(root / "tok")
    return prepare_model(AutoModelForCausalLM.from_pretrained(make_llama(root / "m", tok, layers=3)).eval())


@pytest.mark.parametrize("pack_rows", [(), (1, 5)])
def test_fused_step_equals_transformers_on_a_mixed_packed_batch(model, pack_rows):
    """A prefill, a 1-token decode and a 4-token verification in one pass (then a pass over what they wrote):
    the same logits and the same keys/values in every slot as the transformers path."""
    torch.manual_seed(0)
    geometry = KVGeometry.of(model)
    pools = [SlotKVPool(geometry, 3, 64) for _ in range(2)]
    prompts = [torch.randint(0, model.config.vocab_size, (n,)).tolist() for n in (9, 5, 7)]
    step = LlamaStep(model, pack_rows)
    outs = []
    with torch.inference_mode():
        for pool, fast in zip(pools, (None, step)):
            first = packed_forward(model, pool, [(s, 0, p) for s, p in enumerate(prompts)], [8, 13, 20], fast=fast)
            feeds = [(0, 9, [3]), (1, 5, [4, 5, 6, 7]), (2, 7, [8, 9])]
            second = packed_forward(model, pool, feeds, list(range(7)), fast=fast)
            outs.append((first, second))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    for layer in range(geometry.num_layers):
        for s, n in ((0, 10), (1, 9), (2, 9)):
            torch.testing.assert_close(pools[0].keys[layer][s, :, :n], pools[1].keys[layer][s, :, :n])
            torch.testing.assert_close(pools[0].values[layer][s, :, :n], pools[1].values[layer][s, :, :n])


def test_fused_weights_are_the_models_parameters(model):
    """The model's q/k/v parameters are views of the fused weights (no second copy): transformers' own forward (the
    first test's reference) runs on the same memory."""
    step = step_of(model, ())
    assert step is not None and step_of(model, ()) is step
    attn = model.model.layers[0].self_attn
    fused = step.layers[0].qkv.weight
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr()
    assert attn.k_proj.weight.data_ptr() == fused[attn.q_proj.weight.shape[0] :].data_ptr()


def test_models_outside_the_plain_llama_decoder_keep_the_transformers_path():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    assert not supports(MistralForCausalLM(MistralConfig(**cfg, sliding_window=16)))
    assert supports(MistralForCausalLM(MistralConfig(**cfg, sliding_window=None)))


def test_cost_ratios_are_measured_through_the_engine_passes(model):
    c, v = step_cost_ratios(model, model, context=16, k=4, tokens_per_step=2.0, reps=3)
    assert c > 0 and v > 0  # timings: their size is for benchmarks/cpu_runtime.py
    costs = measure_step_costs(model, model, context=16, k_max=3, prompt_len=12, reps=3)
    assert sorted(costs.body) == [0, 1, 2, 3] and costs.head > 0 and costs.target_prefill > 0
