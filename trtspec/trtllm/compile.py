"""The compile stage: `trtllm-build` for the target and the draft, run where it exists, explained where it does not.

Stage body (run by trtspec.pipeline): ``compile_inputs(spec, role)`` says what the output
depends on, ``compile_into(spec, role, out_dir, progress)`` writes the engine into ``out_dir`` (a temporary directory
the pipeline renames into ``engines/<role>`` and stamps with a manifest). Where `trtllm-build` is absent, the error
carries the exact `docker run` line that builds the same engine in the NGC image; an engine that line produced
(``engines/<role>`` without a manifest) is verified and adopted by the next `trtspec compile`.
"""

from __future__ import annotations

import collections
import json
import os
import shlex
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from trtspec.build.layout import checkpoint_dir, engine_dir
from trtspec.build.stages import PlanEntry
from trtspec.errors import EngineBuildError, SpecError
from trtspec.procs import die_with_parent
from trtspec.spec import BuildSpec, Runtime
from trtspec.trtllm.container import DOCKER_GPU_FLAGS
from trtspec.trtllm.engine_dir import serving_image, verify_engine
from trtspec.trtllm.trtllm_build import trtllm_build_command
from trtspec.trtllm.trtllm_versions import normalize_version

LOG_NAME = "trtllm-build.log"
_STDERR_TAIL = 6
_TERMINATE_GRACE_S = 10.0


def _build_argv(spec: BuildSpec, role: str) -> list[str]:
    """The trtllm-build command line of this role: its checkpoint in, its engine directory out."""
    return trtllm_build_command(spec, role, checkpoint_dir(spec, role), engine_dir(spec, role))


def compile_inputs(spec: BuildSpec, role: str) -> tuple[dict[str, Path | None], dict]:
    """The checkpoint the engine is built from, and every setting that changes the engine."""
    cmd = _build_argv(spec, role)
    return {"checkpoint": checkpoint_dir(spec, role)}, {
        "stage": "compile",
        "role": role,
        "trtllm_version": normalize_version(spec.engine.trtllm_version),
        "argv": cmd[1:],
    }


def compile_plan(spec: BuildSpec, role: str) -> PlanEntry:
    """The compile stage's entry in `trtspec plan`: the trtllm-build command line it runs."""
    return PlanEntry(
        f"trtllm-build (TensorRT-LLM {normalize_version(spec.engine.trtllm_version)})",
        [str(checkpoint_dir(spec, role))],
        [_build_argv(spec, role)],
    )


def read_checkpoint_config(spec: BuildSpec, role: str) -> dict[str, Any]:
    """The TensorRT-LLM checkpoint's config.json, checked for what trtllm-build needs (mapping, rank files)."""
    ckpt = checkpoint_dir(spec, role)
    cfg_path = ckpt / "config.json"
    if not cfg_path.is_file():
        raise EngineBuildError(
            f"{ckpt}: no TensorRT-LLM checkpoint for the {role} (config.json missing)",
            hint="run `trtspec quantize` first (or `trtspec build`, which runs every stage)",
        )
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EngineBuildError(f"{cfg_path}: not valid JSON ({exc})", hint="rerun `trtspec quantize`") from None
    missing = [k for k in ("architecture", "dtype", "mapping") if k not in cfg]
    if missing:
        raise EngineBuildError(
            f"{cfg_path}: not a TensorRT-LLM checkpoint config (no {', '.join(missing)})",
            hint="the compile stage needs a TensorRT-LLM checkpoint; rerun `trtspec quantize`",
        )
    mapping = cfg["mapping"]
    tp = int(mapping.get("tp_size", 1))
    world = int(mapping.get("world_size", tp * int(mapping.get("pp_size", 1))))
    want = getattr(spec, role).tp_size
    if tp != want:
        raise EngineBuildError(
            f"{ckpt}: checkpoint is split for tp_size {tp}, spec says {role}.tp_size {want}",
            hint="rerun `trtspec quantize` after changing tp_size",
        )
    absent = [f"rank{i}.safetensors" for i in range(world) if not (ckpt / f"rank{i}.safetensors").is_file()]
    if absent:
        raise EngineBuildError(f"{ckpt}: {', '.join(absent)} missing", hint="rerun `trtspec quantize`")
    return cfg


