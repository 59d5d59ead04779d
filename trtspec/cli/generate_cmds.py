"""`trtspec generate`: one prompt through the speculative decoder, in process (the torch runtime) or from a served
model (``--url``)."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from trtspec.cli._common import console, err_console, print_json, quiet_transformers, resolve_spec
from trtspec.cli._options import (
    DraftLenAlias,
    JsonOpt,
    MaxTokensOpt,
    NumDraftTokensOpt,
    Protocol,
    ProtocolOpt,
    RawOpt,
    SpecOpt,
    ThreadsOpt,
    UrlOpt,
)
from trtspec.request_fields import BY_NAME as FIELDS


def _stats_table(stats: dict, title: str) -> Table:
    table = Table(title=title, show_header=False)
    for key in (
        "num_output_tokens",
        "total_draft_tokens",
        "total_accepted_draft_tokens",
        "acceptance_rate",
        "target_steps",
        "tokens_per_step",
        "decode_tok_per_s",
        "total_s",
    ):
        if key in stats:
            table.add_row(key, str(stats[key]))
    return table


def _logprobs_table(items: list[dict]) -> Table:
    table = Table(title="log-probabilities under the target", show_header=True)
    for name in ("token", "logprob", "top alternatives"):
        table.add_column(name)
    for t in items:
        top = ", ".join(f"{a['text']!r} {a['logprob']:.3f}" for a in t["top"])
        table.add_row(repr(t["text"]), f"{t['logprob']:.4f}", top)
    return table


def generate(
    prompt: Annotated[str, typer.Argument(help="the prompt (the chat template is applied when the model has one)")],
    spec_path: SpecOpt = None,
    max_tokens: MaxTokensOpt = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="0 = no top-k filtering")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="1.0 = no nucleus filtering")] = 1.0,
    seed: Annotated[Optional[int], typer.Option(help="seed for reproducible sampling")] = None,
    repetition_penalty: Annotated[float, typer.Option(help=FIELDS["repetition_penalty"].help)] = 1.0,
    presence_penalty: Annotated[float, typer.Option(help=FIELDS["presence_penalty"].help)] = 0.0,
    frequency_penalty: Annotated[float, typer.Option(help=FIELDS["frequency_penalty"].help)] = 0.0,
    min_tokens: Annotated[int, typer.Option(help=FIELDS["min_tokens"].help)] = 0,
    num_draft_tokens: NumDraftTokensOpt = None,
    draft_len: DraftLenAlias = None,
    no_draft: Annotated[bool, typer.Option("--no-draft", help="target-only decoding, same code path")] = False,
    raw: RawOpt = False,
    stream: Annotated[bool, typer.Option("--stream", help="print text as it is generated")] = False,
    url: UrlOpt = None,
    protocol: ProtocolOpt = None,
    as_json: JsonOpt = False,
    threads: ThreadsOpt = 0,
    logprobs: Annotated[
        Optional[int],
        typer.Option(
            "--logprobs",
            help="also each token's log-probability under the target and N top alternatives (0..20; in process)",
        ),
    ] = None,
) -> None:
    """Generate text for PROMPT with draft-target speculative decoding (in process, or from a server with --url)."""
    from trtspec.build.check import check_pair
    from trtspec.errors import GenerationError
    from trtspec.validation import validate_request

    k = num_draft_tokens if num_draft_tokens is not None else draft_len
    if no_draft and k:
        raise GenerationError(
            f"--no-draft and --num-draft-tokens {k} exclude each other", hint="--no-draft is --num-draft-tokens 0"
        )
    k = 0 if no_draft else k
    if threads < 0:
        raise GenerationError(f"--threads {threads} must be >= 0", hint="0 = timed: 1 or all cores")
    # trtspec.request_fields, by name (SamplingParams' attributes)
    sampling: dict[str, Any] = dict(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        min_tokens=min_tokens,
    )
    # Before anything is loaded or sent. K's bound is the deployment's: the spec's (below) or the server's (checked
    # once it answers, after this check against the largest bound any deployment has).
    validate_request(prompt, max_tokens, num_draft_tokens=k if url is not None else None, **sampling)
    if logprobs is not None:
        from trtspec.validation import validate_top_logprobs

        validate_top_logprobs(logprobs, True, "--logprobs")
        if url is not None or stream:
            raise GenerationError(
                "--logprobs is served in process without --stream only",
                hint="over a server, ask the OpenAI API (trtspec serve --openai-port) for logprobs",
            )
    if url is not None:
        if spec_path is not None:
            raise GenerationError("--url and --spec exclude each other", hint="the server was built from its spec")
        generate_remote(
            prompt, url, protocol, max_tokens, num_draft_tokens=k, raw=raw, stream=stream, as_json=as_json, **sampling
        )
        return
    spec = resolve_spec(spec_path)
    validate_request(prompt, max_tokens, num_draft_tokens=k, max_draft_len=spec.speculative.max_draft_len, **sampling)
    if k != 0:
        check_pair(spec)  # one tokenizer for both models, as `check` and `build` require
    from trtspec.threads import apply_threads

    apply_threads(threads)  # before torch loads: the OpenMP wait policy is read then
    from trtspec.runtimes.torch.session import TextResult, TorchSession
    from trtspec.speculative.sampling import SamplingParams

    params = SamplingParams(**sampling)
    quiet_transformers()
    with err_console.status("loading models"):
        session = TorchSession.from_spec(spec, with_draft=k != 0)
        if threads == 0:  # one thread or every core, whichever decodes faster here (trtspec.threads)
            from trtspec.runtimes.torch.costs import fastest_threads

            fastest_threads(session.target)
    from trtspec.validation import validate_prompt_tokens

    # The prompt in tokens, counted as the served preprocessing counts it (the same rule at every door).
    n_prompt = len(session.encode(prompt, chat=not raw))
    validate_prompt_tokens(n_prompt, max_tokens, spec.engine.max_input_len, spec.engine.max_seq_len)
    kwargs: dict[str, Any] = dict(num_draft_tokens=k or None, use_draft=k != 0, chat=not raw)
    title = "target only (no draft)" if k == 0 else f"speculative decoding (K = {k or spec.speculative.max_draft_len})"
    if stream and not as_json:
        result = None
        for piece in session.stream(prompt, max_tokens, params, **kwargs):
            if isinstance(piece, TextResult):
                result = piece
            else:
                sys.stdout.write(piece)
                sys.stdout.flush()
        sys.stdout.write("\n")
        assert result is not None
        err_console.print(_stats_table(result.stats, title))
        return
    result = session.generate(prompt, max_tokens, params, logprobs=logprobs, **kwargs)
    if as_json:
        data = {"text": result.text, "token_ids": result.token_ids, "stats": result.stats}
        print_json(data if result.logprobs is None else {**data, "logprobs": result.logprobs})
        return
    console.print(result.text, highlight=False, markup=False)
    if result.logprobs is not None:
        err_console.print(_logprobs_table(result.logprobs))
    err_console.print(_stats_table(result.stats, title))


def generate_remote(
    prompt: str,
    url: str,
    protocol: Protocol | None,
    max_tokens: int,
    *,
    num_draft_tokens: int | None,
    raw: bool,
    stream: bool,
    as_json: bool,
    **sampling: Any,
) -> None:
    """`trtspec generate --url`: one prompt through a served ensemble (the request is validated before it is sent).
    ``sampling``: the fields of trtspec.request_fields by name; those at their defaults are not sent."""
    from trtspec.request_fields import BY_NAME
    from trtspec.serving.client import TritonLLMClient

    options = {
        **{k: v for k, v in sampling.items() if not BY_NAME[k].history or v != BY_NAME[k].default},
        "num_draft_tokens": num_draft_tokens,
        "apply_chat_template": not raw,
    }
    with TritonLLMClient(url, protocol=protocol.value if protocol else None) as client:
        from trtspec.serving.client import request_inputs

        request_inputs(prompt, max_tokens, stream, options)  # every rule, before the first byte goes out
        client.check_ready()
        bound = client.max_draft_len()
        if bound is not None:
            from trtspec.validation import validate_num_draft_tokens

            validate_num_draft_tokens(num_draft_tokens, bound)  # the deployment's max_draft_len, as in process
        show = stream and not as_json

        def on_text(t: str) -> None:
            sys.stdout.write(t)
            sys.stdout.flush()

        result = client.generate(prompt, max_tokens, stream=stream, on_text=on_text if show else None, **options)
    if as_json:
        print_json(result.to_dict())
        return
    if show:
        sys.stdout.write("\n")
    else:
        console.print(result.text, highlight=False, markup=False)
    mode = "target only" if num_draft_tokens == 0 else "speculative"
    table = Table(title=f"{mode}, served by {client.endpoint.url}", show_header=False)
    for key, value in result.stats.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    table.add_row("latency_s", f"{result.latency_s:.3f}")
    err_console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(generate)
