"""How tritonserver is launched for a repository with TensorRT-LLM models (two engines, or the LLM API model), as
upstream launches them.

TensorRT-LLM's triton_backend/scripts/launch_triton_server.py ``--multi-model`` (recorded in tests/upstream/
launch_triton_server.json) runs every rank under ``mpirun --allow-run-as-root`` with ``--disable-auto-complete-config``
and its own ``--backend-config=python,shm-region-prefix-name=prefix<rank>_``, in orchestrator mode
(``TRTLLM_ORCHESTRATOR=1``):

- spawning (the orchestrator starts the engines' workers, ``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1``): world size 1, and
  for Triton > 24.06 ``--pinned-memory-pool-byte-size=0 --enable-peer-access=false``
  ``--cuda-memory-pool-byte-size=<gpu>:0``;
- fast logits (``TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0``): one rank per participant (1 orchestrator + draft ranks +
  target ranks); ranks after 0 load only the engine models (``--model-control-mode=explicit --load-model=...``).

An LLM API repository is launched as upstream's docs launch the llmapi model (``launch_triton_server.py --model_repo``,
world size 1): one rank under ``mpirun --allow-run-as-root -n 1`` with the same two flags, so that the LLM on rank 0
has an MPI world in which to start its tensor-parallel workers (tests/upstream/llmapi_launch.json).

The same argument list serves ``trtspec serve --docker``, the image's entrypoint (``python3 -m trtspec.serving.launch``)
and the Kubernetes pods; the repository's manifest carries the settings (``launch``) it is built from.

In the image the entrypoint does not exec the launch: it supervises it as ``trtspec serve`` supervises a local server
(trtspec.serving.lifecycle): SIGTERM drains (``TRTSPEC_DRAIN_TIMEOUT`` seconds, default 30) before the launch gets
SIGTERM, and a dead model stub is reported and its model reloaded (rank 0 runs with explicit model control behind a
per-pod key; ``TRTSPEC_STUB_WATCH=0`` turns that off and launches upstream's command). Either way rank 0's control
APIs (model repository, shared memory, trace, logging) need that key (trtspec.serving.lifecycle.RESTRICTED_APIS).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.errors import ServerError

TRITONSERVER = "tritonserver"
DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}


@dataclass(frozen=True)
class Launch:
    """The command that starts the server, and the environment it needs on top of the container's."""

    argv: list[str]
    env: dict[str, str]


LLMAPI = "trtllm-llmapi"
MULTI_MODEL = "trtllm-multi-model"


def launch_settings(spec: Any) -> dict[str, Any]:
    """What the launch depends on, for the repository manifest: {} for the torch runtime (plain tritonserver)."""
    from trtspec.spec import Runtime

    if spec.runtime is Runtime.TRTLLM_LLMAPI:
        # One MPI rank, as upstream's docs launch the llmapi model (launch_triton_server.py --model_repo, world size 1):
        # rank 0 runs the LLM, which starts its tensor-parallel workers itself through MPI (tests/upstream/
        # llmapi_launch.json); plain tritonserver has no MPI world for them.
        return {"kind": LLMAPI, "world_size": 1, "tensor_parallel_size": spec.target.tp_size}
    if spec.runtime is not Runtime.TRTLLM_ENGINE:
        return {}
    from trtspec.build.layout import served_roles
    from trtspec.triton_repo.engine_definitions import serving_layout
    from trtspec.triton_repo.names import ROLE_MODELS

    layout = serving_layout(spec)
    gpus = max(spec.gpu.count, *(max(ids) + 1 for ids in layout.gpu_device_ids.values()))
    return {
        "kind": MULTI_MODEL,
        "world_size": layout.world_size,
        "spawn_processes": not layout.fast_logits,
        "gpus": gpus,
        "engine_models": [ROLE_MODELS[r] for r in served_roles(spec)],
    }


def _ports(ports: Mapping[str, int] | None) -> list[str]:
    p = {**DEFAULT_PORTS, **(ports or {})}
    return [f"--grpc-port={p['grpc']}", f"--http-port={p['http']}", f"--metrics-port={p['metrics']}"]


def _rank_tail(rank: int) -> list[str]:
    """What launch_triton_server.py ends every rank's tritonserver command with: no auto-completed configs, a shared
    memory prefix of its own (two stubs' regions must not collide), then the MPI rank separator."""
    return ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_", ":"]


