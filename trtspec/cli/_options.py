"""Option and argument types shared by commands, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

SpecArg = Annotated[
    Optional[Path],
    typer.Argument(help="build spec (trtspec.yaml); omitted: the embedded example", show_default=False),
]
SpecOpt = Annotated[
    Optional[Path],
    typer.Option("--spec", "-s", help="build spec (trtspec.yaml); omitted: the embedded example", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print machine-readable JSON instead of tables")]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="file to write")]
