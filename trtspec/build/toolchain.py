"""What can run on this machine: trtllm-build, CUDA GPUs, a tritonserver binary, a Docker client."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Toolchain:
    trtllm_build: str | None
    nvidia_smi: str | None
    tritonserver: str | None
    docker: str | None
    torch_installed: bool
    modelopt_installed: bool

    @property
    def has_gpu(self) -> bool:
        return self.nvidia_smi is not None

    def to_dict(self) -> dict:
        return {**asdict(self), "has_gpu": self.has_gpu}


def find_tritonserver() -> str | None:
    """A tritonserver binary: on PATH, else the one bundled in nvidia-pytriton."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return on_path
    found = importlib.util.find_spec("pytriton")
    if found is None or not found.submodule_search_locations:
        return None
    binary = Path(list(found.submodule_search_locations)[0]) / "tritonserver" / "bin" / "tritonserver"
    return str(binary) if binary.is_file() else None


def detect_toolchain() -> Toolchain:
    """Probe the machine without importing heavy packages."""
    return Toolchain(
        trtllm_build=shutil.which("trtllm-build"),
        nvidia_smi=shutil.which("nvidia-smi"),
        tritonserver=find_tritonserver(),
        docker=shutil.which("docker"),
        torch_installed=importlib.util.find_spec("torch") is not None,
        modelopt_installed=importlib.util.find_spec("modelopt") is not None,
    )
