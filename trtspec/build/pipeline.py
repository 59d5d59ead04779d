"""`trtspec build`: check -> quantize -> quality -> compile -> repo, resumable, atomic, Ctrl-C safe, with one progress
display.

Every stage with an output writes it through ``atomic_dir`` and stamps it with a manifest whose ``inputs_hash`` covers
the stage's input paths (content) and settings; a stage whose output carries the current hash is skipped. A killed
build leaves only ``.tmp-*`` siblings, which the next run removes before it starts (under a lock, so never another
build's). The stage bodies live with their owners and are imported lazily by the names in ``DEFAULT_BODIES``.
"""

from __future__ import annotations

import importlib
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.build.artifacts import atomic_dir, build_lock, hash_inputs, is_up_to_date, tool_versions, write_manifest
from trtspec.build.plan import ROLES, checkpoint_dir, engine_dir
from trtspec.errors import Interrupted, MissingDependencyError, SpecError
from trtspec.spec import BuildSpec, Runtime

InputsFn = Callable[[], tuple[dict[str, Path | None], dict]]
BodyFn = Callable[[Path, Any], dict]

# Where each stage body lives; resolved on first use so that `trtspec --help` stays light.
DEFAULT_BODIES: dict[str, tuple[str, str]] = {
    "quantize_inputs": ("trtspec.build.quantize", "quantize_inputs"),
    "quantize_into": ("trtspec.build.quantize", "quantize_into"),
    "compile_inputs": ("trtspec.engines.compile", "compile_inputs"),
    "compile_into": ("trtspec.engines.compile", "compile_into"),
    "repo_inputs": ("trtspec.triton_repo.writer", "repo_inputs"),
    "write_repo_into": ("trtspec.triton_repo.writer", "write_repo_into"),
}


