"""Shared by the serving tests: a noisy draft on disk (partial acceptance) and a torch-runtime spec for a pair."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def make_noisy_draft(target: Path, out: Path, scale: float = 0.0015, seed: int = 0) -> Path:
    """The target with small noise on its weights: it agrees with the target part of the time."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(target).save_pretrained(out)
    return out


def torch_spec_dict(target: Path, draft: Path, **overrides) -> dict:
    data = {
        "name": "tiny",
        "runtime": "torch",
        "target": {"model": str(target), "dtype": "float32"},
        "draft": {"model": str(draft), "dtype": "float32"},
        # The fixed model drafter drafts every step, so the serving tests' "went through the draft" checks hold; the
        # adaptive default may rightly draft nothing on a tiny random pair (test_serving_drafters serves it).
        "speculative": {"max_draft_len": 4, "route_threshold": 8, "drafter": "model"},
        "engine": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        "triton": {"orchestrator_instances": 1},
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return data


def default_sigint() -> None:
    """A ``preexec_fn``: Ctrl-C as in a terminal. A suite started in the background (``pytest &``) has SIGINT
    ignored, children inherit that, and a Python started with SIGINT ignored never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def serve_argv(repo: Path, *args: str) -> list[str]:
    """`trtspec serve REPO` on free ports (0: the server picks them and prints them), as a user or a pod runs it."""
    return [
        sys.executable,
        "-m",
        "trtspec",
        "serve",
        str(repo),
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        *args,
    ]


class Serve:
    """`trtspec serve` as a subprocess (what a user or a pod runs), its URLs read from its output."""

    def __init__(self, repo, *args: str) -> None:
        self.proc = subprocess.Popen(
            serve_argv(repo, *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd(), "COLUMNS": "300"},
        )
        line = ""
        while "ready:" not in line:
            line = self.proc.stdout.readline()
            assert line or self.proc.poll() is None, self.proc.stderr.read()
        self.grpc_url = line.split("gRPC ")[1].split(",")[0]
        self.stderr = ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.stderr = self.proc.stderr.read()
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
