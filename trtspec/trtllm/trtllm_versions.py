"""What each TensorRT-LLM release line accepts, and which NGC Triton image ships which release.

The upstream facts behind this table are recorded with their sources in tests/upstream/ (trtllm_build.json,
llm_api.json, ngc_images.json), and the tests compare this table and every command built from it with those records.
In short:
- ``tensorrt_llm/commands/build.py`` + ``tensorrt_llm/plugin/plugin.py``: two stored readings, one with the
  auto-parallel group (``--auto_parallel``, ``--gpus_per_node``, ``--cluster_key``; releases up to 1.1) and one
  without (1.2: PR #8329 "Remove auto_parallel module", merged 2025-10-16 after the 1.1 branch). Every other flag and
  choice is the same.
- ``SpeculativeDecodingMode`` (tensorrt_llm/models/modeling_utils.py): the int an engine's config.json records.
- NGC images: Triton's compatibility matrix for 25.06-25.12 (25.11 ships 1.0.3), the tensorrtllm_backend ``r<yy.mm>``
  branch Dockerfiles (``TENSORRTLLM_VER``) after it: 26.01/26.02 -> 1.1.0, 26.03 -> 1.2.0rc8, 26.04-26.07 -> 1.2.1.
  Pre-releases are releases of their own here: engines built by 1.2.0rc8 load only in 1.2.0rc8.
- LLM API ``DecodingBaseConfig``: ``speculative_model`` (0.2x, plain BaseModel), ``speculative_model_dir`` (1.0, 1.1:
  StrictBaseModel, so the other name is rejected); ``decoding_type`` is dispatched by ``from_dict`` on the key
  ``DraftTarget``. A later llm_args.py (a pydantic discriminated union) accepts only ``Draft_Target`` and takes
  ``speculative_model`` (``speculative_model_dir`` as an alias). Which one 1.2 ships is not verified: 1.2 keeps the 1.1
  names, marked ``verified=False``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from trtspec.errors import EngineBuildError


@dataclass(frozen=True)
class Flag:
    """One ``trtllm-build`` option: a switch (store_true) or an option taking a value, with its choices if closed."""

    name: str
    kind: str = "value"  # "value" | "switch" | "list"
    type: type = str
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()


_PLUGIN_DTYPES = ("auto", "float16", "float32", "bfloat16", "int32", "disable")
_ENABLE = ("enable", "disable")


def _build_py_flags(auto_parallel: bool) -> tuple[Flag, ...]:
    """The argparse options of tensorrt_llm/commands/build.py plus plugin.add_plugin_argument."""
    v, s = "value", "switch"
    flags = [
        Flag("--checkpoint_dir"),
        Flag("--model_config"),
        Flag("--build_config"),
        Flag("--model_cls_file"),
        Flag("--model_cls_name"),
        Flag("--output_dir"),
        Flag("--max_batch_size", v, int),
        Flag("--max_input_len", v, int),
        Flag("--max_seq_len", v, int, aliases=("--max_decoder_seq_len",)),
        Flag("--max_beam_width", v, int),
        Flag("--max_num_tokens", v, int),
        Flag("--opt_num_tokens", v, int),
        Flag("--max_encoder_input_len", v, int),
        Flag("--max_prompt_embedding_table_size", v, int, aliases=("--max_multimodal_len",)),
        # parsed by enum_type(KVCacheType): the names of tensorrt_llm.bindings.KVCacheType, lower-cased
        Flag("--kv_cache_type", v, str, ("continuous", "paged", "disabled")),
        Flag("--paged_kv_cache"),  # deprecated in favour of --kv_cache_type
        Flag("--input_timing_cache"),
        Flag("--output_timing_cache"),
        Flag("--profiling_verbosity", v, str, ("layer_names_only", "detailed", "none")),
        Flag("--strip_plan", s),
        Flag("--weight_sparsity", s),
        Flag("--weight_streaming", s),
        Flag("--fast_build", s),
        Flag("--workers", v, int),
        Flag("--log_level", v, str, ("internal_error", "error", "warning", "info", "verbose")),
        Flag("--enable_debug_output", s),
        Flag("--visualize_network"),
        Flag("--dry_run", s),
        Flag("--monitor_memory", s),
        # Logits arguments
        Flag("--logits_dtype", v, str, ("float16", "float32")),
        Flag("--gather_context_logits", s),
        Flag("--gather_generation_logits", s),
        Flag("--gather_all_token_logits", s),
        # LoRA arguments
        Flag("--lora_dir", "list"),
        Flag("--lora_ckpt_source", v, str, ("hf", "nemo")),
        Flag("--lora_target_modules", "list"),
        Flag("--max_lora_rank", v, int),
        # Speculative decoding arguments
        Flag(
            "--speculative_decoding_mode",
            v,
            str,
            ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"),
        ),
        Flag("--max_draft_len", v, int),
    ]
    if auto_parallel:
        flags += [Flag("--auto_parallel", v, int), Flag("--gpus_per_node", v, int), Flag("--cluster_key")]
    # Plugin config arguments (cli_plugin_args); "disable" stands for None.
    flags += [
        Flag("--bert_attention_plugin", v, str, _PLUGIN_DTYPES),
        Flag("--gpt_attention_plugin", v, str, _PLUGIN_DTYPES),
        Flag("--gemm_plugin", v, str, ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable")),
        Flag("--gemm_swiglu_plugin", v, str, ("fp8", "disable")),
        Flag("--fp8_rowwise_gemm_plugin", v, str, _PLUGIN_DTYPES),
        Flag("--lora_plugin", v, str, _PLUGIN_DTYPES),
        Flag("--dora_plugin", v, str, _ENABLE),
        Flag("--moe_plugin", v, str, _PLUGIN_DTYPES),
        Flag("--mamba_conv1d_plugin", v, str, _PLUGIN_DTYPES),
        Flag("--nccl_plugin", v, str, _PLUGIN_DTYPES),
        Flag("--low_latency_gemm_plugin", v, str, ("fp8", "disable")),
        Flag("--low_latency_gemm_swiglu_plugin", v, str, ("fp8", "disable")),
        Flag("--gemm_allreduce_plugin", v, str, ("float16", "bfloat16", "disable")),
    ]
    flags += [
        Flag(f"--{name}", v, str, _ENABLE)
        for name in (
            "context_fmha",
            "bert_context_fmha_fp32_acc",
            "remove_input_padding",
            "use_paged_context_fmha",
            "use_fp8_context_fmha",
            "fuse_fp4_quant",
            "multiple_profiles",
            "paged_state",
            "streamingllm",
            "norm_quant_fusion",
            "reduce_fusion",
            "user_buffer",
            "use_fused_mlp",
            "pp_reduce_scatter",
        )
    ]
    flags.append(Flag("--tokens_per_block", v, int))
    return tuple(flags)


@dataclass(frozen=True)
class LlmApiFields:
    """Field names of the LLM API's speculative_config for draft-target, as model.yaml spells them."""

    decoding_type: str  # key DecodingBaseConfig.from_dict dispatches on
    draft_model_field: str  # speculative_model | speculative_model_dir
    supported: bool = True  # the Triton llmapi model serves draft-target on the PyTorch backend
    verified: bool = True  # False: read in no source known to belong to this release (see the module docstring)


