"""The build plan: every stage with its inputs, outputs and the exact external commands, without running anything."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtspec.engines.trtllm_build import ngc_image, trtllm_build_command
from trtspec.spec import BuildSpec, KVCacheFormat, Quantization, Runtime

ROLES = ("target", "draft")


@dataclass(frozen=True)
class Stage:
    name: str
    action: str
    inputs: list[str]
    outputs: list[str]
    commands: list[list[str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["command_lines"] = [shlex.join(c) for c in self.commands]
        return d


def checkpoint_dir(spec: BuildSpec, role: str) -> Path:
    """Where the quantize stage writes a model's checkpoint."""
    return spec.build_dir / role


def engine_dir(spec: BuildSpec, role: str) -> Path:
    return spec.engines_dir / role


def serving_model_dir(spec: BuildSpec, role: str, *, weights: bool = True) -> Path:
    """The directory the serving runtime loads for a model: quantized checkpoint, or the source when unquantized
    (``weights=False``: a hub id's snapshot without fetching its weights, for display)."""
    if spec.runtime is Runtime.TRTLLM_ENGINE:
        return engine_dir(spec, role)
    model = getattr(spec, role)
    quantized = model.quantization is not Quantization.NONE or model.kv_cache is not KVCacheFormat.AUTO
    return checkpoint_dir(spec, role) if quantized else spec.model_path(role, weights=weights)


def _quantize_stage(spec: BuildSpec, role: str) -> Stage:
    model = getattr(spec, role)
    q = model.quantization
    assert q is not None
    src = str(spec.model_path(role, weights=False))  # the plan names the directory; it never needs the weights
    out = str(checkpoint_dir(spec, role))
    fmt = "TRT-LLM checkpoint" if spec.runtime is Runtime.TRTLLM_ENGINE else "unified HF checkpoint"
    calibrated = q is not Quantization.NONE or model.kv_cache is not KVCacheFormat.AUTO
    if not calibrated and spec.runtime is not Runtime.TRTLLM_ENGINE:
        return Stage(f"quantize:{role}", f"none: {role} served from its source directory", [src], [src])
    action = (
        f"ModelOpt PTQ {q.value} (KV cache {model.kv_cache.value}) -> {fmt}"
        if calibrated
        else f"convert to {fmt} ({model.dtype.value})"
    )
    return Stage(f"quantize:{role}", action, [src, "calibration data" if calibrated else src], [out])


def _compile_stage(spec: BuildSpec, role: str) -> Stage:
    if spec.runtime is Runtime.TRTLLM_ENGINE:
        ckpt, out = checkpoint_dir(spec, role), engine_dir(spec, role)
        cmd = trtllm_build_command(spec, role, ckpt, out)
        return Stage(
            f"compile:{role}",
            f"trtllm-build (TensorRT-LLM {spec.engine.trtllm_version})",
            [str(ckpt)],
            [str(out)],
            [cmd],
        )
    src = str(serving_model_dir(spec, role, weights=False))
    what = (
        "LLM API loads the checkpoint at serve time"
        if spec.runtime is Runtime.TRTLLM_LLMAPI
        else "torch runtime loads the checkpoint at serve time"
    )
    return Stage(f"compile:{role}", f"none: {what}", [src], [src])


def build_plan(spec: BuildSpec) -> list[Stage]:
    """All stages of `trtspec build` for this spec, in order."""
    stages = [
        Stage(
            "check",
            "preflight: compatibility, memory plan, toolchain",
            [str(spec.model_path(r, weights=False)) for r in ROLES],
            [],
        )
    ]
    stages += [_quantize_stage(spec, r) for r in ROLES]
    stages += [_compile_stage(spec, r) for r in ROLES]
    repo = str(spec.repo_dir)
    stages.append(
        Stage(
            "repo",
            f"Triton model repository ({spec.runtime.value}): ensemble, preprocessing, "
            "tensorrt_llm_bls, tensorrt_llm, tensorrt_llm_draft, postprocessing",
            [str(serving_model_dir(spec, r, weights=False)) for r in ROLES],
            [repo],
        )
    )
    if spec.runtime is Runtime.TORCH:
        serve = ["trtspec", "serve", repo]
    else:
        image = spec.triton.image or ngc_image(spec.engine.trtllm_version)
        serve = ["trtspec", "serve", repo, "--docker", image]
    commands = [serve]
    if spec.runtime is Runtime.TRTLLM_ENGINE:
        from trtspec.engines.container import REPO_MOUNT
        from trtspec.serving.launch import launch_command, launch_settings

        launch = launch_command(launch_settings(spec), REPO_MOUNT)
        commands.append(["env", *(f"{k}={v}" for k, v in sorted(launch.env.items())), *launch.argv])
    stages.append(
        Stage(
            "serve",
            "tritonserver on gRPC :8001, HTTP :8000, metrics :8002"
            + (" (in the container: upstream's multi-model launch)" if len(commands) > 1 else ""),
            [repo],
            [],
            commands,
        )
    )
    return stages
