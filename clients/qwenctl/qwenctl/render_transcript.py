"""Human output of ``qwenctl sessions show --messages``: the recorded conversation.

One block per entry — ``[n] role  time`` then the text indented — with the tool calls of an
assistant reply as ``→ name(arguments)`` lines, tool results labelled with the tool's name,
and compactions as a marker line. Long texts (tool output, mostly) are cut to
:data:`MAX_LINES` lines with a note saying how many were left out, unless ``full``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

from qwenctl.render import parse_iso

if TYPE_CHECKING:
    from qwenctxd.protocol.session import TranscriptResult

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


def transcript(res: TranscriptResult, *, stream: TextIO, full: bool = False,
               around: int | None = None) -> None:
    """``around``: only the entries within :data:`AROUND` of that entry index (a search
    hit's), the hit marked ``▶``."""
    entries = res.entries
    shown = f", around entry {around}" if around is not None else ""
    stream.write(f"\ntranscript ({len(entries)} entries{shown})\n")
    if not entries:
        stream.write(f"{INDENT}(nothing recorded yet)\n")
    n = 0
    for i, e in enumerate(entries):
        if around is not None and abs(i - around) > AROUND:
            n += e.kind != "compression"
            continue
        if e.kind == "compression":
            stream.write(f"\n-- {e.text}  {_when(e.time)} --\n")
            continue
        n += 1
        role = e.role or "?"
        label = role
        if role == "tool":
            label = f"tool result: {e.name or '?'}"
        elif role == "assistant" and e.model:
            label = f"assistant ({e.model})"
        mark = "▶ " if i == around else ""
        stream.write(f"\n{mark}[{n}] {label}  {_when(e.time)}".rstrip() + "\n")
        text = e.text or ""
        if text:
            stream.write("\n".join(_body(text, full)) + "\n")
        for c in e.tool_calls:
            args = c.arguments or ""
            if not full and len(args) > MAX_ARG_CHARS:
                args = args[:MAX_ARG_CHARS] + "…"
            stream.write(f"{INDENT}→ {c.name}({args})\n")
    if res.torn_lines:
        stream.write(f"\n({res.torn_lines} unreadable line(s) of {res.path} skipped)\n")
