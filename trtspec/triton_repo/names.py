"""The model names of a trtspec repository (TensorRT-LLM's names for the same roles), defined once.

Torch-free and protobuf-free: clients read a served repository's settings with these names.
"""

from __future__ import annotations

TARGET, DRAFT = "tensorrt_llm", "tensorrt_llm_draft"
BLS, PRE, POST, ENSEMBLE = "tensorrt_llm_bls", "preprocessing", "postprocessing", "ensemble"
ROLE_MODELS = {"target": TARGET, "draft": DRAFT}  # the engine-backed model of each role
# Runtime trtllm-llmapi's one model (upstream's llmapi model has the target's name); clients call it for the ensemble.
LLMAPI = TARGET
# The Python models' sources (trtspec/triton_repo/models/<source>/model.py) not named after the model they serve.
TORCH_ENGINE_SOURCE = "tensorrt_llm_torch"  # runtime torch: tensorrt_llm and tensorrt_llm_draft (BLS layout)
TORCH_SPEC_SOURCE = "tensorrt_llm_spec_torch"  # runtime torch, in_process: tensorrt_llm with the draft-target loop
LLMAPI_SOURCE = "tensorrt_llm_llmapi"  # runtime trtllm-llmapi: tensorrt_llm

# The model between preprocessing and postprocessing, which carries the draft-target settings (max_draft_len,
# route_threshold): the BLS orchestrator when there is one, else the torch runtime's in-process tensorrt_llm.
DRAFT_TARGET_MODELS = (BLS, TARGET)


def draft_target_params(params_of: dict[str, dict[str, str]]) -> dict[str, str]:
    """The draft-target settings among the models' string parameters ({model: {name: value}}): the first of
    DRAFT_TARGET_MODELS that has ``max_draft_len``; empty when none does (runtime trtllm-llmapi)."""
    for name in DRAFT_TARGET_MODELS:
        params = params_of.get(name) or {}
        if "max_draft_len" in params:
            return params
    return {}
