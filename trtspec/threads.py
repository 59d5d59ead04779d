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
alternating, the faster taken) unless ``--threads`` (or the model's ``torch_threads``) names it. The choice is made
once per process, before it decodes, so target-only and speculative decoding in it run the same numeric path.
The wait policy is read when OpenMP starts (the first ``import torch``): set it before that, or in the environment of a
child process (the Triton server's stubs inherit it). torch's CPU build uses GNU OpenMP, so ``KMP_BLOCKTIME`` (Intel
OpenMP) has no effect.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

WAIT_POLICY = ("OMP_WAIT_POLICY", "PASSIVE")


def set_wait_policy(env: MutableMapping[str, str] | None = None) -> bool:
    """Default the OpenMP wait policy in ``env`` (this process's environment when None) to passive; a value the
    user set stays. Returns whether it takes effect here: False when torch is already loaded in this process."""
    target = os.environ if env is None else env
    target.setdefault(*WAIT_POLICY)
    return env is not None or "torch" not in sys.modules


def apply_threads(threads: int) -> None:
    """Intra-op threads for this process's torch (0: torch's default, one per core); sets the wait policy first."""
    set_wait_policy()
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
