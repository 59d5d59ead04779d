"""TensorRT-LLM builder rules (trtspec.build.engine_rules): `trtspec check` refuses the format combinations that
trtllm-build refuses or builds without paged context FMHA, one rule per test, and the table agrees with the builder's
recorded behaviour (tests/upstream/trtllm_builder_rules.json) for every weight x KV-cache format; `trtspec init`
never picks a refused one."""

from __future__ import annotations

import itertools

import pytest

from tests.upstream import facts
from trtspec.build.check import Level, run_check
from trtspec.build.engine_rules import BUILDER_RULES, broken_rules
from trtspec.build.formats import FORMATS, KVCacheFormat, Quantization
from trtspec.build.toolchain import Toolchain
from trtspec.spec import spec_from_dict
from trtspec.spec_defaults import fill_gpu_defaults

NO_TOOLS = Toolchain(None, None, None, None, True, True)


def _engine_spec(tiny_pair, target=None, draft=None, gpu=None):
    data = {
        "runtime": "trtllm-engine",
        "target": {"model": str(tiny_pair[0]), "dtype": "float16", "quantization": "fp8", **(target or {})},
        "draft": {"model": str(tiny_pair[1]), "dtype": "float16", "quantization": "fp8", **(draft or {})},
        "engine": {"max_input_len": 256, "max_seq_len": 512},
        "gpu": gpu or {},
    }
    return spec_from_dict(data, environ={})


def _engine_findings(report, role):
    return [f for f in report.findings if f.check == f"{role} engine build"]


@pytest.mark.parametrize(
    ("target", "gpu", "rule", "works"),
    [
        ({"quantization": "int8_sq", "kv_cache": "int8"}, {}, "paged-context-fmha-int8-kv", "kv_cache fp8 with"),
        (
            {"quantization": "int4_awq", "kv_cache": "fp8"},
            {},
            "paged-context-fmha-fp8-kv-needs-fp8-weights",
            "quantization fp8 with kv_cache fp8",
        ),
        (
            {"quantization": "fp8", "kv_cache": "fp8"},
            {"compute_capability": "8.0"},
            "fp8-context-fmha-needs-sm89",
            "kv_cache auto with fp8",
        ),
        ({"quantization": "int4_awq"}, {"compute_capability": "10.0"}, "sm100-no-int8-int4", "fp8 or nvfp4"),
    ],
)
def test_check_refuses_each_builder_rule_in_one_line(tiny_pair, target, gpu, rule, works):
    report = run_check(_engine_spec(tiny_pair, target=target, gpu=gpu), NO_TOOLS)
    found = _engine_findings(report, "target")
    assert [f.level for f in found] == [Level.ERROR], found
    assert rule in found[0].detail and target["quantization"] in found[0].detail and "\n" not in found[0].detail
    assert works in found[0].hint and "tensorrt_llm/builder.py" in found[0].hint
    assert not report.ok


def test_check_passes_the_combinations_that_build(tiny_pair):
    ok = _engine_spec(
        tiny_pair, target={"kv_cache": "fp8"}, draft={"quantization": "int4_awq"}, gpu={"compute_capability": "9.0"}
    )
    report = run_check(ok, NO_TOOLS)
    assert [f.level for role in ("target", "draft") for f in _engine_findings(report, role)] == [Level.OK, Level.OK]


def test_the_rules_only_bind_engines(tiny_pair):
    data = {
        "runtime": "torch",
        "target": {"model": str(tiny_pair[0]), "quantization": "int8_sq", "kv_cache": "int8"},
        "draft": {"model": str(tiny_pair[1])},
    }
    report = run_check(spec_from_dict(data, environ={}), NO_TOOLS)
    assert not _engine_findings(report, "target")


def _upstream_refuses(q: Quantization, kv: KVCacheFormat, cc: tuple[int, int] | None) -> bool:
    """Whether any recorded reading of the builder (or the attention plugin) refuses the combination or builds it
    without paged context FMHA, derived from the recorded facts only."""
    data = facts.load("trtllm_builder_rules")
    algo = FORMATS[q].trtllm_algo  # the QuantAlgo trtspec's checkpoint carries for this format
    fp8 = data["paged_context_fmha"]["fp8_kv_cache"]
    if kv is KVCacheFormat.INT8:
        return True
    if kv is KVCacheFormat.FP8:
        takes = set(fp8["builder_py"]["fp8_context_fmha_quant_algos"]) & set(
            fp8["builder_py_older"]["fp8_qdq_quant_algos"]
        )
        if algo not in takes:
            return True
        if cc is not None and cc[0] * 10 + cc[1] < fp8["builder_py"]["min_sm"]:
            return True
    if cc is not None and 100 <= cc[0] * 10 + cc[1] < 120:
        return any(algo in r.get("quant_algos", []) for r in data["sm100"]["refused"])
    return False


@pytest.mark.parametrize("cc", [None, (8, 0), (9, 0), (10, 0)])
def test_rule_table_matches_the_recorded_builder_for_every_combination(cc):
    for q, kv in itertools.product(Quantization, KVCacheFormat):
        assert bool(broken_rules(q, kv, cc)) == _upstream_refuses(q, kv, cc), (q.value, kv.value, cc)


def test_every_rule_names_its_upstream_source():
    recorded = facts.load("trtllm_builder_rules")["sources"]
    for rule in BUILDER_RULES:
        assert any(src["path"] in rule.source for src in recorded.values()), rule.name


def test_init_never_picks_a_format_the_builder_refuses(tiny_pair):
    """tiny_pair's hidden 128 takes int4_awq, the draft's first preference; with an fp8 KV cache the builder only
    takes fp8 weights, and with an int8 KV cache nothing, so init says why it passed the others over."""
    data = {
        "runtime": "trtllm-engine",
        "target": {"model": str(tiny_pair[0]), "kv_cache": "int8"},
        "draft": {"model": str(tiny_pair[1]), "kv_cache": "fp8"},
    }
    notes = fill_gpu_defaults(data, tiny_pair[0].parent)
    assert data["draft"]["quantization"] == "fp8"
    assert "paged-context-fmha-fp8-kv-needs-fp8-weights" in notes["draft.quantization"]
    assert data["target"]["quantization"] == "none" and "paged-context-fmha-int8-kv" in notes["target.quantization"]
    llmapi = {"runtime": "trtllm-llmapi", "draft": {"model": str(tiny_pair[1]), "kv_cache": "fp8"}}
    fill_gpu_defaults(llmapi, tiny_pair[0].parent)
    assert llmapi["draft"]["quantization"] == "int4_awq"  # no engine, no engine-builder rule
