"""The Python-backend stub processes of a running tritonserver, read from /proc, and a watch that notices a dead one.

Triton 2.51 (python_backend r24.10) does not notice a stub that dies: every health endpoint stays 200 and READY,
nothing is logged, the stub is not restarted ("TODO: Implement restart on decoupled", src/python_be.cc), the request
it was serving waits forever and new requests routed to it fail after ~1 s with "Stub process ... is not healthy".
Tritonserver reaps a dead stub (measured: it leaves the process table), so how it died is known only while it is a
zombie; the watch reports a death either way.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class Stub:
    """One stub process: the model it serves and its instance name (e.g. ``tensorrt_llm_bls_0_0``)."""

    pid: int
    model: str
    instance: str
    zombie: bool = False
    exit_status: int | None = None  # waitpid()-style status of a zombie (/proc/<pid>/stat field 52)

    @property
    def how(self) -> str:
        """How a dead stub ended, in words."""
        if self.exit_status is None:
            return "died"  # tritonserver reaped it: how is not known
        if self.exit_status & 0x7F:
            try:
                return f"killed by {signal.Signals(self.exit_status & 0x7F).name}"
            except ValueError:
                return f"killed by signal {self.exit_status & 0x7F}"
        return f"exited with code {self.exit_status >> 8}"


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (tritonserver under mpirun, ranks under the launcher)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def stub_processes(server_pid: int) -> dict[int, Stub]:
    """Every Python-backend stub below ``server_pid`` (a tritonserver, or a launcher above it), zombies included."""
    found: dict[int, Stub] = {}
    for pid in descendants(server_pid) - {server_pid}:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            argv = []
        fields = _stat(pid)
        if fields is None:
            continue
        zombie = fields[0] == "Z"
        if not argv or not argv[0]:
            if not zombie:
                continue
            # A zombie has no cmdline left: its name (comm, at most 15 characters) still says what it was.
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if not STUB_NAME.startswith(comm):
                continue
            status = int(fields[49]) if len(fields) > 49 else None
            found[pid] = Stub(pid, "?", "?", zombie=True, exit_status=status)
            continue
        if not argv[0].endswith(STUB_NAME.encode()):
            continue
        # argv: stub, <repo>/<model>/<version>/model.py, shm region, sizes..., parent pid, libpython dir, ipc handle,
        # instance name, runtime modeldir (python_backend r24.10 src/stub_launcher.cc)
        model_path = Path(argv[1].decode(errors="replace"))
        model = model_path.parent.parent.name
        instance = next(
            (a.decode() for a in argv[7:9] if a and not a.isdigit() and a.decode().startswith(model)), model
        )
        found[pid] = Stub(pid, model, instance, zombie=zombie)
    return found


class StubWatch:
    """Notices stubs that die: ``check()`` returns each newly dead stub once.

    ``expected`` (model -> instance count, from the repository's configs) lets ``missing()`` tell a model whose stub
    count is short, e.g. after a stub died before the watch started.
    """

    def __init__(self, server_pid: int, expected: Mapping[str, int] | None = None) -> None:
        self.server_pid = server_pid
        self.expected = dict(expected or {})
        self.known: dict[int, Stub] = {}
        self.reset()

    def reset(self, server_pid: int | None = None) -> None:
        """Forget what was seen (a restarted server, or a reloaded model) and take the live stubs as the baseline."""
        if server_pid is not None:
            self.server_pid = server_pid
        self.known = {p: s for p, s in stub_processes(self.server_pid).items() if not s.zombie}

    def check(self) -> list[Stub]:
        """Stubs that died since the last call (with how, where the zombie is readable); new live stubs are adopted."""
        now = stub_processes(self.server_pid)
        dead = []
        for pid, stub in list(self.known.items()):
            seen = now.get(pid)
            if seen is None or seen.zombie:
                dead.append(Stub(pid, stub.model, stub.instance, True, seen.exit_status if seen else None))
                del self.known[pid]
        for pid, stub in now.items():
            if not stub.zombie and pid not in self.known:
                self.known[pid] = stub
        return dead

    def missing(self) -> dict[str, int]:
        """model -> how many of its expected stubs are not running."""
        running: dict[str, int] = {}
        for stub in self.known.values():
            running[stub.model] = running.get(stub.model, 0) + 1
        return {m: n - running.get(m, 0) for m, n in self.expected.items() if running.get(m, 0) < n}


def expected_stubs(repo: Path) -> dict[str, int]:
    """model -> number of Python-backend stubs tritonserver starts for it (the sum of its instance_group counts)."""
    from trtspec.triton_repo.validate import load_configs

    out = {}
    for name, cfg in load_configs(Path(repo)).items():
        if cfg.backend != "python":
            continue
        out[name] = sum(max(1, g.count) for g in cfg.instance_group) if cfg.instance_group else 1
    return out
