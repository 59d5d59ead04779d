from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


def pytest_configure(config):
    # One intra-op thread: the models under test are small, and on a loaded 2-core machine OpenMP oversubscription
    # makes tiny-model tests 10x slower. Correctness tests do not need more; benchmarks set their own.
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> Path:
    from tests.tiny import make_tokenizer

    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory, tiny_tokenizer) -> tuple[Path, Path]:
    """A tiny random target (4 layers) and draft (1 layer) sharing one tokenizer; hidden 128 so 4-bit formats work."""
    from tests.tiny import make_llama

    root = tmp_path_factory.mktemp("pair")
    target = make_llama(root / "target", tiny_tokenizer, layers=4, seed=0)
    draft = make_llama(root / "draft", tiny_tokenizer, layers=1, seed=1)
    return target, draft


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec YAML from a dict and return its path."""
    import yaml

    def _write(data: dict, name: str = "trtspec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return _write


@pytest.fixture(scope="session")
def example_paths():
    """The embedded SmolLM2 example (converted once into the user cache)."""
    from trtspec.example import example_models

    return example_models()


STANDIN_DIR = Path(__file__).parent / "standin"


@pytest.fixture(scope="session")
def standin_bin(tmp_path_factory) -> Path:
    """A directory holding the trtllm-build STAND-IN, to put first on PATH (runs with this interpreter)."""
    import os

    bin_dir = tmp_path_factory.mktemp("standin-bin")
    script = bin_dir / "trtllm-build"
    script.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\nsys.argv[0] = 'trtllm-build'\n"
        f"runpy.run_path({str(STANDIN_DIR / 'trtllm_build_standin.py')!r}, run_name='__main__')\n"
    )
    script.chmod(0o755)
    assert os.access(script, os.X_OK)
    return bin_dir


@pytest.fixture
def with_standin(monkeypatch, standin_bin):
    """PATH with the trtllm-build stand-in first."""
    import os

    monkeypatch.setenv("PATH", f"{standin_bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("TRTLLM_STANDIN_FAIL", raising=False)
    monkeypatch.delenv("TRTLLM_STANDIN_SLEEP", raising=False)
    monkeypatch.setenv("TRTLLM_STANDIN_VERSION", "1.0.0")
    return standin_bin


@pytest.fixture(scope="session")
def trtllm_checkpoints(tmp_path_factory, tiny_pair) -> dict[str, Path]:
    """TensorRT-LLM checkpoints of the tiny pair, exported by ModelOpt (float16, unquantized, TP 1)."""
    from tests.engine_helpers import export_trtllm_checkpoint

    root = tmp_path_factory.mktemp("trtllm-ckpt")
    return {role: export_trtllm_checkpoint(src, root / role) for role, src in zip(("target", "draft"), tiny_pair)}
