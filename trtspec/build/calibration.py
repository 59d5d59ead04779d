"""Calibration data: read a text or JSONL file (or the shipped corpus), split off held-out text, pack token chunks.

Documents are assigned to calibration or held-out by a hash of their text, so the quality report evaluates on text the
quantizer never saw. Both streams are packed into chunks of ``seq_len`` tokens (documents joined with EOS), so every
calibration sample is full length and needs no padding or attention mask.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import QuantizationError
from trtspec.spec import BuildSpec

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress

JSONL_SUFFIXES = (".jsonl", ".ndjson")
HELDOUT_EVERY = 10  # about one document in ten is held out
MAX_HELDOUT_CHUNKS = 32
_FILE_HINT = "set calibration.file to a UTF-8 text or JSONL file, or leave it empty for the corpus shipped with trtspec"


@dataclass(frozen=True)
class Document:
    """One calibration document."""

    text: str
    kind: str = "text"


@dataclass
class CalibrationData:
    """Token chunks for calibration and for the held-out quality evaluation, and a summary for the manifest."""

    calib: torch.Tensor  # [samples, seq_len] int64
    heldout: torch.Tensor  # [heldout_samples, heldout_len] int64
    summary: dict[str, Any] = field(default_factory=dict)


def shipped_corpus() -> Path:
    """The calibration corpus shipped as package data (see trtspec/data/README.md)."""
    return Path(str(resources.files("trtspec") / "data" / "calibration.jsonl"))


def calibration_source(spec: BuildSpec) -> Path:
    """The calibration file a spec names, or the shipped corpus."""
    return spec.resolve(spec.calibration.file) if spec.calibration.file else shipped_corpus()


def _read_jsonl(path: Path, text: str, fieldname: str) -> list[Document]:
    docs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise QuantizationError(
                f"{path}:{lineno}: not valid JSON ({exc.msg})",
                hint="a JSONL calibration file holds one JSON object per line",
            ) from None
        if not isinstance(record, dict):
            raise QuantizationError(
                f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}",
                hint="a JSONL calibration file holds one JSON object per line",
            )
        if fieldname not in record:
            keys = ", ".join(sorted(map(str, record))) or "none"
            raise QuantizationError(
                f"{path}:{lineno}: no field {fieldname!r} (fields: {keys})",
                hint="set calibration.field to the field that holds the text",
            )
        value = record[fieldname]
        if not isinstance(value, str):
            raise QuantizationError(
                f"{path}:{lineno}: field {fieldname!r} is {type(value).__name__}, not text",
                hint="set calibration.field to the field that holds the text",
            )
        if value.strip():
            docs.append(Document(value, str(record.get("kind", "text"))))
    return docs


def read_documents(path: Path, fieldname: str = "text") -> list[Document]:
    """Documents of a calibration file: JSONL (one object per line, text in ``fieldname``) or plain text."""
    path = Path(path)
    if not path.exists():
        raise QuantizationError(f"{path}: calibration file not found", hint=_FILE_HINT)
    if not path.is_file():
        raise QuantizationError(f"{path}: not a file", hint=_FILE_HINT)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise QuantizationError(f"{path}: not UTF-8 text (byte {exc.start})", hint=_FILE_HINT) from None
    if path.suffix.lower() in JSONL_SUFFIXES:
        docs = _read_jsonl(path, text, fieldname)
    else:  # plain text: paragraphs separated by blank lines are documents
        docs = [Document(p.strip() + "\n") for p in text.split("\n\n") if p.strip()]
    if not docs:
        raise QuantizationError(f"{path}: no calibration text in it (empty file)", hint=_FILE_HINT)
    return docs


def is_heldout(doc: Document) -> bool:
    """Deterministic ~10 % held-out split by a hash of the document's text."""
    return hashlib.sha256(doc.text.encode()).digest()[0] % HELDOUT_EVERY == 0


