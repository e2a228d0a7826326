"""Schema-driven fuzzing of a live daemon: params for every method from its ``rpc.discover``
(OpenRPC) schema, with edge values and wrong types mixed in.

:func:`fuzz_daemon` sends ``calls`` seeded requests over one connection and reports what came
back: a result, or an error code. The contract it checks (in tests/test_method_fuzz.py and
``python -m bench fuzz``) is that no input yields ``-32603`` (an unhandled exception), every
error code is one of the documented table, and the daemon still answers afterwards. Values are
steered toward the interesting: a real project directory for ``cwd``, a real open session for
``session_id``, paths inside and outside the project, huge and control-character strings.

Every path it makes up lies under a *sandbox* directory (the daemon's scratch tree): a fuzzed
``cwd`` of ``/`` once made ``instructions.add_memory`` leave ``/QWEN.md`` on the machine that
ran the suite, so ``/``, ``/etc/passwd`` and friends are spelled ``<sandbox>/``,
``<sandbox>/etc/passwd`` here (a directory with no project, a file that is not one).
"""

from __future__ import annotations

import json
import random
import string
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenctxd.client import Client, RemoteError
from qwenctxd.testing.openai_stub import Reply

DOCUMENTED_CODES = frozenset({-32700, -32600, -32601, -32602, -32603, -32001, -32002, -32003,
                              -32004, -32005, -32006, -32010})
SKIPPED = frozenset({"daemon.shutdown"})  # would end the run; covered by lifecycle tests


@dataclass
class FuzzReport:
    calls: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # "ok" or the error code
    internal: list[tuple[str, str]] = field(default_factory=list)  # (method, params) → -32603
    undocumented: list[tuple[str, int]] = field(default_factory=list)


class ParamGenerator:
    """Params for one method from its OpenRPC descriptors; ``hints`` are good values by name."""

    def __init__(self, components: dict[str, Any], rng: random.Random,
                 hints: dict[str, list[Any]], sandbox: Path) -> None:
        self.components = components
        self.rng = rng
        self.hints = hints
        box = str(sandbox)
        self.strings = ["", box, "../../etc", f"{box}/etc/passwd", "a\x00b", "x" * 70_000,
                        "\n\n", "é\u202e\U0001f600", "-rf", "*", "{}", "user", "project",
                        "full", f"{box}/{'é' * 150}", f"{box}/nowhere"]

    def params(self, method: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in method["params"]:
            if p["required"] or self.rng.random() < 0.5:
                out[p["name"]] = self.value(p["schema"], p["name"], 0)
        if self.rng.random() < 0.03:
            out["not_a_field"] = 1
        return out

    def value(self, schema: dict[str, Any], name: str, depth: int) -> Any:
        rng = self.rng
        if name in self.hints and rng.random() < 0.6:
            return rng.choice(self.hints[name])
        if rng.random() < 0.08:
            return self.wild(depth)
        if "$ref" in schema:
            schema = self.components[schema["$ref"].rsplit("/", 1)[-1]]
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.value(rng.choice(schema[key]), name, depth)
        if "enum" in schema:
            return rng.choice(schema["enum"])
        if "const" in schema:
            return schema["const"]
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = rng.choice(kind)
        if kind == "object" and "properties" in schema and depth < 4:
            req = set(schema.get("required", ()))
            return {k: self.value(v, k, depth + 1) for k, v in schema["properties"].items()
                    if k in req or rng.random() < 0.5}
        if kind == "object":
            return {} if depth >= 4 else {rng.choice(["role", "content", "type", "text"]):
                                          self.wild(depth + 1) for _ in range(rng.randrange(3))}
        if kind == "array":
            items = schema.get("items", {})
            return [] if depth >= 4 else [self.value(items, name, depth + 1)
                                          for _ in range(rng.randrange(4))]
        if kind == "string":
            return rng.choice(self.strings) if rng.random() < 0.7 else self.word()
        if kind == "integer":
            return rng.choice([0, 1, -1, 7, 10**6, 2**53])
        if kind == "number":
            return rng.choice([0, 0.05, 1.5, -1.0, 1e9])
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        return self.wild(depth)

    def word(self) -> str:
        return "".join(self.rng.choice(string.printable) for _ in range(self.rng.randrange(16)))

    def wild(self, depth: int) -> Any:
        c = self.rng.randrange(7)
        if c == 0:
            return None
        if c == 1:
            return self.rng.choice([True, -1, 2**70, 1e308, 0.5])
        if c == 2:
            return self.rng.choice(self.strings)
        if c == 3 and depth < 4:
            return [self.wild(depth + 1) for _ in range(self.rng.randrange(3))]
        if c == 4 and depth < 4:
            return {self.word(): self.wild(depth + 1) for _ in range(self.rng.randrange(3))}
        return self.word()


def make_fuzz_project(home: Path) -> Path:
    """``home/repo``: a git project with a source file and a QWEN.md that imports it."""
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "src" / "a.py").write_text("x = 1\n")
    (repo / "QWEN.md").write_text("Use tabs. @./src/a.py\n")
    return repo


