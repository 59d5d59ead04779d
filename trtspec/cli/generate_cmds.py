"""`trtspec generate`: one prompt through the speculative decoder, in process (the torch runtime)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.table import Table

from trtspec.cli._common import console, err_console, print_json, quiet_transformers, resolve_spec
from trtspec.cli._options import JsonOpt, SpecOpt


def _stats_table(stats: dict) -> Table:
    table = Table(title="speculative decoding", show_header=False)
    for key in ("num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate",
                "target_steps", "tokens_per_step", "decode_tok_per_s", "total_s"):
        if key in stats:
            table.add_row(key, str(stats[key]))
    return table


def generate(
    prompt: Annotated[str, typer.Argument(help="the prompt (the chat template is applied when the model has one)")],
    spec_path: SpecOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="tokens to generate at most")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="0 = no top-k filtering")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1.0 = no nucleus filtering")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="seed for reproducible sampling")] = None,
    draft_len: Annotated[int | None, typer.Option("--draft-len", "-k", help="K; default: the spec's")] = None,
    no_draft: Annotated[bool, typer.Option("--no-draft", help="target-only decoding, same code path")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="do not apply the chat template")] = False,
    stream: Annotated[bool, typer.Option("--stream", help="print text as it is generated")] = False,
    url: Annotated[str | None, typer.Option("--url", help="a served ensemble, HOST:PORT (instead of --spec)")] = None,
    protocol: Annotated[str, typer.Option("--protocol", help="with --url: grpc | http")] = "grpc",
    as_json: JsonOpt = False,
) -> None:
    """Generate text for PROMPT with draft-target speculative decoding (in process, or from a server with --url)."""
    from trtspec.errors import GenerationError

    if draft_len is not None and not 1 <= draft_len <= 16:
        raise GenerationError(f"--draft-len {draft_len} is out of range", hint="use 1..16")
    if max_tokens <= 0:
        raise GenerationError(f"--max-tokens must be > 0, got {max_tokens}", hint="ask for at least one token")
    if not prompt.strip():
        raise GenerationError("the prompt is empty", hint="give some text to continue")
    if url is not None:
        if spec_path is not None:
            raise GenerationError("--url and --spec exclude each other", hint="the server was built from its spec")
        from trtspec.cli.serve_cmds import generate_remote

        generate_remote(prompt, url, protocol, max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=seed, draft_len=draft_len, no_draft=no_draft, raw=raw, stream=stream, as_json=as_json)
        return
    from trtspec.engines.torch_runtime.sampling import SamplingParams
    from trtspec.engines.torch_runtime.session import TextResult, TorchSession

    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    spec = resolve_spec(spec_path)
    quiet_transformers()
    with err_console.status("loading models"):
        session = TorchSession.from_spec(spec, with_draft=not no_draft)
    kwargs = dict(draft_len=draft_len, use_draft=not no_draft, chat=not raw)
    if stream and not as_json:
        result = None
        for piece in session.stream(prompt, max_tokens, sampling, **kwargs):
            if isinstance(piece, TextResult):
                result = piece
            else:
                sys.stdout.write(piece)
                sys.stdout.flush()
        sys.stdout.write("\n")
        assert result is not None
        err_console.print(_stats_table(result.stats))
        return
    result = session.generate(prompt, max_tokens, sampling, **kwargs)
    if as_json:
        print_json({"text": result.text, "token_ids": result.token_ids, "stats": result.stats})
        return
    console.print(result.text, highlight=False, markup=False)
    err_console.print(_stats_table(result.stats))


def register(app: typer.Typer) -> None:
    app.command()(generate)
