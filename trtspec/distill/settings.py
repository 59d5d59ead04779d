"""Settings of `trtspec distill` (plain dataclasses: validated before anything heavy is imported)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtspec.distill import DistillError

LOSSES = ("fkl", "tvd", "fkl+ce")


@dataclass(frozen=True)
class TrainSettings:
    """Optimization settings (the checkpoint refuses to resume under different ones)."""

    steps: int = 600
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    teacher_temperature: float = 1.0
    seed: int = 0
    checkpoint_every: int = 25
    bf16: bool | None = None  # bfloat16 autocast (2-3x faster where the CPU has AVX512-BF16/AMX); None: placement
    loss: str = "fkl"  # fkl: cross-entropy to the target's top-k; tvd: total variation; fkl+ce: fkl plus greedy CE


@dataclass(frozen=True)
class DistillSettings:
    """Everything `trtspec distill` needs besides the target and output directories."""

    prompts: Path | None = None  # None: the shipped prompt set
    layers: int = 2
    init_layers: tuple[int, ...] | None = None  # the target's layers to start from; None: the first ``layers``
    head_tokens: int = 8192
    intermediate_size: int | None = None  # None: the target's MLP width
    tokens: int = 110_000  # answer tokens of teacher data (at most: the prompts may run out first)
    max_new_tokens: int = 128
    gen_batch_size: int = 64
    answers_per_prompt: int = 2  # the first greedy, the others sampled at sample_temperature
    sample_temperature: float = 0.8
    top_k: int = 20
    held_out: float = 0.06
    eval_prompts: int = 12
    eval_max_tokens: int = 96
    k: int = 4
    device: str = "auto"  # where the draft trains and the teacher runs: auto (GPUs when there are any), cpu, cuda
    teacher_dtype: str = "auto"  # auto: bfloat16 where the hardware has it (see placement), else float32
    ngram_pool: bool = True  # write ngram_pool.npz (the n-gram drafter's pool) from the teacher answers
    train: TrainSettings = field(default_factory=TrainSettings)

    def validate(self, target_layers: int | None = None, vocab: int | None = None) -> None:
        """Raise DistillError for settings that cannot work (with this target when its depth and vocabulary are
        given)."""
        depth = target_layers or 1 << 20
        checks = [
            (
                1 <= self.layers <= depth,
                f"--layers {self.layers} must be in 1..{target_layers or 'the target depth'}",
                "a draft of 1-2 layers keeps the draft cost ratio c small",
            ),
            (
                16 <= self.head_tokens <= (vocab or 1 << 30),
                f"--head-tokens {self.head_tokens} must be in 16..{vocab or 'the vocabulary size'}",
                "the head scores the most frequent tokens of the target's answers",
            ),
            (
                self.intermediate_size is None or self.intermediate_size > 0,
                f"--intermediate-size {self.intermediate_size} must be > 0",
                "default: the target's MLP width",
            ),
            (
                min(self.tokens, self.max_new_tokens, self.gen_batch_size, self.top_k) > 0,
                "--tokens, --max-new-tokens, --gen-batch-size and --top-k must be > 0",
                "use positive values",
            ),
            (
                1 <= self.answers_per_prompt <= 16 and self.sample_temperature > 0,
                "--answers-per-prompt must be in 1..16 and --sample-temperature > 0",
                "e.g. --answers-per-prompt 2 --sample-temperature 0.8",
            ),
            (0 < self.held_out < 1, f"--held-out {self.held_out} must be in (0, 1)", "e.g. 0.06"),
            (
                self.eval_prompts > 0 and self.eval_max_tokens > 1,
                "--eval-prompts must be > 0 and --eval-max-tokens > 1",
                "use positive values",
            ),
            (1 <= self.k <= 16, f"--k {self.k} must be in 1..16", "the draft length K of the report"),
            (
                self.train.steps > 0 and self.train.batch_size > 0 and self.train.lr > 0,
                "--steps, --batch-size and --lr must be > 0",
                "use positive values",
            ),
            (
                self.train.loss in LOSSES,
                f"--loss {self.train.loss!r} is not one of {', '.join(LOSSES)}",
                "fkl (the default) matches the target's top-k distribution",
            ),
            (
                self.device in ("auto", "cpu", "cuda"),
                f"--device {self.device!r} is not one of auto, cpu, cuda",
                "auto uses the GPUs when there are any",
            ),
            (
                self.teacher_dtype in ("auto", "float32", "bfloat16", "float16"),
                f"--teacher-dtype {self.teacher_dtype!r} is not one of auto, float32, bfloat16, float16",
                "auto: bfloat16 where the hardware has it",
            ),
        ]
        if self.init_layers is not None:
            layers = self.init_layers
            ok = len(set(layers)) == len(layers) == self.layers and all(0 <= i < depth for i in layers)
            checks.append(
                (
                    ok,
                    f"--init-layers {','.join(map(str, layers))} must name {self.layers} distinct layers of the target",
                    "e.g. --init-layers 0,1 with --layers 2",
                )
            )
        for ok, message, hint in checks:
            if not ok:
                raise DistillError(message, hint=hint)

    def data_settings(self, teacher_dtype: str) -> dict[str, Any]:
        """What the teacher data depends on (``teacher_dtype`` resolved by the placement, never "auto")."""
        d: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "gen_batch_size": self.gen_batch_size,
            "top_k": self.top_k,
            "held_out": self.held_out,
            "answers_per_prompt": self.answers_per_prompt,
            "sample_temperature": self.sample_temperature,
        }
        if teacher_dtype != "float32":  # float32 teacher data keeps the key it had before teacher dtypes existed
            d["teacher_dtype"] = teacher_dtype
        return d

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompts"] = str(self.prompts) if self.prompts else None
        return d