def launch_command(
    settings: Mapping[str, Any],
    repo: str,
    *,
    ports: Mapping[str, int] | None = None,
    tritonserver: str = TRITONSERVER,
    extra: Sequence[str] = (),
) -> Launch:
    """The server command for a repository whose manifest says ``settings`` (``launch_settings``); ``extra`` goes to
    rank 0 (the rank that serves clients). Without engine settings: one plain tritonserver."""
    if not settings:
        return Launch([tritonserver, f"--model-repository={repo}", *_ports(ports), *extra], {})
    if settings.get("kind") == LLMAPI:
        rank0 = ["-n", "1", tritonserver, f"--model-repository={repo}", *_ports(ports), *extra, *_rank_tail(0)]
        return Launch(["mpirun", "--allow-run-as-root", *rank0], {})
    if settings.get("kind") != MULTI_MODEL:
        raise ServerError(
            f"this trtspec cannot launch a '{settings.get('kind')}' repository",
            hint="rewrite the repository with this trtspec (`trtspec repo --force`)",
        )
    world, spawn = int(settings["world_size"]), bool(settings["spawn_processes"])
    if spawn and world != 1:  # upstream asserts it: the orchestrator spawns the multi-GPU workers itself
        raise ServerError(
            f"multi-model launch with spawned workers needs world size 1, the manifest says {world}",
            hint="rewrite the repository with `trtspec repo --force`",
        )
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world):
        argv += ["-n", "1", tritonserver, f"--model-repository={repo}", *_ports(ports)]
        if rank == 0:
            argv += list(extra)
        else:
            argv += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in settings["engine_models"])]
        if spawn:
            argv += [
                "--pinned-memory-pool-byte-size=0",
                "--enable-peer-access=false",
                *(f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(int(settings["gpus"]))),
            ]
        argv += _rank_tail(rank)
    env = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1" if spawn else "0"}
    return Launch(argv, env)


def repo_launch(repo: Path, in_container: str, **kwargs: Any) -> Launch:
    """The launch for a written repository (its manifest's ``launch`` settings), with the repository at
    ``in_container``. A trtllm-engine repository written before trtspec recorded launches is refused."""
    from trtspec.build.artifacts import read_manifest

    manifest = read_manifest(Path(repo)) or {}
    settings = manifest.get("launch")
    runtime = (manifest.get("settings") or {}).get("runtime")
    if not settings and runtime in ("trtllm-engine", LLMAPI):
        what = "two engines" if runtime == "trtllm-engine" else "LLM API model"
        raise ServerError(
            f"{repo}: the manifest does not say how to launch its {what}",
            hint="rewrite the repository with this trtspec (`trtspec repo --force`)",
        )
    return launch_command(settings or {}, in_container, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m trtspec.serving.launch REPO [tritonserver args...]``: run and supervise the launch (the image's
    entrypoint); returns the launch's exit code (0 after a drain)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: python3 -m trtspec.serving.launch REPO [extra tritonserver arguments]\n")
        return 2
    repo, extra = args[0], args[1:]
    watch = os.environ.get("TRTSPEC_STUB_WATCH", "1") not in ("0", "false", "")
    try:
        drain_s = float(os.environ.get("TRTSPEC_DRAIN_TIMEOUT", "30"))
        import secrets

        from trtspec.serving.lifecycle import model_control_args, restricted_api_args

        key = secrets.token_hex(16)  # every control API behind it; with the watch, explicit model control too
        extra = [*(model_control_args if watch else restricted_api_args)(key), *extra]
        launch = repo_launch(Path(repo), repo, extra=extra)
    except (ServerError, ValueError) as exc:
        sys.stderr.write(f"error: {getattr(exc, 'message', exc)}\nhint: {getattr(exc, 'hint', '')}\n")
        return 1
    sys.stdout.write(" ".join(launch.argv) + "\n")
    sys.stdout.flush()
    from trtspec.serving.launched import run_supervised

    return run_supervised(Path(repo), launch, drain_timeout_s=drain_s, repository_key=key, watch=watch)


def serve_plan(spec: Any) -> Any:
    """`trtspec plan`'s serve entry: the command that serves the repository (and, for engines, the launch it runs
    in the container)."""
    from trtspec.build.stages import PlanEntry
    from trtspec.spec import Runtime
    from trtspec.trtllm.container import REPO_MOUNT
    from trtspec.trtllm.trtllm_build import ngc_image

    repo = str(spec.repo_dir)
    if spec.runtime is Runtime.TORCH:
        serve = ["trtspec", "serve", repo]
    else:
        image = spec.triton.image or ngc_image(spec.engine.trtllm_version)
        serve = ["trtspec", "serve", repo, "--docker", image]
    commands = [serve]
    settings = launch_settings(spec)
    if settings:
        launch = launch_command(settings, REPO_MOUNT)
        commands.append(["env", *(f"{k}={v}" for k, v in sorted(launch.env.items())), *launch.argv])
    kinds = {MULTI_MODEL: "upstream's multi-model launch", LLMAPI: "upstream's llmapi launch"}
    how = kinds.get(str(settings.get("kind", "")))
    return PlanEntry(
        "tritonserver on gRPC :8001, HTTP :8000, metrics :8002" + (f" (in the container: {how})" if how else ""),
        [repo],
        commands,
    )


if __name__ == "__main__":
    sys.exit(main())
