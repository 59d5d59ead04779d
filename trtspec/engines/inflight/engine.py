"""In-flight batching engine: one thread runs packed forward passes over every active request, as TRT-LLM's batch
manager does, so concurrent requests share each pass instead of queueing behind each other.

Each iteration admits waiting jobs (each takes the KV slot with the longest shared prefix and feeds only the rest),
feeds every active job its pending tokens in one packed pass, then samples (generation) or accepts draft tokens
(verification, lossless: greedy exact match, or rejection sampling against the draft's distribution).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import torch

from trtspec.engines.inflight.jobs import Job
from trtspec.engines.inflight.words import banned_tokens, hits_stop_word
from trtspec.engines.inflight.kv_pool import KVGeometry, SlotKVPool
from trtspec.engines.inflight.packed import packed_forward, prepare_model
from trtspec.engines.torch_runtime.acceptance import accept_greedy, accept_sampled
from trtspec.engines.torch_runtime.sampling import logits_to_probs, sample
from trtspec.errors import GenerationError

log = logging.getLogger(__name__)


class InflightEngine:
    """Serve generation/verification jobs for one model (see module docstring). Thread-safe ``submit``."""

    def __init__(self, model: Any, *, max_batch_size: int = 8, slots: int | None = None, capacity: int = 2048,
                 max_queue_delay_s: float = 0.0, name: str = "engine") -> None:
        self.model = prepare_model(model)
        self.geometry = KVGeometry.of(self.model)
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_batch_size = max_batch_size
        self.pool = SlotKVPool(self.geometry, slots or 2 * max_batch_size, capacity)
        self.max_queue_delay_s = max_queue_delay_s
        self.name = name
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._active: list[Job] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.passes = 0
        self.fed_tokens = 0

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> InflightEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"trtspec-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def submit(self, job: Job) -> None:
        """Queue a job; its sinks are called from the engine thread."""
        self.validate(job)
        self._queue.put(job)

    def validate(self, job: Job) -> None:
        """Raise GenerationError for a job this engine cannot serve (before anything is queued)."""
        if not job.tokens:
            raise GenerationError("input_ids is empty", hint="send at least one prompt token")
        if job.max_new <= 0:
            raise GenerationError(f"request_output_len must be > 0, got {job.max_new}", hint="ask for >= 1 token")
        bad = [t for t in job.tokens + (job.draft or []) if not 0 <= t < self.vocab]
        if bad:
            raise GenerationError(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})",
                                  hint="tokenize with the model's tokenizer")
        need = len(job.tokens) + (len(job.draft) + 1 if job.draft is not None else job.max_new)
        if need > self.pool.capacity:
            raise GenerationError(f"{len(job.tokens)} input tokens + {need - len(job.tokens)} new tokens exceed "
                                  f"max_seq_len ({self.pool.capacity})",
                                  hint="shorten the prompt or lower max_tokens")
        if job.draft_logits is not None and job.draft is not None and job.draft_logits.shape[0] < len(job.draft):
            raise GenerationError(f"draft_logits has {job.draft_logits.shape[0]} rows for {len(job.draft)} draft "
                                  "tokens", hint="send one row of logits per draft token")

    # -- the loop -------------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._admit(block=not self._active)
            if self._stop.is_set():
                break
            if self._active:
                self.step()

    def _admit(self, block: bool) -> None:
        """Move waiting jobs into the batch (up to max_batch_size and the free slots)."""
        deadline = None
        while len(self._active) < self.max_batch_size and self.pool.free:
            try:
                if block and not self._active:
                    job = self._queue.get()
                elif deadline is not None:
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                else:
                    job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is None:
                return
            try:
                self._start_job(job)
            except Exception as exc:  # noqa: BLE001 - reported to the request, the engine keeps serving
                job.on_error(exc)
                continue
            self._active.append(job)
            if deadline is None and self.max_queue_delay_s > 0:
                # A burst (e.g. every sequence of a batch verifying at once) shares one pass if it arrives in time.
                deadline = time.monotonic() + self.max_queue_delay_s

    def _start_job(self, job: Job) -> None:
        if job.generator is None and not job.sampling.greedy:
            job.generator = job.sampling.generator()
        feed = job.tokens + (job.draft or [])
        slot, reuse = self.pool.acquire(job.tokens)
        job.slot = slot
        job.pending = feed[reuse:]

    def step(self) -> None:
        """One packed pass over all active jobs, then sampling / acceptance and delivery."""
        jobs = self._active
        feeds, keep, ranges = [], [], []
        offset = 0
        for job in jobs:
            assert job.slot is not None
            n = len(job.pending)
            feeds.append((job.slot.index, job.slot.length, job.pending))
            k = job.keep_count()
            ranges.append((len(keep), k))
            keep.extend(range(offset + n - k, offset + n))
            offset += n
        try:
            logits = packed_forward(self.model, self.pool, feeds, keep)
        except Exception as exc:  # noqa: BLE001 - fail these requests, keep the engine alive
            log.exception("%s: forward pass failed", self.name)
            for job in jobs:
                self._finish(job, error=exc)
            self._active = []
            return
        self.passes += 1
        self.fed_tokens += offset
        self.pool.computed_tokens += offset
        still = []
        for job, (start, k) in zip(jobs, ranges):
            assert job.slot is not None
            job.slot.tokens.extend(job.pending)
            job.pending = []
            try:
                if job.verify:
                    self._verify(job, logits[start: start + k])
                else:
                    self._generate(job, logits[start])
            except Exception as exc:  # noqa: BLE001
                log.exception("%s: request failed", self.name)
                self._finish(job, error=exc)
                continue
            if job.done:
                self._finish(job)
            else:
                still.append(job)
        self._active = still

    def _generate(self, job: Job, logits: torch.Tensor) -> None:
        history = job.history()
        banned = banned_tokens(history, job.bad_words)
        if banned:
            logits = logits.clone()
            logits[banned] = float("-inf")
        if job.sampling.greedy:
            token = int(logits.argmax())
        else:
            token = sample(logits_to_probs(logits, job.sampling), job.generator)  # type: ignore[arg-type]
        if job.end_id is not None and token == job.end_id:
            job.done = True
            return
        job.out.append(token)
        if job.return_logits:
            job.logits.append(logits.detach().clone())
        history.append(token)
        if len(job.out) >= job.max_new or hits_stop_word(history, job.stop_words):
            job.done = True
            return
        job.pending = [token]
        if job.stream:
            self._deliver(job, final=False)

    def _verify(self, job: Job, logits: torch.Tensor) -> None:
        draft = job.draft or []
        if job.sampling.greedy:
            n, nxt = accept_greedy(draft, logits.argmax(-1).tolist())
        else:
            p = logits_to_probs(logits, job.sampling)
            if job.draft_logits is not None:
                q = logits_to_probs(job.draft_logits[: len(draft)].float(), job.sampling)
            else:  # the draft's tokens as a point mass: still lossless (accept with p(x), else resample p without x)
                q = torch.zeros(len(draft), p.shape[-1])
                if draft:
                    q[torch.arange(len(draft)), torch.tensor(draft)] = 1.0
            n, nxt = accept_sampled(draft, q, p, job.generator)  # type: ignore[arg-type]
        emitted = draft[:n] + [nxt]
        out: list[int] = []
        history = list(job.tokens)
        for tok in emitted[: job.max_new]:
            if job.end_id is not None and tok == job.end_id:
                break
            out.append(tok)
            history.append(tok)
            if hits_stop_word(history, job.stop_words):
                break
        job.out = out
        if job.return_logits:
            job.logits = [logits[i].detach().clone() for i in range(len(out))]
        # Keep the keys/values of the prompt and of the accepted draft tokens; drop the rejected ones.
        assert job.slot is not None
        self.pool.truncate(job.slot, len(job.tokens) + min(n, len(out)))
        job.done = True

    def _deliver(self, job: Job, final: bool) -> None:
        new = job.out[job.sent:]
        logits = torch.stack(job.logits[job.sent:]) if job.return_logits and new else None
        job.sent = len(job.out)
        job.on_tokens(new, logits, final)

    def _finish(self, job: Job, error: Exception | None = None) -> None:
        if job.slot is not None:
            if error is not None:
                self.pool.truncate(job.slot, 0)  # its keys/values may be half written
            self.pool.release(job.slot)
            job.slot = None
        job.done = True
        try:
            if error is not None:
                job.on_error(error)
            else:
                self._deliver(job, final=True)
        except Exception:  # noqa: BLE001 - a client that went away must not stop the engine
            log.exception("%s: delivering a response failed", self.name)
