"""How recalled memories reach the model: at most 5 docs, bodies capped at 1 200 characters
with a visible note, the age in words, a freshness warning after a day, and the active-tool
noise filter (a memory that is only a stale note about a tool in use is dropped unless it
records something durable about it)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Protocol

MAX_RELEVANT_DOCS = 5
MAX_DOC_BODY_CHARS = 1_200
DAY_S = 86_400

ACTIVE_MARKERS = (
    "api docs", "api documentation", "failed call", "failed tool call", "failed tool-call",
    "field mapping", "field mappings", "guessed call", "guessed tool", "mcp tool",
    "parameter schema", "parameter schemas", "tool schema", "tool schemas", "tool usage",
    "usage reference",
)
DURABLE_MARKERS = (
    "credential", "credentials", "escalation", "gotcha", "gotchas", "known issue",
    "known issues", "owner", "ownership", "warning", "warnings", "workaround", "workarounds",
)


class DocView(Protocol):
    name: str
    description: str
    body: str
    type: str
    relative_path: str
    mtime: float
    keywords: tuple[str, ...]


def age_in_words(mtime: float, now: float | None = None) -> str:
    days = max(0, math.floor(((now or time.time()) - mtime) / DAY_S))
    if days == 0:
        return "today"
    if days == 1:
        return "yesterday"
    return f"{days} days ago"


def freshness_note(mtime: float, now: float | None = None) -> str:
    days = max(0, math.floor(((now or time.time()) - mtime) / DAY_S))
    if days <= 1:
        return ""
    return (f"This memory is {days} days old. It records what was true then, not what is true "
            "now: check code, files and flags it mentions before relying on them.")


def tool_aliases(active_tools: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for raw in active_tools:
        name = raw.strip().lower()
        if not name:
            continue
        out.add(name)
        if "::" in name:
            out.add(name.split("::")[-1])
        if name.startswith("mcp__"):
            rest = name.split("__", 2)[-1]
            out.add(rest)
            out.add(rest.split("__")[-1])
    return {a for a in out if len(a) >= 3}


def is_tool_noise(doc: DocView, aliases: set[str]) -> bool:
    """A doc about a tool in use that carries only transient tool notes (no durable marker)."""
    if not aliases:
        return False
    hay = " ".join([doc.name, doc.description, " ".join(doc.keywords), doc.body]).lower()
    if not any(a in hay for a in aliases):
        return False
    if any(d in hay for d in DURABLE_MARKERS):
        return False
    return any(m in hay for m in ACTIVE_MARKERS)


def render(docs: Sequence[DocView], *, now: float | None = None) -> str:
    """The ``## Relevant memory`` block (empty string for no docs)."""
    if not docs:
        return ""
    parts = [
        "## Relevant memory",
        "These saved memories may bear on the request. Use one only when it clearly applies, "
        "and verify any file, function or flag it names before acting on it.",
    ]
    for doc in docs[:MAX_RELEVANT_DOCS]:
        parts.append(f"### {doc.name or doc.type} ({doc.relative_path})")
        parts.append(f"Saved {age_in_words(doc.mtime, now)}.")
        if doc.description:
            parts.append(doc.description)
        body = doc.body.strip()
        if body in ("", "_No entries yet._"):
            parts.append("_No detailed entries yet._")
        elif len(body) > MAX_DOC_BODY_CHARS:
            parts.append(body[:MAX_DOC_BODY_CHARS].rstrip()
                         + "\n> NOTE: this memory was cut to fit the prompt budget; read the "
                           "file for the rest.")
        else:
            parts.append(body)
        note = freshness_note(doc.mtime, now)
        if note:
            parts.append(f"> NOTE: {note}")
    return "\n\n".join(parts)
