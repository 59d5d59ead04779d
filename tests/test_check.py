from __future__ import annotations

import json
import shutil

import pytest

from trtspec.build.check import Level, run_check
from trtspec.build.toolchain import Toolchain
from trtspec.spec import spec_from_dict

NO_TOOLS = Toolchain(None, None, None, None, True, True)


def _spec(target_dir, draft_dir, **extra):
    data = {"target": {"model": str(target_dir)}, "draft": {"model": str(draft_dir)}}
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    return spec_from_dict(data, environ={})


def _by_check(report):
    return {f.check: f for f in report.findings}


def test_tiny_pair_passes(tiny_pair):
    report = run_check(_spec(*tiny_pair, engine={"max_seq_len": 4096, "max_input_len": 2048}), NO_TOOLS)
    assert report.ok, [f for f in report.errors]
    assert _by_check(report)["token-to-id mapping"].level is Level.OK


def test_draft_tokenizer_differing_by_one_token_is_blocking(tiny_pair, tmp_path):
    from tests.tiny import perturb_tokenizer

    target, draft = tiny_pair
    bad = perturb_tokenizer(draft, tmp_path / "bad-draft", token_id=300, new_token="ZZZ-not-a-token")
    report = run_check(_spec(target, bad), NO_TOOLS)
    f = _by_check(report)["token-to-id mapping"]
    assert f.level is Level.ERROR
    assert "token id 300" in f.detail and "'ZZZ-not-a-token'" in f.detail


def test_draft_with_other_vocab_size_is_blocking(tiny_pair, tmp_path):
    target, draft = tiny_pair
    other = tmp_path / "draft"
    shutil.copytree(draft, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] += 1
    (other / "config.json").write_text(json.dumps(cfg))
    report = run_check(_spec(target, other), NO_TOOLS)
    assert _by_check(report)["vocabulary size"].level is Level.ERROR


def test_eos_mismatch_is_blocking(tiny_pair, tmp_path):
    target, draft = tiny_pair
    other = tmp_path / "draft"
    shutil.copytree(draft, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["eos_token_id"] = 0
    (other / "config.json").write_text(json.dumps(cfg))
    assert _by_check(run_check(_spec(target, other), NO_TOOLS))["eos id"].level is Level.ERROR


def test_context_shorter_than_max_seq_len_is_blocking(tiny_pair):
    report = run_check(_spec(*tiny_pair, engine={"max_seq_len": 8192, "max_input_len": 1024}), NO_TOOLS)
    assert _by_check(report)["target context"].level is Level.ERROR


@pytest.mark.parametrize("fmt", ["int4_awq", "w4a8_awq"])
def test_4bit_on_hidden_not_multiple_of_128_is_blocking(tmp_path, tiny_tokenizer, fmt):
    from tests.tiny import make_llama

    t = make_llama(tmp_path / "t", tiny_tokenizer, hidden=96, heads=4, kv_heads=2, layers=1)
    report = run_check(_spec(t, t, draft={"quantization": fmt}), NO_TOOLS)
    f = _by_check(report)["draft quantization"]
    assert f.level is Level.ERROR and "hidden_size is 96" in f.detail and "fp8" in f.hint


def test_nvfp4_without_gpu_is_blocking(tiny_pair):
    report = run_check(_spec(*tiny_pair, target={"quantization": "nvfp4"}), NO_TOOLS)
    f = _by_check(report)["target quantization"]
    assert f.level is Level.ERROR and "needs a CUDA GPU" in f.detail and "int4_awq" in f.hint


def test_nvfp4_checks_its_16_channel_block_even_on_a_gpu(tmp_path, tiny_tokenizer):
    """NVFP4 packs weights in blocks of 16 input channels (trtspec.build.formats): hidden 120 cannot take it, and
    the hint names only the formats that fit (no 4-bit ones of block 128)."""
    from tests.tiny import make_llama

    t = make_llama(tmp_path / "t", tiny_tokenizer, hidden=120, heads=4, kv_heads=2, intermediate=240, layers=1)
    gpu_tools = Toolchain(None, "/usr/bin/nvidia-smi", None, None, True, True)
    report = run_check(_spec(t, t, target={"quantization": "nvfp4"}), gpu_tools)
    f = _by_check(report)["target quantization"]
    assert f.level is Level.ERROR and "multiples of 16, hidden_size is 120" in f.detail
    assert "fp8" in f.hint and "int4_awq" not in f.hint and "nvfp4" not in f.hint


def test_missing_directory_and_corrupt_config_are_reported(tiny_pair, tmp_path):
    report = run_check(_spec(tmp_path / "nope", tiny_pair[1]), NO_TOOLS)
    assert "no such model directory" in _by_check(report)["target model"].detail
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_pair[1], corrupt)
    (corrupt / "config.json").write_text("{not json")
    report = run_check(_spec(tiny_pair[0], corrupt), NO_TOOLS)
    assert "not valid JSON" in _by_check(report)["draft model"].detail
    assert not report.ok
