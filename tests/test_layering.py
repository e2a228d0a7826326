"""The data flow stays one way (server → sessions → subsystems → stores): no subsystem imports
the server or the sessions package, and nothing below the subsystems imports them either."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "qwenctxd"
SUBSYSTEMS = ("instructions", "memory", "skills", "compaction", "agents")
SHARED = ("protocol", "config", "watch", "tasks", "model", "store", "project", "secrets")


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def offenders(packages: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for pkg in packages:
        for path in sorted((PACKAGE / pkg).rglob("*.py")):
            for mod in imported_modules(path):
                if any(mod == f or mod.startswith(f + ".") for f in forbidden):
                    out.append(f"{path.relative_to(PACKAGE.parent)} imports {mod}")
    return out


def test_subsystems_import_neither_server_nor_sessions() -> None:
    assert offenders(SUBSYSTEMS, ("qwenctxd.server", "qwenctxd.sessions")) == []


def test_shared_layers_import_no_subsystem() -> None:
    above = tuple(f"qwenctxd.{p}" for p in ("server", "sessions", *SUBSYSTEMS))
    assert offenders(SHARED, above) == []


@pytest.mark.parametrize("pkg", SUBSYSTEMS + SHARED)
def test_every_package_exists(pkg: str) -> None:
    assert (PACKAGE / pkg / "__init__.py").is_file()


def test_projects_are_resolved_only_by_the_registry() -> None:
    """The services and the server take their project (root, ~/.qwen, settings) from the
    ProjectRegistry: none of them walks up for ``.git`` or reads ``QWEN_HOME`` itself."""
    services = [PACKAGE / "instructions" / "service.py", PACKAGE / "memory" / "service.py",
                PACKAGE / "skills" / "service.py", *sorted((PACKAGE / "server").rglob("*.py"))]
    found = [f"{p.relative_to(PACKAGE.parent)}: {needle}" for p in services
             for needle in ("find_project_root", "QWEN_HOME")
             if needle in p.read_text(encoding="utf-8")]
    assert found == []


def test_one_watched_cache() -> None:
    """Per-project caches are WatchedCaches: no subsystem — nor the config store or the project
    registry — builds a SharedLoads of its own, watches the hub directly or waits for it to
    sync (the cache's publish, watch and re-check do that)."""
    found = [f"{p.relative_to(PACKAGE.parent)}: {needle}"
             for pkg in (*SUBSYSTEMS, "config", "project")
             for p in sorted((PACKAGE / pkg).rglob("*.py"))
             for needle in ("SharedLoads(", "wait_synced(", "hub.watch(", "_hub.watch(")
             if needle in p.read_text(encoding="utf-8")]
    assert found == []


def test_qwen_home_is_resolved_in_one_place() -> None:
    """``~/.qwen`` (and ``QWEN_HOME``) is worked out by qwenctxd.paths alone."""
    found = [f"{p.relative_to(PACKAGE.parent)}" for p in sorted(PACKAGE.rglob("*.py"))
             if p.name != "paths.py" or p.parent != PACKAGE
             if '"QWEN_HOME"' in p.read_text(encoding="utf-8")
             or 'home_dir / ".qwen"' in p.read_text(encoding="utf-8")]
    assert found == []


REPO = PACKAGE.parent
#: Every tree of ours that imports: the daemon, qwenctl (its proxy and MCP server) and bench/.
IMPORT_ROOTS = (PACKAGE, REPO / "clients" / "qwenctl" / "qwenctl", REPO / "bench")


def module_names(roots: tuple[Path, ...]) -> dict[str, Path]:
    names: dict[str, Path] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph(roots: tuple[Path, ...] = IMPORT_ROOTS, *,
                 within: str | None = None) -> dict[str, set[str]]:
    """Module → the modules of ours it imports (typing-only and function-level imports
    included, relative imports resolved; importing ``a.b.c`` imports the package ``a.b`` too;
    a module importing its own parent package is not an arrow)."""
    names = module_names(roots)
    if within:
        names = {n: p for n, p in names.items() if n == within or n.startswith(within + ".")}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                if base:
                    deps.add(base)
                    deps.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        with_packages = {".".join(d.split(".")[:i]) for d in deps
                         for i in range(1, d.count(".") + 2)}
        graph[name] = {d for d in with_packages if d in names and d != name
                       and not name.startswith(d + ".")}
    return graph


def server_import_graph() -> dict[str, set[str]]:
    """Module → the qwenctxd.server modules it imports."""
    return import_graph((PACKAGE,), within="qwenctxd.server")


def circles_in(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the walk, 2: done
    circles: list[str] = []

    def walk(mod: str, trail: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph[mod]):
            if state.get(dep) == 1:
                circles.append(" -> ".join([*trail[trail.index(dep):], dep]))
            elif dep not in state:
                walk(dep, [*trail, dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            walk(mod, [mod])
    return circles


def test_nothing_below_the_daemon_imports_it() -> None:
    """Connections and handlers get their collaborators (a ConnectionHost, the dispatcher, the
    services), never the Daemon: only the entry point imports ``server.app``."""
    graph = server_import_graph()
    assert sorted(m for m, deps in graph.items() if "qwenctxd.server.app" in deps) == []
    outside = [p for p in sorted(PACKAGE.rglob("*.py")) if "qwenctxd.server.app"
               in imported_modules(p) and p.parent.name != "server"]
    assert [str(p.relative_to(PACKAGE.parent)) for p in outside] == ["qwenctxd/__main__.py"]


def test_the_server_package_has_no_import_circle() -> None:
    assert circles_in(server_import_graph()) == []


def test_no_import_circle_anywhere() -> None:
    """The daemon, qwenctl and bench/: no module reaches itself through what it imports (qwenctl's
    ``cli`` and its command modules, the shell judge and its rules, the server and its
    connection once did)."""
    graph = import_graph()
    assert "qwenctl.cli" in graph and "bench.recall_quality" in graph  # the walk saw them
    assert circles_in(graph) == []
