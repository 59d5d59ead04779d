"""Entry point: the typer app, and the one place where errors become one line, a hint and an exit code."""

from __future__ import annotations

import os
import sys

import typer

from trtspec import __version__
from trtspec.cli import (
    bench_cmds,
    build_cmds,
    compile_cmds,
    distill_cmds,
    generate_cmds,
    probe_cmds,
    quantize_cmds,
    repo_cmds,
    serve_cmds,
    spec_cmds,
    tune_cmds,
)
from trtspec.errors import TrtspecError


def _flags_show_no_type() -> None:
    """Typer's rich help prints a ``<bool>`` type after every flag, --help included; a flag takes no value, so its
    type column stays empty (options with a value keep theirs)."""
    from typer import core

    option = getattr(core, "TyperOption", None)
    show = getattr(option, "display_type_rich", None)
    if show is None or getattr(show, "_trtspec", False):
        return

    def display_type_rich(self, ctx):
        return "" if getattr(self, "is_flag", False) and self.metavar is None else show(self, ctx)

    display_type_rich._trtspec = True  # type: ignore[attr-defined]
    option.display_type_rich = display_type_rich  # type: ignore[union-attr]  # show is not None: option exists


_flags_show_no_type()

app = typer.Typer(
    name="trtspec",
    help="Draft-target speculative decoding: quantize, compile and serve a target + draft pair on Triton.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trtspec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Draft-target speculative decoding toolchain."""


# One module per command (spec_cmds: init, check and plan, the commands on a spec file); registered in the order
# `trtspec --help` lists them.
spec_cmds.register(app)
compile_cmds.register(app)
build_cmds.register(app)
generate_cmds.register(app)
quantize_cmds.register(app)
repo_cmds.register(app)
serve_cmds.register(app)
bench_cmds.register(app)
distill_cmds.register(app)
probe_cmds.register(app)
tune_cmds.register(app)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a TrtspecError exits with its code after one line and a hint (traceback with TRTSPEC_DEBUG=1)."""
    debug = os.environ.get("TRTSPEC_DEBUG", "") not in ("", "0")
    try:
        rc = app(args=argv, standalone_mode=False)
    except TrtspecError as exc:
        if debug:
            raise
        from rich.markup import escape

        from trtspec.cli._common import err_console
        from trtspec.errors import Interrupted

        label = "[bold yellow]interrupted:[/]" if isinstance(exc, Interrupted) else "[bold red]error:[/]"
        # Escaped: a message or hint is plain text ("pip install 'trtspec[torch,quant]'" is not markup).
        err_console.print(f"{label} {escape(exc.message)}", highlight=False, soft_wrap=True)
        if exc.hint:
            err_console.print(f"[dim]hint:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        if exc.exit_code == 130:  # typer turns Ctrl-C into a silent Exit(130)
            sys.stderr.write("interrupted\n")
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as exc:  # click usage errors and anything unexpected: never exit 0
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if debug:
            raise
        sys.stderr.write(
            f"error: unexpected {type(exc).__name__}: {exc}\nhint: rerun with TRTSPEC_DEBUG=1 for a "
            "traceback and report it\n"
        )
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)
