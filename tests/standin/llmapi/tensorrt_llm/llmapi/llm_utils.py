"""STAND-IN (tests only): ``tensorrt_llm.llmapi.llm_utils.update_llm_args_with_extra_dict``.

Upstream merges a YAML dict into the LLM arguments and turns its config sections into their pydantic objects
(``speculative_config`` through ``DecodingBaseConfig.from_dict``, dispatched on ``decoding_type``)."""

from __future__ import annotations

from typing import Any

from tensorrt_llm import KV_CACHE_FIELDS, DraftTargetDecodingConfig

DECODING_TYPES = {"DraftTarget": DraftTargetDecodingConfig}


def update_llm_args_with_extra_dict(llm_args: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    args = {**llm_args, **extra}
    spec = args.get("speculative_config")
    if isinstance(spec, dict):
        kind = spec.get("decoding_type")
        if kind not in DECODING_TYPES:
            raise ValueError(f"speculative_config: unknown decoding_type {kind!r}")
        args["speculative_config"] = DECODING_TYPES[kind](**spec)
    kv = args.get("kv_cache_config")
    if isinstance(kv, dict):
        unknown = set(kv) - KV_CACHE_FIELDS
        if unknown:
            raise ValueError(f"kv_cache_config: extra fields not permitted: {sorted(unknown)}")
    return args
