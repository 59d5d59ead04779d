"""Draft distillation (`trtspec distill`): data, model, training loop, report and pipeline; imported lazily."""
