"""Compose the full system prompt: base sections, then userMemory and the append text each
behind the ``---`` separator (empty → nothing, not even the separator).

userMemory is laid out as Qwen Code 0.24 sends it: the instruction files and rules, then the
git snapshot (a blank line apart), then ``---`` and the auto-memory section."""

from __future__ import annotations

from dataclasses import dataclass

from qwenctxd.protocol.instructions import PROMPT_ENV_KEYS

__all__ = ["PROMPT_ENV_KEYS", "SEPARATOR", "Composed", "compose", "suffix"]

SEPARATOR = "\n\n---\n\n"


def suffix(text: str | None) -> str:
    """``"\\n\\n---\\n\\n" + text`` for non-blank text; "" otherwise (no orphan separator)."""
    trimmed = (text or "").strip()
    return SEPARATOR + trimmed if trimmed else ""


@dataclass
class Composed:
    text: str
    sections: list[tuple[str, int]]  # (name, chars) — chars include separators before it


def compose(
    base: list[tuple[str, str]],
    *,
    instructions: str,
    memory_section: str,
    append: str | None,
    git_section: str,
) -> Composed:
    sections: list[tuple[str, int]] = []
    parts: list[str] = []
    for i, (name, text) in enumerate(base):
        piece = text if i == 0 else "\n\n" + text
        parts.append(piece)
        sections.append((name, len(piece)))
    # userMemory = QWEN.md text (+ rules), the git snapshot, then the auto-memory section
    # behind its own ---; as a whole it sits behind one --- after the base.
    inst = suffix(instructions)
    if inst:
        parts.append(inst)
        sections.append(("instructions", len(inst)))
    if git_section.strip():
        piece = ("\n\n" if inst else SEPARATOR) + git_section.strip()
        parts.append(piece)
        sections.append(("git_status", len(piece)))
    for name, piece in (("memory", suffix(memory_section)), ("append", suffix(append))):
        if piece:
            parts.append(piece)
            sections.append((name, len(piece)))
    return Composed(text="".join(parts), sections=sections)
