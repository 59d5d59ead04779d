"""In-flight batching engine: one thread runs packed forward passes over every active request, as TRT-LLM's batch
manager does, so concurrent requests share each pass instead of queueing behind each other.

Each iteration admits waiting jobs (each takes the KV slot with the longest shared prefix and feeds only the rest),
asks the drafter (when the engine has one: a draft model, n-grams or the hybrid) for every speculative job's
proposals, feeds every active job its pending tokens plus its draft tokens (proposals, or the draft sent with an
external verification request) in one packed pass of the target, and decides each job's step with the one
acceptance routine (trtspec.speculative.acceptance: lossless greedy exact match or rejection sampling; with
no draft, plain decoding). The same engine serves the torch runtime's Triton models and in-process decoding
(``run_until_idle``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import torch

from trtspec.errors import GenerationError, RequestCancelled
from trtspec.runtimes.inflight import cpu_kernels
from trtspec.runtimes.inflight.drafter import ModelDrafter
from trtspec.runtimes.inflight.head import lazy_head
from trtspec.runtimes.inflight.jobs import Job
from trtspec.runtimes.inflight.kv_pool import KVGeometry, SlotKVPool, device_of, synchronize
from trtspec.runtimes.inflight.llama_step import step_of
from trtspec.runtimes.inflight.packed import packed_forward, prepare_model
from trtspec.runtimes.inflight.timing import calibrate, calibration_batches
from trtspec.speculative.acceptance import Candidate, decide
from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.drafters import Proposal
from trtspec.speculative.rules import check_draft_len
from trtspec.speculative.sampling import logits_to_probs
from trtspec.speculative.words import hits_stop_word

log = logging.getLogger(__name__)


def _counting(head: Any, rows: list[int]) -> Any:
    """``head``, adding the rows of every call to ``rows[0]``."""

    def counted(hidden: torch.Tensor) -> torch.Tensor:
        rows[0] += int(hidden.shape[0])
        return head(hidden)

    return counted


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class InflightEngine:
    """Serve jobs for one target model, optionally with a draft model (see module docstring). Thread-safe
    ``submit``; the loop runs on ``start()``'s thread, or in the caller's thread with ``run_until_idle()``."""

    def __init__(
        self,
        model: Any,
        *,
        draft_model: Any = None,
        max_batch_size: int = 8,
        slots: int | None = None,
        capacity: int = 2048,
        max_queue_delay_s: float = 0.0,
        name: str = "engine",
        use_lazy_head: bool = True,
        drafter: Any = None,
        fast_step: bool = True,
        calibrate_costs: bool = False,
    ) -> None:
        """``fast_step``: run supported (Llama-family) models through their fused step
        (trtspec.runtimes.inflight.llama_step); False: the transformers module tree for every model.
        ``calibrate_costs``: an adaptive drafter's policy has its pass costs measured in turn here, before the first
        request (trtspec.runtimes.inflight.timing.calibrate; 4 s at batch 1 and 20 s up to 8 on SmolLM2-135M on 2 CPU
        cores), unless it was for this batch. Off by default: it has not yet been shown to choose better than the live
        curves on this VM, whose controlled measurements themselves differ by 10-20 % between runs."""
        self.model = prepare_model(model)
        self.fast = step_of(self.model) if fast_step else None
        self.geometry = KVGeometry.of(self.model)
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_batch_size = max_batch_size
        n_slots = slots or 2 * max_batch_size
        self.device = device_of(self.model)  # the KV cache, and every tensor a step makes, live on the model's device
        self.pool = SlotKVPool(self.geometry, n_slots, capacity, device=self.device)
        # a greedy step's tokens from the head's logits: trtspec's kernel reads them in place on a CPU (elsewhere, or
        # without the kernels, cpu_kernels.argmax is torch's own)
        self._argmax: Any = cpu_kernels.argmax
        # The drafter: a draft model (ModelDrafter), or any object with its interface (admit, propose, commit,
        # release, free, observe_pass: trtspec.speculative.drafters.EngineDrafter), built for these slots.
        self.drafter: Any = drafter
        if drafter is None and draft_model is not None:
            self.drafter = ModelDrafter(draft_model, slots=n_slots, capacity=capacity, fast_step=fast_step)
        if self.drafter is not None:
            if getattr(self.drafter, "vocab", self.vocab) != self.vocab:
                raise GenerationError(
                    f"draft vocabulary ({self.drafter.vocab}) differs from the target's ({self.vocab})",
                    hint="draft and target must share one tokenizer",
                )
        policy = getattr(self.drafter, "policy", None)
        if (
            calibrate_costs
            and isinstance(policy, AdaptivePolicy)
            and not policy.calibrated >= calibration_batches(max_batch_size)
        ):
            draft = getattr(getattr(self.drafter, "model", None), "model", None)  # a ModelDrafter's model
            calibrate(policy, self.model, draft, max_batch=max_batch_size, fast_step=fast_step)
        # Logits only where they can be used (trtspec.runtimes.inflight.head), for plain-head model classes.
        self.head = lazy_head(self.model) if use_lazy_head else None
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
            raise GenerationError(
                f"token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})",
                hint="tokenize with the model's tokenizer",
            )
        need = len(job.tokens) + (len(job.draft) + 1 if job.draft is not None else job.max_new)
        if need > self.pool.capacity:
            raise GenerationError(
                f"{len(job.tokens)} input tokens + {need - len(job.tokens)} new tokens exceed "
                f"max_seq_len ({self.pool.capacity})",
                hint="shorten the prompt or lower max_tokens",
            )
        if job.draft_logits is not None and job.draft is not None and job.draft_logits.shape[0] < len(job.draft):
            raise GenerationError(
                f"draft_logits has {job.draft_logits.shape[0]} rows for {len(job.draft)} draft tokens",
                hint="send one row of logits per draft token",
            )
        if job.num_draft_tokens:
            if self.drafter is None:
                raise GenerationError("this engine has no drafter (no draft model)", hint="send num_draft_tokens 0")
            check_draft_len(job.num_draft_tokens)  # the one K rule (the deployment's bound was checked before)
            if job.draft is not None:
                raise GenerationError(
                    "num_draft_tokens and draft_input_ids exclude each other", hint="one source of draft tokens"
                )

    # -- the loop -------------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._admit(block=not self._active)
            if self._stop.is_set():
                break
            if self._active:
                self.step()

    def iterate(self) -> bool:
        """One admission + step in this thread (no engine thread); False once every submitted job has finished."""
        if self._thread is not None:
            raise RuntimeError("the engine runs on its own thread")
        self._admit(block=False)
        if self._active:
            self.step()
        return bool(self._active) or not self._queue.empty()

    def run_until_idle(self) -> None:
        """Run the loop in this thread until every submitted job has finished."""
        while self.iterate():
            pass

    def _can_admit(self) -> bool:
        return (
            len(self._active) < self.max_batch_size
            and self.pool.free > 0
            and (self.drafter is None or self.drafter.free > 0)
        )

    def _admit(self, block: bool) -> None:
        """Move waiting jobs into the batch (up to max_batch_size and the free slots)."""
        deadline = None
        while self._can_admit():
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
            if job.cancelled:
                self._finish(job, error=RequestCancelled("cancelled before it started"))
                continue
            try:
                self._start_job(job)
            except Exception as exc:  # noqa: BLE001 - reported to the request, the engine keeps serving
                self._finish(job, error=exc)
                continue
            self._active.append(job)
            if deadline is None and self.max_queue_delay_s > 0:
                # A burst (e.g. every sequence of a batch verifying at once) shares one pass if it arrives in time.
                deadline = time.monotonic() + self.max_queue_delay_s

    def _start_job(self, job: Job) -> None:
        if job.generator is None and not job.sampling.greedy:
            job.generator = job.sampling.generator()
        slot, reuse = self.pool.acquire(job.tokens)
        job.slot = slot
        job.pending = job.tokens[reuse:]
        job.stats.num_input_tokens = len(job.tokens)
        if job.num_draft_tokens and self.drafter is not None:
            self.drafter.admit(job)

    def _proposals(self, jobs: list[Job]) -> list[Proposal | None]:
        """This step's draft tokens per job: the external draft, the drafter's proposals, or none."""
        out: list[Proposal | None] = [None] * len(jobs)
        asking, ks = [], []
        for i, job in enumerate(jobs):
            if job.external:
                q = None
                if job.draft_logits is not None and not job.sampling.greedy and job.draft:
                    q = logits_to_probs(job.draft_logits[: len(job.draft)].to(self.device).float(), job.sampling)
                out[i] = Proposal(list(job.draft or []), q=q)
                continue
            room = self.pool.capacity - job.length
            k = min(job.num_draft_tokens, job.max_new - len(job.out) - 1, room - 1)
            if k > 0 and job.draft_state is not None:
                asking.append(i)
                ks.append(k)
        if asking:
            assert self.drafter is not None
            # The tokens the step feeds anyway (every job's pending tokens): what speculation adds to (adaptive).
            batch_tokens = sum(len(job.pending) for job in jobs)
            asked = [jobs[i] for i in asking]
            for i, p in zip(asking, self.drafter.propose(asked, ks, batch_tokens, batch_seqs=len(jobs))):
                out[i] = p
        return out

    @torch.inference_mode()
    def step(self) -> None:
        """One iteration: proposals, one packed target pass over all active jobs, decisions, delivery."""
        live = []
        for job in self._active:
            if job.cancelled:
                self._finish(job, error=RequestCancelled("cancelled"))
            else:
                live.append(job)
        jobs = self._active = live
        if not jobs:
            return
        try:
            proposals = self._proposals(jobs)
            t0 = time.perf_counter()
            feeds: list[Any] = []
            keep: list[Any] = []
            ranges: list[Any] = []
            offset = 0
            for job, prop in zip(jobs, proposals):
                assert job.slot is not None
                draft = prop.tokens if prop is not None else []
                fed = job.pending + draft
                feeds.append((job.slot.index, job.slot.length, fed))
                k = len(draft) + 1
                ranges.append((len(keep), k))
                keep.extend(range(offset + len(fed) - k, offset + len(fed)))
                offset += len(fed)
            t_pass = time.perf_counter()
            states = packed_forward(self.model, self.pool, feeds, keep, hidden=self.head is not None, fast=self.fast)
            if self.drafter is not None:
                synchronize(states.device)  # CUDA queues the pass: time what it ran, not its launch
            pass_s = time.perf_counter() - t_pass
            head = self.head if self.head is not None else _identity
            if self.fast is not None and self.fast.head is not None and head is self.model.lm_head:
                head = self.fast.head  # the same weights, packed for the kernel that multiplies one row fastest
            histories = [job.history() for job in jobs]
            cands = [
                Candidate(
                    prop.tokens if prop else [],
                    job.sampling,
                    job.generator,
                    prop.q if prop else None,
                    history=h,
                    bad_words=job.bad_words,
                    keep_logits=job.return_logits,
                    logprobs=job.logprobs,
                    end_ids=job.end_ids(),
                    generated=len(job.out),
                )
                for job, prop, h in zip(jobs, proposals, histories)
            ]
            head_rows = [0]  # what the head computes (a sequence's later rows only if its first was accepted)
            counted = head if head is _identity else _counting(head, head_rows)
            t_verify = time.perf_counter()
            flat = int(getattr(head, "flat_rows", 0))  # trtspec's multiply kernels: a few rows cost about one
            decisions = decide(
                cands, [states[s : s + k] for s, k in ranges], counted, flat_rows=flat, argmax=self._argmax
            )
            verify_s = time.perf_counter() - t_verify
        except Exception as exc:  # noqa: BLE001 - fail these requests, keep the engine alive
            log.exception("%s: forward pass failed", self.name)
            for job in jobs:
                self._finish(job, error=exc)
            self._active = []
            return
        dt = time.perf_counter() - t0
        if self.drafter is not None:
            # The adaptive drafter learns the pass's cost per tokens fed (the packed pass alone) and the verification's
            # (the head and the acceptance routine) per head row computed: decide computes a sequence's later rows
            # only when its first proposal is accepted, so by rows kept a step that accepted would look like an
            # expensive K. Timed with the pass, it would look like an expensive size.
            rows = head_rows[0] if head is not _identity else len(keep)
            self.drafter.observe_pass(offset, pass_s, rows=rows, verify_s=verify_s, seqs=len(jobs))
        self.passes += 1
        self.fed_tokens += offset
        self.pool.computed_tokens += offset
        still = []
        for job, (_, _, fed), cand, dec, history in zip(jobs, feeds, cands, decisions, histories):
            try:
                self._advance(job, fed, cand, dec, len(history), dt)
            except Exception as exc:  # noqa: BLE001
                log.exception("%s: request failed", self.name)
                self._finish(job, error=exc)
                continue
            if job.done:
                self._finish(job)
            else:
                still.append(job)
        self._active = still

    def _advance(self, job: Job, fed: list[int], cand: Candidate, dec: Any, history_len: int, dt: float) -> None:
        """Commit one decided step: emitted tokens, stop conditions, both KV caches, statistics, streaming."""
        assert job.slot is not None
        draft = list(cand.draft)
        job.slot.tokens.extend(fed)
        n = dec.accepted
        # The target's cache keeps the sequence, the accepted draft tokens; the rejected ones are dropped.
        self.pool.truncate(job.slot, history_len + n)
        emitted = draft[:n] + [dec.token]
        new = 0
        history = job.history()
        for tok in emitted:
            if job.end_id is not None and tok == job.end_id:
                job.done, job.finish_reason = True, "stop"
                break
            job.out.append(tok)
            history.append(tok)
            new += 1
            if len(job.out) >= job.sampling.min_tokens and hits_stop_word(history, job.stop_words):
                job.done, job.finish_reason = True, "stop"
                break
            if len(job.out) >= job.max_new:
                job.done, job.finish_reason = True, "length"
                break
        if job.return_logits:
            job.logits.extend(dec.logits[:new])
        if dec.logprobs is not None:
            job.token_logprobs.extend(dec.logprobs[:new])
        job.stats.note_step(len(draft), n)
        job.stats.note_tokens(new)
        job.stats.target_s += dt
        if self.drafter is not None:
            self.drafter.commit(job, history_len, 0 if job.external else len(draft), n)
        if job.external:
            job.done = True
        if not job.done:
            job.pending = [job.out[-1]]
            if job.stream and job.sent < len(job.out):
                self._deliver(job, final=False)

    def _deliver(self, job: Job, final: bool) -> None:
        new = job.out[job.sent :]
        logits = torch.stack(job.logits[job.sent :]) if job.return_logits and new else None
        job.sent = len(job.out)
        job.on_tokens(new, logits, final)

    def _finish(self, job: Job, error: Exception | None = None) -> None:
        if job.slot is not None:
            if error is not None:
                self.pool.truncate(job.slot, 0)  # its keys/values may be half written
            self.pool.release(job.slot)
            job.slot = None
        if self.drafter is not None:
            self.drafter.release(job, keep=error is None)
        job.done = True
        if isinstance(error, RequestCancelled):
            job.finish_reason = "cancelled"
        try:
            if error is not None:
                job.on_error(error)
            else:
                self._deliver(job, final=True)
        except Exception:  # noqa: BLE001 - a client that went away must not stop the engine
            log.exception("%s: delivering a response failed", self.name)
