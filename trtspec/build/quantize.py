"""The quantize stage: ModelOpt post-training quantization of the target or the draft, and its export.

``quantize_into`` is the stage body the pipeline calls inside an atomic output directory (the work itself is in
:mod:`trtspec.build.ptq`); ``quantize_stage`` wraps it with the directory, the manifest and skip-if-up-to-date, for
``trtspec quantize``.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.build.artifacts import atomic_dir, hash_inputs, is_up_to_date, read_manifest, tool_versions, write_manifest
from trtspec.build.calibration import calibration_source
from trtspec.build.plan import ROLES, checkpoint_dir
from trtspec.build.ptq import export_kind, needs_calibration
from trtspec.errors import QuantizationError
from trtspec.spec import BuildSpec, Runtime

if TYPE_CHECKING:
    from rich.progress import Progress

STAGE_VERSION = 1  # bump when quantize_into's output changes for the same inputs


def stage_needed(spec: BuildSpec, role: str) -> bool:
    """False when the role is served from its source directory (no quantization, no engine checkpoint)."""
    return spec.runtime is Runtime.TRTLLM_ENGINE or needs_calibration(spec, role)


def quantize_inputs(spec: BuildSpec, role: str) -> tuple[dict[str, Path | None], dict]:
    """The paths and settings whose hash decides whether a role's quantized checkpoint is up to date."""
    model = getattr(spec, role)
    calibrate = needs_calibration(spec, role)
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
        "versions": tool_versions("nvidia-modelopt", "transformers", "torch"),
    }
    return paths, settings


def quantize_into(spec: BuildSpec, role: str, out_dir: Path, progress: Progress | None = None) -> dict:
    """Quantize (calibrate) one role and export its checkpoint plus tokenizer into ``out_dir``; extra manifest
    fields."""
    from trtspec.build.ptq import calibrate, export_calibrated

    if role not in ROLES:
        raise QuantizationError(f"unknown role {role!r}", hint="use target or draft")
    if not stage_needed(spec, role):
        raise QuantizationError(
            f"{role}: quantization none on runtime {spec.runtime.value}: nothing to write",
            hint="the source directory is served as is",
        )
    t0 = time.monotonic()
    calibrated = calibrate(spec, role, progress)
    extra = export_calibrated(spec, calibrated, Path(out_dir), progress)
    extra["timings"]["total_s"] = round(time.monotonic() - t0, 3)
    return extra


def _clean_stale(out: Path) -> None:
    """Remove temporaries of this output left by killed runs (never those of a process still running)."""
    if not out.parent.is_dir():
        return
    for p in out.parent.iterdir():
        for prefix in (f".tmp-{out.name}-", f".old-{out.name}-"):
            pid = p.name[len(prefix) :].split("-")[0] if p.name.startswith(prefix) else ""
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class StageOutcome:
    """What ``quantize_stage`` did for one role."""

    role: str
    path: Path
    status: str  # "built", "up to date", "not needed"
    manifest: dict | None


def quantize_stage(spec: BuildSpec, role: str, progress: Progress | None = None, force: bool = False) -> StageOutcome:
    """Run the quantize stage for one role into ``build/<role>/`` atomically, unless its output is up to date."""
    out = checkpoint_dir(spec, role)
    if not stage_needed(spec, role):
        return StageOutcome(role, spec.model_path(role), "not needed", None)
    paths, settings = quantize_inputs(spec, role)
    inputs_hash = hash_inputs(paths, settings)
    if not force and is_up_to_date(out, inputs_hash):
        return StageOutcome(role, out, "up to date", read_manifest(out))
    _clean_stale(out)
    started = time.time()
    with atomic_dir(out) as tmp:
        extra = quantize_into(spec, role, tmp, progress)
        manifest = {
            "stage": f"quantize:{role}",
            "inputs_hash": inputs_hash,
            "settings": settings,
            "inputs": {k: str(v) if v is not None else None for k, v in paths.items()},
            "started_at": started,
            "finished_at": time.time(),
            **extra,
        }
        write_manifest(tmp, manifest)
    return StageOutcome(role, out, "built", manifest)


def quantize_models(
    spec: BuildSpec, roles: tuple[str, ...] = ROLES, progress: Progress | None = None, force: bool = False
) -> list[StageOutcome]:
    """``trtspec quantize``: each role's stage under the build lock; a failure leaves no new build directory behind."""
    from trtspec.build.artifacts import build_lock

    build = spec.build_dir
    existed = build.exists()
    ok = False
    with build_lock(build) as lock_file:  # the lock `trtspec build` takes
        try:
            outcomes = [quantize_stage(spec, role, progress, force) for role in roles]
            ok = True
            return outcomes
        finally:
            if not ok and not existed:
                lock_file.unlink(missing_ok=True)
                if build.is_dir() and not any(build.iterdir()):
                    build.rmdir()
