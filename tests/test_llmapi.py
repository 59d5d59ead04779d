"""Runtime trtllm-llmapi: model.yaml's speculative_config with the targeted release's field names."""

from __future__ import annotations

import pytest
import yaml

from tests.engine_helpers import engine_spec
from trtspec.errors import SpecError
from trtspec.trtllm.llmapi import model_yaml_text


@pytest.mark.parametrize(
    "version,field",
    [
        ("1.0.0", "speculative_model_dir"),
        ("1.0.3", "speculative_model_dir"),
        ("1.1.0", "speculative_model_dir"),
        ("1.2.0", "speculative_model_dir"),
    ],
)
def test_model_yaml_names_the_draft_with_the_version_s_field(tmp_path, tiny_pair, version, field):
    spec = engine_spec(
        tmp_path,
        tiny_pair,
        runtime="trtllm-llmapi",
        engine={"trtllm_version": version},
        speculative={"max_draft_len": 5},
        target={"tp_size": 2},
        gpu={"count": 2},
    )
    data = yaml.safe_load(model_yaml_text(spec))
    sc = data["speculative_config"]
    assert sc == {"decoding_type": "DraftTarget", "max_draft_len": 5, field: "/checkpoints/draft"}
    assert data["model"] == "/checkpoints/target" and data["backend"] == "pytorch"
    assert data["tensor_parallel_size"] == 2 and data["max_seq_len"] == spec.engine.max_seq_len
    assert data["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert data["kv_cache_config"]["enable_block_reuse"] is True


@pytest.mark.parametrize("version", ["0.20.0", "0.21.0"])
def test_llmapi_runtime_refuses_releases_before_1_0(tmp_path, tiny_pair, version):
    spec = engine_spec(tmp_path, tiny_pair, runtime="trtllm-llmapi", engine={"trtllm_version": version})
    with pytest.raises(SpecError, match="needs TensorRT-LLM >= 1.0"):
        model_yaml_text(spec)