def _pack(stream: list[int], seq_len: int, limit: int) -> list[list[int]]:
    n = min(limit, len(stream) // seq_len)
    if n == 0 and len(stream) >= 2:
        return [stream]  # less than one full chunk: one shorter chunk rather than nothing
    return [stream[i * seq_len : (i + 1) * seq_len] for i in range(n)]


def heldout_chunk_count(samples: int) -> int:
    """How many held-out chunks the quality evaluation uses for a given calibration sample count."""
    return min(MAX_HELDOUT_CHUNKS, max(2, samples // 4))


def tokenize_calibration(
    docs: list[Document], tokenizer: Any, *, samples: int, seq_len: int, source: str
) -> CalibrationData:
    """Split documents into calibration and held-out streams and pack both into token chunks."""
    import torch

    sep = tokenizer.eos_token_id
    calib_stream: list[int] = []
    held_stream: list[int] = []
    n_held = 0
    for doc in docs:
        ids = list(tokenizer(doc.text, add_special_tokens=False)["input_ids"])
        if sep is not None:
            ids.append(int(sep))
        if is_heldout(doc):
            held_stream += ids
            n_held += 1
        else:
            calib_stream += ids
    want_held = heldout_chunk_count(samples)
    if len(held_stream) < seq_len and len(calib_stream) > 2 * seq_len:
        # Too few held-out documents (a small file): carve held-out text off the end of the calibration stream.
        take = min(want_held * seq_len, len(calib_stream) // 5)
        held_stream, calib_stream = calib_stream[-take:] + held_stream, calib_stream[:-take]
    calib = _pack(calib_stream, seq_len, samples)
    held = _pack(held_stream, seq_len, want_held)
    if not calib:
        raise QuantizationError(
            f"{source}: the calibration text is shorter than two tokens", hint="give a longer calibration file"
        )
    calib_t = torch.tensor(calib, dtype=torch.long)
    held_t = torch.tensor(held, dtype=torch.long) if held else torch.zeros((0, 0), dtype=torch.long)
    summary = {
        "source": source,
        "documents": len(docs),
        "heldout_documents": n_held,
        "tokens": len(calib_stream) + len(held_stream),
        "requested_samples": samples,
        "samples": int(calib_t.shape[0]),
        "seq_len": int(calib_t.shape[1]),
        "heldout_samples": int(held_t.shape[0]),
        "heldout_seq_len": int(held_t.shape[1]) if held_t.numel() else 0,
        "heldout_sha256": hashlib.sha256(held_t.numpy().tobytes()).hexdigest()[:16],
    }
    return CalibrationData(calib=calib_t, heldout=held_t, summary=summary)


def load_calibration(spec: BuildSpec, tokenizer: Any) -> CalibrationData:
    """The spec's calibration data, tokenized with the model's tokenizer."""
    path = calibration_source(spec)
    shipped = spec.calibration.file is None
    docs = read_documents(path, "text" if shipped else spec.calibration.field)
    source = "shipped corpus (trtspec/data/calibration.jsonl)" if shipped else str(path)
    data = tokenize_calibration(
        docs, tokenizer, samples=spec.calibration.samples, seq_len=spec.calibration.seq_len, source=source
    )
    data.summary["batch_size"] = spec.calibration.batch_size
    return data


def batches(chunks: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """Consecutive batches of at most ``batch_size`` chunks."""
    return [chunks[i : i + batch_size] for i in range(0, int(chunks.shape[0]), batch_size)]


def forward_loop(
    chunks: torch.Tensor, batch_size: int, progress: Progress | None = None, description: str = "calibrating"
) -> Callable[[Any], None]:
    """A ModelOpt ``forward_loop``: runs every calibration batch through the model, with a progress bar per pass."""
    import torch

    parts = batches(chunks, batch_size)
    passes = 0

    def loop(model: Any) -> None:
        nonlocal passes
        passes += 1
        device = next(model.parameters()).device
        label = description if passes == 1 else f"{description} (pass {passes})"  # AWQ runs the loop several times
        task = progress.add_task(label, total=len(parts)) if progress is not None else None
        with torch.no_grad():
            for batch in parts:
                model(input_ids=batch.to(device), use_cache=False)
                if progress is not None and task is not None:
                    progress.advance(task)

    return loop
