"""The auto-memory section of the system prompt (userMemory's second half, behind ``---``).

Written in our own words: what the memory directories are, the four types and which scope each
belongs to, what never to save, how to save (a topic file with frontmatter, then one index
line), when to consult memory and how to treat what it says, and each scope's MEMORY.md index
within the injection limits (200 lines, 25 000 characters, with a visible warning when cut).
A condensed variant is used while every index is empty.
"""

from __future__ import annotations

from pathlib import Path

from qwenctxd.memory.index import index_for_prompt

EMPTY_INDEX = "MEMORY.md is empty so far; memories you save will be listed here."

TYPES = """\
- **user** — who the user is and how they like to work (role, experience, tone, tools they
  prefer). Always saved in the user directory.
- **feedback** — rules the user gave about how you should work ("always run the linter",
  "never amend commits"). User directory by default; the project directory only for a
  convention that belongs to this project. Structure the body as the rule, then **Why:** and
  **How to apply:** lines.
- **project** — durable facts about this project that are not in the code or its docs: goals,
  deadlines, decisions, incidents, who owns what. Always the project directory. Same
  **Why:** / **How to apply:** structure.
- **reference** — where to find things outside the repository: dashboards, tickets, runbooks,
  documents. Project directory by default, user directory when personal."""

DO_NOT_SAVE = """\
- code patterns, conventions, architecture, file paths or project structure — read the code;
- git history or who changed what — ask git;
- fixes and debugging recipes — the fix is in the code and the commit message;
- tool names, parameter schemas, field mappings or transcripts of failed tool calls, unless
  they record a confirmed workaround, warning, owner or escalation path;
- anything already in QWEN.md or AGENTS.md;
- details of the task at hand that will not matter next week.
These exclusions hold even when the user asks you to save such things; say why instead."""

HOW_TO_SAVE = """\
1. Write one memory per file under the type's folder of the right directory, e.g.
   `feedback/testing.md`, starting with frontmatter:
   ```
   ---
   name: <short title>
   description: <one specific line: used later to decide whether this memory is relevant>
   type: <user | feedback | project | reference>
   ---
   <the memory>
   ```
   The directories already exist; write the file directly.
2. Add one line for it to that directory's MEMORY.md: `- [Title](feedback/testing.md) — hook`,
   under ~150 characters. MEMORY.md is an index only: never put memory content in it.
Update an existing memory instead of adding a near-duplicate, and delete memories that turn
out to be wrong."""

USING = """\
Consult memory when the user refers to earlier work, asks you to remember or check something,
or when a saved preference bears on the task. If the user asks you to ignore memory, act as if
the indexes below were empty. A memory is a note from the past: "the memory says X exists" is
not "X exists now" — check files, functions and flags before you rely on them, and fix or
remove a memory you find to be stale."""


def _index_block(root: Path, text: str) -> str:
    body, warning = index_for_prompt(text) if text.strip() else (EMPTY_INDEX, None)
    block = f"## {root}/MEMORY.md\n\n{body.strip()}"
    return block + (f"\n\n{warning}" if warning else "")


def memory_section(indexes: list[tuple[str, Path, str]]) -> str:
    """The prompt section for ``[(scope, root, MEMORY.md text)]`` in user → project → team order."""
    if not indexes:
        return ""
    order = {"user": 0, "project": 1, "team": 2}
    indexes = sorted(indexes, key=lambda x: order.get(x[0], 9))
    dirs = "\n".join(f"- {scope} memory: `{root}`" for scope, root, _ in indexes)
    blocks = "\n\n".join(_index_block(root, text) for _, root, text in indexes)
    all_empty = all(not text.strip() for _, _, text in indexes)
    intro = (
        "# auto memory\n\nYou keep a persistent, file-based memory across sessions with this "
        f"user, in {len(indexes)} director{'y' if len(indexes) == 1 else 'ies'}:\n{dirs}\n\n"
        "Save what will still matter in a later conversation, so that you get better at working "
        "with this user and this project over time."
    )
    if all_empty:
        return "\n\n".join([
            intro, "Your memory is empty so far.", "## Types\n\n" + TYPES,
            "## Do not save\n\n" + DO_NOT_SAVE, "## How to save\n\n" + HOW_TO_SAVE, blocks])
    team = ""
    if any(scope == "team" for scope, _, _ in indexes):
        team = ("## Team memory\n\nThe team directory lives in the repository and every "
                "collaborator reads it: put shared conventions and references there, never "
                "anything about one person, and never secrets — such writes are refused. Its "
                "MEMORY.md is generated; do not edit it by hand.")
    parts = [intro, "## Types of memory\n\n" + TYPES]
    if team:
        parts.append(team)
    parts += ["## What not to save\n\n" + DO_NOT_SAVE, "## How to save memories\n\n" + HOW_TO_SAVE,
              "## Using memories\n\n" + USING, blocks]
    return "\n\n".join(parts)
