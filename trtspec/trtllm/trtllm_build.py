"""`trtllm-build` command lines for draft and target, checked against the TensorRT-LLM version table.

Nothing here imports tensorrt_llm: commands are argument lists run as subprocesses where the tool exists. What each
flag means for draft-target follows examples/draft_target_model/README.md (TensorRT-LLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.build.formats import KVCacheFormat, Quantization
from trtspec.build.layout import ROLES
from trtspec.errors import EngineBuildError
from trtspec.spec import BuildSpec
from trtspec.trtllm.trtllm_versions import (
    RELEASES,
    Flag,
    TrtllmRelease,
    get_release,
    ngc_image,
)

__all__ = [
    "RELEASES",
    "ngc_image",
    "trtllm_build_command",
    "validate_command",
    "get_release",
    "LOGITS_DTYPE",
    "engine_input_limits",
]

# Both engines emit float32 logits, so the Triton configs' logits_datatype (TYPE_FP32) and the draft_logits the
# target receives agree whatever the checkpoint's logits_dtype says (ModelOpt's export writes float16).
LOGITS_DTYPE = "float32"


# BuildConfig.max_num_tokens's default (tensorrt_llm/builder.py; tests/upstream/engine_input_limits.json). trtspec
# passes no --max_num_tokens; for a speculative engine the builder raises it to max_batch_size * (max_draft_len + 1).
DEFAULT_MAX_NUM_TOKENS = 8192


@dataclass(frozen=True)
class EngineInputLimits:
    """How long an input the two engines accept, as TensorRT-LLM's runtime computes it (trtGptModel.h): without
    chunked context min(max_seq_len - 1, max_num_tokens), with it max_seq_len - 1. Every draft-target step re-sends
    the whole sequence, so a generation longer than that cap would fail part-way ("Prompt length exceeds maximum
    input length", LlmRequest::validate)."""

    max_num_tokens: int  # the smaller of the two engines' (the draft has no speculative bump)
    chunked_context: bool  # written as enable_chunked_context into both engine configs
    max_input_tokens: int  # the longest sequence a step may send

    @property
    def config_parameters(self) -> dict[str, str]:
        """The engine models' config parameters that set the cap (none when the default already fits)."""
        return {"enable_chunked_context": "true"} if self.chunked_context else {}


def engine_input_limits(spec: BuildSpec) -> EngineInputLimits:
    """The engines' input cap for ``spec``: chunked context on exactly when ``max_seq_len - 1`` exceeds the engines'
    max_num_tokens, so that every sequence the spec allows (prompt + max_tokens <= max_seq_len) fits every step."""
    num_tokens = DEFAULT_MAX_NUM_TOKENS  # the draft's; the target's, max(it, max_batch_size * (K + 1)), is not smaller
    longest = spec.engine.max_seq_len - 1
    chunked = longest > num_tokens
    return EngineInputLimits(num_tokens, chunked, longest if chunked else min(longest, num_tokens))


def trtllm_build_command(
    spec: BuildSpec, role: str, checkpoint_dir: Path, output_dir: Path, program: str = "trtllm-build"
) -> list[str]:
    """The `trtllm-build` argument list for the target or the draft of a draft-target pair."""
    if role not in ROLES:
        raise ValueError(role)
    model = getattr(spec, role)
    eng = spec.engine
    cmd = [
        program,
        "--checkpoint_dir",
        str(checkpoint_dir),
        "--output_dir",
        str(output_dir),
        "--gemm_plugin",
        "auto",  # the checkpoint's dtype
        "--kv_cache_type",
        "paged",
        "--use_paged_context_fmha",
        "enable",  # KV-cache reuse: required for draft-target
        "--max_batch_size",
        str(eng.max_batch_size),
        "--max_input_len",
        str(eng.max_input_len),
        "--max_seq_len",
        str(eng.max_seq_len),
        "--max_beam_width",
        "1",  # draft-target supports beam width 1 only
        "--logits_dtype",
        LOGITS_DTYPE,
    ]
    if role == "target":
        # Without --max_draft_len the served target rejects every draft ("larger than maximum number of draft
        # tokens (0)", tensorrtllm_backend #473).
        cmd += [
            "--speculative_decoding_mode",
            "draft_tokens_external",
            "--max_draft_len",
            str(spec.speculative.max_draft_len),
        ]
    if spec.speculative.use_draft_logits:
        # Both engines (run_dtm_pld.py asserts it for draft and target); without it on the draft the target waits for
        # logits that never come (TRT-LLM #2798).
        cmd += ["--gather_generation_logits"]
    if model.quantization is Quantization.FP8 and model.kv_cache is KVCacheFormat.FP8:
        cmd += ["--use_fp8_context_fmha", "enable"]
    if model.tp_size > 1:
        cmd += ["--workers", str(model.tp_size)]  # one build process per rank
    validate_command(cmd, eng.trtllm_version)
    return cmd


def _check_value(release: TrtllmRelease, flag: Flag, value: str) -> None:
    if flag.type is int:
        try:
            int(value)
        except ValueError:
            raise EngineBuildError(
                f"trtllm-build {release.line}: {flag.name} takes an integer, got '{value}'",
                hint="this is a bug in trtspec's command builder",
            ) from None
    if flag.choices is not None and value not in flag.choices:
        raise EngineBuildError(
            f"trtllm-build {release.line}: {flag.name} has no choice '{value}'",
            hint=f"choices: {', '.join(flag.choices)}",
        )


def validate_command(cmd: list[str], version: str) -> None:
    """Reject flags, missing values and choices that the given TensorRT-LLM version does not document."""
    release = get_release(version)
    if not release.engines_supported:
        raise EngineBuildError(
            f"TensorRT-LLM {version} cannot build engines", hint="use runtime trtllm-llmapi, or a version up to 1.2"
        )
    args = cmd[1:]
    i = 0
    seen: set[str] = set()
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        flag = release.flag(name) if arg.startswith("--") else None
        if flag is None:
            raise EngineBuildError(
                f"trtllm-build {release.line} has no flag {name}"
                if arg.startswith("--")
                else f"trtllm-build {release.line}: unexpected argument '{arg}'",
                hint="update trtspec's version table or pick another engine.trtllm_version",
            )
        if flag.name in seen:
            raise EngineBuildError(f"trtllm-build command repeats {flag.name}", hint="a bug in trtspec's builder")
        seen.add(flag.name)
        if flag.kind == "switch":
            if eq:
                raise EngineBuildError(
                    f"trtllm-build {release.line}: {flag.name} takes no value", hint="it is a switch"
                )
            i += 1
            continue
        if eq:
            values, i = [inline], i + 1
        else:
            values = []
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        if not values or (flag.kind == "value" and len(values) != 1):
            raise EngineBuildError(
                f"trtllm-build {release.line}: {flag.name} needs exactly one value, got {values}",
                hint="a bug in trtspec's builder",
            )
        for value in values:
            _check_value(release, flag, value)
