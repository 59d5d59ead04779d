"""`trtspec build`: every stage of the pipeline, with one progress display."""

from __future__ import annotations

import typer

from trtspec.cli._common import console, resolve_spec
from trtspec.cli._options import ForceOpt, JsonOpt, SpecArg
from trtspec.cli._stages import run_stages


def build(spec_path: SpecArg = None, force: ForceOpt = False, as_json: JsonOpt = False) -> None:
    """Every stage: check -> quantize -> quality (build/quality.json, when a model is quantized) -> compile -> repo.
    Unchanged stages are skipped, so an interrupted build resumes."""
    spec = resolve_spec(spec_path)
    run_stages(spec, None, force, as_json)
    if not as_json:
        console.print(f"model repository: {spec.repo_dir}")


def register(app: typer.Typer) -> None:
    app.command()(build)
