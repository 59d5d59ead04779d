"""Loaders for the upstream facts recorded in this directory (one JSON file per upstream source; see README.md).

Tests compare what trtspec writes with these files, never with trtspec's own tables.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


@lru_cache(maxsize=None)
def load(name: str) -> dict[str, Any]:
    """One recorded source, e.g. ``load("trtllm_build")``."""
    return json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))


def release_line(version: str) -> str:
    """``1.2.0rc8`` -> ``1.2``."""
    major, minor = version.strip().lstrip("v").split(".")[:2]
    return f"{int(major)}.{int(''.join(c for c in minor if c.isdigit()))}"


def trtllm_build_flags(version: str) -> list[dict[str, Any]]:
    """trtllm-build's flags for the release line of ``version``."""
    data = load("trtllm_build")
    return data["readings"][data["releases"][release_line(version)]]["flags"]


def template(version: str = "1.0.0") -> dict[str, Any]:
    """The tensorrt_llm config.pbtxt template reading that applies to ``version``."""
    data = load("tensorrt_llm_template")
    return data["readings"][data["applies_to"][release_line(version)]]


def backend_parameters() -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in load("tensorrtllm_backend_parameters")["parameters"]}


def unguarded_parameters() -> set[str]:
    return {name for name, p in backend_parameters().items() if not p["guarded"]}


def perf_outputs() -> dict[str, str]:
    data = load("tensorrtllm_backend_parameters")
    return {o["name"]: o["data_type"] for o in data["perf_outputs"]["outputs"] + data["token_count_outputs"]["outputs"]}


def llm_api(version: str) -> dict[str, Any]:
    data = load("llm_api")
    return data["readings"][data["releases"][release_line(version)]]


def ngc_images() -> dict[str, str]:
    """NGC tag -> the TensorRT-LLM version it ships."""
    return {i["tag"]: i["trtllm_version"] for i in load("ngc_images")["images"]}


def ensemble_inputs(version: str = "1.0.0") -> list[dict[str, Any]]:
    """The ensemble's inputs (what clients send) in the reading that applies to ``version``."""
    data = load("ensemble_inputs")
    return data["readings"][data["applies_to"][release_line(version)]]["inputs"]
