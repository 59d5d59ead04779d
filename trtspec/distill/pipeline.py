"""`trtspec distill` end to end: teacher data -> head tokens -> draft init -> training -> held-out report -> output.

The output is a standard checkpoint of the target's family (``model.to_standard``) plus ``ngram_pool.npz`` (the
n-gram drafter's pool, from the same teacher answers or a traffic file) and ``distill_report.json``, which records
where each part ran (``placement``).

Resumable: the target's answers are cached as shards and the training loop checkpoints, both in a work directory keyed
by a hash of everything they depend on; the output directory is written atomically with a manifest, and an output
already made from the same inputs is kept as it is.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.distill import DistillError
from trtspec.distill.settings import DistillSettings

if TYPE_CHECKING:
    from trtspec.distill.placement import Placement
    from trtspec.prompts import Prompt

REPORT_FILE = "distill_report.json"


@dataclass
class DistillResult:
    out: Path
    report: dict[str, Any]
    skipped: bool = False


def default_work_dir(out: Path) -> Path:
    """Where teacher shards and checkpoints live by default: a hidden sibling of the output directory."""
    return out.parent / f".{out.name}.distill-work"


def check_dirs(target_dir: Path, out: Path) -> None:
    """Raise DistillError unless ``target_dir`` is a model directory and ``out`` a separate, writable place."""
    if not target_dir.is_dir():
        raise DistillError(f"{target_dir}: target directory not found", hint="pass --target DIR (a local HF model)")
    if not (target_dir / "config.json").is_file():
        raise DistillError(
            f"{target_dir}: not a model directory (no config.json)",
            hint="pass --target DIR (a local HF model with its tokenizer)",
        )
    t, o = target_dir.resolve(), out.resolve()
    if o == t or t in o.parents or o in t.parents:
        raise DistillError(
            f"--out {out} overlaps the target directory {target_dir}", hint="write the draft to a directory of its own"
        )
    if out.exists() and not out.is_dir():
        raise DistillError(f"--out {out} exists and is not a directory", hint="choose another output path")


def _short_hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _combine(hashes: dict[str, str], settings: dict[str, Any]) -> str:
    """``artifacts.hash_inputs`` over already hashed paths (the target is hashed once, not once per use)."""
    h = hashlib.sha256()
    for name in sorted(hashes):
        h.update(name.encode() + b"=" + hashes[name].encode() + b";")
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return h.hexdigest()


def check_inputs(target_dir: Path, out: Path, settings: DistillSettings, traffic: Path | None) -> None:
    """What needs no model (so the CLI runs it before importing torch): the settings, the directories, the traffic
    file."""
    settings.validate()
    check_dirs(target_dir, out)
    if traffic is not None and not Path(traffic).is_file():
        raise DistillError(
            f"{traffic}: n-gram traffic file not found", hint="one text per line, or JSONL with 'response'"
        )


def distill(
    target_dir: Path,
    out: Path,
    settings: DistillSettings,
    *,
    work_dir: Path | None = None,
    progress: Any | None = None,
    machine: Any | None = None,
    traffic: Path | None = None,
) -> DistillResult:
    """Distill a draft for the target in ``target_dir`` into ``out`` (a loadable HF directory + report); ``machine``
    (default: detected) decides the placement, ``traffic`` (texts) replaces the teacher answers as the n-gram pool."""
    from trtspec.build.artifacts import hash_dir
    from trtspec.build.stages import SKIPPED, Stage, run_stage
    from trtspec.distill.placement import Machine, plan_placement
    from trtspec.prompts import load_prompts, shipped_prompts

    target_dir, out = Path(target_dir), Path(out)
    check_inputs(target_dir, out, settings, traffic)
    placement = plan_placement(
        machine or Machine.detect(), settings.device, settings.teacher_dtype, settings.train.bf16
    )
    settings = replace(settings, train=replace(settings.train, bf16=placement.train_bf16))
    prompts_path = settings.prompts or shipped_prompts()
    prompts = load_prompts(prompts_path)
    paths: dict[str, Path | None] = {"target": target_dir, "prompts": Path(prompts_path)}
    if traffic is not None:
        paths["traffic"] = Path(traffic)
    hashes = {name: hash_dir(p) for name, p in paths.items() if p is not None}  # hashed once, used twice
    stage_settings = {**settings.to_dict(), "placement": placement.to_dict()}
    made: dict[str, Any] = {}

    def body(tmp: Path, progress: Any) -> dict:
        made["report"] = _distill_into(
            tmp, target_dir, settings, placement, prompts, hashes, work_dir, progress, traffic, out
        )
        return {"target": str(target_dir), "report": made["report"]}

    stage = Stage(
        "distill",
        out,
        inputs=lambda: (paths, stage_settings),
        body=body,
        inputs_hash=_combine(hashes, stage_settings),  # artifacts.hash_inputs of the same, from the hashes above
        complete=lambda d: (d / REPORT_FILE).is_file(),
    )
    result = run_stage(stage, progress=progress)
    if result.status == SKIPPED:
        return DistillResult(out, json.loads((out / REPORT_FILE).read_text()), skipped=True)
    return DistillResult(out, made["report"])


def _distill_into(
    tmp: Path,
    target_dir: Path,
    settings: DistillSettings,
    placement: Placement,
    prompts: list[Prompt],
    hashes: dict[str, str],
    work_dir: Path | None,
    progress: Any,
    traffic: Path | None,
    out: Path,
) -> dict[str, Any]:
    """Everything after the up-to-date test: teacher data, training, the held-out report, the output in ``tmp``."""
    from trtspec.distill.data import generate_teacher_data, select_head_tokens, token_counts
    from trtspec.distill.model import draft_from_target, source_weights
    from trtspec.distill.report import measure
    from trtspec.distill.train import train
    from trtspec.prompts import encode, split_prompts
    from trtspec.runtimes.torch.draft_model import register
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer
    from trtspec.runtimes.torch.session import eos_ids_of

    register()
    target = load_model(target_dir, placement.teacher_dtype, device_map=placement.teacher_device_map)
    tokenizer = load_tokenizer(target_dir)
    if not hasattr(getattr(target, "model", None), "layers") or not hasattr(target.model, "norm"):
        raise DistillError(
            f"{target_dir}: {type(target).__name__} is not a Llama-style decoder (model.layers, model.norm)",
            hint="distill supports Llama-family targets (Llama, SmolLM, Mistral, Qwen2)",
        )
    vocab = int(target.get_input_embeddings().weight.shape[0])
    settings.validate(int(target.config.num_hidden_layers), vocab)
    eos = eos_ids_of(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    train_prompts, test_prompts = split_prompts(prompts, settings.held_out)
    work = Path(work_dir) if work_dir else default_work_dir(out)
    # Teacher data depends on the target, the prompts and how they are answered, not on the draft's settings.
    data_key = _short_hash(_combine(hashes, settings.data_settings(placement.teacher_dtype)))
    timings: dict[str, float] = {}

    task = (
        progress.add_task(
            f"target answers (tokens, {placement.teacher_device} {placement.teacher_dtype})", total=settings.tokens
        )
        if progress
        else None
    )
    samples, timings["teacher_data_s"] = generate_teacher_data(
        target,
        tokenizer,
        train_prompts,
        work / f"teacher-{data_key}",
        max_new_tokens=settings.max_new_tokens,
        tokens=settings.tokens,
        batch_size=settings.gen_batch_size,
        top_k=settings.top_k,
        eos_ids=eos,
        answers_per_prompt=settings.answers_per_prompt,
        sample_temperature=settings.sample_temperature,
        on_batch=(lambda n: progress.advance(task, n)) if progress else None,
    )
    if progress:  # the prompts may run out before --tokens
        n = sum(len(s.answer) for s in samples)
        progress.update(task, total=n, completed=n)

    head = select_head_tokens(token_counts(samples, vocab), settings.head_tokens, eos)
    layers = settings.init_layers or tuple(range(settings.layers))
    # From the target's own float32 tensors (the teacher may be bfloat16, or spread over GPUs).
    init = source_weights(target_dir, layers) if placement.teacher_dtype != "float32" or placement.gpus else None
    draft = draft_from_target(target, layers, head, settings.intermediate_size, init)
    draft = draft.to(placement.draft_device)  # type: ignore[arg-type]  # transformers' decorated to() takes a device
    task = (
        progress.add_task(f"training (steps, {placement.draft_device})", total=settings.train.steps)
        if progress
        else None
    )
    ckpt = work / f"checkpoint-{_short_hash(data_key, settings.to_dict())}.pt"

    def on_step(log) -> None:
        if progress:
            progress.update(
                task, completed=log.step, description=f"training (steps) loss {log.loss:.3f} top-1 {log.top1:.2f}"
            )

    logs, timings["train_s"] = train(draft, samples, settings.train, ckpt, pad_id=pad, on_step=on_step)

    t0 = time.perf_counter()
    pool = build_pool(samples, tokenizer, target_dir, vocab, traffic) if settings.ngram_pool else None
    eval_target = target
    if placement.reload_for_eval:  # the report judges the draft against the target as it serves (float32 on a CPU)
        del target
        eval_target = load_model(target_dir, placement.eval_dtype)
    eval_ids = [encode(tokenizer, p) for p in test_prompts[: settings.eval_prompts]]
    if progress:
        task = progress.add_task("held-out evaluation", total=None)
    report = measure(
        eval_target,
        draft.eval(),
        eval_ids,
        k=settings.k,
        max_tokens=settings.eval_max_tokens,
        eos_ids=eos,
        pad_id=pad,
        head_tokens=head,
        pool=pool,
    ).to_dict()
    timings["eval_s"] = time.perf_counter() - t0
    if progress:
        progress.update(task, total=1, completed=1)
    # Summed over resumed runs (shards and checkpoints record their seconds); loading and hashing are not counted.
    timings["total_s"] = sum(timings.values())
    report.update(
        {
            "train_answer_tokens": sum(len(s.answer) for s in samples),
            "train_prompts": len(samples),
            "final_loss": logs[-1].loss if logs else None,
            "final_top1": logs[-1].top1 if logs else None,
            "draft_parameters": sum(p.numel() for n, p in draft.named_parameters() if "embed_tokens" not in n),
            "placement": placement.to_dict(),
            "loss": settings.train.loss,
            **{k: round(v, 3) for k, v in timings.items()},
        }
    )
    standard = to_standard_cpu(draft, eval_target.config)
    _write_output(tmp, standard, tokenizer, target_dir, report, pool)
    ckpt.unlink(missing_ok=True)  # the teacher shards stay: another draft shape can reuse them
    return report


def to_standard_cpu(draft: Any, target_config: Any) -> Any:
    """The trained draft as a standard checkpoint of the target's family, in float32 on the CPU."""
    from trtspec.distill.model import to_standard

    return to_standard(draft.float().cpu(), target_config)


