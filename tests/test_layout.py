"""The package layout of the README's Layout table, checked on the source: every import (lazy ones inside functions
too, parsed with ast, never executed) points down the table's layers, and no modules import each other in a cycle.

A new package or module must be placed in ``LAYERS`` (the test names what it cannot place); an import that points up
fails with the importing file and the imported module, and so does a cycle, with its modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "trtspec"

# Bottom to top, as in the README's Layout table. A module may import its own layer and every layer below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("trtspec", "trtspec.errors")),
    ("speculative", ("trtspec.speculative",)),
    # The build's rule tables (quantization formats, TensorRT-LLM's builder rules): pure tables that the spec's field
    # types, defaults and validation read, so they sit below the spec although they live with the stages they rule.
    ("build rules", ("trtspec.build.formats", "trtspec.build.engine_rules")),
    (
        "base",
        (
            "trtspec.spec",
            "trtspec.spec_defaults",
            "trtspec.spec_doc",
            "trtspec.spec_edit",
            "trtspec.families",
            "trtspec.hub",
            "trtspec.paths",
            "trtspec.procs",
            "trtspec.prompts",
            "trtspec.threads",
            "trtspec.validation",
        ),
    ),
    ("build", ("trtspec.build",)),
    ("runtimes/inflight", ("trtspec.runtimes", "trtspec.runtimes.inflight")),
    ("runtimes/torch", ("trtspec.runtimes.torch",)),
    ("trtllm", ("trtspec.trtllm", "trtspec.engines")),
    ("distill", ("trtspec.distill",)),
    ("triton_repo", ("trtspec.triton_repo",)),
    ("triton_repo/models", ("trtspec.triton_repo.models",)),
    ("serving", ("trtspec.serving",)),
    ("top", ("trtspec.pipeline", "trtspec.plan", "trtspec.tune", "trtspec.example")),
    ("cli", ("trtspec.cli", "trtspec.__main__")),
]

# Imports that still point up, each with its reason (the README's Layout table says the same). An entry that no
# longer occurs fails the test too, so this list cannot go stale.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def _layer(module: str) -> int | None:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Every trtspec module each module imports (top-level or lazy), resolved to the module that defines it."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if not node.module.startswith("trtspec"):
                    continue
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("trtspec")]
            else:
                continue
            for t in targets:
                r = resolve(t)
                if r is not None and r != mod:
                    graph[mod].add(r)
    return graph


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in _modules() if _layer(m) is None)
    assert not unplaced, f"place these modules in LAYERS (and the README's Layout table): {unplaced}"


def test_imports_point_down_the_layout_table():
    mods = _modules()
    graph = _imports(mods)
    up, seen = [], set()
    for mod, targets in graph.items():
        for t in targets:
            a, b = _layer(mod), _layer(t)
            if a is None or b is None or b <= a:
                continue
            key = (mod, t)
            seen.add(key)
            if key not in EXCEPTIONS:
                up.append(f"{mods[mod].relative_to(ROOT.parent)} ({LAYERS[a][0]}) imports {t} ({LAYERS[b][0]})")
    assert not up, "imports that point up the layout table:\n" + "\n".join(sorted(up))
    stale = sorted(set(EXCEPTIONS) - seen)
    assert not stale, f"EXCEPTIONS that no longer occur (remove them, and from the README): {stale}"


def test_no_modules_import_each_other_in_a_cycle():
    graph = _imports(_modules())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"modules that import each other (lazily or not): {cycles}"


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The checks above can fail: a fake tree with a core module importing the CLI, and two modules in a cycle."""
    pkg = tmp_path / "trtspec"
    (pkg / "speculative").mkdir(parents=True)
    (pkg / "cli").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "speculative" / "__init__.py").write_text("")
    (pkg / "speculative" / "a.py").write_text("def f():\n    from trtspec.cli import main\n")
    (pkg / "speculative" / "b.py").write_text("from trtspec.speculative import c\n")
    (pkg / "speculative" / "c.py").write_text("import trtspec.speculative.b\n")
    (pkg / "cli" / "__init__.py").write_text("main = 1\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", pkg)
    import pytest

    with pytest.raises(AssertionError, match="speculative/a.py .speculative. imports trtspec.cli .cli."):
        test_imports_point_down_the_layout_table()
    with pytest.raises(AssertionError, match="trtspec.speculative.b', 'trtspec.speculative.c'"):
        test_no_modules_import_each_other_in_a_cycle()
