"""Change a few values of a spec file in place, keeping its comments and layout (what `trtspec tune --write` does).

Only ``key: value`` lines of one top-level section are rewritten (their trailing comments kept); a missing key is
added to the section, a missing section appended. The result must load as a valid spec, else nothing is written.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

_TOP = re.compile(r"^[A-Za-z_][\w-]*\s*:")
_ENTRY = re.compile(
    r"^(?P<indent>[ \t]+)(?P<key>[A-Za-z_][\w-]*)(?P<sep>\s*:\s*)(?P<value>[^#\n]*?)"
    r"(?P<comment>\s+#.*)?$"
)


def _scalar(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def set_section_values(text: str, section: str, values: dict[str, Any]) -> str:
    """``text`` with ``section.key`` set to each value of ``values``."""
    lines = text.splitlines(keepends=True)
    todo = dict(values)
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{re.escape(section)}\s*:\s*(#.*)?$", line)), None)
    if start is None:
        tail = "" if not text or text.endswith("\n") else "\n"
        return text + tail + f"{section}:\n" + "".join(f"  {k}: {_scalar(v)}\n" for k, v in values.items())
    indent = "  "
    end = len(lines)
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if _TOP.match(line):
            end = i
            break
        m = _ENTRY.match(line.rstrip("\n"))
        if not m:
            continue
        indent = m["indent"]
        if m["key"] in todo:
            newline = "\n" if line.endswith("\n") else ""
            lines[i] = f"{m['indent']}{m['key']}{m['sep']}{_scalar(todo.pop(m['key']))}{m['comment'] or ''}{newline}"
    insert = [f"{indent}{k}: {_scalar(v)}\n" for k, v in todo.items()]
    while end > start + 1 and not lines[end - 1].strip():  # before the blank lines that end the section
        end -= 1
    lines[end:end] = insert
    return "".join(lines)


def diff(old: str, new: str, name: str) -> str:
    """A unified diff of a spec file's change."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=name, tofile=f"{name} (tuned)"
        )
    )


def write_checked(path: Path, new_text: str) -> None:
    """Write ``new_text`` to ``path`` atomically after checking that it loads as a spec (SpecError otherwise)."""
    import yaml

    from trtspec.spec import spec_from_dict

    spec_from_dict(yaml.safe_load(new_text) or {}, source=path.name, base_dir=path.parent, environ={})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new_text, encoding="utf-8")
    tmp.replace(path)
