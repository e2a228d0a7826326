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
    """One tool call: its name, its arguments in order, and a one-line gist for ``general``."""

    name: str
    args: tuple[tuple[str, ArgValue], ...]
    gist: str


_Step: TypeAlias = str | _Call

_APP = "/home/dev/shop"

# Each scenario is a short exchange: plain lines (``user:``/``model:`` turns or a bracketed
# note on what a tool returned) and tool calls. The same scenarios render in every style.
_SCENARIOS: tuple[tuple[_Step, ...], ...] = (
    (
        "user: what's in the src folder?",
        _Call("list_directory", (("path", f"{_APP}/src"),), f"'{_APP}/src'"),
    ),
    (
        "user: Where is the HTTP timeout set?",
        "model: I'll search for it.",
        _Call("grep_search", (("pattern", r"timeout\s*="),), r"'timeout\s*='"),
        "(one match: src/http/client.py, line 12)",
        _Call(
            "read_file",
            (("file_path", f"{_APP}/src/http/client.py"),),
            f"'{_APP}/src/http/client.py'",
        ),
        "model: In src/http/client.py, line 12: `timeout=30` (seconds), passed to every request.",
    ),
    (
        "user: start the dev server",
        "model: It keeps running, so I'll start it in the background.",
        _Call(
            "run_shell_command",
            (("command", "npm run dev"), ("is_background", True)),
            "'npm run dev' in the background",
        ),
    ),
    (
        "user: Rename fetch_user to load_user in src/users.py.",
        "model: First I'll read the file and look for other callers.",
        _Call("read_file", (("file_path", f"{_APP}/src/users.py"),), f"'{_APP}/src/users.py'"),
        _Call("grep_search", (("pattern", r"\bfetch_user\b"),), r"'\bfetch_user\b'"),
        "(callers in src/users.py and tests/test_users.py)",
        "model: Two files call it. Updating the definition first:",
        _Call(
            "edit",
            (
                ("file_path", f"{_APP}/src/users.py"),
                ("old_string", "def fetch_user(user_id):"),
                ("new_string", "def load_user(user_id):"),
            ),
            f"'{_APP}/src/users.py' replacing 'def fetch_user(' with 'def load_user('",
        ),
        "(after updating the remaining call sites the same way)",
        _Call("run_shell_command", (("command", "npm test"),), "'npm test'"),
    ),
    (
        "user: delete the build folder",
        "model: This permanently removes build/ and everything in it.",
        _Call(
            "run_shell_command", (("command", f"rm -rf {_APP}/build"),), f"'rm -rf {_APP}/build'"
        ),
    ),
)


def _render_coder(call: _Call) -> str:
    params = "".join(f"<parameter={k}>\n{_scalar(v)}\n</parameter>\n" for k, v in call.args)
    return f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>"


def _render_vl(call: _Call) -> str:
    body = json.dumps({"name": call.name, "arguments": dict(call.args)}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _render_general(call: _Call) -> str:
    return f"[tool_call: {call.name} for {call.gist}]"


def _render_gemma4(call: _Call) -> str:
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


def examples(style: ToolCallStyle) -> str:
    """All scenarios rendered in ``style``, each wrapped in ``<example>`` tags."""
    render = _RENDERERS[style]
    blocks = []
    for scenario in _SCENARIOS:
        lines = [step if isinstance(step, str) else render(step) for step in scenario]
        blocks.append("<example>\n" + "\n".join(lines) + "\n</example>")
    return "\n\n".join(blocks)
