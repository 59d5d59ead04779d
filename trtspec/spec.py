"""BuildSpec: the one validated object that carries every setting of a trtspec build.

Loaded from YAML (``trtspec.yaml``), overridable from the environment (``TRTSPEC_SPEC__DRAFT__QUANTIZATION=fp8``),
passed whole to every stage. Relative paths in a spec resolve against the spec file's directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from trtspec.build.formats import KVCacheFormat, Quantization, default_format, preferences_text
from trtspec.errors import SpecError
from trtspec.speculative.drafters import DrafterKind
from trtspec.speculative.rules import MAX_DRAFT_LEN

ENV_PREFIX = "TRTSPEC_SPEC__"


class Runtime(str, Enum):
    """Where the two models run."""

    TRTLLM_ENGINE = "trtllm-engine"
    TRTLLM_LLMAPI = "trtllm-llmapi"
    TORCH = "torch"


class DType(str, Enum):
    """Compute dtype of a model's unquantized parts."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"

    @property
    def nbytes(self) -> int:
        return 4 if self is DType.FLOAT32 else 2


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False, validate_assignment=True)


class ModelSpec(_Section):
    """One model of the pair (target or draft)."""

    model: str = Field(
        description="local HF model directory (config.json, tokenizer, weights), or a Hugging Face "
        "hub id org/name[@revision] (downloaded, or read from the HF cache offline)"
    )
    dtype: DType = Field(
        DType.BFLOAT16,
        description="dtype of the unquantized parts: bfloat16 or float16 on GPUs; on CPUs (the torch runtime) "
        "bfloat16 where the CPU has native bfloat16 (verification then costs about one step), else float32",
    )
    quantization: Quantization | None = Field(
        None,
        description="ModelOpt PTQ format; empty: none on torch; on GPU runtimes the best format that fits the "
        f"model ({preferences_text()})",
    )
    kv_cache: KVCacheFormat = Field(KVCacheFormat.AUTO, description="KV-cache format; fp8 halves KV memory on GPUs")
    tp_size: int = Field(1, ge=1, le=64, description="tensor-parallel GPUs (the draft always runs on one GPU)")


class SpeculativeSpec(_Section):
    """Draft-target decoding settings."""

    max_draft_len: int = Field(4, ge=1, le=MAX_DRAFT_LEN, description="K: draft tokens proposed per target step")
    use_draft_logits: bool = Field(
        False, description="target accepts by rejection sampling on draft logits (needs the draft's generation logits)"
    )
    route_threshold: int = Field(
        100, ge=0, description="requests asking fewer max_tokens than this go straight to the target"
    )
    drafter: DrafterKind = Field(
        DrafterKind.ADAPTIVE,
        description="adaptive: per sequence and step, n-grams, the draft model or none, and K up to max_draft_len, "
        "from measured acceptance and costs; model: the draft model, K every step; ngram: prompt lookup + the n-gram "
        "pool; hybrid: n-gram on a >= 2-token match, else the draft model",
    )
    ngram_pool: Path | None = Field(
        None, description="n-gram pool (ngram_pool.npz from trtspec distill); empty: the one in the draft's directory"
    )


class CalibrationSpec(_Section):
    """Calibration data for post-training quantization."""

    file: Path | None = Field(None, description="text or JSONL file; empty: the corpus shipped with trtspec")
    field: str = Field("text", description="JSONL field holding the text")
    samples: int = Field(128, ge=1, le=100_000, description="calibration samples")
    seq_len: int = Field(512, ge=8, le=131_072, description="tokens per calibration sample")
    batch_size: int = Field(4, ge=1, le=1024, description="samples per calibration forward pass")


