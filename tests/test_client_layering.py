"""Clients speak the wire contract only: qwenctl (clients/) imports the client library, the
protocol package and the socket paths of qwenctxd, never a subsystem; the client and protocol
packages themselves import nothing above them; handler modules (server/methods) reach no
subsystem internals (names starting with ``_``); the daemon is composed by constructor
arguments, not attribute patching or module-global registries."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ROOT / "clients"
PACKAGE = ROOT / "qwenctxd"
CLIENT_API = ("qwenctxd.client", "qwenctxd.protocol", "qwenctxd.paths",
              # a leaf helper below every subsystem (atomic writes), no daemon state
              "qwenctxd.fsutil",
              # the secret scanner: a pure library (no daemon state), so a memory file the MCP
              # server hands out as a resource is redacted like everything the daemon renders
              "qwenctxd.secrets",
              # the one token estimator (pure functions): the proxy sizes requests with it
              "qwenctxd.tokens",
              # full collections at idle (a leaf over the gc module): the proxy runs one too
              "qwenctxd.idle_gc")
# qwenctl proxy reads the same endpoint settings (URL, API key) the daemon reads, from the
# user's own settings files: a local read of configuration, not a call into the daemon
EXCEPTIONS = {("qwenctl/qwenctl/proxy/command.py", "qwenctxd.config")}


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) for every absolute import in ``path``, lazy ones included."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
    return out


def within(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def test_clients_import_only_the_client_protocol_and_paths() -> None:
    files = sorted(CLIENTS.rglob("*.py"))
    assert files, "no client sources found"
    bad = []
    for path in files:
        rel = str(path.relative_to(CLIENTS))
        for mod, _names in imports(path):
            if mod.split(".")[0] != "qwenctxd" or mod == "qwenctxd":
                continue
            if within(mod, CLIENT_API) or (rel, mod) in EXCEPTIONS:
                continue
            if within(mod, ("qwenctxd.testing",)) and "/tests/" in f"/{rel}":
                continue
            bad.append(f"{rel} imports {mod}")
    assert bad == []


def test_client_and_protocol_packages_import_nothing_above_them() -> None:
    bad = []
    for pkg, allowed in (("protocol", ("qwenctxd.protocol",)),
                         # socket_io: byte I/O over a socket (a leaf over asyncio, no daemon
                         # state), the same the daemon serves its connections with
                         ("client", ("qwenctxd.client", "qwenctxd.protocol", "qwenctxd.paths",
                                     "qwenctxd.socket_io"))):
        for path in sorted((PACKAGE / pkg).rglob("*.py")):
            for mod, _names in imports(path):
                if mod.startswith("qwenctxd.") and not within(mod, allowed):
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert bad == []


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_handlers_reach_no_subsystem_internals() -> None:
    files = sorted((PACKAGE / "server" / "methods").glob("*.py"))
    assert len(files) > 5
    bad = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for mod, names in imports(path):
            if mod.startswith("qwenctxd.") and not within(mod, ("qwenctxd.server",)):
                if private(mod.rsplit(".", 1)[-1]):
                    bad.append(f"{path.name} imports module {mod}")
                bad.extend(f"{path.name} imports {mod}.{n}" for n in names if private(n))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr):
                bad.append(f"{path.name}:{node.lineno} uses .{node.attr}")
    assert bad == []


def test_no_attribute_patching_or_global_registries_in_the_composition() -> None:
    sources = {p: p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}
    for needle in ('getattr(self, "turn_complete_hooks"', 'getattr(self.m, "user_turn_hooks"',
                   "_REVIEWERS", "reviewer_for(", "id(daemon)"):
        assert [str(p.relative_to(ROOT)) for p, t in sources.items() if needle in t] == [], needle
    app = ast.parse((PACKAGE / "server" / "app.py").read_text(encoding="utf-8"))
    patched = []
    for node in ast.walk(app):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                # self.<service>.<attr> = …: wiring a service after construction
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
                        and isinstance(target.value.value, ast.Name)
                        and target.value.value.id == "self"):
                    patched.append(f"app.py:{node.lineno}")
    assert patched == []


#: the one raw call in the clients: ``qwenctl call METHOD PARAMS`` sends whatever name the user
#: typed (a method of a newer daemon, a misspelt one to see the error)
RAW_RPC_CALL = ("qwenctl/qwenctl/rpc_cmds.py", "cmd_call")
#: ``request(...)`` calls that are not daemon calls: the proxy's HTTP client (httpx) to the model
NOT_DAEMON_CALLS = {("qwenctl/qwenctl/proxy/upstream.py", "_get_json")}
RPC_CALLS = ("call", "request", "notify")


def table_aliases(tree: ast.Module) -> set[str]:
    """The names a module binds to ``qwenctxd.protocol.methods`` (``methods``, ``table``…)."""
    return {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == "qwenctxd.protocol" for a in node.names if a.name == "methods"}


def method_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Parameters of ``fn`` annotated ``Method[...]``: a typed forwarder passes them on."""
    args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    return {a.arg for a in args if a.annotation is not None
            and ast.unparse(a.annotation).strip("'\"").split("[")[0] in ("Method", "methods.Method")}


