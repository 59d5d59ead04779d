"""Option and argument types shared by commands, declared once."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from trtspec.build.layout import Role

_SPEC_HELP = "build spec; omitted: ./trtspec.yaml if there is one, else the embedded example"
SpecArg = Annotated[Optional[Path], typer.Argument(help=_SPEC_HELP, show_default=False)]
SpecOpt = Annotated[Optional[Path], typer.Option("--spec", "-s", help=_SPEC_HELP, show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="print machine-readable JSON instead of tables")]
# --force of the stage commands (quantize, compile, build, repo); init's --force (overwrite the spec file) is another
# option that happens to share the name.
ForceOpt = Annotated[bool, typer.Option("--force", help="rebuild even when the inputs are unchanged")]
OverwriteOpt = Annotated[bool, typer.Option("--force", help="overwrite an existing file")]
RawOpt = Annotated[bool, typer.Option("--raw", help="do not apply the chat template")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", help="tokens to generate per answer, at most")]
ThreadsOpt = Annotated[
    int,
    typer.Option(
        "--threads",
        help="torch intra-op threads (0 where allowed: 1 or one per core, whichever decodes faster here; see "
        "trtspec.threads)",
    ),
]


OnlyOpt = Annotated[Optional[Role], typer.Option("--only", help="only this model", show_default=False)]

# K, in TensorRT-LLM's words: a deployment's max_draft_len (spec: speculative.max_draft_len), a request's
# num_draft_tokens. --draft-len is the older name, kept hidden.
NumDraftTokensOpt = Annotated[
    Optional[int],
    typer.Option(
        "--num-draft-tokens",
        "-k",
        help="draft tokens per target step (K) for this request, 1..the deployment's "
        "max_draft_len; default: max_draft_len",
        show_default=False,
    ),
]
DraftLenAlias = Annotated[Optional[int], typer.Option("--draft-len", hidden=True)]


class Protocol(str, Enum):
    """How a client talks to Triton."""

    GRPC = "grpc"
    HTTP = "http"


ProtocolOpt = Annotated[
    Optional[Protocol],
    typer.Option(
        "--protocol", help="with --url: default the URL's scheme (grpc://, http://), else grpc", show_default=False
    ),
]
# Triton's address, for every command that talks to a server (generate, bench, tune, probe).
UrlOpt = Annotated[
    Optional[str],
    typer.Option("--url", help="a served model: [grpc://|http://]HOST[:PORT] (default ports: gRPC 8001, HTTP 8000)"),
]
