"""Settings of `trtspec distill` (plain dataclasses: validated before anything heavy is imported).

A field with ``cli(...)`` metadata is a flag of `trtspec distill` (trtspec.cli.distill_cmds derives the flags from
these classes): its name (``--`` + the field name with dashes, or ``flag``), its default and its help are written
here only. Fields without it (warmup, weight_decay, ...) keep their defaults and have no flag."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from trtspec.distill import DistillError
from trtspec.errors import TrtspecError
from trtspec.prompts import HELD_OUT
from trtspec.speculative.rules import check_max_draft_len

LOSSES = ("fkl", "tvd", "fkl+ce")


def cli(help: str, *, flag: str | None = None, parse: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Field metadata that makes a setting a `trtspec distill` flag: its help, its name when it is not the field's
    (``flag``), and ``parse`` for a setting given as text (the flag then takes a string)."""
    return {"help": help, "flag": flag, "parse": parse}


def parse_layers(text: str) -> tuple[int, ...]:
    """``--init-layers 0,1`` as layer indices."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DistillError(
            f"--init-layers {text!r} is not a comma-separated list of layer indices", hint="e.g. --init-layers 0,1"
        ) from None


@dataclass(frozen=True)
class TrainSettings:
    """Optimization settings (the checkpoint refuses to resume under different ones)."""

    steps: int = field(default=600, metadata=cli("training steps"))
    batch_size: int = field(default=16, metadata=cli("answers per training step"))
    lr: float = field(default=1e-3, metadata=cli("peak learning rate (AdamW, cosine decay)"))
    warmup: int = 20
    weight_decay: float = 0.0
    teacher_temperature: float = 1.0
    seed: int = field(default=0, metadata=cli("seed of the training order"))
    checkpoint_every: int = 25
    # bfloat16 autocast: 2-3x faster where the CPU has AVX512-BF16/AMX; None: as the placement decides
    bf16: bool | None = field(
        default=None, metadata=cli("bfloat16 autocast while training (default: where the device supports it)")
    )
    # fkl: cross-entropy to the target's top-k; tvd: total variation; fkl+ce: fkl plus greedy CE
    loss: str = field(
        default="fkl", metadata=cli("fkl (target's top-k), tvd (total variation) or fkl+ce (plus the greedy label)")
    )


@dataclass(frozen=True)
class DistillSettings:
    """Everything `trtspec distill` needs besides the target and output directories."""

    prompts: Path | None = field(
        default=None,
        metadata=cli("prompts the target answers (one per line, or JSONL: 'prompt' or 'messages'); default: shipped"),
    )
    layers: int = field(default=2, metadata=cli("draft depth (decoder layers)"))
    init_layers: tuple[int, ...] | None = field(
        default=None,
        metadata=cli("target layers to start from, e.g. 0,1 (default: the first --layers)", parse=parse_layers),
    )
    head_tokens: int = field(
        default=8192,
        metadata=cli("head width: the most frequent tokens of the target's answers that the draft can propose"),
    )
    intermediate_size: int | None = field(default=None, metadata=cli("MLP width (default: the target's)"))
    # at most: the prompts may run out first
    tokens: int = field(default=110_000, metadata=cli("answer tokens of training data the target generates (at most)"))
    max_new_tokens: int = field(default=128, metadata=cli("answer length per prompt"))
    gen_batch_size: int = field(default=64, metadata=cli("prompts answered per batch"))
    answers_per_prompt: int = field(
        default=2, metadata=cli("answers per prompt: the first greedy, the others sampled")
    )  # sampled at sample_temperature
    sample_temperature: float = field(default=0.8, metadata=cli("temperature of the sampled answers"))
    top_k: int = field(default=20, metadata=cli("teacher distribution: the target's top-k"))
    held_out: float = field(default=HELD_OUT, metadata=cli("fraction of prompts held out"))
    eval_prompts: int = field(default=12, metadata=cli("held-out prompts in the report"))
    eval_max_tokens: int = field(default=96, metadata=cli("answer length in the report"))
    k: int = field(
        default=4,
        metadata=cli("K the report measures at (the deployment's speculative.max_draft_len)", flag="--max-draft-len"),
    )
    # where the draft trains and the teacher runs
    device: str = field(
        default="auto",
        metadata=cli("auto (the GPUs when there are any: teacher device_map=auto, draft on the first), cpu or cuda"),
    )
    teacher_dtype: str = field(  # auto: as the placement decides (bfloat16 where the hardware has it, else float32)
        default="auto",
        metadata=cli("auto (bfloat16 where the hardware has it), float32, bfloat16, float16 (GPU)"),
    )
    ngram_pool: bool = field(  # the n-gram drafter's pool, from the teacher answers
        default=True, metadata=cli("write ngram_pool.npz for the n-gram and hybrid drafters")
    )
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
        try:  # the one K rule (trtspec.speculative.rules), in distill's error type
            check_max_draft_len(self.k, "--max-draft-len")
        except TrtspecError as exc:
            raise DistillError(str(exc), hint=exc.hint) from None
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
