"""`trtspec probe`: one 1-token request with a deadline; exit 0 only if it came back (Kubernetes exec probes)."""

from __future__ import annotations

from typing import Annotated

import typer

from trtspec.cli._common import console, print_json
from trtspec.cli._options import JsonOpt, ProtocolOpt, UrlOpt
from trtspec.triton_repo.names import ENSEMBLE, LLMAPI


def probe(
    url: UrlOpt = "127.0.0.1:8001",
    protocol: ProtocolOpt = None,
    model: Annotated[
        str, typer.Option("--model", help=f"model to ask ({ENSEMBLE}, or {LLMAPI} for an LLM API repository)")
    ] = ENSEMBLE,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds for the whole request")] = 10.0,
    as_json: JsonOpt = False,
) -> None:
    """Check that the server generates: one 1-token request within --timeout, else exit 1 with why."""
    from trtspec.serving.probe import probe as run_probe

    assert url is not None  # --url has a default here
    result = run_probe(url, protocol=protocol.value if protocol else None, model=model, timeout_s=timeout)
    if as_json:
        print_json(
            {
                "ok": True,
                "url": result.url,
                "protocol": result.protocol,
                "model": result.model,
                "latency_s": round(result.latency_s, 4),
                "tokens": result.tokens,
            }
        )
        return
    console.print(
        f"ok: {result.protocol}://{result.url} {result.model} generated in {result.latency_s:.2f} s", highlight=False
    )


def register(app: typer.Typer) -> None:
    app.command()(probe)