def own_nodes(fn: ast.AST) -> list[ast.AST]:
    """The nodes of ``fn``'s body, not descending into the functions defined inside it."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return out


def daemon_call_violations(rel: str, tree: ast.Module) -> list[str]:
    """Every ``x.call/request/notify(first, …)`` whose ``first`` is neither a table entry
    (``methods.NAME``) nor a ``Method``-typed parameter being forwarded."""
    aliases, bad = table_aliases(tree), list[tuple[int, str]]()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if (rel, fn.name) == RAW_RPC_CALL or (rel, fn.name) in NOT_DAEMON_CALLS:
            continue
        forwarded = method_params(fn)
        for node in own_nodes(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in RPC_CALLS and node.args):
                continue
            first = node.args[0]
            if isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name) \
                    and first.value.id in aliases and first.attr.isupper():
                continue
            if isinstance(first, ast.Name) and first.id in forwarded:
                continue
            kind = "an f-string" if isinstance(first, ast.JoinedStr) else ast.unparse(first)
            bad.append((node.lineno, f"{rel}:{node.lineno}: {node.func.attr}({kind}, …)"))
    return [text for _line, text in sorted(bad)]


def test_clients_call_the_daemon_through_table_entries_only() -> None:
    """Every daemon call in the clients names its method by ``methods.X`` (or forwards a
    ``Method``-typed parameter): no f-string name, no name from a variable or a string —
    except the raw ``qwenctl call`` command."""
    files = sorted(CLIENTS.rglob("*.py"))
    bad = []
    for path in files:
        rel = str(path.relative_to(CLIENTS))
        bad += daemon_call_violations(rel, ast.parse(path.read_text(encoding="utf-8")))
    assert bad == []


def test_the_guard_refuses_fstring_and_non_table_names() -> None:
    tree = ast.parse(
        "from qwenctxd.protocol import methods\n"
        "def f(ctx, action, method: Method[Any, Any]):\n"
        "    ctx.request(methods.SKILLS_LIST, None)\n"
        "    ctx.request(method, None)\n"
        "    ctx.call(f'skills.review.{action}', {})\n"
        "    ctx.call(action, {})\n"
        "    ctx.request(other.SKILLS_LIST, None)\n")
    assert daemon_call_violations("x.py", tree) == [
        "x.py:5: call(an f-string, …)", "x.py:6: call(action, …)",
        "x.py:7: request(other.SKILLS_LIST, …)"]
    raw = ast.parse("def cmd_call(ctx):\n    ctx.client().call(ctx.args.method, None)\n")
    assert daemon_call_violations(RAW_RPC_CALL[0], raw) == []
    assert daemon_call_violations("elsewhere.py", raw) == ["elsewhere.py:2: call(ctx.args.method, …)"]


def test_clients_name_methods_through_the_table() -> None:
    """qwenctl, its MCP server and proxy call the daemon with ``methods.X`` (the table entry
    carrying the params and result types), never with a bare method-name string."""
    from qwenctxd.protocol import methods

    names = set(methods.METHODS) | set(methods.DEBUG_METHODS)
    found = []
    for path in sorted(CLIENTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef
                                    | ast.ClassDef)
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names \
                    and id(node) not in docstrings:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []
