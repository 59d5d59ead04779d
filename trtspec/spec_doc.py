"""Write a BuildSpec as commented YAML: every field, its value, its allowed values and one line of why."""

from __future__ import annotations

import enum
import typing
from typing import Any

from pydantic import BaseModel

from trtspec.spec import BuildSpec


def _yaml_scalar(value: Any) -> str:
    from pathlib import PurePath

    import yaml

    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    if value is None:
        return "null"
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _choices(annotation: Any) -> list[str] | None:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            return [m.value for m in arg]
    return None


def _section_lines(model: BaseModel, indent: int, notes: dict[str, str], prefix: str = "") -> list[str]:
    lines: list[str] = []
    pad = "  " * indent
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        doc = field.description or ""
        if isinstance(value, BaseModel):
            cls_doc = (type(value).__doc__ or "").strip().splitlines()[0]
            lines.append(f"{pad}# {cls_doc}")
            lines.append(f"{pad}{name}:")
            lines.extend(_section_lines(value, indent + 1, notes, f"{prefix}{name}."))
            continue
        choices = _choices(field.annotation)
        if choices:
            doc += f" [{' | '.join(choices)}]"
        note = notes.get(f"{prefix}{name}")
        if note:
            lines.append(f"{pad}# chosen: {note}")
        lines.append(f"{pad}{name}: {_yaml_scalar(value)}" + (f"  # {doc}" if doc else ""))
    return lines


def commented_yaml(spec: BuildSpec) -> str:
    """The spec as YAML with a comment on every field; loads back to an equal spec."""
    header = [
        "# trtspec build spec: `trtspec check` validates it, `trtspec plan` shows what `trtspec build` will do.",
        "# Relative paths resolve against this file's directory. Any field can be overridden from the environment:",
        "# TRTSPEC_SPEC__SECTION__FIELD=value (e.g. TRTSPEC_SPEC__DRAFT__QUANTIZATION=fp8).",
    ]
    return "\n".join(header + _section_lines(spec, 0, spec.default_notes)) + "\n"
