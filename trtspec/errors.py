"""Typed errors: each carries a one-line message and a hint saying what to do next.

The CLI turns any ``TrtspecError`` into one line plus its hint and a non-zero exit (see ``trtspec.cli.main``).
"""

from __future__ import annotations


class TrtspecError(Exception):
    """Base of every error trtspec reports to a user."""

    exit_code: int = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class SpecError(TrtspecError):
    """The build spec (YAML or flags) is invalid."""


class ModelLoadError(TrtspecError):
    """A model directory, config or tokenizer is missing or unreadable."""


class IncompatibleModelsError(TrtspecError):
    """Draft and target cannot be paired for speculative decoding."""


class QuantizationError(TrtspecError):
    """ModelOpt quantization or checkpoint export failed or cannot run here."""


class EngineBuildError(TrtspecError):
    """A TensorRT-LLM engine build failed or cannot run here."""


class ServerError(TrtspecError):
    """The Triton server failed to start, answer or stop."""


class GenerationError(TrtspecError):
    """A generation request is invalid or failed."""


class RequestCancelled(GenerationError):
    """The request was cancelled (its client went away); its generation stopped and freed its resources."""


class Interrupted(TrtspecError):
    """The user interrupted a command (Ctrl-C); the message says where, and what was kept (the CLI prints it after
    "interrupted:")."""

    exit_code = 130


class MissingDependencyError(TrtspecError):
    """An optional dependency that this command needs is not installed."""


def require(module: str, extra: str) -> None:
    """Raise MissingDependencyError naming the extra to install when ``module`` cannot be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(
            f"this command needs the Python package '{module}', which is not installed",
            hint=f"pip install 'trtspec[{extra}]'",
        )


class DistillError(TrtspecError):
    """A distillation input or setting is invalid."""
