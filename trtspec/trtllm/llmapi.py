"""Runtime trtllm-llmapi: the Triton `llmapi` model's ``model.yaml`` with a draft-target ``speculative_config``.

TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm/1/model.py reads ``model.yaml``: ``triton_config``
(max_batch_size, decoupled) configures Triton, every other key goes through ``update_llm_args_with_extra_dict`` into
``LLM(**args)``; ``speculative_config`` becomes a DecodingBaseConfig through ``from_dict``, dispatched on
``decoding_type``. The draft checkpoint's field name differs between releases (trtllm_versions.LlmApiFields).
"""

from __future__ import annotations

from typing import Any

from trtspec.errors import SpecError
from trtspec.spec import BuildSpec
from trtspec.trtllm.container import checkpoint_path_in_container
from trtspec.trtllm.trtllm_versions import get_release

# NGramDecodingConfig (tensorrt_llm/llmapi/llm_args.py; tests/upstream/ngram_decoding.json): its pool is built at run
# time from the requests served (is_public_pool: one pool for all of them); it cannot be pre-seeded from a file.
NGRAM_DECODING_TYPE = "NGram"


def speculative_config(spec: BuildSpec) -> dict[str, Any]:
    """``speculative_config`` for DraftTarget (drafters model and adaptive: TensorRT-LLM's draft-target at a fixed K;
    no release in trtspec's table is recorded with its SpeculationGate fields) or NGram (``ngram``), with the targeted
    release's field names."""
    from trtspec.speculative.drafters.ngram import MAX_MATCH
    from trtspec.speculative.drafters.registry import entry as drafter_entry

    version = spec.engine.trtllm_version
    fields = get_release(version).llmapi
    if not fields.supported:
        raise SpecError(
            f"runtime trtllm-llmapi needs TensorRT-LLM >= 1.0; engine.trtllm_version is {version}",
            hint="set engine.trtllm_version to 1.0.0 or later, or use runtime trtllm-engine",
        )
    drafter = drafter_entry(spec.speculative.drafter)
    if drafter.llmapi_decoding_type is None:
        raise SpecError(
            f"runtime trtllm-llmapi does not serve drafter {drafter.kind.value} ({drafter.llmapi_note})",
            hint="set speculative.drafter to adaptive, model or ngram",
        )
    if drafter.llmapi_decoding_type == NGRAM_DECODING_TYPE:
        return {
            "decoding_type": NGRAM_DECODING_TYPE,
            "max_draft_len": spec.speculative.max_draft_len,
            "max_matching_ngram_size": MAX_MATCH,
            "is_keep_all": True,
            "is_use_oldest": True,
            "is_public_pool": True,
        }
    return {
        "decoding_type": fields.decoding_type,
        "max_draft_len": spec.speculative.max_draft_len,
        fields.draft_model_field: checkpoint_path_in_container("draft"),
    }


def model_yaml(spec: BuildSpec) -> dict[str, Any]:
    """The whole model.yaml as a dict: target checkpoint, parallelism, limits, draft-target, Triton settings."""
    return {
        "model": checkpoint_path_in_container("target"),
        "backend": "pytorch",
        "tensor_parallel_size": spec.target.tp_size,
        "pipeline_parallel_size": 1,
        "max_batch_size": spec.engine.max_batch_size,
        "max_seq_len": spec.engine.max_seq_len,
        # Draft-target on the PyTorch backend runs without the overlap scheduler (TensorRT-LLM's
        # speculative-decoding guide passes disable_overlap_scheduler=True with DraftTargetDecodingConfig).
        "disable_overlap_scheduler": True,
        "kv_cache_config": {
            "enable_block_reuse": True,
            "free_gpu_memory_fraction": round(min(0.9, spec.gpu.memory_utilization), 4),
        },
        "speculative_config": speculative_config(spec),
        # upstream: "The current implementation does not support batching" -> max_batch_size 0 for Triton
        "triton_config": {"max_batch_size": 0, "decoupled": spec.triton.decoupled},
    }


def model_yaml_text(spec: BuildSpec) -> str:
    """model.yaml as written into ``<repo>/tensorrt_llm/1/model.yaml``."""
    import yaml

    header = (
        f"# Written by trtspec for TensorRT-LLM {spec.engine.trtllm_version} (LLM API, PyTorch backend).\n"
        "# Paths are as mounted in the serving container (trtspec.trtllm.container).\n"
    )
    if not get_release(spec.engine.trtllm_version).llmapi.verified:
        header += (
            "# speculative_config names for this release are not verified against its llm_args.py: a later\n"
            "# llm_args.py accepts only decoding_type Draft_Target and speculative_model (see the README).\n"
        )
    return header + yaml.safe_dump(model_yaml(spec), sort_keys=False)
