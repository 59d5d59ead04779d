"""Where each stage's output lives, and which roles a stage has work for: the one home of these rules.

Imports only the trtspec top level (the spec), so that build, engines, triton_repo and serving can all use it.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from trtspec.build.formats import KVCacheFormat, Quantization
from trtspec.spec import BuildSpec, Runtime
from trtspec.speculative.drafters.registry import entry as drafter_entry


class Role(str, Enum):
    """A model of the pair. A ``str`` whose value is the spec's field name: ``getattr(spec, role)``, dict keys,
    f-strings and paths see ``"target"`` / ``"draft"``."""

    TARGET = "target"
    DRAFT = "draft"

    def __str__(self) -> str:
        return self.value

    def __format__(self, format_spec: str) -> str:
        return format(self.value, format_spec)


ROLES: tuple[Role, ...] = (Role.TARGET, Role.DRAFT)
QUALITY_REPORT = "quality.json"  # in the build directory: what quantization cost each model


NO_DRAFT_MODEL = "drafter ngram: the draft model never runs (its directory only holds the n-gram pool)"


def runs(spec: BuildSpec, role: str) -> bool:
    """Whether the role's model runs when the deployment serves: the draft does not when the drafter runs no draft
    model (``ngram``: proposals come from prompt lookup and the pool), so nothing is built or loaded for it."""
    return role == Role.TARGET or drafter_entry(spec.speculative.drafter).runs_draft_model


def served_roles(spec: BuildSpec) -> tuple[Role, ...]:
    """The roles whose models are built and served (see :func:`runs`)."""
    return tuple(r for r in ROLES if runs(spec, r))


def served_ngram_pool(spec: BuildSpec) -> Path | None:
    """The n-gram pool the deployment serves: the pool file of a drafter that reads one, when it exists (None: the
    model drafter, or prompt lookup only)."""
    if not drafter_entry(spec.speculative.drafter).uses_pool or not spec.ngram_pool_path.is_file():
        return None
    return spec.ngram_pool_path


def is_quantized(spec: BuildSpec, role: str) -> bool:
    """True when the role's weights or KV cache are quantized (and so calibrated)."""
    model = getattr(spec, role)
    return model.quantization is not Quantization.NONE or model.kv_cache is not KVCacheFormat.AUTO


def needs_checkpoint(spec: BuildSpec, role: str) -> bool:
    """Whether the quantize stage writes a checkpoint for the role: engines always need one (the TRT-LLM checkpoint
    trtllm-build reads); the other runtimes serve an unquantized role from its source directory. None for a role that
    does not run (:func:`runs`)."""
    return runs(spec, role) and (spec.runtime is Runtime.TRTLLM_ENGINE or is_quantized(spec, role))


def checkpoint_dir(spec: BuildSpec, role: str) -> Path:
    """Where the quantize stage writes a model's checkpoint."""
    return spec.build_dir / str(role)


def engine_dir(spec: BuildSpec, role: str) -> Path:
    """Where the compile stage writes a model's TensorRT-LLM engine."""
    return spec.engines_dir / str(role)


def quality_report_path(spec: BuildSpec) -> Path:
    return spec.build_dir / QUALITY_REPORT


def serving_model_dir(spec: BuildSpec, role: str, *, weights: bool = True) -> Path:
    """The directory the serving runtime loads for a model: its engine, quantized checkpoint, or the source when
    unquantized (``weights=False``: a hub id's snapshot without fetching its weights, for display)."""
    if not runs(spec, role):
        return spec.model_path(str(role), weights=weights)  # nothing built: its source (the n-gram pool's home)
    if spec.runtime is Runtime.TRTLLM_ENGINE:
        return engine_dir(spec, role)
    return checkpoint_dir(spec, role) if is_quantized(spec, role) else spec.model_path(str(role), weights=weights)
