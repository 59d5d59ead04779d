"""The Python backend's shared-memory regions of a server (``/dev/shm/<prefix>*``): who may read them, and their
removal once the server is gone.

The regions carry every request's tensors. boost.interprocess creates them -rw-r--r-- whatever the umask (measured
on Triton 2.51), so trtspec makes them owner-only itself as soon as it sees them, while the server starts (before it
admits a request) and at every supervision poll (a reloaded model's new stubs); the server also runs with umask 077
for what it writes. A stub that is killed (SIGKILL of the process group, a crash) leaves its region behind (seen: a
1 MiB region after 2 of 3 stops): every stop removes them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

SERVER_UMASK = 0o077
SHM_DIR = Path("/dev/shm")
SHM_MODE = 0o600


def protect_shm_regions(prefix: str, shm_dir: Path = SHM_DIR) -> None:
    """Make the Python backend's regions named ``prefix*`` readable by their owner only."""
    for region in shm_dir.glob(f"{prefix}*") if prefix else ():
        with contextlib.suppress(OSError):
            if region.stat().st_mode & 0o777 != SHM_MODE:
                region.chmod(SHM_MODE)


def remove_shm_regions(prefix: str, shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove the Python backend's shared-memory regions named ``prefix*`` once their server is gone: a stub that
    was killed (SIGKILL of the process group, a crash) leaves its region behind (seen: 1 MiB in 2 of 3 stops)."""
    removed = []
    for region in shm_dir.glob(f"{prefix}*") if prefix else ():
        with contextlib.suppress(OSError):
            region.unlink()
            removed.append(region.name)
    return removed
