"""STAND-IN (tests only): ``tensorrt_llm.llmapi``; see the package docstring."""

from tensorrt_llm import LLM, DraftTargetDecodingConfig, SamplingParams  # noqa: F401
