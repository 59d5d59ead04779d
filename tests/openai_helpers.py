"""Shared by the OpenAI-frontend tests: a tiny target with a chat template, `trtspec serve --openai-port` as a
subprocess, and transformers' own greedy generate as the reference text."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

# A ChatML-like template (what SmolLM2 ships) with a BOS, so the template's special tokens are exercised.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def with_chat_template(model_dir: Path, out: Path) -> Path:
    """A copy of a model directory whose tokenizer has CHAT_TEMPLATE."""
    shutil.copytree(model_dir, out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return out


class Served:
    """`trtspec serve REPO --openai-port P` in a subprocess, ready (both Triton and the frontend)."""

    def __init__(
        self,
        repo: Path,
        log: Path,
        env: dict[str, str] | None = None,
        timeout_s: float = 240.0,
        args: tuple[str, ...] = (),
    ) -> None:
        from trtspec.serving.server import free_port

        self.ports = {name: free_port() for name in ("http", "grpc", "metrics", "openai")}
        while len(set(self.ports.values())) < 4:
            self.ports = {name: free_port() for name in ("http", "grpc", "metrics", "openai")}
        self.base_url = f"http://127.0.0.1:{self.ports['openai']}/v1"
        self.grpc_url = f"127.0.0.1:{self.ports['grpc']}"
        cmd = [sys.executable, "-m", "trtspec", "serve", str(repo), "--log-file", str(log)]
        cmd += [a for name, port in self.ports.items() for a in (f"--{name}-port", str(port))]
        cmd += list(args)
        self.out = log.with_suffix(".out")
        self._out = open(self.out, "wb")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.getcwd(), **(env or {})},
        )
        deadline = time.monotonic() + timeout_s
        while "ready:" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"trtspec serve did not get ready:\n{self.output()}")
            time.sleep(0.2)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def health(self) -> int:
        return httpx.get(self.base_url[: -len("/v1")] + "/health", timeout=5).status_code

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()
        return self.proc.returncode


class Reference:
    """transformers' own greedy generate on the target: the text any correct server returns (greedy is lossless)."""

    def __init__(self, target: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(target)
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        self.cache: dict[tuple, tuple[str, int, int]] = {}

    def chat_ids(self, messages: list[dict]) -> list[int]:
        ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if not isinstance(ids, list) else ids)

    def _generate(self, ids: list[int], n: int) -> tuple[str, int, int]:
        key = (tuple(ids), n)
        if key not in self.cache:
            x = self.torch.tensor([ids])
            with self.torch.no_grad():
                out = self.model.generate(
                    x,
                    attention_mask=self.torch.ones_like(x),
                    max_new_tokens=n,
                    do_sample=False,
                    pad_token_id=self.tok.pad_token_id or 0,
                )
            new = out[0, len(ids) :].tolist()
            self.cache[key] = (self.tok.decode(new, skip_special_tokens=True), len(ids), len(new))
        return self.cache[key]

    def chat(self, messages: list[dict], n: int) -> tuple[str, int, int]:
        """(text, prompt tokens, completion tokens) of a greedy chat completion."""
        return self._generate(self.chat_ids(messages), n)

    def complete(self, prompt: str, n: int) -> tuple[str, int, int]:
        return self._generate(self.tok.encode(prompt), n)
