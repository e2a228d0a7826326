"""Read the discovered files into the instructions text (the QWEN.md part of userMemory).

Each file is read with a size cap (truncated visibly, never silently), its ``@imports``
expanded, trimmed, and wrapped in Qwen Code's markers::

    --- Context from: <path relative to cwd> ---
    <content>
    --- End of Context from: <path relative to cwd> ---

Blocks are joined by a blank line; baseline rules follow the files in Qwen Code's rule markers,
the path relative to the project root::

    --- Rule from: .qwen/rules/00-base.md ---
    <body>
    --- End of Rule from: .qwen/rules/00-base.md ---
Everything that went wrong is collected as a problem, and everything that was read or looked
for is recorded as a dependency so the cache can be invalidated by the watchers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qwenctxd.fsutil import open_regular
from qwenctxd.instructions.discovery import Discovery, InstructionFile
from qwenctxd.instructions.imports import process_imports
from qwenctxd.instructions.rules import RuleSet, load_rules

ANY_MD = "*.md"
EXPANDED_CAP_FACTOR = 8  # a file with its imports may be 8x the per-file cap


@dataclass
class LoadedFile:
    path: Path
    type: str
    bytes: int
    imports: list[Path] = field(default_factory=list)
    truncated: bool = False


@dataclass
class Problem:
    path: Path
    kind: str
    message: str


@dataclass
class InstructionSet:
    """Everything ``prompt.system`` and ``instructions.files`` need for one cwd."""

    cwd: Path
    project_root: Path | None
    files: list[LoadedFile]
    rules: RuleSet
    text: str
    problems: list[Problem]
    # dir -> names whose change invalidates this set ("*.md": any markdown file there)
    deps: dict[Path, set[str]]
    # path -> (mtime_ns, size) at build time, None for a path that did not exist
    fingerprints: dict[Path, tuple[int, int] | None]


def marker_path(path: Path, cwd: Path) -> str:
    return os.path.relpath(path, cwd).replace(os.sep, "/")


def wrap(content: str, rel: str) -> str:
    return f"--- Context from: {rel} ---\n{content}\n--- End of Context from: {rel} ---"


def wrap_rule(content: str, rel: str) -> str:
    return f"--- Rule from: {rel} ---\n{content}\n--- End of Rule from: {rel} ---"


def fingerprint(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def read_capped(path: Path, cap: int) -> tuple[str, int, bool]:
    """(text, size on disk, truncated). Raises OSError when unreadable."""
    with open_regular(path) as f:
        raw = f.read(cap + 1)
        size = os.fstat(f.fileno()).st_size
    truncated = len(raw) > cap or size > cap
    if truncated:
        raw = raw[:cap]
    text = raw.decode("utf-8", errors="ignore" if truncated else "replace")
    if truncated:
        text += (f"\n[... truncated: {path.name} is {size} bytes, over the {cap}-byte cap; "
                 f"the rest was not loaded ...]")
    return text, size, truncated


def build(discovery: Discovery, *, import_format: str, max_file_bytes: int,
          root_of: Callable[[Path], Path | None]) -> InstructionSet:
    """Read the discovered files; ``root_of`` maps a directory to its git root (the daemon
    passes its project registry's lookup)."""
    cwd = discovery.cwd
    deps: dict[Path, set[str]] = {}
    prints: dict[Path, tuple[int, int] | None] = {}

    def depend(path: Path, name: str | None = None) -> None:
        deps.setdefault(path.parent, set()).add(name or path.name)

    for probed in discovery.probed:
        depend(probed)
        prints[probed] = fingerprint(probed)
    problems = [Problem(p, "refused", msg) for p, msg in discovery.problems]
    blocks: list[str] = []
    loaded: list[LoadedFile] = []
    for f in discovery.files:
        lf = _load_one(f, cwd, import_format, max_file_bytes, problems, blocks, root_of)
        if lf is None:
            continue
        loaded.append(lf)
        for imp in lf.imports:
            depend(imp)
            prints[imp] = fingerprint(imp)

    root = discovery.effective_root
    rules = load_rules(root)
    deps.setdefault(rules.directory, set()).add(ANY_MD)
    depend(rules.directory)  # the rules dir appearing or vanishing
    for path, msg in rules.problems:
        problems.append(Problem(path, "rule", msg))
    for rule in rules.baseline:
        blocks.append(wrap_rule(rule.body, marker_path(rule.path, root)))
    for path in rules.files:
        prints[path] = fingerprint(path)
    return InstructionSet(
        cwd=cwd,
        project_root=discovery.project_root,
        files=loaded,
        rules=rules,
        text="\n\n".join(blocks),
        problems=problems,
        deps=deps,
        fingerprints=prints,
    )


def _load_one(f: InstructionFile, cwd: Path, import_format: str, cap: int,
              problems: list[Problem], blocks: list[str],
              root_of: Callable[[Path], Path | None]) -> LoadedFile | None:
    try:
        text, size, truncated = read_capped(f.path, cap)
    except OSError as exc:
        problems.append(Problem(f.path, "unreadable", f"cannot read: {exc.strerror or exc}"))
        return None
    if truncated:
        problems.append(Problem(f.path, "too_large",
                                f"{size} bytes, over the {cap}-byte cap: truncated"))
    import_root = root_of(f.path.parent) or f.path.parent
    result = process_imports(text, f.path.parent, project_root=import_root, current_file=f.path,
                             fmt=import_format, max_file_bytes=cap)  # type: ignore[arg-type]
    for p in result.problems:
        problems.append(Problem(Path(p.file), f"import_{p.kind}", f"@{p.target}: {p.message}"))
    content = result.text.strip()
    expanded_cap = cap * EXPANDED_CAP_FACTOR
    if len(content) > expanded_cap:  # a high fan-out of imports repeats shared files
        problems.append(Problem(f.path, "too_large",
                                f"{len(content)} chars after imports, over {expanded_cap}: "
                                f"truncated"))
        content = (content[:expanded_cap] + f"\n[... truncated: {f.path.name} with its imports "
                   f"is over {expanded_cap} characters ...]")
        truncated = True
    if content:
        blocks.append(wrap(content, marker_path(f.path, cwd)))
    return LoadedFile(path=f.path, type=f.type, bytes=size, imports=list(result.imports),
                      truncated=truncated)
