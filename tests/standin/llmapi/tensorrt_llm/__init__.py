"""STAND-IN for TensorRT-LLM's LLM API, for tests only: TensorRT-LLM cannot be installed on a machine without a GPU.

It exists so that trtspec's own llmapi Triton model (trtspec/triton_repo/models/tensorrt_llm_llmapi/model.py) runs in
a real tritonserver. It checks what that model passes against the documented interface (``LLM`` keyword arguments,
``update_llm_args_with_extra_dict`` sections, ``DraftTargetDecodingConfig`` fields of the release named by
TRTLLM_STANDIN_VERSION, ``SamplingParams`` fields, ``generate_async`` / ``RequestOutput`` iteration) and refuses
anything else. The tokens come from trtspec's torch SpeculativeDecoder on the real checkpoints, so a test's expected
text is computed independently (transformers' own greedy generate), never by this stand-in.

Perf metrics: as in every release up to 1.2 (TensorRT-LLM PR #17082), the PyTorch flow's
``request_perf_metrics.speculative_decoding`` comes back zeroed; TRTLLM_STANDIN_SPEC_METRICS=filled fills it, as a
release with that fix would.

Container paths (``/checkpoints/target``) are mapped to host directories by TRTLLM_STANDIN_MOUNTS
(``/checkpoints/target=/host/dir;/checkpoints/draft=/other``), as the container's volume mounts would.

``RequestOutput.abort()`` stops a request as the real one does (it then finishes with finish_reason "cancelled").
Where TRTLLM_STANDIN_STEP_LOG names a file, every decoding step appends a line to it, so that a test can see how much
work the LLM API did (a cancelled request must stop costing work).
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

__version__ = os.environ.get("TRTLLM_STANDIN_VERSION", "1.1.0")

# TorchLlmArgs fields (tensorrt_llm/llmapi/llm_args.py) that trtspec may set; the real class has many more, all
# optional. An unknown keyword is an error there (StrictBaseModel), so it is here.
LLM_ARGS = {
    "model",
    "tokenizer",
    "backend",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_batch_size",
    "max_seq_len",
    "max_num_tokens",
    "disable_overlap_scheduler",
    "kv_cache_config",
    "speculative_config",
    "trust_remote_code",
    "dtype",
    "cuda_graph_config",
    "enable_chunked_prefill",
}
KV_CACHE_FIELDS = {"free_gpu_memory_fraction", "enable_block_reuse", "max_tokens", "dtype", "host_cache_size"}


def _api(version: str) -> dict:
    """The LLM API reading recorded for this release line (tests/upstream/llm_api.json), not trtspec's own table."""
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[4])  # the repository root, for the tests package
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.upstream.facts import llm_api, release_line

    major_minor = tuple(int(x) for x in release_line(version).split("."))
    if major_minor < (1, 0):
        raise RuntimeError(f"stand-in: the LLM API's PyTorch backend draft-target needs >= 1.0, not {version}")
    return llm_api(version)


class DraftTargetDecodingConfig:
    def __init__(self, **kwargs: Any) -> None:
        base = _api(__version__)["decoding_base_config"]
        names = set(base["fields"]) | {a for v in base.get("aliases", {}).values() for a in v}
        unknown = set(kwargs) - names
        if unknown and "Strict" in base["model"]:
            raise ValueError(f"DraftTargetDecodingConfig: extra fields not permitted: {sorted(unknown)}")
        if not kwargs.get("max_draft_len"):
            raise ValueError("DraftTargetDecodingConfig: max_draft_len is required")
        self.max_draft_len = int(kwargs["max_draft_len"])
        self.speculative_model = kwargs.get("speculative_model_dir") or kwargs.get("speculative_model")
        if not self.speculative_model:
            raise ValueError("DraftTargetDecodingConfig: the draft checkpoint is required")


@dataclass
class SamplingParams:
    """The SamplingParams fields trtspec's model sets (a dataclass upstream too: unknown names raise TypeError)."""

    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    return_perf_metrics: bool = False


@dataclass
class _SpecStats:
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclass
class _PerfMetrics:
    speculative_decoding: _SpecStats = field(default_factory=_SpecStats)


@dataclass
class CompletionOutput:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    request_perf_metrics: _PerfMetrics | None = None
    _last_text_len: int = 0

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]


class RequestOutput:
    """What ``generate_async`` returns: iterate it (one step per iteration when streaming) or call ``result()``."""

    def __init__(self, steps: "queue.Queue[Any]", streaming: bool, aborted: threading.Event | None = None) -> None:
        self._steps = steps
        self._streaming = streaming
        self._aborted = aborted or threading.Event()
        self.outputs = [CompletionOutput()]
        self.finished = False

    def abort(self) -> None:
        """Stop generating this request (TensorRT-LLM: GenerationResult.abort)."""
        self._aborted.set()

    def _step(self) -> None:
        item = self._steps.get()
        if isinstance(item, BaseException):
            raise item
        text, ids, reason, stats = item
        out = self.outputs[0]
        out._last_text_len = len(out.text)
        out.text, out.token_ids = text, ids
        if reason is not None:
            out.finish_reason = reason
            out.request_perf_metrics = stats
            self.finished = True

    def result(self) -> "RequestOutput":
        while not self.finished:
            self._step()
        return self

    def __iter__(self) -> "RequestOutput":
        return self

    def __next__(self) -> "RequestOutput":
        if self.finished:
            raise StopIteration
        self._step()
        if not self._streaming:
            self.result()
        return self


