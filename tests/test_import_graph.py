"""The import graph itself keeps the architecture: no import circles between modules, and no
import that runs back up the layers (server → sessions → agents → subsystems → shared → leaves).

Built from the code's own ``import`` statements (every one: top-level, lazy inside functions and
under ``TYPE_CHECKING``, since each is a dependency a reader must follow), resolved to the
module files of this tree — no string needles. A failure names the files and the import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "qwenctxd"
QWENCTL = ROOT / "clients" / "qwenctl" / "qwenctl"

#: Layer of each top-level part of ``qwenctxd`` (higher uses lower; equal may use each other
#: without a circle). Modules not named here are leaves (layer 1).
LAYERS: dict[str, int] = {
    "__main__": 10,
    "server": 9,
    "sessions": 8,
    "agents": 7,
    "skills": 6,
    "compaction": 6,
    "instructions": 5,
    "memory": 5,
    "project": 4,
    "model": 4,
    "config": 3,
    "client": 2,
    "watch": 2,
}
#: The clients (qwenctl, its MCP server and proxy) sit above the client library.
CLIENT_LAYER = 4
#: Test support imports whatever it drives; it is not a layer of the daemon.
UNLAYERED = {"testing"}


def module_files() -> dict[str, Path]:
    """Dotted module name → file, for the daemon package and qwenctl."""
    out: dict[str, Path] = {}
    for base, top in ((PACKAGE, "qwenctxd"), (QWENCTL, "qwenctl")):
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([top, *parts])] = path
    return out


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module of this tree, line) for every import in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _longest_known(alias.name, known)
                if target:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = _package_of(name, path).split(".")
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in known else _longest_known(base, known)
                if target:
                    yield target, node.lineno


def _longest_known(dotted: str, known: dict[str, Path]) -> str | None:
    parts = dotted.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


def graph() -> dict[str, dict[str, int]]:
    known = module_files()
    edges: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        out = edges.setdefault(name, {})
        for target, line in imports_of(name, path, known):
            if target != name and not name.startswith(target + ".") and target != "qwenctxd":
                out.setdefault(target, line)
    return edges


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, {}))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def layer(module: str) -> int | None:
    top, _, rest = module.partition(".")
    if top == "qwenctl":
        return CLIENT_LAYER
    part = rest.split(".", 1)[0]
    if part in UNLAYERED:
        return None
    return LAYERS.get(part, 1)


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "qwenctxd.server.app" in edges and "qwenctxd.sessions.manager" in edges
    assert sum(len(v) for v in edges.values()) > 200  # the daemon's imports were resolved


def test_no_import_circles() -> None:
    edges = graph()
    described = []
    for comp in circles(edges):
        ties = [f"{a} -> {b} (line {edges[a][b]})" for a in comp for b in comp if b in edges[a]]
        described.append("; ".join(ties))
    assert described == []


def test_no_import_runs_back_up_the_layers() -> None:
    up = []
    for src, targets in graph().items():
        low = layer(src)
        for dst, line in targets.items():
            high = layer(dst)
            if low is not None and high is not None and high > low:
                up.append(f"{src} (layer {low}) imports {dst} (layer {high}) at line {line}")
    assert up == []
