"""What a session's declared tools are for, judged from their names and parameter schemas.

Clients name their tools in many ways (Qwen Code's ``read_file`` / ``run_shell_command``,
Claude-like ``Read`` / ``Bash`` / ``str_replace_editor``, an editor plugin's ``open_buffer``).
:func:`classify` maps each declared tool to a role — ``read``, ``edit``, ``write``, ``shell``,
``search``, ``list``, ``todo``, ``skill`` — by its name first and its parameter schema second
(a ``command`` string makes a shell tool; a ``file_path`` / ``path`` / ``filename`` …
parameter makes a file tool). The base prompt uses the roles to teach only declared tools
(protocol C5); compaction uses :attr:`ToolRoles.file_params` to find the files a session had
open, whatever its tools are called (:meth:`ToolRoles.restoration_tools`: Qwen Code's file
tools when the client declared none — the daemon's own ``skill`` tool does not count).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

#: Parameter names that carry a file path, in the order they are tried.
PATH_KEYS: Final = ("file_path", "absolute_path", "path", "filename", "file", "filepath",
                    "target_file", "notebook_path", "file_name")
#: Qwen Code's file tools, used when a history's tools are unknown.
QWEN_FILE_TOOLS: Final = frozenset({"read_file", "write_file", "edit", "replace"})

_NAME_ROLES: Final[tuple[tuple[str, frozenset[str]], ...]] = (
    ("skill", frozenset({"skill"})),
    ("todo", frozenset({"todowrite", "todo", "todos", "todolist", "updatetodos"})),
    ("read", frozenset({"readfile", "read", "view", "cat", "openfile", "viewfile", "readmanyfiles"})),
    ("edit", frozenset({"edit", "replace", "strreplaceeditor", "strreplacebasededittool",
                        "editfile", "multiedit", "applypatch", "patch", "strreplace"})),
    ("write", frozenset({"writefile", "write", "createfile", "savefile"})),
    ("shell", frozenset({"runshellcommand", "bash", "shell", "exec", "runcommand", "terminal",
                         "executecommand", "sh", "runterminalcmd"})),
    ("search", frozenset({"grepsearch", "grep", "search", "rg", "ripgrep", "searchfiles",
                          "codesearch"})),
    ("list", frozenset({"listdirectory", "ls", "glob", "listfiles", "findfiles", "listdir"})),
)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def tool_name(tool: Mapping[str, Any]) -> str | None:
    fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return name if isinstance(name, str) and name else None


def tool_params(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    params = fn.get("parameters") if isinstance(fn, Mapping) else None
    props = params.get("properties") if isinstance(params, Mapping) else None
    return dict(props) if isinstance(props, Mapping) else {}


@dataclass(frozen=True)
class DeclaredTool:
    name: str
    role: str | None
    params: tuple[str, ...]
    path_param: str | None


@dataclass(frozen=True)
class ToolRoles:
    """The classified tool set of one session."""

    tools: tuple[DeclaredTool, ...] = ()
    #: (file tool name, the parameter that names its file) pairs
    file_params: tuple[tuple[str, str], ...] = ()

    def file_tools(self) -> dict[str, str]:
        """File tool name → its path parameter (what compaction looks for in calls)."""
        return dict(self.file_params)

    def restoration_tools(self, *, own: frozenset[str] = frozenset()) -> dict[str, str] | None:
        """The file tools post-compaction restoration looks for: the declared ones, or None
        (Qwen Code's ``read_file``/``write_file``/``edit``/``replace``) when the client
        declared none. ``own`` names tools the daemon added itself (its ``skill``): they are
        not a declaration, so a session opened without ``tools`` still restores its files."""
        if not any(t.name not in own for t in self.tools):
            return None
        return self.file_tools()

    def first(self, role: str) -> DeclaredTool | None:
        return next((t for t in self.tools if t.role == role), None)

    def names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)


def _role(name: str, params: Sequence[str], path_param: str | None) -> str | None:
    key = _norm(name)
    for role, names in _NAME_ROLES:
        if key in names:
            return role
    lowered = {p.lower() for p in params}
    if "command" in lowered or "cmd" in lowered:
        return "shell"
    if path_param is not None:
        if {"old_string", "old_str", "new_string", "new_str"} & lowered:
            return "edit"
        if "content" in lowered or "contents" in lowered:
            return "write"
        if "pattern" in lowered or "query" in lowered:
            return "search"
        return "read"
    if "pattern" in lowered or "query" in lowered or "regex" in lowered:
        return "search"
    return None


def classify(tools: Iterable[Mapping[str, Any]]) -> ToolRoles:
    """Roles and file parameters of ``tools`` (OpenAI ``tools`` entries; junk is skipped)."""
    out: list[DeclaredTool] = []
    file_params: dict[str, str] = {}
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        name = tool_name(tool)
        if name is None:
            continue
        params = tuple(tool_params(tool))
        lowered = {p.lower(): p for p in params}
        path_param = next((lowered[k] for k in PATH_KEYS if k in lowered), None)
        role = _role(name, params, path_param)
        if path_param is None and role in ("read", "edit", "write"):
            path_param = next((p for p in params if "path" in p.lower() or "file" in p.lower()),
                              None)
        out.append(DeclaredTool(name=name, role=role, params=params, path_param=path_param))
        if path_param is not None and role in ("read", "edit", "write"):
            file_params[name] = path_param
    return ToolRoles(tools=tuple(out), file_params=tuple(file_params.items()))
