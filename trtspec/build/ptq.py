"""Post-training quantization of one model: guards, calibration with ModelOpt, quality figures, export.

Two steps with a seam between them, so that tests and tools can look at the calibrated model before it is exported
(ModelOpt's exports rewrite the model's weights in place): :func:`calibrate` and :func:`export_calibrated`. The order
of work puts every refusal before anything expensive: format and machine guards, model files, calibration file,
block-size check on a weightless skeleton, and only then loading weights and calibrating.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.build.artifacts import hash_dir, tool_versions
from trtspec.build.formats import Quantization, get_format
from trtspec.build.layout import is_quantized
from trtspec.build.quiet import quiet_libraries
from trtspec.errors import ModelLoadError, QuantizationError
from trtspec.spec import BuildSpec, DType, Runtime

if TYPE_CHECKING:
    from rich.progress import Progress

    from trtspec.build.calibration import CalibrationData
    from trtspec.build.quality import EvalResult

log = logging.getLogger("trtspec.quantize")
MODELOPT_LOG = "modelopt.log"
_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def export_kind(spec: BuildSpec) -> str:
    """``trtllm-checkpoint`` for runtime trtllm-engine, ``hf-checkpoint`` (unified HF) for the others."""
    return "trtllm-checkpoint" if spec.runtime is Runtime.TRTLLM_ENGINE else "hf-checkpoint"


def check_weights_present(model_dir: Path) -> None:
    """Raise ModelLoadError when a model directory has a config but no weight files."""
    if not any(next(Path(model_dir).glob(g), None) for g in _WEIGHT_GLOBS):
        raise ModelLoadError(
            f"{model_dir}: no model weights (*.safetensors or pytorch_model*.bin)",
            hint="save the full model into this directory (model.save_pretrained(dir)); "
            "config and tokenizer alone are not enough",
        )


def _fp8_capabilities(spec: BuildSpec, cuda: bool) -> list[tuple[str, tuple[int, int]]]:
    import torch

    from trtspec.build.formats import parse_capability

    caps: list[tuple[str, tuple[int, int]]] = []
    if cuda:
        major, minor = torch.cuda.get_device_capability(0)
        caps.append((f"this GPU ({torch.cuda.get_device_name(0)})", (major, minor)))
    spec_cc = parse_capability(spec.gpu.compute_capability)
    if spec_cc is not None:
        caps.append(("the spec's gpu.compute_capability", spec_cc))
    return caps


def preflight(spec: BuildSpec, role: str, cuda: bool) -> tuple[dict[str, Any], list[str]]:
    """Guards that need no weights (format vs. machine and export, model files, family); the raw source config and
    warnings (FP8 below compute capability 8.9)."""
    from trtspec.build.formats import TORCH_SUPPORTED_ALGOS as SUPPORTED_ALGOS
    from trtspec.build.formats import check_machine, fp8_capability_warning
    from trtspec.families import get_family, read_config

    model = getattr(spec, role)
    q, kv = model.quantization, model.kv_cache
    check_machine(q, kv, cuda_available=cuda, hf_export=spec.runtime is not Runtime.TRTLLM_ENGINE)
    algo = get_format(q).trtllm_algo
    if spec.runtime is Runtime.TORCH and algo is not None and algo not in SUPPORTED_ALGOS:
        raise QuantizationError(
            f"the torch runtime cannot run {q.value} checkpoints (no PyTorch kernels for {algo})",
            hint=f"use runtime trtllm-llmapi for {q.value}, or another format for the torch runtime",
        )
    src = spec.model_path(role)
    cfg = read_config(src)
    if spec.runtime is Runtime.TRTLLM_ENGINE:
        get_family(cfg.model_type)  # the TRT-LLM export needs a decoder type
    check_weights_present(src)
    warn = fp8_capability_warning(q, kv, _fp8_capabilities(spec, cuda))
    raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    return raw, [warn] if warn else []


def check_blocks(src: Path, q: Quantization, cuda: bool) -> None:
    """INT4/W4A8/NVFP4 block-size check on a weightless (meta-device) skeleton of the model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trtspec.build.formats import check_block_size, quantized_linears

    if get_format(q).block_size is None:
        return
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
    check_block_size(q, quantized_linears(skeleton), cuda_available=cuda)


