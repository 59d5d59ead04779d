"""Regenerate trtspec/data/calibration.jsonl, the calibration corpus shipped with trtspec.

Sources (no network): the hand-written texts in scripts/corpus/handwritten.txt (prose, dialogue, code; written for
this project), and material from the running CPython's standard library, under the PSF License (kept next to the
corpus as LICENSE-PSF.txt): the language reference topics in ``pydoc_data.topics`` (prose), source code of selected
stdlib modules (code), and their docstrings recast as question-and-answer turns (dialogue).

Deterministic for a given CPython version: ``python scripts/make_calibration_corpus.py`` (3.11.7 wrote the shipped
file).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import random
import re
import shutil
import sys
import sysconfig
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "trtspec" / "data" / "calibration.jsonl"
HANDWRITTEN = Path(__file__).resolve().parent / "corpus" / "handwritten.txt"

CODE_MODULES = [
    "textwrap",
    "heapq",
    "bisect",
    "functools",
    "fractions",
    "statistics",
    "shlex",
    "string",
    "glob",
    "fnmatch",
    "difflib",
    "csv",
    "json.encoder",
    "json.decoder",
    "base64",
    "colorsys",
    "graphlib",
    "calendar",
    "ipaddress",
    "pprint",
    "secrets",
    "tokenize",
    "argparse",
    "dataclasses",
    "enum",
    "contextlib",
    "copy",
    "random",
    "queue",
    "sched",
    "zipfile",
    "tempfile",
    "shutil",
    "pathlib",
]
DOC_MODULES = [
    "textwrap",
    "heapq",
    "bisect",
    "functools",
    "itertools",
    "statistics",
    "shlex",
    "string",
    "glob",
    "fnmatch",
    "difflib",
    "json",
    "base64",
    "calendar",
    "ipaddress",
    "secrets",
    "shutil",
    "os.path",
    "math",
    "random",
    "collections",
    "contextlib",
    "copy",
    "datetime",
    "re",
    "operator",
    "pathlib",
    "tempfile",
    "zlib",
    "hashlib",
    "time",
    "uuid",
    "urllib.parse",
    "html",
    "unicodedata",
]
QUESTIONS = [
    "What does {name} do in Python?",
    "How do I use {name}?",
    "Can you explain {name}?",
    "what is {name} for",
    "I found {name} in some code. What is it?",
    "Explain {name} briefly, please.",
]
PROSE_BUDGET, CODE_BUDGET, DIALOGUE_BUDGET = 190_000, 110_000, 70_000


def handwritten() -> list[dict]:
    docs = []
    for block in HANDWRITTEN.read_text(encoding="utf-8").split("\n=====\n")[1:]:
        head, _, body = block.partition("\n")
        kind = head.removeprefix("kind:").strip()
        docs.append({"text": body.strip() + "\n", "kind": kind, "source": "handwritten"})
    return docs


def _reflow(section: str) -> str:
    """Join hard-wrapped prose lines into paragraphs; keep indented blocks (grammar, code) as they are."""
    out = []
    for para in re.split(r"\n\s*\n", section):
        lines = para.split("\n")
        if any(line.startswith("   ") for line in lines):
            out.append(textwrap.dedent(para))
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(p for p in out if p.strip())


def reference_prose(budget: int) -> list[dict]:
    import pydoc_data.topics as topics

    docs, used = [], 0
    for key in sorted(topics.topics):
        text = topics.topics[key]
        # Split at section headings (a title line underlined with *, = or -).
        parts = re.split(r"\n(?=[^\n]+\n[*=\-]{4,}\n)", text)
        for part in parts:
            body = _reflow(re.sub(r"\n[*=\-]{4,}\n", "\n\n", part, count=1)).strip()
            while body:
                piece, body = body[:3000], body[3000:]
                if body:  # cut at a paragraph end
                    cut = piece.rfind("\n\n")
                    if cut > 800:
                        piece, body = piece[:cut], piece[cut:].lstrip() + body
                if len(piece) >= 300:
                    docs.append({"text": piece + "\n", "kind": "prose", "source": f"pydoc_data.topics[{key!r}]"})
                    used += len(piece)
                if used >= budget:
                    return docs
    return docs


def stdlib_code(budget: int) -> list[dict]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs, used = [], 0
    per_module = 5
    for mod in CODE_MODULES:
        path = stdlib / (mod.replace(".", "/") + ".py")
        if not path.is_file():
            path = stdlib / mod.replace(".", "/") / "__init__.py"
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        taken = 0
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            seg = ast.get_source_segment(source, node) or ""
            if not 300 <= len(seg) <= 3500:
                continue
            docs.append(
                {
                    "text": f"# from Lib/{path.relative_to(stdlib).as_posix()}\n{seg}\n",
                    "kind": "code",
                    "source": f"Lib/{path.relative_to(stdlib).as_posix()}",
                }
            )
            used += len(seg)
            taken += 1
            if taken >= per_module or used >= budget:
                break
        if used >= budget:
            break
    return docs


def docstring_dialogues(budget: int) -> list[dict]:
    rng = random.Random(7)
    docs, used = [], 0
    for mod_name in DOC_MODULES:
        mod = importlib.import_module(mod_name)
        for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 120:
                continue
            try:
                sig = f"{name}{inspect.signature(obj)}"
            except (TypeError, ValueError):
                sig = None
            answer = _reflow(doc.strip())[:1500]
            qualified = f"{mod_name}.{name}"
            turns = [f"User: {rng.choice(QUESTIONS).format(name=f'`{qualified}`')}", f"Assistant: {answer}"]
            if sig and rng.random() < 0.5:
                turns += ["User: What arguments does it take?", f"Assistant: Its signature is `{sig}`."]
            text = "\n".join(turns) + "\n"
            docs.append({"text": text, "kind": "dialogue", "source": f"docstring of {qualified}"})
            used += len(text)
            if used >= budget:
                return docs
    return docs


def main() -> None:
    docs = handwritten()
    docs += reference_prose(PROSE_BUDGET)
    docs += stdlib_code(CODE_BUDGET)
    docs += docstring_dialogues(DIALOGUE_BUDGET)
    random.Random(0).shuffle(docs)  # interleave kinds so any prefix of the corpus is varied
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    lic = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
    if lic.is_file():
        shutil.copyfile(lic, OUT.parent / "LICENSE-PSF.txt")
    kinds: dict[str, int] = {}
    for d in docs:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + len(d["text"])
    print(
        f"wrote {OUT} ({OUT.stat().st_size / 1024:.0f} KiB, {len(docs)} documents, Python {sys.version.split()[0]}): "
        + ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in sorted(kinds.items()))
    )


if __name__ == "__main__":
    main()
