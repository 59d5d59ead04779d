"""The Python backend's shared-memory regions of a server trtspec runs: owner-only while it runs, removed after it.

What the server and its stubs create is theirs alone. The regions in /dev/shm carry every request's tensors, and
boost.interprocess creates them -rw-r--r-- whatever the umask (measured on 2.51): trtspec makes them owner-only
itself (``protect_shm_regions``) as soon as it sees them, while the server starts, before any request. Used by the
bundled server (trtspec.serving.server) and the supervised launch (trtspec.serving.launched).
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
