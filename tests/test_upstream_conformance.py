"""What trtspec writes for TensorRT-LLM, compared with upstream's own sources as recorded in tests/upstream/ (never with
trtspec's own tables): trtllm-build flags, the backend's parameters and tensors, model.yaml, the NGC image table."""

from __future__ import annotations

import itertools

import pytest
import yaml
from tritonclient.grpc import model_config_pb2 as pb

from tests.engine_helpers import engine_spec
from tests.standin.trtllm_build_standin import make_parser
from tests.upstream import facts
from trtspec.triton_repo.engine_definitions import engine_model_configs
from trtspec.triton_repo.pbtxt import serialize
from trtspec.trtllm.trtllm_build import trtllm_build_command
from trtspec.trtllm.trtllm_versions import NGC_TAGS, RELEASES, normalize_version

VERSIONS = {"0.20": "0.20.0", "0.21": "0.21.0", "1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.1"}
_DTYPES = {"float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float32": "TYPE_FP32"}


# -- trtllm-build ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("line", sorted(VERSIONS))
def test_version_table_matches_the_recorded_build_py_flags(line):
    recorded = {f["name"]: f for f in facts.trtllm_build_flags(VERSIONS[line])}
    table = {f.name: f for f in RELEASES[line].flags}
    assert set(table) == set(recorded), set(table) ^ set(recorded)
    for name, flag in table.items():
        rec = recorded[name]
        assert flag.kind == rec["kind"], name
        if rec["kind"] == "value":
            assert flag.type.__name__ == rec["type"], name
        assert tuple(flag.aliases) == tuple(rec.get("aliases", [])), name
        if "choices" in rec:
            assert flag.choices is not None and list(flag.choices) == rec["choices"], name


_VARIANTS = [
    {},
    {"speculative": {"use_draft_logits": True, "max_draft_len": 7}},
    {"target": {"kv_cache": "fp8", "tp_size": 2}, "gpu": {"count": 2}},
    {"target": {"dtype": "bfloat16"}, "draft": {"dtype": "float32", "quantization": "none"}},
]


@pytest.mark.parametrize("line,variant", list(itertools.product(sorted(VERSIONS), range(len(_VARIANTS)))))
def test_every_build_command_parses_with_upstream_s_flags(tmp_path, tiny_pair, line, variant):
    spec = engine_spec(tmp_path, tiny_pair, engine={"trtllm_version": VERSIONS[line]}, **_VARIANTS[variant])
    parser = make_parser(VERSIONS[line])  # argparse over the recorded flags: exits on an unknown flag or choice
    example = facts.load("draft_target_example")
    for role in ("target", "draft"):
        cmd = trtllm_build_command(spec, role, tmp_path / "ckpt", tmp_path / "out")
        ns = parser.parse_args(cmd[1:])
        assert ns.use_paged_context_fmha == example["both_engines_flags"]["--use_paged_context_fmha"]
        if role == "target":
            assert ns.speculative_decoding_mode == example["target_flags"]["--speculative_decoding_mode"]
            assert ns.max_draft_len == spec.speculative.max_draft_len
        else:
            assert ns.speculative_decoding_mode is None
        # run_dtm_pld.py asserts --gather_generation_logits on draft AND target for logits-based acceptance
        assert ns.gather_generation_logits is spec.speculative.use_draft_logits, role
        assert not (ns.gather_context_logits and (ns.max_draft_len or 0) > 0)  # build.py's RuntimeError


def test_use_draft_logits_builds_both_engines_with_generation_logits(tmp_path, tiny_pair):
    spec = engine_spec(tmp_path, tiny_pair, speculative={"use_draft_logits": True})
    for role in ("target", "draft"):
        assert "--gather_generation_logits" in trtllm_build_command(spec, role, tmp_path / "c", tmp_path / "o"), role


# -- the tensorrt_llm / tensorrt_llm_draft configs ----------------------------------------------------------------
def _configs(tmp_path, tiny_pair, **overrides) -> dict[str, pb.ModelConfig]:
    from google.protobuf import text_format

    spec = engine_spec(tmp_path, tiny_pair, **overrides)
    return spec, {
        name: text_format.Parse(serialize(cfg), pb.ModelConfig()) for name, cfg in engine_model_configs(spec).items()
    }


