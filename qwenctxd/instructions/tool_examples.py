"""Tool-call examples for the base system prompt, in the call syntax the model was trained on.

Models emit tool calls in different surface syntaxes. Showing examples in the syntax a model
already knows makes it far more likely to produce well-formed calls, so this module:

* picks a style from the model name (or from ``QWEN_CODE_TOOL_CALL_STYLE``) with
  :func:`select_style`, and
* renders one fixed set of scenarios in that style with :func:`examples`.

The scenarios are written once as data and rendered per style, so every style teaches the
same behaviour and only the syntax differs. The wording is ours.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

import structlog

from qwenctxd.instructions.tool_roles import DeclaredTool, ToolRoles, classify

log = structlog.get_logger(__name__)

ToolCallStyle: TypeAlias = Literal["qwen-coder", "qwen-vl", "general", "gemma4"]
STYLES: tuple[ToolCallStyle, ...] = get_args(ToolCallStyle)

#: The env var that forces a style regardless of the model name.
STYLE_ENV = "QWEN_CODE_TOOL_CALL_STYLE"

# Model names of this length or longer are not matched at all (a cheap guard against
# pathological input); they get the general style unless the env var forces one.
_MAX_MODEL_NAME = 100

# Checked in this order; the first hit wins (upstream's order, see docs/design.md).
_MODEL_RULES: tuple[tuple[re.Pattern[str], ToolCallStyle], ...] = (
    (re.compile(r"qwen[^-]*-coder", re.IGNORECASE), "qwen-coder"),
    (re.compile(r"qwen[^-]*-vl", re.IGNORECASE), "qwen-vl"),
    (re.compile(r"coder-model", re.IGNORECASE), "qwen-coder"),
)


def select_style(model: str | None, env_value: str | None) -> ToolCallStyle:
    """The example style for ``model``; a recognised ``env_value`` overrides the name.

    ``env_value`` is matched case-insensitively after trimming; an unknown value is logged at
    debug level and ignored. ``gemma4`` is reachable only through the env var: model-name
    detection knows the coder and VL families and falls back to ``general``.
    """
    if env_value is not None and env_value.strip():
        forced = env_value.strip().lower()
        if forced in STYLES:
            return forced  # type: ignore[return-value]
        log.debug("tool_call_style.unknown_env_value", env=STYLE_ENV, value=env_value[:64])
    if model and len(model) < _MAX_MODEL_NAME:
        for pattern, style in _MODEL_RULES:
            if pattern.search(model):
                return style
    return "general"


ArgValue: TypeAlias = str | bool | int


@dataclass(frozen=True, slots=True)
class _Call:
    """One tool call by role: its arguments by meaning (``path``, ``pattern``, ``command``,
    ``background``, ``old``, ``new``), mapped to a declared tool's parameters when rendered,
    and a one-line gist for ``general``."""

    role: str
    args: tuple[tuple[str, ArgValue], ...]
    gist: str


_Step: TypeAlias = str | _Call

_APP = "/home/dev/shop"

# Each scenario is a short exchange: plain lines (``user:``/``model:`` turns or a bracketed
# note on what a tool returned) and tool calls. The same scenarios render in every style; a
# scenario is shown only when the session declared a tool for every role it uses.
_SCENARIOS: tuple[tuple[_Step, ...], ...] = (
    (
        "user: what's in the src folder?",
        _Call("list", (("path", f"{_APP}/src"),), f"'{_APP}/src'"),
    ),
    (
        "user: Where is the HTTP timeout set?",
        "model: I'll search for it.",
        _Call("search", (("pattern", r"timeout\s*="),), r"'timeout\s*='"),
        "(one match: src/http/client.py, line 12)",
        _Call("read", (("path", f"{_APP}/src/http/client.py"),), f"'{_APP}/src/http/client.py'"),
        "model: In src/http/client.py, line 12: `timeout=30` (seconds), passed to every request.",
    ),
    (
        "user: start the dev server",
        "model: It keeps running, so I'll start it in the background.",
        _Call("shell", (("command", "npm run dev"), ("background", True)),
              "'npm run dev' in the background"),
    ),
    (
        "user: Rename fetch_user to load_user in src/users.py.",
        "model: First I'll read the file and look for other callers.",
        _Call("read", (("path", f"{_APP}/src/users.py"),), f"'{_APP}/src/users.py'"),
        _Call("search", (("pattern", r"\bfetch_user\b"),), r"'\bfetch_user\b'"),
        "(callers in src/users.py and tests/test_users.py)",
        "model: Two files call it. Updating the definition first:",
        _Call(
            "edit",
            (
                ("path", f"{_APP}/src/users.py"),
                ("old", "def fetch_user(user_id):"),
                ("new", "def load_user(user_id):"),
            ),
            f"'{_APP}/src/users.py' replacing 'def fetch_user(' with 'def load_user('",
        ),
        "(after updating the remaining call sites the same way)",
        _Call("shell", (("command", "npm test"),), "'npm test'"),
    ),
    (
        "user: delete the build folder",
        "model: This permanently removes build/ and everything in it.",
        _Call("shell", (("command", f"rm -rf {_APP}/build"),), f"'rm -rf {_APP}/build'"),
    ),
)

_MEANING_PARAMS: dict[str, tuple[str, ...]] = {
    "pattern": ("pattern", "query", "regex", "search"),
    "command": ("command", "cmd", "script"),
    "background": ("is_background", "background", "run_in_background"),
    "old": ("old_string", "old_str", "old_text", "search"),
    "new": ("new_string", "new_str", "new_text", "replace"),
}

#: Qwen Code's own tool set: the examples for a caller that names no tools
QWEN_TOOLS: ToolRoles = classify([
    {"function": {"name": n, "parameters": {"properties": dict.fromkeys(ps, {})}}}
    for n, ps in (("list_directory", ("path",)), ("grep_search", ("pattern",)),
                  ("read_file", ("file_path",)), ("run_shell_command", ("command", "is_background")),
                  ("edit", ("file_path", "old_string", "new_string")))
])


@dataclass(frozen=True, slots=True)
class _Bound:
    """A call bound to a declared tool: its real name and parameter names."""

    name: str
    args: tuple[tuple[str, ArgValue], ...]
    gist: str


def _bind(call: _Call, tool: DeclaredTool) -> _Bound:
    params = {p.lower(): p for p in tool.params}
    args: list[tuple[str, ArgValue]] = []
    if tool.role == "edit" and "command" in params:  # str_replace_editor-like tools
        args.append((params["command"], "str_replace"))
    for meaning, value in call.args:
        if meaning == "path":
            key = tool.path_param or next(iter(tool.params), None)
        else:
            key = next((params[k] for k in _MEANING_PARAMS[meaning] if k in params), None)
        if key is None:
            if meaning == "background":
                continue  # the tool has no background switch: leave it out
            key = next(iter(tool.params), meaning) if meaning == "command" else meaning
        args.append((key, value))
    return _Bound(name=tool.name, args=tuple(args), gist=call.gist)


def scenario_roles() -> frozenset[str]:
    """Every role some scenario uses."""
    return frozenset(step.role for sc in _SCENARIOS for step in sc if isinstance(step, _Call))


def _render_coder(call: _Bound) -> str:
    params = "".join(f"<parameter={k}>\n{_scalar(v)}\n</parameter>\n" for k, v in call.args)
    return f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>"


def _render_vl(call: _Bound) -> str:
    body = json.dumps({"name": call.name, "arguments": dict(call.args)}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _render_general(call: _Bound) -> str:
    return f"[tool_call: {call.name} for {call.gist}]"


def _render_gemma4(call: _Bound) -> str:
    q = '<|"|>'
    args = ",".join(
        f"{k}:{q}{v}{q}" if isinstance(v, str) else f"{k}:{_scalar(v)}" for k, v in call.args
    )
    return f"<|tool_call>call:{call.name}{{{args}}}<tool_call|>"


def _scalar(value: ArgValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_RENDERERS = {
    "qwen-coder": _render_coder,
    "qwen-vl": _render_vl,
    "general": _render_general,
    "gemma4": _render_gemma4,
}


def examples(style: ToolCallStyle, tools: ToolRoles | None = None) -> str:
    """The scenarios ``tools`` can play (None: Qwen Code's tool set) rendered in ``style``,
    each wrapped in ``<example>`` tags, with the declared tools' names and parameters; "" when
    no scenario fits the declared tools."""
    render = _RENDERERS[style]
    roles = tools if tools is not None else QWEN_TOOLS
    blocks = []
    for scenario in _SCENARIOS:
        bound: list[str] = []
        for step in scenario:
            if isinstance(step, str):
                bound.append(step)
                continue
            tool = roles.first(step.role)
            if tool is None:
                break
            bound.append(render(_bind(step, tool)))
        else:
            blocks.append("<example>\n" + "\n".join(bound) + "\n</example>")
    return "\n\n".join(blocks)
