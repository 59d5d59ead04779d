"""`trtllm-build` command lines for draft and target, per TensorRT-LLM version.

Nothing here imports tensorrt_llm: commands are built as argument lists and run as subprocesses where the tool exists.
Flags per version were read from each release's ``tensorrt_llm/commands/build.py`` and
``examples/draft_target_model/README.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.errors import EngineBuildError
from trtspec.spec import BuildSpec, DType, Quantization


@dataclass(frozen=True)
class TrtllmVersion:
    """What one TensorRT-LLM release line accepts and which NGC Triton image ships it."""

    version: str
    ngc_tag: str  # nvcr.io/nvidia/tritonserver:<tag>-trtllm-python-py3
    flags: frozenset[str]
    speculative_modes: frozenset[str]


_COMMON_FLAGS = frozenset({
    "--checkpoint_dir", "--output_dir", "--max_batch_size", "--max_input_len", "--max_seq_len", "--max_beam_width",
    "--max_num_tokens", "--gemm_plugin", "--gpt_attention_plugin", "--use_paged_context_fmha", "--kv_cache_type",
    "--speculative_decoding_mode", "--max_draft_len", "--gather_context_logits", "--gather_generation_logits",
    "--gather_all_token_logits", "--logits_dtype", "--workers", "--remove_input_padding", "--context_fmha",
    "--use_fp8_context_fmha", "--log_level", "--multiple_profiles", "--paged_state", "--strongly_typed",
    "--max_prompt_embedding_table_size", "--use_fused_mlp", "--reduce_fusion", "--monitor_memory", "--model_config",
})
_SPEC_MODES = frozenset({"draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"})

VERSIONS: dict[str, TrtllmVersion] = {
    v.version: v
    for v in (
        TrtllmVersion("0.20.0", "25.07", _COMMON_FLAGS, _SPEC_MODES),
        TrtllmVersion("0.21.0", "25.08", _COMMON_FLAGS, _SPEC_MODES),
        TrtllmVersion("1.0.0", "25.10", _COMMON_FLAGS, _SPEC_MODES),
        TrtllmVersion("1.1.0", "25.12", _COMMON_FLAGS, _SPEC_MODES),
        TrtllmVersion("1.2.0", "26.02", _COMMON_FLAGS, _SPEC_MODES),
    )
}


def get_version(version: str) -> TrtllmVersion:
    if version in VERSIONS:
        return VERSIONS[version]
    # Patch releases share their line's flags (1.0.3 -> 1.0.0).
    line = ".".join(version.split(".")[:2]) + ".0"
    if line in VERSIONS:
        return VERSIONS[line]
    raise EngineBuildError(f"TensorRT-LLM {version} is not in trtspec's version table",
                           hint=f"known versions: {', '.join(VERSIONS)}")


def ngc_image(version: str) -> str:
    return f"nvcr.io/nvidia/tritonserver:{get_version(version).ngc_tag}-trtllm-python-py3"


def _gemm_dtype(dtype: DType) -> str:
    return "auto" if dtype is not DType.FLOAT32 else "float32"


def trtllm_build_command(spec: BuildSpec, role: str, checkpoint_dir: Path, output_dir: Path) -> list[str]:
    """The `trtllm-build` argument list for the target or the draft of a draft-target pair."""
    if role not in ("target", "draft"):
        raise ValueError(role)
    model = getattr(spec, role)
    eng = spec.engine
    cmd = [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(output_dir),
        "--gemm_plugin", _gemm_dtype(model.dtype),
        "--use_paged_context_fmha", "enable",  # KV-cache reuse: required for draft-target
        "--max_batch_size", str(eng.max_batch_size),
        "--max_input_len", str(eng.max_input_len),
        "--max_seq_len", str(eng.max_seq_len),
        "--max_beam_width", "1",  # draft-target supports beam width 1 only
    ]
    if role == "target":
        cmd += ["--speculative_decoding_mode", "draft_tokens_external",
                "--max_draft_len", str(spec.speculative.max_draft_len)]
    elif spec.speculative.use_draft_logits:
        cmd += ["--gather_generation_logits"]  # without it the target waits for logits that never come (TRT-LLM #2798)
    if model.quantization is Quantization.FP8 and model.kv_cache.value == "fp8":
        cmd += ["--use_fp8_context_fmha", "enable"]
    validate_command(cmd, spec.engine.trtllm_version)
    return cmd


def validate_command(cmd: list[str], version: str) -> None:
    """Reject flags the given TensorRT-LLM version does not document."""
    known = get_version(version)
    for arg in cmd[1:]:
        if arg.startswith("--") and arg not in known.flags:
            raise EngineBuildError(f"trtllm-build {version} has no flag {arg}",
                                   hint="update trtspec's version table or pick another engine.trtllm_version")
    if "--speculative_decoding_mode" in cmd:
        mode = cmd[cmd.index("--speculative_decoding_mode") + 1]
        if mode not in known.speculative_modes:
            raise EngineBuildError(f"trtllm-build {version} has no speculative mode {mode}",
                                   hint=f"modes: {', '.join(sorted(known.speculative_modes))}")
