"""`trtspec build`: check -> quantize -> quality -> compile -> repo, resumable, atomic, Ctrl-C safe, with one progress
display.

``pipeline_stages`` is the one stage list: `trtspec build` runs it, `trtspec plan` describes it (each stage's
``describe``, :mod:`trtspec.plan`), `trtspec quantize` and `trtspec repo` run their stage of it (``quantize_models``,
``write_repo``). Every stage with an output goes through :func:`trtspec.build.stages.run_stage` (inputs hash, skip
when up to date, atomic write, manifest). A killed build leaves only ``.tmp-*`` siblings, which the next run removes
before it starts (never a live process's). The pipeline sits on top: it imports the stage bodies from their owners
(build.quantize, trtllm.compile, triton_repo.writer) and none of them imports it back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.build import quantize
from trtspec.build.artifacts import MANIFEST, build_lock
from trtspec.build.check import run_check
from trtspec.build.layout import (
    NO_DRAFT_MODEL,
    ROLES,
    checkpoint_dir,
    engine_dir,
    needs_checkpoint,
    quality_report_path,
    runs,
    serving_model_dir,
)
from trtspec.build.quality import write_quality_report
from trtspec.build.stages import (
    BUILT,
    NOT_NEEDED,
    PASSED,
    SKIPPED,
    UP_TO_DATE,
    PlanEntry,
    Stage,
    StageResult,
    clean_stale_temporaries,
    run_stage,
)
from trtspec.errors import Interrupted, SpecError
from trtspec.serving.launch import launch_settings
from trtspec.spec import BuildSpec, Runtime
from trtspec.triton_repo import writer
from trtspec.trtllm import compile as trtllm_compile

if TYPE_CHECKING:
    from rich.progress import Progress


@dataclass
class StageBodies:
    """The functions behind the stages (each stage's owner's); a test replaces some with stand-ins."""

    quantize_inputs: Callable = quantize.quantize_inputs
    quantize_into: Callable = quantize.quantize_into
    quantize_plan: Callable = quantize.quantize_plan
    compile_inputs: Callable = trtllm_compile.compile_inputs
    compile_into: Callable = trtllm_compile.compile_into
    compile_plan: Callable = trtllm_compile.compile_plan
    repo_inputs: Callable = writer.repo_inputs
    write_repo_into: Callable = writer.write_repo_into
    repo_plan: Callable = writer.repo_plan

    def get(self, name: str) -> Callable:
        return getattr(self, name)


@dataclass
class BuildReport:
    stages: list[StageResult] = field(default_factory=list)

    def status(self, name: str) -> str:
        return next(s.status for s in self.stages if s.name == name)

    def to_dict(self) -> dict:
        return {"stages": [s.to_dict() for s in self.stages]}


def _model_dirs(spec: BuildSpec) -> list[str]:
    return [str(spec.model_path(r, weights=False)) for r in ROLES]  # the plan names directories, never fetches weights


def pipeline_stages(spec: BuildSpec, bodies: StageBodies | None = None) -> list[Stage]:
    """Every stage of `trtspec build` for this spec, in order."""
    b = bodies or StageBodies()

    def role_stage(name: str, output: Path, role: str) -> Stage:
        return Stage(
            f"{name}:{role}",
            output,
            inputs=lambda: b.get(f"{name}_inputs")(spec, role),
            body=lambda out, progress: b.get(f"{name}_into")(spec, role, out, progress),
            describe=lambda: b.get(f"{name}_plan")(spec, role),
        )

    def not_needed(name: str, why: str, inputs: Callable[[], list[str]]) -> Stage:
        return Stage(name, None, not_needed=why, describe=lambda: PlanEntry(f"none: {why}", inputs()))

    stages = [
        Stage(
            "check",
            None,
            run=lambda force, progress: _run_check(spec),
            describe=lambda: PlanEntry("preflight: compatibility, memory plan, toolchain", _model_dirs(spec)),
        )
    ]

    def served_from(role: str) -> Callable[[], list[str]]:
        return lambda: [str(serving_model_dir(spec, role, weights=False))]

    for role in ROLES:
        if needs_checkpoint(spec, role):
            stages.append(role_stage("quantize", checkpoint_dir(spec, role), role))
        else:
            why = "served unquantized from its source directory" if runs(spec, role) else NO_DRAFT_MODEL
            stages.append(not_needed(f"quantize:{role}", why, served_from(role)))
    quantized = [r for r in ROLES if needs_checkpoint(spec, r)]
    if quantized:
        stages.append(
            Stage(
                "quality",
                quality_report_path(spec),  # a file, not a directory: see _run_quality
                run=lambda force, progress: _run_quality(spec, force, progress),
                describe=lambda: PlanEntry(
                    "what quantization cost each model (held-out loss, top-1 agreement), and the draft-target "
                    "agreement",
                    [str(checkpoint_dir(spec, r)) for r in quantized],
                ),
            )
        )
    else:
        stages.append(not_needed("quality", "nothing is quantized", lambda: _model_dirs(spec)))
    for role in ROLES:
        if runs(spec, role) and spec.runtime is Runtime.TRTLLM_ENGINE:
            stages.append(role_stage("compile", engine_dir(spec, role), role))
        else:
            why = f"{spec.runtime.value} loads the checkpoint at serve time" if runs(spec, role) else NO_DRAFT_MODEL
            stages.append(not_needed(f"compile:{role}", why, served_from(role)))
    stages.append(repo_stage(spec, b))
    return stages


def repo_stage(spec: BuildSpec, bodies: StageBodies | None = None) -> Stage:
    """The repo stage (also `trtspec repo`): its inputs run the engines' version guard (trtspec.triton_repo.writer);
    its manifest records how the repository is launched (trtspec.serving.launch), which `trtspec serve` reads."""
    b = bodies or StageBodies()
    return Stage(
        "repo",
        spec.repo_dir,
        inputs=lambda: b.get("repo_inputs")(spec),
        body=lambda out, progress: {**(b.get("write_repo_into")(spec, out) or {}), "launch": launch_settings(spec)},
        describe=lambda: b.get("repo_plan")(spec),
    )


def write_repo(spec: BuildSpec, force: bool = False) -> dict[str, Any]:
    """``trtspec repo``: the repo stage through the one runner: write ``spec.repo_dir`` unless an up-to-date one is
    there; return {"path", "skipped", "manifest"}."""
    result = run_stage(repo_stage(spec), force)
    return {"path": spec.repo_dir, "skipped": result.status == SKIPPED, "manifest": result.manifest}


def quantize_stage(spec: BuildSpec, role: str, progress: Progress | None = None, force: bool = False) -> StageResult:
    """Run the quantize stage for one role into ``build/<role>/`` (the pipeline's stage, through the one runner)."""
    result = run_stage(stage_named(spec, f"quantize:{role}"), force, progress)
    if result.status == NOT_NEEDED:
        result.output = str(spec.model_path(role))  # what is served instead
    return result


def quantize_models(
    spec: BuildSpec, roles: tuple[str, ...] = ROLES, progress: Progress | None = None, force: bool = False
) -> list[StageResult]:
    """``trtspec quantize``: each role's stage under the build lock; a failure leaves no new build directory behind."""
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


def stage_named(spec: BuildSpec, name: str, bodies: StageBodies | None = None) -> Stage:
    """One stage of the list, for a command that runs a single stage (`trtspec quantize`; `trtspec repo` runs
    ``repo_stage``)."""
    stages = {s.name: s for s in pipeline_stages(spec, bodies)}
    if name not in stages:
        raise SpecError(f"no stage named {name}", hint=f"stages: {', '.join(stages)}")
    return stages[name]


def _run_check(spec: BuildSpec) -> StageResult:
    t0 = time.monotonic()
    report = run_check(spec)
    if not report.ok:
        first = report.errors[0]
        more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        raise SpecError(
            f"preflight check failed: {first.check}: {first.detail}{more}",
            hint=first.hint or "`trtspec check` shows every finding",
        )
    warns = [f.check for f in report.findings if f.level.value == "warn"]
    detail = (
        f"{len(report.findings)} checks, warnings: {', '.join(warns)}" if warns else f"{len(report.findings)} checks"
    )
    return StageResult("check", PASSED, None, time.monotonic() - t0, detail)


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
            clean_stale_temporaries(s.output for s in stages if s.output is not None)
            overall = progress.add_task("build", total=len(stages)) if progress is not None else None
            for stage in stages:
                current = stage.name
                if progress is not None:
                    progress.update(overall, description=f"build: {stage.name}")
                result = run_stage(stage, force, progress)
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
        exc.trtspec_done = [r.name for r in report.stages if r.status in (BUILT, SKIPPED)]  # type: ignore
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


def _run_quality(spec: BuildSpec, force: bool, progress: Any) -> StageResult:
    """Write build/quality.json (what quantization cost each model, and the draft-target agreement) unless it is newer
    than both checkpoints' manifests. The quantize stages measured the figures; this only combines them (a role
    served unquantized is evaluated from its source once, then cached)."""
    t0 = time.monotonic()
    path = quality_report_path(spec)
    manifests = [checkpoint_dir(spec, r) / MANIFEST for r in ROLES if needs_checkpoint(spec, r)]
    if (
        not force
        and path.is_file()
        and all(m.is_file() and m.stat().st_mtime <= path.stat().st_mtime for m in manifests)
    ):
        return StageResult("quality", SKIPPED, str(path), time.monotonic() - t0, UP_TO_DATE)
    report = write_quality_report(spec, progress)
    pair = (report.get("draft_target_top1_agreement") or {}).get("after")
    detail = f"draft-target top-1 agreement {pair:.3f}" if isinstance(pair, float) else "; ".join(report["notes"])
    return StageResult("quality", BUILT, str(path), time.monotonic() - t0, detail)
