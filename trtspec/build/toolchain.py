"""What can run on this machine: trtllm-build, CUDA GPUs, a tritonserver binary, a Docker client."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


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


# -- the Python packages a stage runs on -------------------------------------------------------------------------
# What the quantize stage imports (ModelOpt PTQ on transformers models, safetensors export), by distribution name;
# the versions are trtspec's own pins for them (its `torch` and `quant` extras, read from the installed metadata, so
# pyproject.toml stays their one home). In the NGC image these packages are TensorRT-LLM's own, at its pins
# (tests/upstream/trtllm_requirements.json: transformers 4.57, ModelOpt 0.37, torch 2.9): trtspec's code is tested on
# others, and installing its pins there would replace what trtllm-build runs on. A stage refuses, in one line, to run
# on versions it was not tested with.
STAGE_PACKAGES = {"quantize": ("torch", "transformers", "safetensors", "nvidia-modelopt")}
STAGE_EXTRAS = {"quantize": "torch,quant"}


def _name(requirement: str) -> str:
    import re

    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def trtspec_pins(requires: list[str] | None = None) -> dict[str, str]:
    """Distribution -> the version specifier trtspec's extras pin it to (``requires``: the metadata's lines)."""
    import importlib.metadata as md

    if requires is None:
        try:
            requires = md.requires("trtspec") or []
        except md.PackageNotFoundError:  # run from a source tree that was never installed: no pins to hold
            requires = []
    out: dict[str, str] = {}
    for line in requires:
        req = line.split(";", 1)[0].strip()
        name = _name(req)
        if name == "trtspec":
            continue
        rest = req[len(name) :].lstrip()
        if rest.startswith("["):
            rest = rest[rest.index("]") + 1 :]
        out.setdefault(name, rest.strip())
    return out


def installed_version(distribution: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return None


def unmet_packages(
    stage: str, *, pins: dict[str, str] | None = None, version_of: Any = None
) -> list[tuple[str, str, str | None]]:
    """(distribution, trtspec's specifier, the installed version or None) for each package ``stage`` runs on that
    is missing or outside trtspec's pin."""
    pins = trtspec_pins() if pins is None else pins
    version_of = version_of or installed_version
    out = []
    for name in STAGE_PACKAGES.get(stage, ()):
        wanted, have = pins.get(name, ""), version_of(name)
        if have is None or (wanted and not _satisfies(have, wanted)):
            out.append((name, wanted, have))
    return out


def _satisfies(version: str, specifier: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:  # nothing to compare with: presence is all that can be checked
        return True
    try:
        return Version(version) in SpecifierSet(specifier, prereleases=True)
    except InvalidVersion:
        return False


def require_stage_packages(stage: str, **kwargs: Any) -> None:
    """Raise MissingDependencyError, one line naming each missing or mismatched package, when ``stage`` cannot run
    on this environment's packages."""
    from trtspec.errors import MissingDependencyError

    unmet = unmet_packages(stage, **kwargs)
    if not unmet:
        return
    found = ", ".join(f"{n}{w} (installed: {h or 'none'})" for n, w, h in unmet)
    raise MissingDependencyError(
        f"{stage} needs {found}",
        hint=f"run `trtspec {stage}` where `pip install 'trtspec[{STAGE_EXTRAS[stage]}]'` is installed, then the build "
        "again with that build directory (up-to-date stages are skipped); in the NGC image these packages are "
        "TensorRT-LLM's: keep them",
    )
