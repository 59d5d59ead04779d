"""Where things live inside the serving container, and the docker flags that put them there.

The Triton configs name paths as the server sees them: the engines, checkpoints and repository are mounted at fixed
places, so one repository works unchanged under `docker run`, compose and Kubernetes (docker/).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.build.layout import engine_dir, served_roles, serving_model_dir
from trtspec.spec import BuildSpec, Runtime

REPO_MOUNT = "/models"  # the Triton model repository (--model-repository)
ENGINES_MOUNT = "/engines"  # engines/<role>
CHECKPOINTS_MOUNT = "/checkpoints"  # checkpoints/<role> for runtime trtllm-llmapi

# GPU access and the shared-memory / locked-memory limits NVIDIA documents for TensorRT-LLM containers.
DOCKER_GPU_FLAGS = ["--gpus", "all", "--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
# Triton's three, and the OpenAI-compatible frontend the trtspec image runs next to it (9000, as Triton's own frontend).
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}


def engine_path_in_container(role: str) -> str:
    return f"{ENGINES_MOUNT}/{role}"


def checkpoint_path_in_container(role: str) -> str:
    return f"{CHECKPOINTS_MOUNT}/{role}"


@dataclass(frozen=True)
class Mount:
    host: Path
    container: str
    read_only: bool = True

    def docker_args(self) -> list[str]:
        return ["-v", f"{self.host}:{self.container}" + (":ro" if self.read_only else "")]


def serving_mounts(spec: BuildSpec) -> list[Mount]:
    """The volumes `serve --docker` needs so that the repository's paths resolve inside the container."""
    mounts = [Mount(spec.repo_dir, REPO_MOUNT)]
    if spec.runtime is Runtime.TRTLLM_ENGINE:
        mounts += [Mount(engine_dir(spec, r), engine_path_in_container(r)) for r in served_roles(spec)]
    elif spec.runtime is Runtime.TRTLLM_LLMAPI:
        mounts += [Mount(serving_model_dir(spec, r), checkpoint_path_in_container(r)) for r in served_roles(spec)]
    return mounts
