"""Where trtspec keeps what outlives one run: its cache directory (the example's converted models, build digests,
the bundled tritonserver's files), and where this trtspec is imported from."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """trtspec's cache directory: ``$TRTSPEC_CACHE``, else ``$XDG_CACHE_HOME/trtspec``, else ``~/.cache/trtspec``."""
    if os.environ.get("TRTSPEC_CACHE"):
        return Path(os.environ["TRTSPEC_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "trtspec"


def trtspec_import_root() -> Path:
    """The directory that holds this ``trtspec`` package (what the backend stubs and containers must import)."""
    import trtspec

    return Path(trtspec.__file__).resolve().parent.parent
