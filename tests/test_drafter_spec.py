"""``speculative.drafter``: validated by `trtspec check` per runtime, mapped to TensorRT-LLM's NGram config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec.build.check import Level, run_check
from trtspec.build.toolchain import Toolchain
from trtspec.spec import spec_from_dict

NO_TOOLS = Toolchain(None, None, None, None, True, True)
UPSTREAM = json.loads((Path(__file__).parent / "upstream" / "ngram_decoding.json").read_text())
LLM_API = json.loads((Path(__file__).parent / "upstream" / "llm_api.json").read_text())


def _spec(tiny_pair, runtime: str, drafter: str, pool: Path | None = None, orchestration: str = "auto"):
    spec = {
        "runtime": runtime,
        "target": {"model": str(tiny_pair[0]), "quantization": "none"},
        "draft": {"model": str(tiny_pair[1]), "quantization": "none"},
        "speculative": {"drafter": drafter, "ngram_pool": str(pool) if pool else None},
        "triton": {"orchestration": orchestration},
    }
    return spec_from_dict(spec, environ={})


@pytest.fixture
def pool_file(tiny_pair, tmp_path):
    from trtspec.build.tokenizers import read_tokenizer
    from trtspec.families import read_config
    from trtspec.speculative.drafters.ngram import NgramPool, vocab_fingerprint

    vocab = read_config(tiny_pair[0]).vocab_size
    pool = NgramPool.from_sequences(
        [[5, 6, 7, 8, 9]],
        vocab_size=vocab,
        meta={"tokenizer_sha256": vocab_fingerprint(read_tokenizer(tiny_pair[0]).vocab), "source": "test"},
    )
    return pool.save(tmp_path / "ngram_pool.npz")


def _finding(report, name):
    return next(f for f in report.findings if f.check == name)


def test_model_drafter_passes_on_every_runtime(tiny_pair):
    for runtime in ("torch", "trtllm-engine", "trtllm-llmapi"):
        report = run_check(_spec(tiny_pair, runtime, "model"), NO_TOOLS)
        assert _finding(report, "drafter").level is Level.OK


def test_ngram_on_llmapi_passes_and_says_the_pool_is_not_pre_seeded(tiny_pair, pool_file):
    report = run_check(_spec(tiny_pair, "trtllm-llmapi", "ngram", pool_file), NO_TOOLS)
    assert report.ok, report.errors
    pool = _finding(report, "n-gram pool")
    assert pool.level is Level.WARN and "cannot be pre-seeded" in pool.detail


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_torch_in_process_serves_ngram_and_hybrid(tiny_pair, pool_file, drafter):
    report = run_check(_spec(tiny_pair, "torch", drafter, pool_file), NO_TOOLS)
    assert _finding(report, "drafter").level is Level.OK
    assert _finding(report, "n-gram pool").level is Level.OK


def test_torch_without_a_pool_warns_prompt_lookup_only(tiny_pair):
    report = run_check(_spec(tiny_pair, "torch", "ngram"), NO_TOOLS)  # the tiny draft has no ngram_pool.npz
    pool = _finding(report, "n-gram pool")
    assert pool.level is Level.WARN and "prompt lookup only" in pool.detail


@pytest.mark.parametrize(
    "runtime, drafter, orchestration",
    [
        ("torch", "ngram", "bls"),
        ("torch", "hybrid", "bls"),
        ("trtllm-engine", "hybrid", "auto"),
        ("trtllm-engine", "ngram", "auto"),
    ],
)
def test_the_bls_orchestrator_serves_ngram_and_hybrid(tiny_pair, pool_file, runtime, drafter, orchestration):
    report = run_check(_spec(tiny_pair, runtime, drafter, pool_file, orchestration), NO_TOOLS)
    assert _finding(report, "drafter").level is Level.OK


def test_a_drafter_the_runtime_does_not_serve_is_blocking(tiny_pair, pool_file):
    report = run_check(_spec(tiny_pair, "trtllm-llmapi", "hybrid", pool_file), NO_TOOLS)
    finding = _finding(report, "drafter")
    assert finding.level is Level.ERROR and "'hybrid'" in finding.detail and not report.ok


def test_missing_pool_and_pool_of_another_tokenizer_are_reported(tiny_pair, tmp_path):
    from trtspec.speculative.drafters.ngram import NgramPool

    missing = run_check(_spec(tiny_pair, "torch", "ngram", tmp_path / "none.npz"), NO_TOOLS)
    assert "missing" in _finding(missing, "n-gram pool").detail
    assert _finding(missing, "n-gram pool").level is Level.ERROR  # a pool the spec names must be there
    other = NgramPool.from_sequences([[1, 2, 3]], vocab_size=7).save(tmp_path / "other.npz")
    report = run_check(_spec(tiny_pair, "trtllm-llmapi", "ngram", other), NO_TOOLS)
    assert (
        _finding(report, "n-gram pool").level is Level.ERROR
        and "another tokenizer" in _finding(report, "n-gram pool").detail
    )


def test_spec_rejects_an_unknown_drafter(tiny_pair):
    from trtspec.errors import SpecError

    with pytest.raises(SpecError, match="speculative.drafter: 'eagle' is not one of model, ngram, hybrid, adaptive"):
        _spec(tiny_pair, "torch", "eagle")


@pytest.mark.parametrize("version", ["1.0.0", "1.1.0", "1.2.0"])
def test_llmapi_maps_ngram_to_tensorrt_llm_s_ngram_decoding_config(tiny_pair, pool_file, version):
    """Every key of the NGram speculative_config is a field of the release's recorded NGramDecodingConfig (strict
    there), the dispatch key is the recorded one, and the match size is set (its 1.0-era default is 0)."""
    from trtspec.trtllm.llmapi import model_yaml

    spec = _spec(tiny_pair, "trtllm-llmapi", "ngram", pool_file)
    spec.engine.trtllm_version = version
    reading = UPSTREAM["readings"][LLM_API["releases"][".".join(version.split(".")[:2])]]
    config = model_yaml(spec)["speculative_config"]
    assert config["decoding_type"] == reading["dispatch_key"]
    assert set(config) - {"decoding_type"} <= set(reading["fields"])
    assert config["max_draft_len"] == 4 and config["max_matching_ngram_size"] >= 1 and config["is_public_pool"]


def test_llmapi_refuses_hybrid(tiny_pair, pool_file):
    from trtspec.errors import SpecError
    from trtspec.trtllm.llmapi import model_yaml

    with pytest.raises(SpecError, match="does not serve drafter hybrid"):
        model_yaml(_spec(tiny_pair, "trtllm-llmapi", "hybrid", pool_file))