def export_dtype(spec: BuildSpec, role: str) -> tuple[Any, list[str]]:
    """The dtype of the exported unquantized tensors, and a note when it differs from the spec's."""
    import torch

    dtype = getattr(spec, role).dtype
    if spec.runtime is Runtime.TRTLLM_ENGINE and dtype is DType.FLOAT32:
        # ModelOpt would switch to float16 with a warning; say so in the manifest instead.
        return torch.float16, [f"{role}.dtype float32 is not a TensorRT-LLM checkpoint dtype: exported as float16"]
    return getattr(torch, dtype.value), []


def load_for_calibration(
    src: Path, dtype: Any, cuda: bool, log_lines: list[str] | None = None
) -> tuple[Any, dict[str, int]]:
    """Load a model where it is calibrated; return it (eval mode) and where its modules went (device -> count).

    On a GPU machine, as ModelOpt's examples/llm_ptq/hf_ptq.py does: ``device_map="auto"`` spreads the layers over every
    visible GPU and keeps what does not fit in CPU memory (accelerate moves activations between them); calibration then
    runs on the devices. Without a GPU the whole model stays in CPU memory, as before."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": dtype}
    if cuda:
        kwargs["device_map"] = "auto"
    try:
        with quiet_libraries(log_lines if log_lines is not None else []):
            model = AutoModelForCausalLM.from_pretrained(src, **kwargs)
    except ValueError as exc:
        if "offload" not in str(exc):
            raise
        raise QuantizationError(
            f"{src}: the model fits neither the GPUs nor CPU memory ({exc})",
            hint="use a machine with more GPU or CPU memory for the quantize stage",
        ) from None
    return model.eval(), placement_of(model)


def placement_of(model: Any) -> dict[str, int]:
    """Device -> number of top-level modules there: from accelerate's ``hf_device_map``, else the parameters' device."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return {str(next(model.parameters()).device): 1}
    counts: dict[str, int] = {}
    for device in device_map.values():
        name = f"cuda:{device}" if isinstance(device, int) else str(device)
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def placement_summary(placement: dict[str, int]) -> str:
    """``cuda:0`` / ``cuda:0+cuda:1+cpu``: where a model was calibrated (CPU memory only holds offloaded layers)."""
    return "+".join(placement)


@dataclass
class Calibrated:
    """A model after calibration (ModelOpt fake-quant modules in place) and what was learned on the way."""

    role: str
    model: Any
    raw_config: dict[str, Any]
    data: CalibrationData | None
    before: EvalResult | None = None
    after: EvalResult | None = None
    warnings: list[str] = field(default_factory=list)
    modelopt_log: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    device: str = "cpu"
    placement: dict[str, int] = field(default_factory=lambda: {"cpu": 1})


