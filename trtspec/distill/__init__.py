"""Draft distillation (`trtspec distill`): settings, data, model, training loop, report, pipeline, packing.

Only this module and ``settings`` are light to import (no torch): the CLI validates its input with them first.
"""

from trtspec.errors import DistillError

__all__ = ["DistillError"]