class EngineSpec(_Section):
    """Engine limits, shared by both models."""

    max_batch_size: int = Field(8, ge=1, le=4096, description="concurrent sequences per engine")
    max_input_len: int = Field(2048, ge=1, description="longest prompt in tokens")
    max_seq_len: int = Field(4096, ge=2, description="prompt plus generated tokens")
    trtllm_version: str = Field("1.0.0", description="TensorRT-LLM version that builds and serves the engines")

    @model_validator(mode="after")
    def _input_fits(self) -> EngineSpec:
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len ({self.max_input_len}) must be smaller than max_seq_len ({self.max_seq_len})"
            )
        return self


class Orchestration(str, Enum):
    """Where the draft-target loop runs in the Triton repository."""

    AUTO = "auto"  # in_process for the torch runtime, bls for trtllm-engine
    IN_PROCESS = "in_process"  # torch runtime: target and draft in one model process, one in-flight engine
    BLS = "bls"  # a BLS orchestrator model calling two engine models (trtllm-engine; torch for testing that path)


class TritonSpec(_Section):
    """Triton model repository settings."""

    target_instances: int = Field(1, ge=1, le=64, description="instances of the target model")
    draft_instances: int = Field(1, ge=1, le=64, description="instances of the draft model")
    orchestrator_instances: int = Field(4, ge=1, le=256, description="instances of the draft-target orchestrator (BLS)")
    orchestration: Orchestration = Field(
        Orchestration.AUTO,
        description="auto | in_process (torch: draft and target in one model) | bls (two engine "
        "models and a BLS orchestrator)",
    )
    decoupled: bool = Field(True, description="streaming responses (decoupled transaction policy)")
    max_queue_delay_us: int = Field(100, ge=0, description="dynamic batching queue delay in microseconds")
    target_kv_cache_fraction: float | None = Field(
        None, gt=0, lt=1, description="target's share of free GPU memory for KV cache; empty: from the memory plan"
    )
    draft_kv_cache_fraction: float | None = Field(
        None, gt=0, lt=1, description="draft's share of free GPU memory for KV cache; empty: from the memory plan"
    )
    image: str | None = Field(None, description="NGC tritonserver image; empty: the tag that ships trtllm_version")


class GPUSpec(_Section):
    """The GPUs the engines will run on."""

    memory_gib: float = Field(80.0, gt=0, description="memory of one GPU in GiB (H100 80, H200 141)")
    count: int = Field(1, ge=1, le=64, description="GPUs available on the serving machine")
    memory_utilization: float = Field(0.94, gt=0, le=1, description="fraction of GPU memory trtspec may plan for")
    compute_capability: str | None = Field(None, description="e.g. '9.0' for Hopper; empty: not checked")


class OutputSpec(_Section):
    """Output directories (relative to the spec file)."""

    build_dir: Path = Field(Path("build"), description="quantized checkpoints")
    engines_dir: Path = Field(Path("engines"), description="TensorRT-LLM engines")
    repo_dir: Path = Field(Path("triton_repo"), description="Triton model repository")


