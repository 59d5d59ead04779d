"""Engine-backed tensorrt_llm / tensorrt_llm_draft: real ModelConfig protobufs, every needed value filled."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from tests.engine_helpers import engine_spec
from trtspec.build.memory import plan_memory
from trtspec.families import read_config
from trtspec.triton_repo.engine_definitions import engine_model_configs, serving_layout
from trtspec.triton_repo.pbtxt import serialize

# What TensorRT-LLM's tensorrt_llm/config.pbtxt template needs filled (tests/upstream/tensorrt_llm_template.json),
# as they appear in the written config.
_MANDATORY_PARAMETERS = (
    "gpt_model_type",
    "gpt_model_path",
    "max_beam_width",
    "max_tokens_in_paged_kv_cache",
    "gpu_device_ids",
    "enable_kv_cache_reuse",
    "batch_scheduler_policy",
)


def _parse(text: str) -> pb.ModelConfig:
    return text_format.Parse(text, pb.ModelConfig())  # an unknown field raises ParseError


def test_both_engine_models_parse_and_have_every_mandatory_value(tmp_path, tiny_pair):
    spec = engine_spec(tmp_path, tiny_pair)
    plan = plan_memory(spec, read_config(tiny_pair[0]), read_config(tiny_pair[1]))
    configs = engine_model_configs(spec)
    assert set(configs) == {"tensorrt_llm", "tensorrt_llm_draft"}
    for name, role in (("tensorrt_llm", "target"), ("tensorrt_llm_draft", "draft")):
        text = serialize(configs[name])
        assert "${" not in text
        cfg = _parse(text)
        assert cfg.name == name and cfg.backend == "tensorrtllm"
        assert cfg.max_batch_size == spec.engine.max_batch_size
        assert cfg.HasField("model_transaction_policy")
        assert cfg.dynamic_batching.max_queue_delay_microseconds == spec.triton.max_queue_delay_us
        assert cfg.dynamic_batching.default_queue_policy.max_queue_size > 0
        params = {k: v.string_value for k, v in cfg.parameters.items()}
        for key in _MANDATORY_PARAMETERS:
            assert params.get(key), key
        assert params["gpt_model_type"] == "inflight_fused_batching"
        assert params["gpt_model_path"] == f"/engines/{role}"
        assert params["gpu_device_ids"] == "0"
        assert int(params["max_tokens_in_paged_kv_cache"]) == plan.kv_tokens_capacity  # absolute, order-independent
        assert "kv_cache_free_gpu_mem_fraction" not in params
        assert "participant_ids" not in params and "speculative_decoding_fast_logits" not in params
        inputs = {i.name: i for i in cfg.input}
        assert inputs["encoder_input_features"].data_type == pb.TYPE_FP16  # the models' dtype
        assert inputs["draft_logits"].data_type == pb.TYPE_FP32  # logits_datatype = the engines' float32 logits
        assert inputs["draft_input_ids"].data_type == pb.TYPE_INT32 and list(inputs["draft_input_ids"].dims) == [-1]
        assert not inputs["input_lengths"].optional and list(inputs["input_lengths"].reshape.shape) == []
        outputs = {o.name: o for o in cfg.output}
        assert outputs["generation_logits"].data_type == pb.TYPE_FP32
        assert list(outputs["output_ids"].dims) == [-1, -1]


def test_tensor_parallel_target_gets_fast_logits_participants_and_world_size(tmp_path, tiny_pair):
    spec = engine_spec(tmp_path, tiny_pair, target={"tp_size": 4}, gpu={"count": 4})
    layout = serving_layout(spec)
    assert layout.fast_logits and layout.world_size == 1 + 1 + 4  # orchestrator + draft + target ranks
    configs = engine_model_configs(spec)
    t = {k: v.string_value for k, v in configs["tensorrt_llm"].parameters.items()}
    d = {k: v.string_value for k, v in configs["tensorrt_llm_draft"].parameters.items()}
    assert t["gpu_device_ids"] == "0,1,2,3" and d["gpu_device_ids"] == "0"
    assert d["participant_ids"] == "1" and t["participant_ids"] == "2,3,4,5"
    assert t["speculative_decoding_fast_logits"] == d["speculative_decoding_fast_logits"] == "1"
    for cfg in configs.values():
        assert "${" not in serialize(cfg)  # serialize checks that the text parses back


def test_kv_fraction_overrides_from_the_spec_are_used(tmp_path, tiny_pair):
    spec = engine_spec(tmp_path, tiny_pair, triton={"target_kv_cache_fraction": 0.3, "draft_kv_cache_fraction": 0.2})
    configs = engine_model_configs(spec)
    assert configs["tensorrt_llm"].parameters["kv_cache_free_gpu_mem_fraction"].string_value == "0.3000"
    assert configs["tensorrt_llm_draft"].parameters["kv_cache_free_gpu_mem_fraction"].string_value == "0.2000"


def test_bfloat16_models_declare_bf16_feature_inputs(tmp_path, tiny_pair):
    spec = engine_spec(tmp_path, tiny_pair, target={"dtype": "bfloat16"})
    cfg = engine_model_configs(spec)["tensorrt_llm"]
    assert {i.name: i.data_type for i in cfg.input}["prompt_embedding_table"] == pb.TYPE_BF16
