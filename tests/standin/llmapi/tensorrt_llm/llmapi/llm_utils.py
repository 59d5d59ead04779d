"""STAND-IN (tests only): ``tensorrt_llm.llmapi.llm_utils.update_llm_args_with_extra_dict``.

Upstream merges a YAML dict into the LLM arguments and turns its config sections into their pydantic objects
(``speculative_config`` through ``DecodingBaseConfig.from_dict``, dispatched on ``decoding_type``)."""

from __future__ import annotations

from typing import Any

import tensorrt_llm
from tensorrt_llm import KV_CACHE_FIELDS, DraftTargetDecodingConfig


def update_llm_args_with_extra_dict(llm_args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    args = {**llm_args, **extra}
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        # The decoding_type keys the recorded reading of this release dispatches on (tests/upstream/llm_api.json).
        types = tensorrt_llm._api(tensorrt_llm.__version__)["decoding_types"]
        data = dict(spec)
        kind = data.pop("decoding_type", None)
        if types.get(kind) != "DraftTargetDecodingConfig":
            raise ValueError(f"Invalid decoding type: {kind}")
        args["speculative_config"] = DraftTargetDecodingConfig(**data)
    kv = args.get("kv_cache_config")
    if isinstance(kv, dict):
        unknown = set(kv) - KV_CACHE_FIELDS
        if unknown:
            raise ValueError(f"kv_cache_config: extra fields not permitted: {sorted(unknown)}")
    return args
