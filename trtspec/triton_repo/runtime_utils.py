"""Small helpers the repository's Python models share (no Triton import: requests are duck-typed)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

TRUE = ("1", "true", "yes", "y", "t", "on")


def model_params(args: dict[str, str]) -> dict[str, str]:
    """The ``parameters`` of a model's config as plain strings."""
    cfg = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}


def model_file(args: dict[str, str], path: str) -> str:
    """A path a config names, as the model opens it: relative ones are relative to the model's version directory
    (``<repository>/<model>/<version>/``; the repository's own files, e.g. the tokenizer copy), absolute ones as is."""
    import os

    if os.path.isabs(path):
        return path
    return os.path.join(args["model_repository"], str(args["model_version"]), path)


def as_bool(value: Any, default: bool = False) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, str):
        return value.strip().lower() in TRUE
    return bool(np.asarray(value).reshape(-1)[0])


def request_inputs(request: Any) -> dict[str, np.ndarray]:
    """Every input tensor of a Triton request as numpy, by name."""
    return {t.name(): t.as_numpy() for t in request.inputs()}


def scalar_rows(x: np.ndarray | None, batch: int, default: Any) -> list[Any]:
    """Per-row values of an optional [B, 1] (or [B]) input."""
    if x is None:
        return [default] * batch
    flat = np.asarray(x).reshape(np.asarray(x).shape[0], -1)[:, 0].tolist()
    if len(flat) == 1 and batch > 1:
        flat = flat * batch
    return flat


# Errors whose words are meant for a client: trtspec's own (with a hint) and another model's error response passed on
# by BLS (already worded by that model's error_message).
_CLIENT_WORDED = ("TrtspecError", "TritonModelException")


def error_message(exc: BaseException) -> str:
    """One line for a client: the message, and the hint of a TrtspecError. Anything else is a library's own words
    about tensors it could not use (``index 0 is out of bounds for axis 1 with size 0``): the client gets what kind
    of failure it was, the server log (the stub's stderr) the traceback."""
    if not any(c.__name__ in _CLIENT_WORDED for c in type(exc).__mro__):
        import sys
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        return (
            f"the request could not be served ({type(exc).__name__}): its inputs do not fit this model's tensors "
            "(GET /v2/models/<model>/config lists them); the server log has the details"
        )
    hint = getattr(exc, "hint", None)
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{text} (hint: {hint})" if hint else text
