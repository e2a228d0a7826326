"""Human output of ``qwenctl context``: the context-window bar, threshold marks and the
parts table (generic helpers live in :mod:`qwenctl.render`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TextIO

import msgspec

from qwenctl.render import (
    table_to,
)

if TYPE_CHECKING:
    from qwenctxd.protocol.session import ContextResult

# part name → (label, plain-text letter, rich colour)
CONTEXT_PARTS: dict[str, tuple[str, str, str]] = {
    "system_base": ("system base", "S", "blue"),
    "instructions": ("instructions", "I", "cyan"),
    "memory": ("memory", "M", "magenta"),
    "system_other": ("system other", "O", "bright_blue"),
    "tools": ("tools", "T", "yellow"),
    "skills": ("skills", "K", "bright_yellow"),
    "reminders": ("reminders", "N", "bright_magenta"),
    "history_user": ("user messages", "U", "green"),
    "history_assistant": ("assistant messages", "A", "bright_green"),
    "history_tool_results": ("tool results", "R", "red"),
}
CONTEXT_FREE = ("free", ".", "grey50")
CONTEXT_MARKS = (("warn", "W"), ("auto", "A"), ("hard", "H"))
CONTEXT_PIPED_WIDTH = 80
CONTEXT_MIN_WIDTH = 20


def context_part_style(name: str) -> tuple[str, str, str]:
    """(label, letter, colour) of a context part; unknown parts get ``?``."""
    return CONTEXT_PARTS.get(name, (name.replace("_", " "), "?", "white"))


def context_width(stream: TextIO, override: int | None = None) -> int:
    """Bar width: ``override``; else the terminal's width less a margin on a TTY; else 80."""
    import shutil

    if override is not None:
        return max(CONTEXT_MIN_WIDTH, override)
    if stream.isatty():
        return max(CONTEXT_MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns - 4)
    return CONTEXT_PIPED_WIDTH


def context_cells(tokens: list[int], window: int, width: int) -> tuple[list[int], int]:
    """Cells of a ``width``-cell bar for each part (≥ 1 when its tokens > 0) and the free
    remainder. The used cells follow ``sum(tokens) / window``; a full window fills the bar."""
    used_tok = sum(max(0, t) for t in tokens)
    nonzero = [i for i, t in enumerate(tokens) if t > 0]
    cells = [0] * len(tokens)
    if not nonzero:
        return cells, width
    share = used_tok / window if window > 0 else 1.0
    used = min(width, max(len(nonzero), round(share * width)))
    if used < len(nonzero):  # a bar narrower than the parts: the largest parts win
        for i in sorted(nonzero, key=lambda i: -tokens[i])[:used]:
            cells[i] = 1
        return cells, width - used
    exact = {i: tokens[i] * used / used_tok for i in nonzero}
    for i in nonzero:
        cells[i] = max(1, int(exact[i]))
    diff = used - sum(cells)
    if diff > 0:  # hand out the rest by largest remainder
        for i in sorted(nonzero, key=lambda i: exact[i] - cells[i], reverse=True)[:diff]:
            cells[i] += 1
    while diff < 0:  # the minimum of one cell overshot: take from the most over-served
        i = max((i for i in nonzero if cells[i] > 1), key=lambda i: cells[i] - exact[i])
        cells[i] -= 1
        diff += 1
    return cells, width - used


def context_marks(thresholds: dict[str, int], window: int, width: int) -> str:
    """The line under the bar: ``^W``, ``^A``, ``^H`` with the caret under the cell where the
    warn / auto / hard threshold falls; labels that would collide are nudged apart, never
    past the bar's end."""
    if window <= 0:
        return ""
    marks = []
    for key, letter in CONTEXT_MARKS:
        if key in thresholds:
            pos = min(width - 1, max(0, int(thresholds[key] * width / window)))
            marks.append((pos, "^" + letter))
    marks.sort(key=lambda m: m[0])
    starts = []
    cursor = 0
    for pos, label in marks:  # forward: no overlap
        start = max(pos, cursor)
        starts.append(start)
        cursor = start + len(label)
    limit = width
    for i in range(len(marks) - 1, -1, -1):  # backward: stay inside the bar
        starts[i] = max(0, min(starts[i], limit - len(marks[i][1])))
        limit = starts[i]
    line = [" "] * width
    for (_, label), start in zip(marks, starts, strict=True):
        for j, ch in enumerate(label):
            if start + j < width:
                line[start + j] = ch
    return "".join(line).rstrip()


