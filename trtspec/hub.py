"""Model references: a local directory, or a Hugging Face Hub id (``org/name``, optionally ``org/name@revision``).

A hub id is resolved with ``huggingface_hub``: downloaded where the network allows, else taken from the local Hugging
Face cache (``HF_HUB_CACHE`` / ``HF_HOME``); with ``HF_HUB_OFFLINE=1`` only the cache is read. Commands that read only
configs and tokenizers (``check``, ``plan``, ``init``) fetch only those files; the stages that load weights fetch the
whole snapshot. A reference that neither a directory nor the Hub nor the cache has is one ModelLoadError.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from trtspec.errors import MissingDependencyError, ModelLoadError

# What `check`, `plan` and `init` read: configs, tokenizer files, chat templates; never weights.
CONFIG_PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*")
_HUB_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)"
    r"(?:@(?P<rev>[A-Za-z0-9._/-]+))?$"
)
_TRUE = ("1", "true", "yes", "on")


def parse_hub_id(ref: str) -> tuple[str, str | None] | None:
    """``('org/name', revision or None)`` when ``ref`` has the form of a hub id, else None."""
    m = _HUB_ID.match(ref.strip())
    if m is None or ".." in ref or ref.startswith((".", "~")):
        return None
    return m.group("repo"), m.group("rev")


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) says to read the local cache only."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> Path:
    """The Hugging Face cache trtspec reads (what huggingface_hub uses: ``HF_HUB_CACHE``, else ``HF_HOME``/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def resolve_model(ref: str, base_dir: Path, *, weights: bool = True) -> Path:
    """The local directory a model reference names: an existing path (relative to ``base_dir``), or a hub id's
    snapshot. Anything else is returned as the path it names, for the caller's missing-directory message."""
    local = Path(os.path.expanduser(ref))
    local = local if local.is_absolute() else Path(base_dir) / local
    parsed = parse_hub_id(ref)
    if local.exists() or parsed is None:
        return local
    repo_id, revision = parsed
    return _snapshot(repo_id, revision, weights, hub_offline(), str(hub_cache_dir()))


@functools.lru_cache(maxsize=64)
def _snapshot(repo_id: str, revision: str | None, weights: bool, offline: bool, cache: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    except ImportError:
        raise MissingDependencyError(
            f"{repo_id}: resolving a hub id needs the Python package 'huggingface_hub'",
            hint="pip install huggingface_hub (it comes with 'trtspec[torch]'), or point "
            "the spec at a local model directory",
        ) from None
    ref = repo_id + (f"@{revision}" if revision else "")
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            local_files_only=offline,
            allow_patterns=None if weights else list(CONFIG_PATTERNS),
        )
    except RevisionNotFoundError:
        raise ModelLoadError(
            f"{ref}: the Hugging Face Hub has no revision {revision!r} of this model",
            hint="use a branch, tag or commit the model has, or omit @revision",
        ) from None
    except GatedRepoError:
        raise ModelLoadError(
            f"{ref}: the model is gated on the Hugging Face Hub and this machine is not allowed to download it",
            hint="accept its terms on the Hub, then `hf auth login` or set HF_TOKEN",
        ) from None
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"{ref}: no such model on the Hugging Face Hub (nor a local directory)",
            hint="check the spelling (org/name), or point the spec at a local model directory",
        ) from None
    except Exception as exc:  # noqa: BLE001 - LocalEntryNotFoundError, connection errors: not in cache, no Hub
        cause = exc.__cause__ or exc
        why = "HF_HUB_OFFLINE is set" if offline else f"the Hub could not be reached ({type(cause).__name__})"
        raise ModelLoadError(
            f"{ref}: not a local directory, not in the Hugging Face cache {cache}, and {why}",
            hint=f"download it where the network allows (`hf download {repo_id}`) into that cache, or point the "
            "spec at a local model directory",
        ) from None
    return Path(path)