@dataclass
class StageBodies:
    """The functions behind the stages; None means the default from DEFAULT_BODIES."""

    quantize_inputs: Callable | None = None
    quantize_into: Callable | None = None
    compile_inputs: Callable | None = None
    compile_into: Callable | None = None
    repo_inputs: Callable | None = None
    write_repo_into: Callable | None = None

    def get(self, name: str) -> Callable:
        fn = getattr(self, name)
        if fn is not None:
            return fn
        module, attr = DEFAULT_BODIES[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise MissingDependencyError(
                f"this trtspec has no {attr} ({module}): the stage it belongs to is not installed",
                hint=f"update trtspec; the import failed with: {exc}",
            ) from None


@dataclass
class PipelineStage:
    name: str
    output: Path | None  # None: no output directory (check, or a stage this runtime does not need)
    inputs: InputsFn | None = None
    body: BodyFn | None = None
    not_needed: str | None = None  # why the stage does nothing for this spec


@dataclass
class StageResult:
    name: str
    status: str  # passed | built | skipped | not needed
    output: str | None = None
    seconds: float = 0.0
    detail: str = ""

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "output": self.output,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


@dataclass
class BuildReport:
    stages: list[StageResult] = field(default_factory=list)

    def status(self, name: str) -> str:
        return next(s.status for s in self.stages if s.name == name)

    def to_dict(self) -> dict:
        return {"stages": [s.to_dict() for s in self.stages]}


def _needs_quantize(spec: BuildSpec, role: str) -> bool:
    from trtspec.build.quantize import stage_needed  # one rule: an fp8 KV cache alone is a quantized checkpoint too

    return stage_needed(spec, role)


def pipeline_stages(spec: BuildSpec, bodies: StageBodies | None = None) -> list[PipelineStage]:
    """Every stage of `trtspec build` for this spec, in order."""
    b = bodies or StageBodies()

    def role_stage(name: str, output: Path, role: str) -> PipelineStage:
        return PipelineStage(
            f"{name}:{role}",
            output,
            inputs=lambda: b.get(f"{name}_inputs")(spec, role),
            body=lambda out, progress: b.get(f"{name}_into")(spec, role, out, progress),
        )

    stages = [PipelineStage("check", None)]
    for role in ROLES:
        if _needs_quantize(spec, role):
            stages.append(role_stage("quantize", checkpoint_dir(spec, role), role))
        else:
            stages.append(
                PipelineStage(
                    f"quantize:{role}", None, not_needed="quantization none: served from its source directory"
                )
            )
    if any(_needs_quantize(spec, r) for r in ROLES):
        stages.append(PipelineStage("quality", None))  # build/quality.json (a file, see _run_quality)
    else:
        stages.append(PipelineStage("quality", None, not_needed="nothing is quantized"))
    for role in ROLES:
        if spec.runtime is Runtime.TRTLLM_ENGINE:
            stages.append(role_stage("compile", engine_dir(spec, role), role))
        else:
            stages.append(
                PipelineStage(
                    f"compile:{role}", None, not_needed=f"{spec.runtime.value} loads the checkpoint at serve time"
                )
            )

    def repo_inputs() -> tuple[dict[str, Path | None], dict]:
        return b.get("repo_inputs")(spec)  # runs the engines' version guard (trtspec.triton_repo.writer)

    def repo_body(out: Path, progress: Any) -> dict:
        return b.get("write_repo_into")(spec, out) or {}

    stages.append(PipelineStage("repo", spec.repo_dir, inputs=repo_inputs, body=repo_body))
    return stages


def _run_check(spec: BuildSpec) -> str:
    from trtspec.build.check import run_check

    report = run_check(spec)
    if not report.ok:
        first = report.errors[0]
        more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        raise SpecError(
            f"preflight check failed: {first.check}: {first.detail}{more}",
            hint=first.hint or "`trtspec check` shows every finding",
        )
    warns = [f.check for f in report.findings if f.level.value == "warn"]
    return f"{len(report.findings)} checks, warnings: {', '.join(warns)}" if warns else f"{len(report.findings)} checks"


def clean_stale_outputs(outputs: Iterable[Path]) -> list[Path]:
    """Remove ``.tmp-<name>-*`` / ``.old-<name>-*`` siblings that killed runs left next to our outputs."""
    removed = []
    for out in outputs:
        parent = out.parent
        if not parent.is_dir():
            continue
        for p in parent.iterdir():
            if p.name.startswith((f".tmp-{out.name}-", f".old-{out.name}-")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def run_pipeline(
    spec: BuildSpec,
    *,
    only: Iterable[str] | None = None,
    force: bool = False,
    bodies: StageBodies | None = None,
    progress: Any = None,
    on_result: Callable[[StageResult], None] | None = None,
) -> BuildReport:
    """Run the stages (all, or those named in ``only``); skip up-to-date ones unless ``force``."""
    stages = pipeline_stages(spec, bodies)
    wanted = set(only) if only is not None else None
    if wanted is not None:
        unknown = wanted - {s.name for s in stages}
        if unknown:
            raise SpecError(
                f"no stage named {', '.join(sorted(unknown))}", hint=f"stages: {', '.join(s.name for s in stages)}"
            )
        stages = [s for s in stages if s.name in wanted]
    report = BuildReport()
    current: str | None = None
    try:
        with build_lock(spec.build_dir):
            clean_stale_outputs(s.output for s in stages if s.output is not None)
            overall = progress.add_task("build", total=len(stages)) if progress is not None else None
            for stage in stages:
                current = stage.name
                if progress is not None:
                    progress.update(overall, description=f"build: {stage.name}")
                result = _run_stage(spec, stage, force, progress)
                report.stages.append(result)
                if on_result is not None:
                    on_result(result)
                if progress is not None:
                    progress.advance(overall)
            if progress is not None:
                progress.update(overall, description="build: done")
    except KeyboardInterrupt as exc:
        # Still a KeyboardInterrupt for Python callers; the CLI reads what it says about the build.
        exc.trtspec_stage = current  # type: ignore[attr-defined]
        exc.trtspec_done = [r.name for r in report.stages if r.status in ("built", "skipped")]  # type: ignore
        raise
    return report


def interrupted_error(exc: KeyboardInterrupt) -> Interrupted:
    """What to tell a user whose Ctrl-C stopped ``run_pipeline``: the stage, and what was kept."""
    stage = getattr(exc, "trtspec_stage", None)
    done = getattr(exc, "trtspec_done", [])
    return Interrupted(
        (f"during {stage}; its partial output was removed" if stage else "before the first stage")
        + (f"; completed stages kept: {', '.join(done)}" if done else ""),
        hint="run the same command again: completed stages are skipped",
    )


def _run_stage(spec: BuildSpec, stage: PipelineStage, force: bool, progress: Any) -> StageResult:
    t0 = time.monotonic()
    if stage.name == "check":
        detail = _run_check(spec)
        return StageResult("check", "passed", None, time.monotonic() - t0, detail)
    if stage.not_needed is not None:
        return StageResult(stage.name, "not needed", None, 0.0, stage.not_needed)
    if stage.name == "quality":
        return _run_quality(spec, force, progress, t0)
    assert stage.output is not None and stage.inputs is not None and stage.body is not None
    paths, settings = stage.inputs()
    inputs_hash = hash_inputs(paths, settings)
    if not force and is_up_to_date(stage.output, inputs_hash):
        return StageResult(stage.name, "skipped", str(stage.output), time.monotonic() - t0, "up to date")
    started = time.time()
    with atomic_dir(stage.output) as tmp:
        extras = stage.body(tmp, progress) or {}
        write_manifest(
            tmp,
            {
                **extras,  # first: a body's fields never overwrite the hash the skip decision reads
                "stage": stage.name,
                "inputs_hash": inputs_hash,
                "inputs": {k: str(v) for k, v in paths.items()},
                "settings": settings,
                "started_at": started,
                "seconds": round(time.monotonic() - t0, 3),
                "tools": tool_versions("trtspec", "torch", "transformers", "nvidia-modelopt", "tritonclient"),
            },
        )
    return StageResult(stage.name, "built", str(stage.output), time.monotonic() - t0, "")


def _run_quality(spec: BuildSpec, force: bool, progress: Any, t0: float) -> StageResult:
    """Write build/quality.json (what quantization cost each model, and the draft-target agreement) unless it is newer
    than both checkpoints' manifests. The quantize stages measured the figures; this only combines them (a role
    served unquantized is evaluated from its source once, then cached)."""
    from trtspec.build.artifacts import MANIFEST
    from trtspec.build.quality import REPORT

    path = spec.build_dir / REPORT
    manifests = [checkpoint_dir(spec, r) / MANIFEST for r in ROLES if _needs_quantize(spec, r)]
    if (
        not force
        and path.is_file()
        and all(m.is_file() and m.stat().st_mtime <= path.stat().st_mtime for m in manifests)
    ):
        return StageResult("quality", "skipped", str(path), time.monotonic() - t0, "up to date")
    from trtspec.build.quality import write_quality_report

    report = write_quality_report(spec, progress)
    pair = (report.get("draft_target_top1_agreement") or {}).get("after")
    detail = f"draft-target top-1 agreement {pair:.3f}" if isinstance(pair, float) else "; ".join(report["notes"])
    return StageResult("quality", "built", str(path), time.monotonic() - t0, detail)
