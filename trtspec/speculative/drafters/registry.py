"""The drafter registry: one entry per ``speculative.drafter`` kind, saying what it needs, which runtimes and
orchestrations serve it, what the LLM API maps it to, and how each process builds it. Every caller that dispatches on
the kind (check, the build layout, the torch runtime, the in-process and BLS Triton models, the LLM-API config, tune)
reads it here, so adding a drafter is its module, its entry and its tests.

Builders receive what only their caller has (the n-gram pool, the target's vocabulary, and for kinds that run the
draft model a factory of the runtime's ``ModelDrafter``), so this module imports no runtime and no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtspec.errors import GenerationError
from trtspec.speculative.drafters import DrafterKind

# Where a kind can run: the torch runtime in process (the in-flight engine) or with a BLS orchestrator, a TensorRT-LLM
# engine repository (always a BLS orchestrator), the LLM API (TensorRT-LLM's own speculation).
IN_PROCESS = "torch/in_process"
TORCH_BLS = "torch/bls"
ENGINE_BLS = "trtllm-engine/bls"
LLMAPI = "trtllm-llmapi"
EVERYWHERE = frozenset({IN_PROCESS, TORCH_BLS, ENGINE_BLS, LLMAPI})


@dataclass(frozen=True)
class DrafterContext:
    """What a process hands a builder: the n-gram pool (None: prompt lookup only), the target's vocabulary size,
    and, where the draft model runs in this process, a factory of the runtime's ``ModelDrafter`` (None: no draft model
    loaded here; the BLS orchestrator's draft model is an engine it calls, ``has_draft_engine``), and the adaptive
    drafter's policy."""

    pool: Any = None
    vocab: int = 0
    model_drafter: Callable[[], Any] | None = None
    has_draft_engine: bool = False
    policy: Any = None  # the adaptive drafter's AdaptivePolicy (None: a new one with the default cost prior)


@dataclass(frozen=True)
class DrafterEntry:
    """One drafter kind (see the module docstring)."""

    kind: DrafterKind
    summary: str
    runs_draft_model: bool  # the draft model is built (quantized, compiled) and loaded to serve this kind
    uses_pool: bool  # reads the n-gram pool
    served: frozenset[str]  # IN_PROCESS, TORCH_BLS, ENGINE_BLS, LLMAPI
    llmapi_decoding_type: str | None  # TensorRT-LLM's decoding_type for this kind (None: not served there)
    llmapi_note: str  # what differs on the LLM API
    engine: Callable[[DrafterContext], Any]  # the in-flight engine's drafter
    local: Callable[[DrafterContext], Any]  # the BLS orchestrator's drafter (None: the draft engine proposes)


def _ngram(ctx: DrafterContext) -> Any:
    from trtspec.speculative.drafters.ngram import NgramDrafter

    return NgramDrafter(ctx.pool)


def _model_drafter(ctx: DrafterContext, kind: DrafterKind) -> Any:
    if ctx.model_drafter is None:
        raise GenerationError(f"drafter {kind.value} needs a draft model", hint="load the draft too")
    return ctx.model_drafter()


def _engine_model(ctx: DrafterContext) -> Any:
    return _model_drafter(ctx, DrafterKind.MODEL)


def _engine_ngram(ctx: DrafterContext) -> Any:
    from trtspec.speculative.drafters.ngram import NgramEngineDrafter

    return NgramEngineDrafter(_ngram(ctx), ctx.vocab)


def _engine_hybrid(ctx: DrafterContext) -> Any:
    from trtspec.speculative.drafters.hybrid import HybridEngineDrafter, HybridRule

    return HybridEngineDrafter(HybridRule(_ngram(ctx)), _model_drafter(ctx, DrafterKind.HYBRID))


def _engine_adaptive(ctx: DrafterContext) -> Any:
    from trtspec.speculative.drafters.adaptive import AdaptiveEngineDrafter

    model = ctx.model_drafter() if ctx.model_drafter is not None else None
    return AdaptiveEngineDrafter(_ngram(ctx), ctx.vocab, model, ctx.policy)


