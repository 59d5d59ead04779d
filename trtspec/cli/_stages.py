"""What `trtspec build` and `compile` share: the pipeline's stages run under one progress display."""

from __future__ import annotations

from trtspec.cli._common import err_console, print_json

_STYLE = {"built": "green", "skipped": "cyan", "passed": "green", "not needed": "dim"}


def run_stages(spec, only, force: bool, as_json: bool):
    """Run the pipeline (``only``: these stages) showing one line per finished stage; the report as JSON with
    ``as_json``."""
    from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

    from trtspec.cli._progress import make_progress
    from trtspec.pipeline import run_pipeline

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
        from trtspec.pipeline import interrupted_error

        raise interrupted_error(exc) from None
    if as_json:
        print_json(report.to_dict())
    return report
