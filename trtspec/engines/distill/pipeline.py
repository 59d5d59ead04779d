"""`trtspec distill` end to end: teacher data -> head tokens -> draft init -> training -> held-out report -> output.

Resumable: the target's answers are cached as shards and the training loop checkpoints, both in a work directory keyed
by a hash of everything they depend on; the output directory is written atomically with a manifest, and an output
already made from the same inputs is kept as it is.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtspec.engines.distill.data import DistillError
from trtspec.engines.distill.train import TrainSettings

REPORT_FILE = "distill_report.json"


@dataclass(frozen=True)
class DistillSettings:
    """Everything `trtspec distill` needs besides the target and output directories."""

    prompts: Path | None = None  # None: the shipped prompt set
    layers: int = 2
    init_layers: tuple[int, ...] | None = None  # the target's layers to start from; None: the first ``layers``
    head_tokens: int = 8192
    intermediate_size: int | None = None  # None: the target's MLP width
    tokens: int = 60_000  # answer tokens of teacher data (at most: the prompts may run out first)
    max_new_tokens: int = 128
    gen_batch_size: int = 32
    top_k: int = 20
    held_out: float = 0.06
    eval_prompts: int = 12
    eval_max_tokens: int = 96
    k: int = 4
    train: TrainSettings = field(default_factory=TrainSettings)

    def validate(self, target_layers: int | None = None, vocab: int | None = None) -> None:
        """Raise DistillError for settings that cannot work (with this target, when its depth and vocabulary are
        given)."""
        max_layers, max_vocab = target_layers or 1 << 20, vocab or 1 << 30
        checks = [
            (1 <= self.layers <= max_layers, f"--layers {self.layers} must be in 1..{target_layers or 'the target depth'}",
             "a draft of 1-2 layers keeps the draft cost ratio c small"),
            (16 <= self.head_tokens <= max_vocab, f"--head-tokens {self.head_tokens} must be in 16..{vocab or 'vocab'}",
             "the head scores the most frequent tokens of the target's answers"),
            (self.intermediate_size is None or self.intermediate_size > 0,
             f"--intermediate-size {self.intermediate_size} must be > 0", "default: the target's MLP width"),
            (self.tokens > 0 and self.max_new_tokens > 0 and self.gen_batch_size > 0 and self.top_k > 0,
             "--tokens, --max-new-tokens, --gen-batch-size and --top-k must be > 0", "use positive values"),
            (0 < self.held_out < 1, f"--held-out {self.held_out} must be in (0, 1)", "e.g. 0.06"),
            (self.eval_prompts > 0 and self.eval_max_tokens > 1, "--eval-prompts and --eval-max-tokens must be > 0",
             "use positive values"),
            (1 <= self.k <= 16, f"--k {self.k} must be in 1..16", "the draft length K of the report"),
            (self.train.steps > 0 and self.train.batch_size > 0 and self.train.lr > 0,
             "--steps, --batch-size and --lr must be > 0", "use positive values"),
        ]
        if self.init_layers is not None:
            checks.append((len(set(self.init_layers)) == len(self.init_layers) == self.layers and all(0 <= i < max_layers
                                                                       for i in self.init_layers),
                           f"--init-layers {','.join(map(str, self.init_layers))} must name {self.layers} "
                           f"distinct layers of the target", "e.g. --init-layers 0,1 with --layers 2"))
        for ok, message, hint in checks:
            if not ok:
                raise DistillError(message, hint=hint)

    def data_settings(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "gen_batch_size": self.gen_batch_size, "top_k": self.top_k,
                "held_out": self.held_out}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompts"] = str(self.prompts) if self.prompts else None
        return d


@dataclass
class DistillResult:
    out: Path
    report: dict[str, Any]
    skipped: bool = False


def default_work_dir(out: Path) -> Path:
    """Where teacher shards and checkpoints live by default: a hidden sibling of the output directory."""
    return out.parent / f".{out.name}.distill-work"


def _check_dirs(target_dir: Path, out: Path) -> None:
    if not target_dir.is_dir():
        raise DistillError(f"{target_dir}: target directory not found", hint="pass --target DIR (a local HF model)")
    if not (target_dir / "config.json").is_file():
        raise DistillError(f"{target_dir}: not a model directory (no config.json)",
                           hint="pass --target DIR (a local HF model with its tokenizer)")
    t, o = target_dir.resolve(), out.resolve()
    if o == t or t in o.parents or o in t.parents:
        raise DistillError(f"--out {out} overlaps the target directory {target_dir}",
                           hint="write the draft to a directory of its own")
    if out.exists() and not out.is_dir():
        raise DistillError(f"--out {out} exists and is not a directory", hint="choose another output path")


def _short_hash(*parts: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def distill(target_dir: Path, out: Path, settings: DistillSettings, *, work_dir: Path | None = None,
            progress: Any | None = None) -> DistillResult:
    """Distill a draft for the target in ``target_dir`` into ``out`` (a loadable HF directory + report)."""
    from trtspec.build.artifacts import atomic_dir, hash_inputs, is_up_to_date, tool_versions, write_manifest
    from trtspec.engines.distill.data import (generate_teacher_data, load_prompts, select_head_tokens, shipped_prompts,
                                              split_prompts, token_counts, encode_prompt)
    from trtspec.engines.distill.model import draft_from_target, register
    from trtspec.engines.distill.report import measure
    from trtspec.engines.distill.train import train
    from trtspec.engines.torch_runtime.loading import load_model, load_tokenizer
    from trtspec.engines.torch_runtime.session import eos_ids_of

    target_dir, out = Path(target_dir), Path(out)
    _check_dirs(target_dir, out)
    prompts_path = settings.prompts or shipped_prompts()
    prompts = load_prompts(prompts_path)
    t_start = time.perf_counter()
    inputs_hash = hash_inputs({"target": target_dir, "prompts": prompts_path}, settings.to_dict())
    if is_up_to_date(out, inputs_hash) and (out / REPORT_FILE).is_file():
        return DistillResult(out, json.loads((out / REPORT_FILE).read_text()), skipped=True)

    register()
    target = load_model(target_dir)
    tokenizer = load_tokenizer(target_dir)
    if not hasattr(getattr(target, "model", None), "layers") or not hasattr(target.model, "norm"):
        raise DistillError(f"{target_dir}: {type(target).__name__} is not a Llama-style decoder (model.layers, "
                           "model.norm)", hint="distill supports Llama-family targets (Llama, SmolLM, Mistral, Qwen2)")
    vocab = int(target.get_input_embeddings().weight.shape[0])
    settings.validate(int(target.config.num_hidden_layers), vocab)
    eos = eos_ids_of(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    train_prompts, test_prompts = split_prompts(prompts, settings.held_out)
    work = Path(work_dir) if work_dir else default_work_dir(out)
    data_key = _short_hash(inputs_hash_of_data(target_dir, prompts_path, settings))
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    task = progress.add_task("target answers (tokens)", total=settings.tokens) if progress else None
    samples = generate_teacher_data(
        target, tokenizer, train_prompts, work / f"teacher-{data_key}", max_new_tokens=settings.max_new_tokens,
        tokens=settings.tokens, batch_size=settings.gen_batch_size, top_k=settings.top_k, eos_ids=eos,
        on_batch=(lambda n: progress.advance(task, n)) if progress else None)
    if progress:
        progress.update(task, completed=settings.tokens)
    timings["teacher_data_s"] = time.perf_counter() - t0

    head = select_head_tokens(token_counts(samples, vocab), settings.head_tokens, eos)
    layers = settings.init_layers or tuple(range(settings.layers))
    draft = draft_from_target(target, layers, head, settings.intermediate_size)
    t0 = time.perf_counter()
    task = progress.add_task("training (steps)", total=settings.train.steps) if progress else None
    ckpt = work / f"checkpoint-{_short_hash(data_key, settings.to_dict())}.pt"

    def on_step(log) -> None:
        if progress:
            progress.update(task, completed=log.step,
                            description=f"training (steps) loss {log.loss:.3f} top-1 {log.top1:.2f}")

    logs = train(draft, samples, settings.train, ckpt, pad_id=pad, on_step=on_step)
    timings["train_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    eval_ids = [encode_prompt(tokenizer, p) for p in test_prompts[: settings.eval_prompts]]
    if progress:
        task = progress.add_task("held-out evaluation", total=None)
    report = measure(target, draft, eval_ids, k=settings.k, max_tokens=settings.eval_max_tokens, eos_ids=eos,
                     pad_id=pad, head_tokens=head).to_dict()
    timings["eval_s"] = time.perf_counter() - t0
    if progress:
        progress.update(task, total=1, completed=1)
    timings["total_s"] = time.perf_counter() - t_start
    report.update({
        "train_answer_tokens": sum(len(s.answer) for s in samples), "train_prompts": len(samples),
        "final_loss": logs[-1].loss if logs else None, "final_top1": logs[-1].top1 if logs else None,
        "draft_parameters": sum(p.numel() for n, p in draft.named_parameters() if "embed_tokens" not in n),
        **{k: round(v, 1) for k, v in timings.items()}})
    with atomic_dir(out) as tmp:
        draft.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if (target_dir / "generation_config.json").is_file():
            shutil.copy2(target_dir / "generation_config.json", tmp / "generation_config.json")
        (tmp / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
        write_manifest(tmp, {"stage": "distill", "inputs_hash": inputs_hash, "target": str(target_dir),
                             "settings": settings.to_dict(), "report": report,
                             "tools": tool_versions("torch", "transformers")})
    shutil.rmtree(ckpt, ignore_errors=True) if ckpt.is_dir() else ckpt.unlink(missing_ok=True)
    return DistillResult(out, report)


def inputs_hash_of_data(target_dir: Path, prompts_path: Path, settings: DistillSettings) -> str:
    """What the teacher data depends on: the target, the prompts and the generation settings (not the draft's)."""
    from trtspec.build.artifacts import hash_inputs

    return hash_inputs({"target": target_dir, "prompts": prompts_path}, settings.data_settings())