def _fill(data_type: str, model_dtype: str) -> str:
    """The template's ${...} data types as trtspec fills them: model dtype for features/prompt tables, FP32 logits."""
    if data_type in ("${encoder_input_features_data_type}", "${prompt_embedding_table_data_type}"):
        return _DTYPES[model_dtype]
    return "TYPE_FP32" if data_type == "${logits_datatype}" else data_type


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_engine_tensors_are_the_template_s(tmp_path, tiny_pair, dtype):
    spec, configs = _configs(tmp_path, tiny_pair, target={"dtype": dtype}, draft={"dtype": dtype})
    tpl = facts.template(spec.engine.trtllm_version)
    inputs = {t["name"]: t for t in tpl["inputs"]}
    outputs = {t["name"]: t for t in tpl["outputs"]}
    for cfg in configs.values():
        for i in cfg.input:
            rec = inputs.get(i.name)
            assert rec is not None, f"{i.name} is not an input of upstream's template"
            assert pb.DataType.Name(i.data_type) == _fill(rec["data_type"], dtype), i.name
            assert list(i.dims) == rec["dims"] and i.optional == rec["optional"], i.name
            assert i.allow_ragged_batch == rec["allow_ragged_batch"], i.name
            assert (list(i.reshape.shape) if i.HasField("reshape") else None) == rec["reshape"], i.name
        got = {o.name: (pb.DataType.Name(o.data_type), list(o.dims)) for o in cfg.output}
        assert got == {n: (_fill(t["data_type"], dtype), t["dims"]) for n, t in outputs.items()}


def test_every_output_the_backend_writes_unasked_is_declared(tmp_path, tiny_pair):
    """return_perf_metrics makes the backend write its perf outputs into every response (fillTritonResponse); Triton
    fails a response with an undeclared output."""
    _, configs = _configs(tmp_path, tiny_pair)
    for cfg in configs.values():
        declared = {o.name: pb.DataType.Name(o.data_type) for o in cfg.output}
        for name, data_type in facts.perf_outputs().items():
            assert declared.get(name) == data_type, name
        asked = {i.name for i in cfg.input}
        assert {"return_perf_metrics", "return_num_input_tokens", "return_num_output_tokens"} <= asked


def test_every_parameter_the_backend_reads_unguarded_is_written(tmp_path, tiny_pair):
    _, configs = _configs(tmp_path, tiny_pair)
    recorded = facts.backend_parameters()
    template_keys = set(facts.template()["parameters"])
    bools = facts.load("tensorrtllm_backend_parameters")["bool_values"]
    for name, cfg in configs.items():
        params = {k: v.string_value for k, v in cfg.parameters.items()}
        missing = facts.unguarded_parameters() - set(params)
        assert not missing, f"{name}: the backend throws 'Cannot find parameter with name' for {sorted(missing)}"
        for key, value in params.items():
            assert key in template_keys, f"{key} is not a parameter of upstream's template"
            assert "${" not in value, key
            rec = recorded.get(key)
            if rec is None:
                continue  # FORCE_CPU_ONLY_INPUT_TENSORS: read by Triton's backend utilities, not by the backend
            if rec["type"] == "bool":
                assert value in bools["true"] + bools["false"], key
            if rec["type"] in ("int32", "int", "uint32"):
                assert value.lstrip("-").isdigit() and -(2**31) <= int(value) < 2**31, key
            if rec.get("values") is not None:
                assert value in rec["values"], (key, value)
        assert params["guided_decoding_backend"] == ""  # guided decoding off, explicitly


def test_kv_caches_are_sized_in_tokens_whatever_the_load_order(tmp_path, tiny_pair):
    """kv_cache_free_gpu_mem_fraction is a share of what is free when each executor allocates (load order decides);
    max_tokens_in_paged_kv_cache is absolute: both engines get the memory plan's token capacity."""
    from trtspec.build.memory import plan_memory
    from trtspec.families import read_config

    spec, configs = _configs(tmp_path, tiny_pair)
    plan = plan_memory(spec, read_config(tiny_pair[0]), read_config(tiny_pair[1]))
    for cfg in configs.values():
        params = {k: v.string_value for k, v in cfg.parameters.items()}
        assert int(params["max_tokens_in_paged_kv_cache"]) == plan.kv_tokens_capacity > 0
        assert "kv_cache_free_gpu_mem_fraction" not in params
    # Target and draft bytes for that many tokens fit what GPU 0 has left after both models' weights.
    per_token = plan.target.kv_bytes_per_token_per_gpu + plan.draft.kv_bytes_per_token
    assert plan.kv_tokens_capacity * per_token <= plan.free_for_kv_gpu0