@dataclass(frozen=True)
class TrtllmRelease:
    """One TensorRT-LLM release line: its trtllm-build interface and LLM API field names."""

    line: str  # "1.0"
    flags: tuple[Flag, ...]
    llmapi: LlmApiFields
    engines_supported: bool = True
    _by_name: Mapping[str, Flag] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {}
        for f in self.flags:
            for n in (f.name, *f.aliases):
                by_name[n] = f
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))

    def flag(self, name: str) -> Flag | None:
        return self._by_name.get(name)

    @property
    def flag_names(self) -> frozenset[str]:
        return frozenset(self._by_name)

    @property
    def speculative_modes(self) -> tuple[str, ...]:
        f = self.flag("--speculative_decoding_mode")
        assert f is not None and f.choices is not None
        return f.choices


@dataclass(frozen=True)
class NgcTag:
    """One NGC ``tritonserver:<tag>-trtllm-python-py3`` image and the TensorRT-LLM release it ships."""

    tag: str
    trtllm_version: str
    source: str  # "support matrix" (Triton's compatibility matrix) | "backend branch Dockerfile" (backend r<tag>)


_OLD_LLMAPI = LlmApiFields("DraftTarget", "speculative_model", supported=False)  # llmapi runtime needs >= 1.0
_NEW_LLMAPI = LlmApiFields("DraftTarget", "speculative_model_dir")
_UNVERIFIED_LLMAPI = LlmApiFields("DraftTarget", "speculative_model_dir", verified=False)

RELEASES: dict[str, TrtllmRelease] = {
    r.line: r
    for r in (
        TrtllmRelease("0.20", _build_py_flags(auto_parallel=True), _OLD_LLMAPI),
        TrtllmRelease("0.21", _build_py_flags(auto_parallel=True), _OLD_LLMAPI),
        TrtllmRelease("1.0", _build_py_flags(auto_parallel=True), _NEW_LLMAPI),
        TrtllmRelease("1.1", _build_py_flags(auto_parallel=True), _NEW_LLMAPI),
        TrtllmRelease("1.2", _build_py_flags(auto_parallel=False), _UNVERIFIED_LLMAPI),
    )
}

