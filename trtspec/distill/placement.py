"""Where `trtspec distill` runs each part: the teacher (the target answering and labelling), the draft's training, and
the held-out evaluation.

The decisions are a pure function of a :class:`Machine` (what the host has), so they are tested without a GPU:

- teacher: on GPUs when there are any, spread over all of them with ``device_map="auto"`` (the target runs where it
  fits), in bfloat16 (float16 on GPUs without bf16); on a CPU, in bfloat16 where the CPU has native bf16 (AVX512-BF16 /
  AMX: teacher-forced labelling ran 616 vs 143 answer tokens/s, top-1 98 % equal to float32 on SmolLM2-135M), else
  float32;
- draft: trains on the first GPU, else on the CPU, with bfloat16 autocast where the device supports it;
- evaluation: the draft is judged against the target as it will serve. On a CPU that is float32 (the torch runtime's
  CPU default), so a bf16 teacher is reloaded in float32 for the report; on GPUs the teacher itself is used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trtspec.distill import DistillError

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Machine:
    """What the host offers for distillation."""

    cuda_devices: int = 0
    cuda_bf16: bool = False  # every visible GPU supports bfloat16 (compute capability >= 8.0)
    cpu_bf16: bool = False  # native bfloat16 matmuls on the CPU (oneDNN: AVX512-BF16 or AMX)

    @classmethod
    def detect(cls) -> Machine:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        cuda_bf16 = n > 0 and all(torch.cuda.get_device_capability(i)[0] >= 8 for i in range(n))
        return cls(n, cuda_bf16, bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


@dataclass(frozen=True)
class Placement:
    """Devices and dtypes of one distillation run (written to the report as ``placement``)."""

    teacher_device: str  # "cuda" (device_map="auto" over every visible GPU) or "cpu"
    teacher_device_map: str | None  # passed to from_pretrained; None: the whole model on ``teacher_device``
    teacher_dtype: str
    draft_device: str  # "cuda:0" or "cpu"
    train_bf16: bool  # bfloat16 autocast for the draft's training matmuls
    eval_dtype: str  # the target's dtype in the held-out report
    gpus: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def reload_for_eval(self) -> bool:
        """True when the report needs the target in another dtype than the teacher's."""
        return self.eval_dtype != self.teacher_dtype


def plan_placement(
    machine: Machine, device: str = "auto", teacher_dtype: str = "auto", train_bf16: bool | None = None
) -> Placement:
    """The placement for ``machine``; ``device`` and ``teacher_dtype`` override the automatic choices."""
    if device not in DEVICES:
        raise DistillError(f"--device {device!r} is not one of {', '.join(DEVICES)}", hint="auto picks the GPUs")
    if teacher_dtype not in DTYPES:
        raise DistillError(
            f"--teacher-dtype {teacher_dtype!r} is not one of {', '.join(DTYPES)}",
            hint="auto: bfloat16 where the hardware has it, else float32 (float16 on old GPUs)",
        )
    if device == "cuda" and machine.cuda_devices == 0:
        raise DistillError("--device cuda: no CUDA GPU is visible", hint="use --device auto or cpu")
    gpu = machine.cuda_devices > 0 and device != "cpu"
    native_bf16 = machine.cuda_bf16 if gpu else machine.cpu_bf16
    if teacher_dtype == "auto":
        teacher_dtype = "bfloat16" if native_bf16 else ("float16" if gpu else "float32")
    if teacher_dtype == "float16" and not gpu:
        raise DistillError(
            "--teacher-dtype float16 needs a GPU (float16 matmuls are slow and lossy on a CPU)",
            hint="use bfloat16 or float32 on a CPU",
        )
    return Placement(
        teacher_device="cuda" if gpu else "cpu",
        teacher_device_map="auto" if gpu else None,
        teacher_dtype=teacher_dtype,
        draft_device="cuda:0" if gpu else "cpu",
        train_bf16=native_bf16 if train_bf16 is None else bool(train_bf16),
        eval_dtype=teacher_dtype if gpu else "float32",
        gpus=machine.cuda_devices if gpu else 0,
    )
