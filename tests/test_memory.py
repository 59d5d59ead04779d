"""The memory plan against figures computed by hand from real configs."""

from __future__ import annotations

import pytest

from trtspec.build.memory import GIB, kv_bytes_per_token, plan_memory, weight_bytes
from trtspec.families import normalize_config
from trtspec.spec import spec_from_dict

LLAMA_31_70B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 28672,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
}
LLAMA_32_1B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}


def _spec(**over):
    data = {
        "runtime": "trtllm-engine",
        "target": {"model": "t", "dtype": "float16", "quantization": "none"},
        "draft": {"model": "d", "dtype": "float16", "quantization": "none"},
    }
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v}
    return spec_from_dict(data, environ={})


def test_llama70b_kv_bytes_per_token_fp16():
    cfg = normalize_config(LLAMA_31_70B)
    assert kv_bytes_per_token(cfg, _spec().target) == 80 * 8 * 128 * 2 * 2 == 327_680


def test_fp8_kv_cache_halves_it():
    cfg = normalize_config(LLAMA_31_70B)
    assert kv_bytes_per_token(cfg, _spec(target={"kv_cache": "fp8"}).target) == 163_840


def test_llama70b_param_count_and_weight_bytes():
    cfg = normalize_config(LLAMA_31_70B)
    # 70.55B parameters is the published count for Llama-3.1-70B.
    assert cfg.num_params == 70_553_706_496
    assert weight_bytes(cfg, _spec().target) == 2 * 70_553_706_496
    fp8 = weight_bytes(cfg, _spec(target={"quantization": "fp8"}).target)
    linear = cfg.param_counts()["linear"]
    assert fp8 == linear * 1 + (cfg.num_params - linear) * 2


def test_llama1b_tied_head_params():
    cfg = normalize_config(LLAMA_32_1B)
    assert cfg.num_params == 1_235_814_400  # published count of Llama-3.2-1B


def test_plan_70b_fp8_tp2_with_1b_draft_on_h100():
    spec = _spec(
        target={"quantization": "fp8", "tp_size": 2},
        draft={"quantization": "none"},
        gpu={"memory_gib": 80, "count": 2, "memory_utilization": 0.94},
        engine={"max_batch_size": 8, "max_seq_len": 8192, "max_input_len": 4096},
    )
    plan = plan_memory(spec, normalize_config(LLAMA_31_70B), normalize_config(LLAMA_32_1B))
    t_w = weight_bytes(normalize_config(LLAMA_31_70B), spec.target)
    d_w = weight_bytes(normalize_config(LLAMA_32_1B), spec.draft)
    free = int(80 * GIB * 0.94) - 2 * GIB - (-(-t_w // 2)) - d_w
    assert plan.free_for_kv_gpu0 == free
    per_token = 327_680 // 2 + 16 * 8 * 64 * 2 * 2
    assert plan.kv_tokens_capacity == free // per_token
    assert plan.fits and plan.kv_sufficient


def test_plan_70b_fp16_does_not_fit_one_gpu():
    plan = plan_memory(_spec(), normalize_config(LLAMA_31_70B), normalize_config(LLAMA_32_1B))
    assert not plan.fits
    assert plan.free_for_kv_gpu0 < 0


def test_kv_fractions_split_free_memory_by_kv_bytes():
    spec = _spec()
    plan = plan_memory(spec, normalize_config(LLAMA_32_1B), normalize_config(LLAMA_32_1B))
    # Equal models: the target takes u/2 of free memory, then the draft u/2 of the original from what is left.
    u = spec.gpu.memory_utilization
    assert plan.target_kv_fraction == pytest.approx(u / 2, abs=1e-4)
    assert plan.draft_kv_fraction == pytest.approx((u / 2) / (1 - u / 2), abs=1e-4)


def test_drafter_ngram_plans_no_draft_memory():
    """n-grams load no draft model: its weights and KV cache take nothing, the target gets what they took."""
    over = {
        "target": {"quantization": "fp8", "tp_size": 2},
        "gpu": {"memory_gib": 80, "count": 2, "memory_utilization": 0.94},
        "engine": {"max_batch_size": 8, "max_seq_len": 8192, "max_input_len": 4096},
    }
    t, d = normalize_config(LLAMA_31_70B), normalize_config(LLAMA_32_1B)
    model = plan_memory(_spec(**over), t, d)
    ngram = plan_memory(_spec(**over, speculative={"drafter": "ngram"}), t, d)
    assert ngram.draft.weight_bytes == ngram.draft.kv_bytes_per_token == 0
    assert ngram.free_for_kv_gpu0 == model.free_for_kv_gpu0 + model.draft.weight_bytes_per_gpu
    assert ngram.kv_tokens_capacity == ngram.free_for_kv_gpu0 // (327_680 // 2)
    assert ngram.draft_kv_fraction == 0 and ngram.target_kv_fraction == pytest.approx(0.94)