_MATRIX, _DOCKERFILE = "support matrix", "backend branch Dockerfile"
NGC_TAGS: tuple[NgcTag, ...] = (
    NgcTag("25.06", "0.20.0", _MATRIX),
    NgcTag("25.07", "0.20.0", _MATRIX),
    NgcTag("25.08", "0.21.0", _MATRIX),
    NgcTag("25.09", "1.0.0", _MATRIX),
    NgcTag("25.10", "1.0.0", _MATRIX),
    NgcTag("25.11", "1.0.3", _MATRIX),  # matrix: 1.0.3.2510 (its branch Dockerfile's 1.2.0rc2 is not what shipped)
    NgcTag("25.12", "1.1.0", _MATRIX),
    NgcTag("26.01", "1.1.0", _DOCKERFILE),
    NgcTag("26.02", "1.1.0", _DOCKERFILE),
    NgcTag("26.03", "1.2.0rc8", _DOCKERFILE),
    NgcTag("26.04", "1.2.1", _DOCKERFILE),
    NgcTag("26.05", "1.2.1", _DOCKERFILE),
    NgcTag("26.06", "1.2.1", _DOCKERFILE),
    NgcTag("26.07", "1.2.1", _DOCKERFILE),
)

NGC_REPOSITORY = "nvcr.io/nvidia/tritonserver"
NGC_SUFFIX = "-trtllm-python-py3"

# SpeculativeDecodingMode is an IntFlag: NONE=1, DRAFT_TOKENS_EXTERNAL=2, MEDUSA=4, LOOKAHEAD_DECODING=8,
# EXPLICIT_DRAFT_TOKENS=16, EAGLE=32; an engine's config.json records the int.
SPECULATIVE_MODE_VALUES = {
    "none": 1,
    "draft_tokens_external": 2,
    "medusa": 4,
    "lookahead_decoding": 8,
    "explicit_draft_tokens": 16,
    "eagle": 32,
}


_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)*((?:rc|a|b|\.?post|\.?dev)\d+)?")


def normalize_version(version: str) -> str:
    """``1.0.3.2510`` / ``v1.0.3`` -> ``1.0.3``; ``1.2.0rc8`` stays ``1.2.0rc8``: the release an engine or image is tied
    to (a pre-release is a release of its own: engines load only in the build that made them)."""
    m = _VERSION.fullmatch(version.strip())
    if m is None:
        raise EngineBuildError(f"'{version}' is not a TensorRT-LLM version", hint="expected e.g. 1.0.0 or 1.2.0rc8")
    major, minor, patch, pre = m.groups()
    return f"{int(major)}.{int(minor)}.{int(patch or 0)}" + (pre.lstrip(".") if pre else "")


def release_line(version: str) -> str:
    """``1.0.3`` -> ``1.0``; ``1.2.0rc8`` -> ``1.2``."""
    major, minor = _VERSION.fullmatch(normalize_version(version)).groups()[:2]  # type: ignore[union-attr]
    return f"{major}.{minor}"


def get_release(version: str) -> TrtllmRelease:
    """The table entry of a version's release line (patch releases share their line's interface)."""
    line = release_line(version)
    if line not in RELEASES:
        raise EngineBuildError(
            f"TensorRT-LLM {version} is not in trtspec's version table",
            hint=f"known release lines: {', '.join(RELEASES)}",
        )
    return RELEASES[line]


def ngc_tags_for(version: str) -> list[NgcTag]:
    """NGC tags that ship exactly this release, newest first."""
    v = normalize_version(version)
    return sorted((t for t in NGC_TAGS if t.trtllm_version == v), key=lambda t: t.tag, reverse=True)


def ngc_image(version: str) -> str:
    """The NGC Triton + TensorRT-LLM image that ships exactly this TensorRT-LLM release."""
    get_release(version)
    tags = ngc_tags_for(version)
    if not tags:
        shipped = ", ".join(sorted({t.trtllm_version for t in NGC_TAGS}))
        raise EngineBuildError(
            f"no NGC tritonserver image in trtspec's table ships TensorRT-LLM {version}",
            hint=f"set engine.trtllm_version to one of {shipped}, or triton.image explicitly",
        )
    return f"{NGC_REPOSITORY}:{tags[0].tag}{NGC_SUFFIX}"


def image_trtllm_version(image: str) -> str | None:
    """The TensorRT-LLM release an NGC ``tritonserver:<tag>-trtllm-python-py3`` image ships; None for other images."""
    name, _, tag = image.rpartition(":")
    if not name.endswith("tritonserver") or not tag.endswith(NGC_SUFFIX):
        return None
    yymm = tag[: -len(NGC_SUFFIX)]
    for t in NGC_TAGS:
        if t.tag == yymm:
            return t.trtllm_version
    raise EngineBuildError(
        f"{image}: trtspec does not know which TensorRT-LLM release tag {yymm} ships",
        hint=f"known tags: {', '.join(t.tag for t in NGC_TAGS)}",
    )