def build_pool(samples: Any, tokenizer: Any, target_dir: Path, vocab: int, traffic: Path | None) -> Any:
    """The n-gram pool: the teacher answers with the target's greedy label at every position (sampled answers
    included: their contexts are the target's kind of text, their labels its choices), or a traffic file's texts."""
    from trtspec.build.tokenizers import read_tokenizer
    from trtspec.speculative.drafters.ngram import MAX_MATCH, NgramPool, vocab_fingerprint

    # the fingerprint `trtspec check` compares (its tokenizer reader, not transformers')
    meta = {"tokenizer_sha256": vocab_fingerprint(read_tokenizer(target_dir).vocab)}
    if traffic is not None:
        from trtspec.prompts import load_texts

        texts = load_texts(Path(traffic))
        seqs = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return NgramPool.from_sequences(
            seqs, vocab_size=vocab, meta={**meta, "source": f"traffic:{Path(traffic).name}", "documents": len(seqs)}
        )
    seqs, labels = [], []
    for s in samples:
        s0 = max(0, s.start - MAX_MATCH)
        seqs.append(s.ids[s0:].tolist())
        labels.append([-1] * (s.start - 1 - s0) + s.topk_ids[:, 0].tolist() + [-1])
    return NgramPool.from_sequences(
        seqs, labels, vocab_size=vocab, meta={**meta, "source": "teacher answers", "documents": len(seqs)}
    )


def _write_output(
    tmp: Path, draft: Any, tokenizer: Any, target_dir: Path, report: dict[str, Any], pool: Any | None
) -> None:
    """The draft as an HF directory (weights, config, tokenizer, generation config), its pool and report, written
    into the stage's temporary directory (the runner adds the manifest and renames it into place)."""
    from trtspec.speculative.drafters.ngram import POOL_FILE

    draft.save_pretrained(tmp, safe_serialization=True)
    if pool is not None:
        pool.save(tmp / POOL_FILE)
    tokenizer.save_pretrained(tmp)
    if (target_dir / "generation_config.json").is_file():
        shutil.copy2(target_dir / "generation_config.json", tmp / "generation_config.json")
    (tmp / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
