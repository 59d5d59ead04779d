"""The quantize stage: ModelOpt post-training quantization of the target or the draft, and its export.

``quantize_inputs`` (what to hash), ``quantize_into`` (the body, run inside an atomic output directory; the work itself
is in :mod:`trtspec.build.ptq`) and ``quantize_plan`` (the plan entry) are what :mod:`trtspec.pipeline` runs as the
quantize stage of one role, for `trtspec build` and `trtspec quantize`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.build.artifacts import tool_versions
from trtspec.build.calibration import calibration_source
from trtspec.build.layout import ROLES, is_quantized, needs_checkpoint
from trtspec.build.ptq import export_kind
from trtspec.build.stages import PlanEntry
from trtspec.errors import QuantizationError
from trtspec.spec import BuildSpec, Runtime

if TYPE_CHECKING:
    from rich.progress import Progress

STAGE_VERSION = 1  # bump when quantize_into's output changes for the same inputs


def quantize_inputs(spec: BuildSpec, role: str) -> tuple[dict[str, Path | None], dict]:
    """The paths and settings whose hash decides whether a role's quantized checkpoint is up to date."""
    model = getattr(spec, role)
    calibrate = is_quantized(spec, role)
    paths: dict[str, Path | None] = {
        "model": spec.model_path(role),
        "calibration": calibration_source(spec) if calibrate else None,
    }
    settings = {
        "stage": "quantize",
        "stage_version": STAGE_VERSION,
        "role": role,
        "quantization": model.quantization.value,
        "kv_cache": model.kv_cache.value,
        "dtype": model.dtype.value,
        "tp_size": model.tp_size,
        "export": export_kind(spec),
        "calibration": {
            "samples": spec.calibration.samples,
            "seq_len": spec.calibration.seq_len,
            "batch_size": spec.calibration.batch_size,
            "field": spec.calibration.field if spec.calibration.file else None,
        }
        if calibrate
        else None,
        "versions": _quantizer_versions(spec, role),
    }
    return paths, settings


def _quantizer_versions(spec: BuildSpec, role: str) -> dict:
    """The versions of what quantizes (a new one rebuilds the checkpoint). Where the stage cannot run (its packages
    are not trtspec's pins: the NGC image's are TensorRT-LLM's), those recorded by a checkpoint already there, so that
    one quantized elsewhere from the same inputs is kept and the rest of the build runs; any other change still
    reaches the stage, which then refuses in one line."""
    from trtspec.build.artifacts import read_manifest
    from trtspec.build.layout import checkpoint_dir
    from trtspec.build.toolchain import unmet_packages

    versions = tool_versions("nvidia-modelopt", "transformers", "torch")
    if unmet_packages("quantize"):
        recorded = ((read_manifest(checkpoint_dir(spec, role)) or {}).get("settings") or {}).get("versions")
        if isinstance(recorded, dict):
            return recorded
    return versions


def quantize_into(spec: BuildSpec, role: str, out_dir: Path, progress: Progress | None = None) -> dict:
    """Quantize (calibrate) one role and export its checkpoint plus tokenizer into ``out_dir``; extra manifest
    fields."""
    from trtspec.build.ptq import calibrate, export_calibrated

    if role not in ROLES:
        raise QuantizationError(f"unknown role {role!r}", hint="use target or draft")
    if not needs_checkpoint(spec, role):
        raise QuantizationError(
            f"{role}: quantization none on runtime {spec.runtime.value}: nothing to write",
            hint="the source directory is served as is",
        )
    from trtspec.build.toolchain import require_stage_packages

    require_stage_packages("quantize")  # e.g. the NGC image: TensorRT-LLM's torch/transformers/ModelOpt, not trtspec's
    t0 = time.monotonic()
    calibrated = calibrate(spec, role, progress)
    extra = export_calibrated(spec, calibrated, Path(out_dir), progress)
    extra["timings"]["total_s"] = round(time.monotonic() - t0, 3)
    return extra


def quantize_plan(spec: BuildSpec, role: str) -> PlanEntry:
    """The quantize stage's entry in `trtspec plan`."""
    model = getattr(spec, role)
    src = str(spec.model_path(role, weights=False))  # the plan names the directory; it never needs the weights
    fmt = "TRT-LLM checkpoint" if spec.runtime is Runtime.TRTLLM_ENGINE else "unified HF checkpoint"
    if not is_quantized(spec, role):
        return PlanEntry(f"convert to {fmt} ({model.dtype.value})", [src])
    return PlanEntry(
        f"ModelOpt PTQ {model.quantization.value} (KV cache {model.kv_cache.value}) -> {fmt}", [src, "calibration data"]
    )