def _mapped(path: str) -> str:
    for pair in filter(None, os.environ.get("TRTLLM_STANDIN_MOUNTS", "").split(";")):
        inside, host = pair.split("=", 1)
        if path == inside or path.startswith(inside + "/"):
            return host + path[len(inside) :]
    return path


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = set(kwargs) - LLM_ARGS
        if unknown:
            raise TypeError(f"LLM got unexpected keyword arguments {sorted(unknown)}")
        if kwargs.get("backend", "pytorch") != "pytorch":
            raise ValueError(f"stand-in: backend {kwargs['backend']!r}; draft-target runs on the PyTorch backend")
        spec = kwargs.get("speculative_config")
        if spec is not None and not isinstance(spec, DraftTargetDecodingConfig):
            raise TypeError(f"speculative_config must be a DecodingBaseConfig, got {type(spec).__name__}")
        if spec is not None and not kwargs.get("disable_overlap_scheduler"):
            raise ValueError("draft-target on the PyTorch backend needs disable_overlap_scheduler=True")
        if kwargs.get("tensor_parallel_size", 1) != 1 or kwargs.get("pipeline_parallel_size", 1) != 1:
            raise ValueError("stand-in: one process, tensor_parallel_size and pipeline_parallel_size must be 1")
        from trtspec.runtimes.torch.decoder import SpeculativeDecoder
        from trtspec.runtimes.torch.loading import load_model, load_tokenizer
        from trtspec.runtimes.torch.session import eos_ids_of

        target = load_model(_mapped(model))
        self.tokenizer = load_tokenizer(_mapped(model))
        draft = load_model(_mapped(spec.speculative_model)) if spec is not None else None
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.decoder = SpeculativeDecoder(
            target,
            draft,
            max_draft_len=spec.max_draft_len if spec else 1,
            eos_ids=eos_ids_of(target, self.tokenizer),
            pad_id=pad,
        )
        self.use_draft = draft is not None
        self.max_seq_len = kwargs.get("max_seq_len")
        self._lock = threading.Lock()  # one request at a time through the decoder

    def generate_async(
        self, prompt: str, sampling_params: SamplingParams | None = None, streaming: bool = False
    ) -> RequestOutput:
        if not isinstance(prompt, str):
            raise TypeError("stand-in: prompts are strings here")
        sp = sampling_params or SamplingParams()
        steps: queue.Queue[Any] = queue.Queue()
        aborted = threading.Event()
        threading.Thread(target=self._run, args=(prompt, sp, steps, aborted), daemon=True).start()
        return RequestOutput(steps, streaming, aborted)

    def _run(self, prompt: str, sp: SamplingParams, steps: "queue.Queue[Any]", aborted: threading.Event) -> None:
        from trtspec.speculative.sampling import SamplingParams as TorchSampling

        try:
            ids = self.tokenizer.encode(prompt)
            sampling = TorchSampling(
                temperature=sp.temperature or 0.0, top_k=sp.top_k or 0, top_p=sp.top_p or 1.0, seed=sp.seed
            )
            out: list[int] = []
            log = os.environ.get("TRTLLM_STANDIN_STEP_LOG")
            with self._lock:
                for event in self.decoder.stream(ids, sp.max_tokens, sampling, use_draft=self.use_draft):
                    if aborted.is_set():
                        steps.put((self.tokenizer.decode(out, skip_special_tokens=True), list(out), "cancelled", None))
                        return
                    if log:
                        with open(log, "a", encoding="utf-8") as f:
                            f.write("step\n")
                    if isinstance(event, list):
                        out += event
                        steps.put((self.tokenizer.decode(out, skip_special_tokens=True), list(out), None, None))
                    else:
                        s = event.stats
                        filled = os.environ.get("TRTLLM_STANDIN_SPEC_METRICS", "zeroed") == "filled"
                        spec_stats = (
                            _SpecStats(s.acceptance_rate, s.total_accepted_draft_tokens, s.total_draft_tokens)
                            if filled
                            else _SpecStats()
                        )  # what the PyTorch flow writes (never updated, PR #17082)
                        stats = _PerfMetrics(spec_stats)
                        steps.put(
                            (
                                self.tokenizer.decode(out, skip_special_tokens=True),
                                list(out),
                                event.finish_reason,
                                stats if sp.return_perf_metrics else None,
                            )
                        )
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting RequestOutput
            steps.put(exc)

    def shutdown(self) -> None:
        pass


__all__ = ["LLM", "SamplingParams", "DraftTargetDecodingConfig", "RequestOutput"]
