from __future__ import annotations

import pytest
import yaml

from trtspec.build.formats import Quantization
from trtspec.errors import SpecError
from trtspec.spec import BuildSpec, Runtime, load_spec, spec_from_dict
from trtspec.spec_doc import commented_yaml

BASE = {"target": {"model": "t"}, "draft": {"model": "d"}}


def test_defaults_fill_runtime_quantization():
    gpu = spec_from_dict({**BASE, "runtime": "trtllm-engine"}, environ={})
    assert gpu.target.quantization is Quantization.FP8
    assert gpu.draft.quantization is Quantization.INT4_AWQ
    cpu = spec_from_dict(BASE, environ={})
    assert cpu.runtime is Runtime.TORCH
    assert cpu.target.quantization is Quantization.NONE and cpu.draft.quantization is Quantization.NONE


def test_bad_enum_names_file_field_and_allowed_values(write_spec):
    path = write_spec({**BASE, "draft": {"model": "d", "quantization": "int3"}})
    with pytest.raises(SpecError) as exc:
        load_spec(path, environ={})
    assert exc.value.message == (
        "trtspec.yaml: draft.quantization: 'int3' is not one of none, fp8, int8_sq, int8_wo, int4_awq, w4a8_awq, nvfp4"
    )


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"speculative": {"max_draft_len": 17}}, "speculative.max_draft_len: Input should be less than or equal to 16"),
        ({"speculative": {"max_draft_len": 0}}, "speculative.max_draft_len"),
        ({"tokenizer": "x"}, "tokenizer: unknown field"),
        ({"engine": {"max_input_len": 4096, "max_seq_len": 4096}}, "max_input_len (4096) must be smaller"),
        ({"draft": {"model": "d", "tp_size": 2}}, "draft.tp_size must be 1"),
    ],
)
def test_invalid_fields_are_reported_with_their_path(patch, expected):
    with pytest.raises(SpecError) as exc:
        spec_from_dict({**BASE, **patch}, source="s.yaml", environ={})
    assert expected in exc.value.message
    assert exc.value.hint


def test_missing_model_is_reported():
    with pytest.raises(SpecError, match="target: field required"):
        spec_from_dict({"draft": {"model": "d"}}, environ={})


def test_env_overrides_fields():
    spec = spec_from_dict(
        BASE, environ={"TRTSPEC_SPEC__DRAFT__QUANTIZATION": "fp8", "TRTSPEC_SPEC__SPECULATIVE__MAX_DRAFT_LEN": "7"}
    )
    assert spec.draft.quantization is Quantization.FP8
    assert spec.speculative.max_draft_len == 7


def test_relative_paths_resolve_against_spec_file(write_spec, tmp_path):
    spec = load_spec(write_spec(BASE), environ={})
    assert spec.model_path("target") == tmp_path / "t"
    assert spec.repo_dir == tmp_path / "triton_repo"


def test_invalid_yaml_is_one_line(write_spec, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("target: [unclosed\n")
    with pytest.raises(SpecError, match="bad.yaml:.*not valid YAML"):
        load_spec(path)


def test_commented_yaml_round_trips_and_documents_every_field():
    spec = spec_from_dict({**BASE, "runtime": "trtllm-engine"}, environ={})
    text = commented_yaml(spec)
    again = BuildSpec.model_validate(yaml.safe_load(text))
    assert again.to_yaml_dict() == spec.to_yaml_dict()
    lines = [ln for ln in text.splitlines() if ":" in ln and not ln.lstrip().startswith("#")]
    leaf = [ln for ln in lines if not ln.rstrip().endswith(":")]
    assert all("  # " in ln for ln in leaf), [ln for ln in leaf if "  # " not in ln]
    assert "[none | fp8 | int8_sq | int8_wo | int4_awq | w4a8_awq | nvfp4]" in text


def test_the_example_runs_in_bfloat16_only_where_the_cpu_has_native_bfloat16(monkeypatch):
    from trtspec import spec_defaults
    from trtspec.example import example_spec_dict

    zen4 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
    skylake = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"
    sapphire = "flags\t\t: avx512f amx_tile amx_bf16 amx_int8\n"
    assert spec_defaults.cpu_dtype(zen4) == "bfloat16" and spec_defaults.cpu_dtype(sapphire) == "bfloat16"
    assert spec_defaults.cpu_dtype(skylake) == "float32" and spec_defaults.cpu_dtype("") == "float32"
    monkeypatch.setattr(spec_defaults, "cpu_dtype", lambda cpuinfo=None: "float32")
    data = example_spec_dict("t", "d")
    assert data["target"]["dtype"] == data["draft"]["dtype"] == "float32"
    assert example_spec_dict("t", "d", dtype="bfloat16")["draft"]["dtype"] == "bfloat16"