def docker_command(spec: BuildSpec, role: str) -> list[str]:
    """`docker run` that builds this role's engine into engines/<role> in the NGC image (paths mounted 1:1)."""
    ckpt, out = checkpoint_dir(spec, role), engine_dir(spec, role)
    cmd = _build_argv(spec, role)
    return [
        "docker",
        "run",
        "--rm",
        *DOCKER_GPU_FLAGS,
        "-v",
        f"{ckpt}:{ckpt}:ro",
        "-v",
        f"{out.parent}:{out.parent}",
        serving_image(spec),
        *cmd,
    ]


def find_trtllm_build() -> str | None:
    return shutil.which("trtllm-build")


def _log_path(spec: BuildSpec, role: str) -> Path:
    # Outside the stage's temporary directory, so that a failed build's log survives the cleanup.
    return spec.engines_dir / "logs" / f"{role}.{LOG_NAME}"


def run_trtllm_build(cmd: list[str], log_path: Path, on_line=None) -> float:
    """Run trtllm-build, teeing its output to ``log_path``; raise EngineBuildError with the stderr tail on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL)
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        lock = threading.Lock()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            preexec_fn=die_with_parent(),
        )

        def pump(stream, is_err: bool) -> None:
            for line in stream:
                with lock:
                    log.write(line)
                    log.flush()
                if is_err and line.strip():
                    tail.append(line.rstrip())
                if on_line is not None and line.strip():
                    on_line(line.rstrip())

        threads = [
            threading.Thread(target=pump, args=(proc.stdout, False), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, True), daemon=True),
        ]
        for t in threads:
            t.start()
        try:
            rc = proc.wait()
        except BaseException:  # Ctrl-C or an error in a progress callback: never leave the build running
            _stop(proc)
            raise
        finally:
            for t in threads:
                t.join(timeout=5)
    if rc != 0:
        detail = " | ".join(tail) or "no output on stderr"
        raise EngineBuildError(f"trtllm-build exited with code {rc}: {detail}", hint=f"full log: {log_path}")
    return time.monotonic() - t0


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=_TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _adopt_external_engine(spec: BuildSpec, role: str, out_dir: Path) -> dict | None:
    """Take over an engine the printed docker command built into engines/<role> (no manifest yet)."""
    from trtspec.build.artifacts import MANIFEST

    final = engine_dir(spec, role)
    if not (final / "config.json").is_file() or (final / MANIFEST).exists():
        return None
    info = verify_engine(final, spec, role)
    for item in final.iterdir():
        target = out_dir / item.name
        if item.is_dir():
            shutil.copytree(item, target)
        else:
            try:
                os.link(item, target)  # engines are large: a hard link costs nothing and leaves the original intact
            except OSError:
                shutil.copy2(item, target)
    return {
        "engine": info.to_dict(),
        "built_by": "external (docker run in the NGC image)",
        "trtllm_build": None,
        "command": shlex.join(docker_command(spec, role)),
    }


def compile_into(spec: BuildSpec, role: str, out_dir: Path, progress=None) -> dict:
    """Build one engine into ``out_dir`` and verify it; return the manifest fields (version, command, engine facts)."""
    if spec.runtime is not Runtime.TRTLLM_ENGINE:
        raise SpecError(
            f"runtime {spec.runtime.value} has no engine compile stage",
            hint="only runtime trtllm-engine builds engines; the others load checkpoints at serve time",
        )
    read_checkpoint_config(spec, role)
    program = find_trtllm_build()
    if program is None:
        adopted = _adopt_external_engine(spec, role, out_dir)
        if adopted is not None:
            return adopted
        raise EngineBuildError(
            f"trtllm-build is not on PATH, so the {role} engine cannot be built on this machine",
            hint=f"build it in the NGC image, then rerun `trtspec compile`: {shlex.join(docker_command(spec, role))}",
        )
    cmd = trtllm_build_command(spec, role, checkpoint_dir(spec, role), out_dir, program=program)
    log_path = _log_path(spec, role)
    task = progress.add_task(f"compile:{role} trtllm-build", total=None) if progress is not None else None

    def on_line(line: str) -> None:
        if progress is not None:
            progress.update(task, description=f"compile:{role} {line[:70]}")

    try:
        seconds = run_trtllm_build(cmd, log_path, on_line)
    finally:
        if progress is not None:
            progress.remove_task(task)
    info = verify_engine(out_dir, spec, role)
    shutil.copy2(log_path, out_dir / LOG_NAME)
    return {
        "engine": info.to_dict(),
        "built_by": "trtllm-build",
        "trtllm_build": program,
        "command": shlex.join(cmd),
        "build_seconds": round(seconds, 3),
        "log": LOG_NAME,
    }