def chaotic_model(seed: int) -> Any:
    """A ScriptedOpenAI handler answering every side query and agent turn at random: plain
    text, JSON selections, HTTP 500, tool calls (good, bad and unknown), compaction summaries —
    so the fuzz reaches the model-dependent paths and their fallbacks."""
    rng = random.Random(seed)
    tools = ["read_file", "write_file", "edit", "glob", "grep_search", "run_shell_command",
             "list_directory", "no_such_tool"]
    args = ["{}", "not json", '{"file_path": "/etc/passwd"}', '{"command": "ls -la"}',
            '{"file_path": "src/a.py", "content": "y = 2\\n"}', '{"pattern": "*.py"}']

    def handler(body: dict[str, Any]) -> Reply:
        r = rng.random()
        if r < 0.3:
            return Reply(content="ok")
        if r < 0.45:
            return Reply(content=json.dumps({"selected_memories": []}))
        if r < 0.55:
            return Reply(fault="http_500")
        if r < 0.8:
            return Reply(tool_calls=[{"id": f"c{rng.randrange(99)}", "function": {
                "name": rng.choice(tools), "arguments": rng.choice(args)}}])
        return Reply(content="<analysis>a</analysis><state_snapshot>s</state_snapshot>")

    return handler


def make_sandbox_decoys(sandbox: Path) -> None:
    """``<sandbox>/etc/passwd``: a file where the fuzz may put a directory (and vice versa)."""
    (sandbox / "etc").mkdir(parents=True, exist_ok=True)
    (sandbox / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")


def fuzz_daemon(client: Client, *, calls: int, seed: int, project: Path,
                sessions: list[str], sandbox: Path | None = None) -> FuzzReport:
    """Send ``calls`` generated requests; ``sessions`` gains ids of sessions opened on the way.
    Made-up paths lie under ``sandbox`` (default: the project's parent, the scratch HOME)."""
    sandbox = sandbox or project.parent
    make_sandbox_decoys(sandbox)
    doc = client.call("rpc.discover")
    methods = [m for m in doc["methods"] if m["name"] not in SKIPPED]
    rng = random.Random(seed)
    inside = [str(project), str(project / "QWEN.md"), str(project / "src" / "a.py"),
              "src/**/*.py", "src/a.py"]
    hints: dict[str, list[Any]] = {"cwd": [str(project)], "session_id": sessions,
                                   "path": inside, "paths": [inside[1:3], ["../x"]],
                                   "timeout_s": [0, 0.05]}
    gen = ParamGenerator(doc["components"]["schemas"], rng, hints, sandbox)
    report = FuzzReport()
    for _ in range(calls):
        method = rng.choice(methods)
        params = gen.params(method)
        if method["name"] == "daemon.drain":
            params["timeout_s"] = 0.05  # never wait on what the fuzz started
        report.calls += 1
        try:
            result = client.call(method["name"], params)
        except RemoteError as exc:
            report.outcomes[str(exc.code)] += 1
            if exc.code == -32603:
                report.internal.append((method["name"], json.dumps(params)[:300]))
            elif exc.code not in DOCUMENTED_CODES:
                report.undocumented.append((method["name"], exc.code))
            continue
        report.outcomes["ok"] += 1
        if method["name"] == "session.open" and isinstance(result, dict):
            sessions.append(result["session_id"])
    return report
