"""What commands share: the console, spec resolution, JSON output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from trtspec.spec import BuildSpec, load_spec

# Not a terminal (a log, a pipe, CI): rich would fold tables at 80 columns ("tar…", "0.8…"); print them whole.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


DEFAULT_SPEC = "trtspec.yaml"


def resolve_spec(path: Path | None) -> BuildSpec:
    """The spec at ``path``; when omitted, ./trtspec.yaml if there is one (what `trtspec init` writes), else the
    embedded example (materialized on first use)."""
    if path is not None:
        return load_spec(path)
    if Path(DEFAULT_SPEC).is_file():
        err_console.print(f"[dim]using ./{DEFAULT_SPEC}[/]")
        return load_spec(Path(DEFAULT_SPEC))
    from trtspec.example import example_spec

    with err_console.status("preparing the embedded example (SmolLM2-135M-Instruct; first run converts it, ~30 s)"):
        return example_spec()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def quiet_transformers() -> None:
    """Hide transformers' per-file loading bars and advisory warnings in CLI output (the CLI owns the terminal)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
