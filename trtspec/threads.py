"""The CPU thread policy of every process in which trtspec runs torch (in-process decoding, the served models).

Measured on the 2-core development machine (SmolLM2-135M, target-only decode, fused step; ms/token):

| machine | 2 threads, OpenMP default | 2 threads, OMP_WAIT_POLICY=PASSIVE | 1 thread |
|---|---|---|---|
| idle | 54.3 | 43.9 | 60.2 |
| two CPU burners beside it | 175.8 | 76.0 | 109.5 |

GNU OpenMP's default spins after each parallel region: with hundreds of small regions per step, the spinning thread
takes the core the next region (or another process) needs. A passive wait is faster idle and 2.3x faster busy.

Whether all cores beat one depends on the machine. On the EPYC above they did; on a 2-vCPU Intel Xeon VM (AVX512-BF16,
2026-12-02; bfloat16, in process, tok/s, medians of 3 alternating runs, the same tokens under both counts):

| machine | target-only, 1 / 2 threads | n-gram K 4, 1 / 2 | 8 sequences target-only, 1 / 2 |
|---|---|---|---|
| idle | 17.1 / 9.8 | 19.3 / 11.8 | 70.7 / 47.6 |
| two CPU burners beside it | 10.2 / 10.1 | 12.7 / 14.0 | 42.4 / 48.7 |

(two vCPUs that share a physical core's units, most likely). So: ``OMP_WAIT_POLICY=PASSIVE`` unless the user set it,
and the intra-op thread count timed once when a process loads its model (``trtspec generate`` and the served torch
models; ``trtspec.runtimes.torch.costs.fastest_threads``: a few one-token passes at 1 and at one per core,
alternating, the faster taken) unless ``--threads`` (or the model's ``torch_threads``) names it. A served engine
model of the BLS orchestration (two model processes beside the orchestrator) leaves one core to the server
(``SERVED_RESERVE``: Triton's frontends, the stubs' IPC, the response threads): on 2 cores it takes one thread
untimed. Timed idle at start, two threads had looked as fast and were taken in 4 of 10 server starts, and through
Triton they then decoded 37.6 tok/s against 51.6 at concurrency 1 (214 against 237 at 8). That was before a pass ran
in one OpenMP region (trtspec.runtimes.inflight.cpu_kernels.pass_team); the in-process model (one process for both
models) now reserves nothing (``IN_PROCESS_RESERVE``), measured in trtspec.runtimes.torch.costs.
The choice is made once per process, before it decodes, so target-only and speculative decoding in it run the same
numeric path.
A passive wait has a price where the step runs many short parallel regions: each wakes the sleeping thread again,
and on a VM a sleeping vCPU's wake-up goes through the hypervisor. ``benchmarks/wait_policy.py`` (2026-12-04, a
2-vCPU AMD EPYC with AVX512-BF16, the example in bfloat16 through trtspec's kernels, ms/token target-only / n-gram K 4,
medians of 2 alternating rounds; ``benchmarks/results/wait_policy.json``):

| policy | idle | two CPU burners beside it |
|---|---|---|
| ``OMP_WAIT_POLICY=PASSIVE`` (trtspec's default) | 34.7 / 28.6 | 33.5 / 37.5 |
| passive, ``GOMP_SPINCOUNT=10000`` | 21.1 / 19.2 | 75.5 / 44.9 |
| passive, ``GOMP_SPINCOUNT=100000`` | 20.7 / 18.4 | 110.6 / 82.4 |
| GNU OpenMP's default (300,000 spins) | 22.3 / 19.2 | 95.5 / 98.3 |

A short spin is 1.5-1.6x faster on an idle machine and 1.2-2.3x slower on a busy one. The default stays passive (a
shared or busy CPU must not stall); on a machine that serves nothing else, set ``GOMP_SPINCOUNT=10000`` in the
environment of the process (it is kept: only ``OMP_WAIT_POLICY`` is defaulted here, and libgomp lets an explicit spin
count override the passive policy's zero).
Under the passive wait trtspec's own bfloat16 kernels (trtspec.runtimes.inflight.cpu_kernels), called one by one,
run a call of fewer than ``PASSIVE_PARALLEL_ROWS`` (8) rows on the calling thread: such a call's second core gained
less than waking it cost. A whole pass runs in one OpenMP region instead (one wake-up a pass, a spinning barrier
between its steps that yields after 200 us): every thread from one token on.
Measured 2026-12-07 on the 2-core EPYC (bfloat16, in process, both variants alternated group by group in one process,
the same tokens): target-only 1.20x the tok/s at one sequence, adaptive 1.26x, n-grams K 4 1.23x; at 8 sequences 1.02x,
1.07x, 0.98x (passes of 8 or more rows keep both threads).
The wait policy is read when OpenMP starts (the first ``import torch``): set it before that, or in the environment of a
child process (the Triton server's stubs inherit it). torch's CPU build uses GNU OpenMP, so ``KMP_BLOCKTIME`` (Intel
OpenMP) has no effect.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

WAIT_POLICY = ("OMP_WAIT_POLICY", "PASSIVE")


def set_wait_policy(env: MutableMapping[str, str] | None = None) -> bool:
    """Default the OpenMP wait policy in ``env`` (this process's environment when None) to passive; a value the
    user set stays. Returns whether it takes effect here: False when torch is already loaded in this process."""
    target = os.environ if env is None else env
    target.setdefault(*WAIT_POLICY)
    return env is not None or "torch" not in sys.modules


def waits_passively(env: Mapping[str, str] | None = None) -> bool:
    """Whether OpenMP's idle threads sleep at once in this process (``OMP_WAIT_POLICY=passive`` and no
    ``GOMP_SPINCOUNT``, which libgomp lets override the passive policy's zero spins)."""
    source = os.environ if env is None else env
    return source.get("OMP_WAIT_POLICY", "").strip().lower() == "passive" and "GOMP_SPINCOUNT" not in source


def apply_threads(threads: int) -> None:
    """Intra-op threads for this process's torch (0: torch's default, one per core); sets the wait policy first."""
    set_wait_policy()
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