class BuildSpec(_Section):
    """Everything a trtspec build needs, validated once."""

    name: str = Field("trtspec", pattern=r"^[A-Za-z0-9_.-]+$", description="name of this deployment")
    runtime: Runtime = Field(
        Runtime.TORCH,
        description="where the models run: TensorRT-LLM engines, the LLM API, or "
        "trtspec's torch runtime (any machine, CPU included)",
    )
    target: ModelSpec
    draft: ModelSpec
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    triton: TritonSpec = Field(default_factory=TritonSpec)
    gpu: GPUSpec = Field(default_factory=GPUSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _notes: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _fill_runtime_defaults(self) -> BuildSpec:
        gpu_runtime = self.runtime is not Runtime.TORCH
        for role in ("target", "draft"):
            model = getattr(self, role)
            if model.quantization is None:  # spec_defaults chose from the model's shapes when it could read them
                model.quantization = default_format(role, gpu_runtime)
        if self.draft.tp_size != 1:
            raise ValueError("draft.tp_size must be 1: the draft runs on one GPU")
        if self.triton.orchestration is Orchestration.IN_PROCESS and self.runtime is not Runtime.TORCH:
            raise ValueError(
                f"triton.orchestration in_process needs runtime torch (runtime {self.runtime.value} "
                "serves its engines as separate models): use auto or bls"
            )
        return self

    @property
    def in_process(self) -> bool:
        """The torch runtime's in-process draft-target model serves this repository (no BLS orchestrator)."""
        return self.runtime is Runtime.TORCH and self.triton.orchestration is not Orchestration.BLS

    # -- paths --------------------------------------------------------------------------------------------------
    @property
    def base_dir(self) -> Path:
        """Directory that relative paths resolve against (the spec file's directory)."""
        return self._base_dir

    def with_base_dir(self, base_dir: Path) -> BuildSpec:
        self._base_dir = Path(base_dir).resolve()
        return self

    def resolve(self, path: Path | str) -> Path:
        """Resolve a path of this spec against its base directory (``~`` expanded)."""
        p = Path(os.path.expanduser(str(path)))
        return p if p.is_absolute() else (self._base_dir / p)

    def model_path(self, role: str, *, weights: bool = True) -> Path:
        """Local directory of the target or draft model: a path (relative to the spec file), or a hub id's snapshot
        (downloaded, or from the Hugging Face cache; ``weights=False`` fetches configs and tokenizer files only)."""
        from trtspec.hub import resolve_model

        return resolve_model(getattr(self, role).model, self._base_dir, weights=weights)

    @property
    def default_notes(self) -> dict[str, str]:
        """Why a default was chosen, by field path (e.g. ``draft.quantization``): `trtspec init` writes them."""
        return dict(self._notes)

    @property
    def ngram_pool_path(self) -> Path:
        """The n-gram pool the ngram and hybrid drafters read (resolved against the spec's directory)."""
        pool = self.speculative.ngram_pool
        return self.model_path("draft") / "ngram_pool.npz" if pool is None else self.resolve(pool)

    @property
    def build_dir(self) -> Path:
        return self.resolve(self.output.build_dir)

    @property
    def engines_dir(self) -> Path:
        return self.resolve(self.output.engines_dir)

    @property
    def repo_dir(self) -> Path:
        return self.resolve(self.output.repo_dir)

    def to_yaml_dict(self) -> dict[str, Any]:
        """A plain dict that round-trips through ``BuildSpec.model_validate``."""
        return self.model_dump(mode="json")


# -- loading ----------------------------------------------------------------------------------------------------
def _section_fields(loc: tuple) -> list[str]:
    """Field names of the section at ``loc`` (a path of field names from the top), for "did you mean"."""
    model: type[BaseModel] = BuildSpec
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _did_you_mean(word: Any, choices: list[str]) -> str:
    import difflib

    if not isinstance(word, str) or not choices:
        return ""
    close = difflib.get_close_matches(word.lower(), choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _format_error(source: str, err: Mapping[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    kind = err["type"]
    value = err.get("input")
    if kind == "enum":
        expected = str(err.get("ctx", {}).get("expected", ""))
        allowed = [v.strip().strip("'") for v in expected.replace(" or ", ", ").split(",") if v.strip()]
        guess = _did_you_mean(str(value).replace("-", "_") if isinstance(value, str) else value, allowed)
        return f"{source}: {loc}: {value!r} is not one of {', '.join(allowed)}{guess}"
    if kind == "extra_forbidden":
        return f"{source}: {loc}: unknown field{_did_you_mean(err['loc'][-1], _section_fields(err['loc'][:-1]))}"
    if kind == "missing":
        return f"{source}: {loc}: field required"
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ")
    return f"{source}: {loc}: {msg}" + (
        f" (got {value!r})"
        if kind not in ("value_error",) and value is not None and not isinstance(value, dict)
        else ""
    )


def _error_source(source: str, loc: tuple, overrides: Mapping[tuple, str]) -> tuple[str, bool]:
    """Who set the field an error is about: an environment variable (when it set that field or one above it),
    else ``source``; a section error with an override below it names both. Second value: an override is involved."""
    for path, var in overrides.items():
        if tuple(loc[: len(path)]) == path:
            return f"{var} (environment)", True
    below = [var for path, var in overrides.items() if tuple(path[: len(loc)]) == tuple(loc)]
    if below:
        return f"{source} with {', '.join(below)} from the environment", True
    return source, False


def _raise_validation(source: str, exc: ValidationError, overrides: Mapping[tuple, str] | None = None) -> None:
    errors = exc.errors()
    where, from_env = _error_source(source, tuple(str(p) for p in errors[0]["loc"]), overrides or {})
    first = _format_error(where, errors[0])
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    hint = (
        "fix or unset that environment variable (TRTSPEC_SPEC__SECTION__FIELD=value)"
        if from_env
        else "`trtspec init` writes a commented spec with every field and its allowed values"
    )
    raise SpecError(first + more, hint=hint)


def _parse_scalar(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def env_overrides(environ: Mapping[str, str]) -> dict[tuple, str]:
    """The field paths that ``TRTSPEC_SPEC__...`` variables set, each with its variable's name."""
    return {
        tuple(p.lower() for p in key[len(ENV_PREFIX) :].split("__") if p): key
        for key in sorted(environ)
        if key.startswith(ENV_PREFIX)
    }


def apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Override spec fields from ``TRTSPEC_SPEC__SECTION__FIELD=value`` variables (values parsed as YAML scalars)."""
    for path, key in env_overrides(environ).items():
        if not path:
            raise SpecError(f"{key}: names no field", hint="use TRTSPEC_SPEC__SECTION__FIELD=value")
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SpecError(
                    f"{key} (environment): {part} is not a section", hint="use TRTSPEC_SPEC__SECTION__FIELD=value"
                )
        try:
            node[path[-1]] = _parse_scalar(environ[key])
        except Exception as exc:  # noqa: BLE001 - a YAML error in one variable's value
            raise SpecError(
                f"{key} (environment): its value is not a YAML scalar ({exc})",
                hint="quote the value, e.g. TRTSPEC_SPEC__NAME='\"my-name\"'",
            ) from None
    return data


def spec_from_dict(
    data: Mapping[str, Any],
    source: str = "spec",
    base_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> BuildSpec:
    """Validate a dict into a BuildSpec; errors name ``source`` (or the environment variable that set the field),
    the field path and the allowed values. Empty quantization fields of GPU runtimes get the best format the model
    takes (read from its config.json), with a note saying why."""
    import copy

    from trtspec.spec_defaults import fill_gpu_defaults

    environ = os.environ if environ is None else environ
    overrides = env_overrides(environ)
    merged = apply_env_overrides(copy.deepcopy(dict(data)), environ)
    base = Path(base_dir or Path.cwd()).resolve()
    notes = fill_gpu_defaults(merged, base)
    try:
        spec = BuildSpec.model_validate(merged)
    except ValidationError as exc:
        _raise_validation(source, exc, overrides)
        raise  # unreachable
    spec._notes = notes
    return spec.with_base_dir(base)


def load_spec(path: Path | str, environ: Mapping[str, str] | None = None) -> BuildSpec:
    """Load and validate a YAML spec file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise SpecError(
            f"{path}: no such spec file",
            hint="`trtspec init` writes one; with no SPEC, ./trtspec.yaml or the embedded example is used",
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise SpecError(
            f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})", hint="check indentation and quoting"
        ) from None
    if not isinstance(data, dict):
        raise SpecError(
            f"{path}: expected a mapping of sections, got {type(data).__name__}",
            hint="`trtspec init` writes a commented spec",
        )
    return spec_from_dict(data, source=path.name, base_dir=path.parent, environ=environ)


def dump_spec(spec: BuildSpec, path: Path | str) -> None:
    """Write a spec as YAML (no comments; ``trtspec init`` writes the commented form)."""
    import yaml

    Path(path).write_text(yaml.safe_dump(spec.to_yaml_dict(), sort_keys=False), encoding="utf-8")
