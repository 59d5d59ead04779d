"""`trtspec compile` and `trtspec build`: run the pipeline's stages with one progress display."""

from __future__ import annotations

import typer

from trtspec.cli._common import console, err_console, print_json, resolve_spec
from trtspec.cli._options import ForceOpt, JsonOpt, OnlyOpt, SpecArg

_STYLE = {"built": "green", "skipped": "cyan", "passed": "green", "not needed": "dim"}


def _run(spec, only, force: bool, as_json: bool):
    from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

    from trtspec.build.pipeline import run_pipeline
    from trtspec.cli._progress import make_progress

    def show(result) -> None:
        if as_json:
            return
        label = "skipped (up to date)" if result.status == "skipped" else result.status
        extra = f" - {result.detail}" if result.detail and result.status != "skipped" else ""
        progress.console.print(
            f"[{_STYLE.get(result.status, 'white')}]{result.name:<17}[/] {label}"
            f"{f' ({result.seconds:.1f} s)' if result.status == 'built' else ''}{extra}",
            highlight=False,
        )

    progress = make_progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=as_json and err_console.is_terminal,
    )
    try:
        with progress:
            report = run_pipeline(spec, only=only, force=force, progress=progress, on_result=show)
    except KeyboardInterrupt as exc:
        from trtspec.build.pipeline import interrupted_error

        raise interrupted_error(exc) from None
    if as_json:
        print_json(report.to_dict())
    return report


def compile(spec_path: SpecArg = None, only: OnlyOpt = None, force: ForceOpt = False, as_json: JsonOpt = False) -> None:
    """Build the TensorRT-LLM engines (runtime trtllm-engine) with trtllm-build, or print the docker command."""
    import shlex

    from trtspec.build.artifacts import MANIFEST
    from trtspec.build.plan import ROLES, engine_dir
    from trtspec.engines.compile import docker_command, find_trtllm_build
    from trtspec.errors import EngineBuildError, SpecError
    from trtspec.spec import Runtime

    spec = resolve_spec(spec_path)
    if spec.runtime is not Runtime.TRTLLM_ENGINE:
        raise SpecError(
            f"runtime {spec.runtime.value} has no engines to compile",
            hint="set runtime: trtllm-engine, or go on with `trtspec build`",
        )
    roles = [only.value] if only is not None else list(ROLES)
    try:
        _run(spec, [f"compile:{r}" for r in roles], force, as_json)
    except EngineBuildError:
        if find_trtllm_build() is None:
            # What to run elsewhere, for every role still without an engine; the next `trtspec compile` adopts them.
            for role in roles:
                if not (engine_dir(spec, role) / MANIFEST).is_file():
                    err_console.print(
                        f"[dim]{role}:[/] {shlex.join(docker_command(spec, role))}", highlight=False, soft_wrap=True
                    )
        raise


def build(spec_path: SpecArg = None, force: ForceOpt = False, as_json: JsonOpt = False) -> None:
    """Every stage: check -> quantize -> quality (build/quality.json, when a model is quantized) -> compile -> repo.
    Unchanged stages are skipped, so an interrupted build resumes."""
    spec = resolve_spec(spec_path)
    _run(spec, None, force, as_json)
    if not as_json:
        console.print(f"model repository: {spec.repo_dir}")


def register(app: typer.Typer) -> None:
    app.command()(compile)
    app.command()(build)
