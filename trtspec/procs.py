"""Child processes that die with their parent: tritonserver under `trtspec serve`, trtllm-build under `trtspec build`;
and whether a process (the owner of a pid file or of a temporary output) is still running.

Linux's PR_SET_PDEATHSIG sends the child SIGKILL when the parent *thread* that forked it exits, even if the parent
is killed with SIGKILL and runs no clean-up: so start such a child from a thread that outlives it (the main thread,
or the thread that waits for it).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

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


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs (another user's counts; a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return sys.platform != "linux"  # no /proc to ask: kill(0) said it exists
