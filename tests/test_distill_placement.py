"""Where `trtspec distill` runs each part, decided for machines this one is not (no GPU is needed to test it)."""

from __future__ import annotations

import pytest

from trtspec.distill import DistillError
from trtspec.distill.placement import Machine, plan_placement


def test_gpus_take_the_teacher_across_all_of_them_in_bf16_and_the_draft_on_the_first():
    p = plan_placement(Machine(cuda_devices=4, cuda_bf16=True, cpu_bf16=True))
    assert (p.teacher_device, p.teacher_device_map, p.teacher_dtype) == ("cuda", "auto", "bfloat16")
    assert (p.draft_device, p.train_bf16, p.eval_dtype, p.gpus) == ("cuda:0", True, "bfloat16", 4)
    assert not p.reload_for_eval


def test_gpus_without_bf16_use_float16_and_train_in_float32():
    p = plan_placement(Machine(cuda_devices=1, cuda_bf16=False))
    assert (p.teacher_dtype, p.train_bf16, p.draft_device) == ("float16", False, "cuda:0")


def test_a_bf16_cpu_labels_in_bf16_and_reports_against_the_float32_target():
    p = plan_placement(Machine(cuda_devices=0, cpu_bf16=True))
    assert (p.teacher_device, p.teacher_device_map, p.teacher_dtype) == ("cpu", None, "bfloat16")
    assert (p.draft_device, p.train_bf16, p.eval_dtype) == ("cpu", True, "float32") and p.reload_for_eval


def test_a_plain_cpu_runs_everything_in_float32():
    p = plan_placement(Machine())
    assert (p.teacher_dtype, p.train_bf16, p.eval_dtype, p.reload_for_eval) == ("float32", False, "float32", False)


def test_overrides_and_their_refusals():
    gpu = Machine(cuda_devices=2, cuda_bf16=True)
    assert plan_placement(gpu, device="cpu").teacher_device == "cpu"
    assert plan_placement(gpu, teacher_dtype="float32").teacher_dtype == "float32"
    assert plan_placement(Machine(cpu_bf16=True), train_bf16=False).train_bf16 is False
    with pytest.raises(DistillError, match="no CUDA GPU"):
        plan_placement(Machine(), device="cuda")
    with pytest.raises(DistillError, match="float16 needs a GPU"):
        plan_placement(Machine(), teacher_dtype="float16")
    with pytest.raises(DistillError, match="--device 'tpu'"):
        plan_placement(gpu, device="tpu")


def test_this_machine_is_detected_without_error():
    m = Machine.detect()
    p = plan_placement(m)
    assert p.teacher_device == ("cuda" if m.cuda_devices else "cpu")