def calibrate(spec: BuildSpec, role: str, progress: Progress | None = None) -> Calibrated:
    """Load one role's model and quantize it with ModelOpt (fake quantization), with quality figures before/after."""
    import torch
    from transformers import AutoTokenizer

    from trtspec.build import quality
    from trtspec.build.calibration import forward_loop, load_calibration
    from trtspec.build.formats import modelopt_config

    t0 = time.monotonic()
    model_spec = getattr(spec, role)
    q, kv = model_spec.quantization, model_spec.kv_cache
    src = spec.model_path(role)
    cuda = torch.cuda.is_available()
    raw_cfg, warnings_out = preflight(spec, role, cuda)
    calibrating = is_quantized(spec, role)
    data = load_calibration(spec, AutoTokenizer.from_pretrained(src)) if calibrating else None
    check_blocks(src, q, cuda)
    # CPUs calibrate in float32 (bfloat16 matmuls are slow there); GPUs in the spec's dtype, as ModelOpt's examples do.
    load_dtype = getattr(torch, model_spec.dtype.value) if cuda else torch.float32
    out = Calibrated(role, None, raw_cfg, data, warnings=warnings_out)
    out.model, out.placement = load_for_calibration(src, load_dtype, cuda, out.modelopt_log)
    out.device = placement_summary(out.placement)
    if cuda and any(not d.startswith("cuda") for d in out.placement):
        out.warnings.append(
            f"{role}: the GPUs hold only part of the model ({out.device}); the rest runs from CPU "
            "memory, so calibration is slower"
        )
    log.info("%s: placed on %s", role, out.device)
    out.timings["load_s"] = time.monotonic() - t0
    if not calibrating:
        return out
    assert data is not None
    with quiet_libraries(out.modelopt_log):  # its import warns that transformers 5.24 is untested (it works)
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export.unified_export_hf import requantize_resmooth_fused_llm_layers
    bs = spec.calibration.batch_size
    if data.heldout.numel():
        out.before = quality.evaluate(out.model, data.heldout, bs, progress, f"{role}: evaluating unquantized")
    t = time.monotonic()
    loop = forward_loop(data.calib, bs, progress, f"{role}: calibrating {q.value}")
    with quiet_libraries(out.modelopt_log):
        out.model = mtq.quantize(out.model, modelopt_config(q, kv), loop)
        # What both exports do first: layers that share an input get shared AWQ/SmoothQuant scales. Doing it here makes
        # the quality figures (and the model a caller sees) the numbers that are exported, not the pre-export ones.
        requantize_resmooth_fused_llm_layers(out.model)
    out.timings["calibrate_s"] = time.monotonic() - t
    if out.before is not None:
        out.after = quality.evaluate(out.model, data.heldout, bs, progress, f"{role}: evaluating {q.value}")
    return out


def _dedupe(lines: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return [line if n == 1 else f"{line}  (x{n})" for line, n in counts.items()]


def export_calibrated(spec: BuildSpec, c: Calibrated, out_dir: Path, progress: Progress | None = None) -> dict:
    """Export a calibrated model (TRT-LLM or unified HF checkpoint) with its tokenizer into ``out_dir``; returns the
    manifest fields. The model's weights are rewritten by ModelOpt: do not run it afterwards."""
    from trtspec.build import export, quality
    from trtspec.families import get_family, normalize_config

    role = c.role
    model_spec = getattr(spec, role)
    src = spec.model_path(role)
    dtype, dtype_notes = export_dtype(spec, role)
    t = time.monotonic()
    task = progress.add_task(f"{role}: exporting {export_kind(spec)}", total=1) if progress is not None else None
    with quiet_libraries(c.modelopt_log):
        if spec.runtime is Runtime.TRTLLM_ENGINE:
            decoder = get_family(normalize_config(c.raw_config).model_type).decoder_type
            fixes = export.export_trtllm(
                c.model,
                out_dir,
                decoder_type=decoder,
                dtype=dtype,
                tp_size=model_spec.tp_size,
                raw_source_config=c.raw_config,
            )
        else:
            fixes = export.export_hf(c.model, out_dir, dtype=dtype, raw_source_config=c.raw_config)
    copied = export.copy_tokenizer_files(src, out_dir)
    metrics = None
    if c.before is not None and c.after is not None:
        metrics = quality.role_metrics(c.before, c.after)
        quality.save_eval(out_dir, c.before, c.after)
    if progress is not None and task is not None:
        progress.advance(task)
    c.timings["export_s"] = time.monotonic() - t
    (Path(out_dir) / MODELOPT_LOG).write_text("\n".join(_dedupe(c.modelopt_log)) + "\n", encoding="utf-8")
    for fix in fixes:
        log.info("%s: %s", role, fix)
    q = model_spec.quantization
    return {
        "role": role,
        "source": str(src),
        "source_hash": hash_dir(src),
        "format": q.value,
        "trtllm_quant_algo": get_format(q).trtllm_algo,
        "kv_cache": model_spec.kv_cache.value,
        "export": export_kind(spec),
        "dtype": str(dtype).removeprefix("torch."),
        "device": c.device,
        "placement": c.placement,
        "versions": tool_versions("nvidia-modelopt", "transformers", "torch"),
        "calibration": c.data.summary if c.data is not None else None,
        "quality": metrics,
        "fixes": fixes,
        "warnings": c.warnings + dtype_notes,
        "tokenizer_files": copied,
        "timings": {k: round(v, 3) for k, v in c.timings.items()},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # process peak so far
    }