# -- LLM API -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.0.0", "1.1.0", "1.2.1"])
def test_model_yaml_speaks_the_recorded_llm_api(tmp_path, tiny_pair, version):
    from trtspec.trtllm.llmapi import model_yaml_text

    spec = engine_spec(
        tmp_path,
        tiny_pair,
        runtime="trtllm-llmapi",
        engine={"trtllm_version": version},
        target={"quantization": "none"},
        draft={"quantization": "none"},
    )
    data = yaml.safe_load(model_yaml_text(spec))
    api = facts.llm_api(version)
    sc = dict(data["speculative_config"])
    assert api["decoding_types"].get(sc.pop("decoding_type")) == "DraftTargetDecodingConfig"
    base = api["decoding_base_config"]
    allowed = set(base["fields"]) | {a for v in base.get("aliases", {}).values() for a in v}
    assert set(sc) <= allowed
    assert sc["max_draft_len"] == spec.speculative.max_draft_len > 0
    later = facts.load("llm_api")["readings"]["discriminated-union"]
    assert set(data["kv_cache_config"]) <= set(later["kv_cache_config_fields"])
    assert set(data) - {"triton_config"} <= set(later["llm_args_fields"])


def test_the_unverified_1_2_llm_api_row_says_so_in_model_yaml(tmp_path, tiny_pair):
    from trtspec.trtllm.llmapi import model_yaml_text

    spec = engine_spec(
        tmp_path,
        tiny_pair,
        runtime="trtllm-llmapi",
        engine={"trtllm_version": "1.2.1"},
        target={"quantization": "none"},
        draft={"quantization": "none"},
    )
    assert "not verified" in model_yaml_text(spec).split("\n\n")[0]


# -- NGC images --------------------------------------------------------------------------------------------------
def test_ngc_table_is_the_recorded_one():
    recorded = facts.ngc_images()
    assert {t.tag: t.trtllm_version for t in NGC_TAGS} == {tag: normalize_version(v) for tag, v in recorded.items()}
    by_tag = {t.tag: t for t in NGC_TAGS}
    for image in facts.load("ngc_images")["images"]:
        assert by_tag[image["tag"]].source == image["source"], image["tag"]


# -- the ensemble (what clients send) -----------------------------------------------------------------------------
def _ensemble_specs(tmp_path, tiny_pair):
    from tests.serving_helpers import torch_spec_dict
    from trtspec.spec import spec_from_dict

    yield "trtllm-engine", engine_spec(tmp_path, tiny_pair)
    for orchestration in ("bls", "in_process"):
        data = torch_spec_dict(*tiny_pair, triton={"orchestration": orchestration})
        yield f"torch {orchestration}", spec_from_dict(data, base_dir=tmp_path / orchestration, environ={})


@pytest.mark.parametrize("line", sorted(VERSIONS))
def test_the_ensemble_declares_every_upstream_input_with_its_type(tmp_path, tiny_pair, line):
    """A client of TensorRT-LLM's ensemble may send any of its inputs: an undeclared one fails with Triton's
    "unexpected inference input" before any model can answer it (issue 23, item 7)."""
    from trtspec.triton_repo.definitions import ensemble

    recorded = facts.ensemble_inputs(VERSIONS[line])
    for what, spec in _ensemble_specs(tmp_path, tiny_pair):
        declared = {i.name: i for i in ensemble(spec).config.input}
        for rec in recorded:
            i = declared.get(rec["name"])
            assert i is not None, f"{what}: upstream's ensemble input {rec['name']} is not declared"
            assert pb.DataType.Name(i.data_type) == f"TYPE_{rec['data_type']}", (what, rec["name"])
            assert list(i.dims) == rec["dims"], (what, rec["name"])
            # text_input and max_tokens: declared optional on purpose (trtspec.triton_repo.tensors)
            assert i.optional or not rec["optional"], (what, rec["name"])
            assert i.allow_ragged_batch == rec.get("allow_ragged_batch", False), (what, rec["name"])


def test_every_input_the_ensemble_does_not_implement_reaches_preprocessing(tmp_path, tiny_pair):
    """Each upstream input without a trtspec model input goes to preprocessing, which refuses a non-default value."""
    from trtspec.triton_repo.definitions import ensemble
    from trtspec.triton_repo.names import PRE
    from trtspec.validation import ALWAYS_HONOURED_INPUTS, UNSUPPORTED_INPUTS

    recorded = {r["name"] for r in facts.ensemble_inputs()}
    assert set(UNSUPPORTED_INPUTS) | set(ALWAYS_HONOURED_INPUTS) <= recorded
    for what, spec in _ensemble_specs(tmp_path, tiny_pair):
        steps = ensemble(spec).config.ensemble_scheduling.step
        consumed = {v for s in steps for v in s.input_map.values()}
        assert recorded <= consumed, (what, sorted(recorded - consumed))
        pre = next(s for s in steps if s.model_name == PRE)
        assert set(UNSUPPORTED_INPUTS) <= set(pre.input_map.values()), what
