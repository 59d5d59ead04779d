"""Stage outputs: atomic directories and their ``manifest.json``.

Every stage writes into a temporary sibling of its output directory and renames it into place only when complete,
so a crash or Ctrl-C never leaves a half-written output. The manifest records the inputs' content hashes, tool
versions, settings and timings; a stage whose recorded ``inputs_hash`` equals the current one is skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
_HASH_CHUNK = 1 << 20


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class _DigestCache:
    """SHA-256 digests of large files keyed by (path, size, mtime_ns), kept in the user cache directory, so that a
    resumed build does not re-read hundreds of GB of unchanged weights to decide that a stage is up to date."""

    MIN_SIZE = 16 << 20  # small files are cheaper to hash than to look up

    def __init__(self) -> None:
        self._entries: dict[str, str] | None = None

    @property
    def path(self) -> Path:
        from trtspec.paths import cache_dir

        return cache_dir() / "digests.json"

    def _load(self) -> dict[str, str]:
        if self._entries is None:
            try:
                self._entries = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def digest(self, path: Path) -> str:
        st = path.stat()
        if st.st_size < self.MIN_SIZE:
            return _sha256_file(path)
        key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        entries = self._load()
        if key not in entries:
            entries[key] = _sha256_file(path)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f".digests-{os.getpid()}.json")
                tmp.write_text(json.dumps(entries), encoding="utf-8")
                tmp.replace(self.path)
            except OSError:
                pass  # a cache that cannot be written only costs time
        return entries[key]


_DIGESTS = _DigestCache()


def hash_file(path: Path, h: Any | None = None) -> str:
    """SHA-256 of a file's bytes (large files: cached by path, size and mtime); fed into ``h`` when given."""
    digest = _DIGESTS.digest(Path(path))
    if h is None:
        return digest
    h.update(digest.encode())
    return h.hexdigest()


def hash_dir(path: Path, exclude: tuple[str, ...] = (MANIFEST,)) -> str:
    """SHA-256 over a directory's relative file names and contents (sorted; ``exclude`` names skipped)."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_file():
        h.update(path.name.encode())
        hash_file(path, h)
        return h.hexdigest()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if file.name in exclude or any(part.startswith(".tmp-") for part in file.relative_to(path).parts):
            continue
        h.update(rel.encode() + b"\0")
        hash_file(file, h)
        h.update(b"\0")
    return h.hexdigest()


def hash_inputs(paths: Mapping[str, Path | None], settings: Mapping[str, Any]) -> str:
    """One hash over named input paths (files or directories) and JSON-serializable settings."""
    h = hashlib.sha256()
    for name in sorted(paths):
        p = paths[name]
        h.update(name.encode() + b"=")
        h.update((hash_dir(p) if p is not None and Path(p).exists() else "absent").encode())
        h.update(b";")
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a completed output directory, or None."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def is_up_to_date(directory: Path, inputs_hash: str) -> bool:
    """True when ``directory`` holds a completed output made from inputs with this hash."""
    manifest = read_manifest(directory)
    return manifest is not None and manifest.get("inputs_hash") == inputs_hash


def write_manifest(directory: Path, data: Mapping[str, Any]) -> Path:
    path = Path(directory) / MANIFEST
    path.write_text(json.dumps(dict(data), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return path


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``final``; on success replace ``final`` with it, on any error remove it
    (and the parent directories it created, when they are left empty).

    The rename is atomic on one filesystem; the old output (if any) is moved aside first and deleted after.
    """
    final = Path(final)
    created = [d for d in final.parents if not d.exists()]  # removed again on failure when left empty
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}-{time.monotonic_ns()}")
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def tool_versions(*packages: str) -> dict[str, str | None]:
    """Installed versions of Python packages (None when absent), without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


BUILD_LOCK = ".trtspec-build.lock"


def _acquire(lock_file: Path) -> int:
    """An exclusive flock on ``lock_file`` (created), held by the returned descriptor, or -1 when another process
    holds it. A file the previous holder unlinked while we opened it is retried, so two processes never both hold
    "the" lock through different inodes."""
    import fcntl

    while True:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return -1
        try:
            same = os.stat(lock_file).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # unlinked by its last holder between our open and flock: take the new file


@contextlib.contextmanager
def build_lock(build_dir: Path) -> Iterator[Path]:
    """Hold the lock of one spec's build directory (`trtspec build` and `trtspec quantize` take it), or raise a
    one-line SpecError at once when another run holds it. Yields the lock file's path. On exit the lock file is
    removed, and so is the build directory when this run created it and left nothing in it."""
    from trtspec.errors import SpecError

    build_dir = Path(build_dir)
    created = [d for d in (build_dir, *build_dir.parents) if not d.exists()]
    build_dir.mkdir(parents=True, exist_ok=True)
    lock_file = build_dir / BUILD_LOCK
    fd = _acquire(lock_file)
    if fd < 0:
        raise SpecError(
            f"another trtspec build of this spec is running (lock {lock_file})",
            hint="wait for it to finish; the lock is released when it exits",
        )
    try:
        yield lock_file
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock_file.unlink()  # while still held: see _acquire
        os.close(fd)
        for d in created:  # deepest first; only directories this run made and left empty
            with contextlib.suppress(OSError):
                d.rmdir()
