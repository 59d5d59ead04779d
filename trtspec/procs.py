"""Child processes that die with their parent: tritonserver under `trtspec serve`, trtllm-build under `trtspec build`.

Linux's PR_SET_PDEATHSIG sends the child SIGKILL when the parent *thread* that forked it exits, even if the parent
is killed with SIGKILL and runs no clean-up: so start such a child from a thread that outlives it (the main thread,
or the thread that waits for it).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], object] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the child die with this process; None off Linux (the
    caller's own clean-up then stops it).

    libc is loaded here, in the parent: between fork and exec the child only calls the resolved function, so it takes
    no loader or import lock that another thread (e.g. the progress display's) might hold at fork time."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    kill = int(signal.SIGKILL)
    return lambda: prctl(PR_SET_PDEATHSIG, kill)
