"""Keep third-party chatter (ModelOpt prints and warnings, transformers progress bars) off the terminal."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_libraries(log_lines: list[str]) -> Iterator[None]:
    """Collect ModelOpt's prints and warnings (and silence transformers' progress bars and info logs) into
    ``log_lines``: on the terminal they would tear the rich progress display."""
    from transformers.utils import logging as hf_logging

    buf = io.StringIO()
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(buf):
        warnings.simplefilter("always")
        try:
            yield
        finally:
            if bars:
                hf_logging.enable_progress_bar()
            hf_logging.set_verbosity(verbosity)
            log_lines.extend(buf.getvalue().splitlines())
            log_lines.extend(f"warning: {w.category.__name__}: {w.message}" for w in caught)
