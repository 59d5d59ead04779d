"""Quality of a quantized pair: top-1 agreement and perplexity against the unquantized model on held-out text, and
the draft-target top-1 agreement (a cheap predictor of the greedy acceptance rate) before and after quantization.

Each quantize stage evaluates its model before and after calibration on the held-out chunks and keeps the per-position
top-1 tokens in ``build/<role>/quality/eval.npz``; :func:`write_quality_report` combines both roles into
``build/quality.json``. A role that is not quantized (served from its source) is evaluated from its source directory.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.build.artifacts import read_manifest
from trtspec.build.formats import Quantization
from trtspec.build.layout import QUALITY_REPORT, ROLES, checkpoint_dir
from trtspec.spec import BuildSpec

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress

EVAL_FILE = Path("quality") / "eval.npz"
REPORT = QUALITY_REPORT
SOURCE_EVAL_CACHE = ".quality"  # under build/: evaluations of unquantized sources


@dataclass
class EvalResult:
    """Per-position top-1 predictions and the summed negative log-likelihood on held-out chunks."""

    top1: Any  # numpy int32 [chunks, seq_len - 1]
    nll_sum: float
    tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_sum / self.tokens) if self.tokens else float("nan")


def evaluate(
    model: Any,
    heldout: torch.Tensor,
    batch_size: int,
    progress: Progress | None = None,
    description: str = "evaluating",
) -> EvalResult:
    """Teacher-forced evaluation of a causal LM on held-out token chunks."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    tops, nll, count = [], 0.0, 0
    chunks = [heldout[i : i + batch_size] for i in range(0, int(heldout.shape[0]), batch_size)]
    task = progress.add_task(description, total=len(chunks)) if progress is not None else None
    with torch.no_grad():
        for batch in chunks:
            batch = batch.to(device)
            logits = model(input_ids=batch, use_cache=False).logits[:, :-1].float()
            target = batch[:, 1:]
            nll += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"))
            count += int(target.numel())
            tops.append(logits.argmax(-1).to(torch.int32).cpu().numpy())
            if progress is not None and task is not None:
                progress.advance(task)
    top1 = np.concatenate(tops) if tops else np.zeros((0, 0), dtype=np.int32)
    return EvalResult(top1=top1, nll_sum=nll, tokens=count)


def agreement(a: Any, b: Any) -> float | None:
    """Fraction of positions where two top-1 arrays agree (None when they do not cover the same positions)."""
    if a is None or b is None or a.shape != b.shape or a.size == 0:
        return None
    return float((a == b).mean())


def role_metrics(before: EvalResult, after: EvalResult) -> dict[str, Any]:
    """Manifest fields: top-1 agreement and perplexity before/after quantization."""
    pb, pa = before.perplexity, after.perplexity
    return {
        "top1_agreement": agreement(before.top1, after.top1),
        "perplexity_before": pb,
        "perplexity_after": pa,
        "perplexity_change_pct": 100.0 * (pa - pb) / pb if pb else None,
        "heldout_tokens": before.tokens,
    }


def save_eval(out_dir: Path, before: EvalResult, after: EvalResult) -> None:
    """Keep the per-position top-1 tokens, so the draft-target agreement can be computed once both roles exist."""
    import numpy as np

    path = Path(out_dir) / EVAL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, before=before.top1, after=after.top1)


def _load_eval(directory: Path) -> dict[str, Any] | None:
    import numpy as np

    path = Path(directory) / EVAL_FILE
    if not path.is_file():
        return None
    with np.load(path) as data:
        return {"before": data["before"], "after": data["after"]}


def _source_eval(spec: BuildSpec, role: str, progress: Progress | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Evaluate an unquantized role from its source directory (it is served as is); cached in build/.quality/."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.build.artifacts import hash_inputs
    from trtspec.build.calibration import calibration_source, load_calibration
    from trtspec.build.quiet import quiet_libraries

    src = spec.model_path(role)
    c = spec.calibration
    key = hash_inputs(
        {"model": src, "calibration": calibration_source(spec)},
        {
            "what": "source evaluation",
            "version": 1,
            "samples": c.samples,
            "seq_len": c.seq_len,
            "batch_size": c.batch_size,
            "field": c.field if c.file else None,
        },
    )
    cache = spec.build_dir / SOURCE_EVAL_CACHE / f"{role}.npz"
    if cache.is_file():
        with np.load(cache) as data:
            if str(data["key"]) == key:
                metrics = json.loads(str(data["metrics"]))
                return metrics, {"before": data["top1"], "after": data["top1"]}
    with quiet_libraries([]):
        data = load_calibration(spec, AutoTokenizer.from_pretrained(src))
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    result = evaluate(model, data.heldout, c.batch_size, progress, f"evaluating {role} (source)")
    metrics = {
        "format": "none",
        "top1_agreement": 1.0,
        "perplexity_before": result.perplexity,
        "perplexity_after": result.perplexity,
        "perplexity_change_pct": 0.0,
        "heldout_tokens": result.tokens,
        "heldout_sha256": data.summary["heldout_sha256"],
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{role}.{os.getpid()}.npz")
    np.savez_compressed(tmp, key=np.array(key), metrics=np.array(json.dumps(metrics)), top1=result.top1)
    tmp.replace(cache)
    return metrics, {"before": result.top1, "after": result.top1}


def build_quality_report(spec: BuildSpec, progress: Progress | None = None) -> dict[str, Any]:
    """Combine both roles' quality figures (evaluating unquantized roles from source) into one report."""
    models: dict[str, Any] = {}
    evals: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for role in ROLES:
        model = getattr(spec, role)
        manifest = read_manifest(checkpoint_dir(spec, role))
        if manifest is not None and manifest.get("quality"):
            models[role] = {
                "format": manifest.get("format"),
                "kv_cache": manifest.get("kv_cache"),
                **manifest["quality"],
                "heldout_sha256": manifest.get("calibration", {}).get("heldout_sha256"),
            }
            loaded = _load_eval(checkpoint_dir(spec, role))
            if loaded is not None:
                evals[role] = loaded
        elif model.quantization is Quantization.NONE and model.kv_cache.value == "auto":
            models[role], evals[role] = _source_eval(spec, role, progress)
        else:
            notes.append(f"{role}: not quantized yet (run `trtspec quantize --only {role}`)")
    pair: dict[str, Any] = {"before": None, "after": None}
    if set(evals) == set(ROLES):
        if models["target"].get("heldout_sha256") != models["draft"].get("heldout_sha256"):
            notes.append(
                "target and draft were evaluated on different held-out text (different tokenizers or "
                "calibration settings); no draft-target agreement"
            )
        else:
            pair = {
                "before": agreement(evals["target"]["before"], evals["draft"]["before"]),
                "after": agreement(evals["target"]["after"], evals["draft"]["after"]),
            }
    return {
        "models": models,
        "draft_target_top1_agreement": pair,
        "notes": notes,
        "definition": "top-1 agreement: fraction of held-out positions where two models' argmax tokens match "
        "(teacher-forced); draft-target agreement predicts the greedy acceptance rate",
    }


def write_quality_report(spec: BuildSpec, progress: Progress | None = None) -> dict[str, Any]:
    """Write ``build/quality.json`` (atomically) and return it."""
    report = build_quality_report(spec, progress)
    path = spec.build_dir / REPORT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{REPORT}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return report
