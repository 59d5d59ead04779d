"""`trtspec serve --docker IMAGE`: the same repository in an NGC tritonserver image (the command is built and shown;
it runs where a Docker engine with the NVIDIA container toolkit is)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from trtspec.paths import trtspec_import_root
from trtspec.threads import set_wait_policy


def docker_command(
    repo: Path,
    image: str,
    *,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    mounts: Sequence[tuple[Path, str]] = (),
    env: Mapping[str, str] | None = None,
    gpus: bool = True,
    with_trtspec: bool = True,
    host: str = "127.0.0.1",
) -> list[str]:
    """``docker run`` for serving ``repo`` in a tritonserver image, its ports published on ``host`` (the address
    ``trtspec serve --host`` names, loopback by default): the repository at /models, every directory its
    configs reference mounted read-only (``mounts``: host path -> path in the container, as the configs name it), and
    this trtspec package mounted and announced in TRTSPEC_PYTHONPATH for the Python models. The server command is the
    repository's launch (``trtspec.serving.launch``): for two TensorRT-LLM engines, upstream's ``--multi-model`` one."""
    from trtspec.trtllm.container import DOCKER_GPU_FLAGS, REPO_MOUNT

    repo = Path(repo).resolve()
    cmd = ["docker", "run", "--rm", "--init"] + (list(DOCKER_GPU_FLAGS) if gpus else ["--shm-size=2g"])
    # Published on ``host`` only (docker's -p without an address publishes on every interface of the machine).
    address = f"[{host}]" if ":" in host else host
    for port, port_inside in ((http_port, 8000), (grpc_port, 8001), (metrics_port, 8002)):
        cmd += ["-p", f"{address}:{port}:{port_inside}"]
    cmd += ["-v", f"{repo}:{REPO_MOUNT}:ro"]
    for host, inside in sorted({(str(Path(h).resolve()), str(c)) for h, c in mounts}):
        cmd += ["-v", f"{host}:{inside}:ro"]
    environment = dict(env or {})
    if with_trtspec:
        root = trtspec_import_root()
        cmd += ["-v", f"{root / 'trtspec'}:/opt/trtspec/trtspec:ro"]
        environment.setdefault("TRTSPEC_PYTHONPATH", "/opt/trtspec")
        set_wait_policy(environment)  # trtspec.threads
    for key, value in sorted(environment.items()):
        cmd += ["-e", f"{key}={value}"]
    # The server command inside the container: upstream's multi-model launch for two engines (trtspec.serving.launch),
    # plain tritonserver otherwise. Its environment (TRTLLM_ORCHESTRATOR ...) comes with it.
    from trtspec.serving.launch import repo_launch

    launch = repo_launch(repo, REPO_MOUNT)
    for key, value in sorted(launch.env.items()):
        if key not in environment:
            cmd += ["-e", f"{key}={value}"]
    return cmd + [image, *launch.argv]


def repo_mounts(repo: Path) -> tuple[list[tuple[Path, str]], dict[str, str]]:
    """The directories a repository's models read, with their paths in the container, and the server environment:
    from the repository's manifest, else from path-like config parameters (mounted at the same path)."""
    from trtspec.build.artifacts import read_manifest

    manifest = read_manifest(Path(repo)) or {}
    if manifest.get("container_mounts"):
        return [(Path(h), c) for h, c in manifest["container_mounts"]], dict(manifest.get("server_env") or {})
    from trtspec.triton_repo.validate import load_configs

    found = set()
    for config in load_configs(Path(repo)).values():
        for key in ("tokenizer_dir", "model_dir", "gpt_model_path", "engine_dir"):
            if key in config.parameters and config.parameters[key].string_value.startswith("/"):
                found.add(config.parameters[key].string_value)
    return [(Path(p), p) for p in sorted(found)], {}
