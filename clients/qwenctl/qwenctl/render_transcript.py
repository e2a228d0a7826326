"""Human output of ``qwenctl sessions show --messages``: the recorded conversation.

One block per entry — ``[n] role  time`` then the text indented — with the tool calls of an
assistant reply as ``→ name(arguments)`` lines, tool results labelled with the tool's name,
and compactions as a marker line. Long texts (tool output, mostly) are cut to
:data:`MAX_LINES` lines with a note saying how many were left out, unless ``full``.
"""

from __future__ import annotations

import time
from typing import Any, TextIO

from qwenctl.render import parse_iso

MAX_LINES = 12
AROUND = 2  # entries shown on each side of ``--around ENTRY``
MAX_ARG_CHARS = 160
INDENT = "    "


def _when(value: str | None) -> str:
    ts = parse_iso(value)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts is not None else ""


def _body(text: str, full: bool) -> list[str]:
    lines = text.splitlines() or ([""] if text else [])
    if not full and len(lines) > MAX_LINES:
        left = len(lines) - MAX_LINES
        lines = [*lines[:MAX_LINES], f"… {left} more line{'s' if left != 1 else ''} "
                                      "(--full shows them)"]
    return [INDENT + ln for ln in lines]


def transcript(res: dict[str, Any], *, stream: TextIO, full: bool = False,
               around: int | None = None) -> None:
    """``around``: only the entries within :data:`AROUND` of that entry index (a search
    hit's), the hit marked ``▶``."""
    entries = res.get("entries") or []
    shown = f", around entry {around}" if around is not None else ""
    stream.write(f"\ntranscript ({len(entries)} entries{shown})\n")
    if not entries:
        stream.write(f"{INDENT}(nothing recorded yet)\n")
    n = 0
    for i, e in enumerate(entries):
        if around is not None and abs(i - around) > AROUND:
            n += e.get("kind") != "compression"
            continue
        if e.get("kind") == "compression":
            stream.write(f"\n-- {e.get('text')}  {_when(e.get('time'))} --\n")
            continue
        n += 1
        role = e.get("role") or "?"
        label = role
        if role == "tool":
            label = f"tool result: {e.get('name') or '?'}"
        elif role == "assistant" and e.get("model"):
            label = f"assistant ({e['model']})"
        mark = "▶ " if i == around else ""
        stream.write(f"\n{mark}[{n}] {label}  {_when(e.get('time'))}".rstrip() + "\n")
        text = e.get("text") or ""
        if text:
            stream.write("\n".join(_body(text, full)) + "\n")
        for c in e.get("tool_calls") or []:
            args = c.get("arguments") or ""
            if not full and len(args) > MAX_ARG_CHARS:
                args = args[:MAX_ARG_CHARS] + "…"
            stream.write(f"{INDENT}→ {c.get('name')}({args})\n")
    if res.get("torn_lines"):
        stream.write(f"\n({res['torn_lines']} unreadable line(s) of {res.get('path')} skipped)\n")