def _local_model(ctx: DrafterContext) -> Any:
    return None


def _local_hybrid(ctx: DrafterContext) -> Any:
    from trtspec.speculative.drafters.hybrid import HybridRule

    return HybridRule(_ngram(ctx))


def _local_adaptive(ctx: DrafterContext) -> Any:
    from trtspec.speculative.drafters.adaptive import AdaptiveLocalDrafter

    return AdaptiveLocalDrafter(_ngram(ctx), has_model=ctx.has_draft_engine, policy=ctx.policy)


DRAFTERS: dict[DrafterKind, DrafterEntry] = {
    entry.kind: entry
    for entry in (
        DrafterEntry(
            DrafterKind.MODEL,
            "the draft model proposes K tokens every step",
            runs_draft_model=True,
            uses_pool=False,
            served=EVERYWHERE,
            llmapi_decoding_type="DraftTarget",
            llmapi_note="",
            engine=_engine_model,
            local=_local_model,
        ),
        DrafterEntry(
            DrafterKind.NGRAM,
            "prompt lookup + the n-gram pool (no draft model runs)",
            runs_draft_model=False,
            uses_pool=True,
            served=EVERYWHERE,
            llmapi_decoding_type="NGram",
            llmapi_note="TensorRT-LLM builds its pool from served requests only (trtspec's pool is not loaded)",
            engine=_engine_ngram,
            local=_ngram,
        ),
        DrafterEntry(
            DrafterKind.HYBRID,
            "n-grams on a >= 2-token match, else the draft model",
            runs_draft_model=True,
            uses_pool=True,
            served=frozenset({IN_PROCESS, TORCH_BLS, ENGINE_BLS}),
            llmapi_decoding_type=None,
            llmapi_note="TensorRT-LLM runs a draft model or n-grams, not both",
            engine=_engine_hybrid,
            local=_local_hybrid,
        ),
        DrafterEntry(
            DrafterKind.ADAPTIVE,
            "per sequence and step: n-grams, the draft model or none, and K, from measured acceptance and costs",
            runs_draft_model=True,
            uses_pool=True,
            served=EVERYWHERE,
            llmapi_decoding_type="DraftTarget",
            llmapi_note=(
                "TensorRT-LLM runs the draft model with its SpeculationGate (acceptance_window, "
                "acceptance_length_threshold: speculation off for good below the threshold) where the release has it; "
                "no per-step K, no n-grams, no coming back"
            ),
            engine=_engine_adaptive,
            local=_local_adaptive,
        ),
    )
}


def entry(kind: DrafterKind | str) -> DrafterEntry:
    """The registry entry of ``kind`` (ValueError listing the known kinds)."""
    try:
        return DRAFTERS[DrafterKind(kind)]
    except ValueError:
        known = ", ".join(k.value for k in DRAFTERS)
        raise ValueError(f"unknown drafter {kind!r} (known: {known})") from None


def place(runtime: str, orchestration: str) -> str:
    """Where a deployment runs its drafter (IN_PROCESS, TORCH_BLS, ENGINE_BLS or LLMAPI), from the spec's
    ``runtime`` and ``triton.orchestration`` values (their str enums compare equal to these strings)."""
    if runtime == "trtllm-llmapi":
        return LLMAPI
    if runtime == "trtllm-engine":
        return ENGINE_BLS
    return TORCH_BLS if orchestration == "bls" else IN_PROCESS


def served(runtime: str, orchestration: str = "auto") -> list[DrafterKind]:
    """The kinds a deployment of ``runtime`` with ``orchestration`` serves."""
    where = place(runtime, orchestration)
    return [kind for kind, e in DRAFTERS.items() if where in e.served]


def engine_drafter(kind: DrafterKind | str, ctx: DrafterContext) -> Any:
    """The in-flight engine's drafter of ``kind``."""
    return entry(kind).engine(ctx)


def local_drafter(kind: DrafterKind | str, ctx: DrafterContext) -> Any:
    """The BLS orchestrator's drafter of ``kind`` (None: the draft engine proposes every step)."""
    return entry(kind).local(ctx)