#: where a session's window came from, in words (qwenctxd/sessions/window.py has the precedence)
WINDOW_SOURCE_WORDS = {
    "client": "the client",
    "upstream": "the upstream model server",
    "config": "[model] context_window",
    "settings": "model.generationConfig.contextWindowSize",
    "default": "the default",
}


def context_report(res: ContextResult, *, stream: TextIO | None = None,
                   width: int | None = None) -> None:
    """The ``session.context`` result: a one-line bar of the window split into its parts
    (colours on a TTY, one letter per part plus a legend when piped), the threshold markers
    under it, then a table of tokens and shares of the window."""
    out = stream or sys.stdout
    w = context_width(out, width)
    window = res.window_tokens
    parts = res.parts
    tokens = [p.tokens for p in parts]
    cells, free_cells = context_cells(tokens, window, w)
    th = msgspec.structs.asdict(res.thresholds)
    used = res.prompt_tokens
    pct = f" ({100 * used / window:.1f}%)" if window else ""
    head = (f"context of session {res.session_id[:8]}: {used:,} / {window:,} "
            f"tokens{pct}, level {res.level}"
            + (", API-anchored" if res.anchored else ", estimated")
            + (f"; window from {WINDOW_SOURCE_WORDS.get(res.window_source, res.window_source)}"
               if res.window_source else ""))
    marks = context_marks(th, window, w)
    th_line = "thresholds: " + "  ".join(
        f"^{letter} {key} {int(th[key]):,}" + (f" ({100 * th[key] / window:.0f}%)" if window
                                               else "")
        for key, letter in CONTEXT_MARKS if key in th)
    shown = [(p, c) for p, c in zip(parts, cells, strict=True) if c > 0]
    if out.isatty():
        from rich.console import Console
        from rich.text import Text

        console = Console(file=out, highlight=False)
        console.print(Text(head))
        bar = Text()
        for p, c in shown:
            bar.append("█" * c, style=context_part_style(p.name)[2])
        bar.append("░" * free_cells, style="dim")
        console.print(bar, no_wrap=True, overflow="crop")
        console.print(Text(marks, style="bold"), no_wrap=True, overflow="crop")
        legend = Text()
        for p, _c in shown:
            label, _letter, colour = context_part_style(p.name)
            legend.append("█ ", style=colour)
            legend.append(label + "  ")
        legend.append("░ ", style="dim")
        legend.append("free")
        console.print(legend)
        console.print(Text(th_line))
    else:
        bar_s = "".join(context_part_style(p.name)[1] * c for p, c in shown)
        bar_s += CONTEXT_FREE[1] * free_cells
        legend_s = "legend: " + "  ".join(
            f"{context_part_style(p.name)[1]}={context_part_style(p.name)[0]}"
            for p in parts) + f"  {CONTEXT_FREE[1]}={CONTEXT_FREE[0]}"
        out.write("\n".join([head, bar_s, marks, legend_s, th_line]) + "\n")
    rows: list[tuple[str, ...]] = []
    for p in parts:
        label, letter, _colour = context_part_style(p.name)
        rows.append((letter, label, f"{p.tokens:,}", f"{p.pct:.1f}%"))
    free = res.free_tokens
    rows.append((CONTEXT_FREE[1], "free", f"{free:,}", f"{res.free_pct:.1f}%"))
    rows.append(("", "total in prompt", f"{used:,}",
                 f"{100 * used / window:.1f}%" if window else "-"))
    table_to(out, "parts", rows, ("", "part", "tokens", "% of window"), right=(2, 3),
             nowrap=(0, 1, 2, 3))
