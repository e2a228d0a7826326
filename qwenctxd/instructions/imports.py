"""Expand ``@path`` imports inside QWEN.md-style instruction files.

This is the daemon's counterpart of Qwen Code's memory import processor: it finds
``@./other.md`` tokens outside Markdown code, checks that each target stays inside the
project root, reads it (UTF-8, size-capped) and either inlines it (``tree``) or lists every
reachable file once (``flat``). Content problems never raise; they come back as
:class:`ImportProblem` records (and a structlog warning) next to the processed text.

Marker formats match upstream exactly:

* tree: ``<!-- Imported from: {path} -->\\n{content}\\n<!-- End of import from: {path} -->``,
  ``<!-- File already processed: {path} -->``, ``<!-- Import failed: {path} - {reason} -->``
  (validation failures, URL or traversal, use the reason ``Path traversal attempt``);
  ``{path}`` is the ``@path`` exactly as written.
* flat: the root content (stripped) first, then ``--- File: {path} ---\\n{content.strip()}\\n
  --- End of File: {path} ---`` blocks joined by ``"\\n\\n"``. Here ``{path}`` is the file's
  path relative to ``project_root`` with forward slashes (upstream prints absolute paths and
  also wraps the root; the caller already wraps the root in its own ``Context from`` marker,
  and absolute paths would leak the home directory into the prompt). ``@path`` tokens stay.

Paths: containment is checked on the lexically normalised path (``os.path.normpath``) and
again on its ``realpath``, so a symlink inside the root that points outside is refused as
traversal. ``ImportResult.imports`` lists the lexical absolute paths (what a watcher should
watch); cycle detection keys on real paths. Problems in the root content report ``file`` as
``str(current_file)``, or ``""`` when no file was given.
"""

from __future__ import annotations

import bisect
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import structlog
from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = ["ImportProblem", "ImportResult", "code_regions", "find_imports", "process_imports"]

log = structlog.get_logger("qwenctxd.instructions.imports")

_WS = frozenset(" \t\r\n")
_URL_PREFIXES = ("http://", "https://", "file://")
_NEWLINE = re.compile(r"\r\n?|\n")
_md: MarkdownIt | None = None


@dataclass(frozen=True)
class ImportProblem:
    file: str  # absolute path of the file containing the @import
    target: str  # the @path as written
    kind: str  # "traversal" | "url" | "cycle" | "depth" | "unreadable" | "too_large" | "missing"
    message: str


@dataclass
class ImportResult:
    text: str  # processed content
    imports: list[Path]  # absolute lexical paths of every imported file, first-seen order
    problems: list[ImportProblem]


# --------------------------------------------------------------------------- scanning


def find_imports(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, path)`` for each import token; ``text[start:end] == "@" + path``.

    An ``@`` counts only at the start of the text or after space/tab/CR/LF; the path runs to
    the next such whitespace and must start with ``.``, ``/`` or an ASCII letter.
    """
    found: list[tuple[int, int, str]] = []
    n = len(text)
    i = text.find("@")
    while i != -1:
        j = i + 1
        if i == 0 or text[i - 1] in _WS:
            while j < n and text[j] not in _WS:
                j += 1
            path = text[i + 1 : j]
            if path and (path[0] in "./" or ("a" <= path[0].lower() <= "z" and path[0].isascii())):
                found.append((i, j, path))
        i = text.find("@", j)
    return found


def _parser() -> MarkdownIt:
    global _md
    if _md is None:
        _md = MarkdownIt("commonmark")
    return _md


def _line_starts(text: str) -> list[int]:
    # markdown-it normalises \r\n and lone \r to \n before parsing; count lines the same way.
    return [0, *(m.end() for m in _NEWLINE.finditer(text))]


def _span_content(raw: str) -> str:
    """CommonMark code-span content normalisation (what markdown-it puts in ``.content``)."""
    s = _NEWLINE.sub(" ", raw)
    if len(s) > 1 and s[0] == " " and s[-1] == " " and s.strip(" "):
        s = s[1:-1]
    return s


def _backtick_run(text: str, i: int, end: int) -> int:
    j = i
    while j < end and text[j] == "`":
        j += 1
    return j


def _closing_run(text: str, i: int, end: int, n: int) -> int:
    """Start of the first run of exactly ``n`` backticks in ``text[i:end]``, or -1."""
    while True:
        i = text.find("`", i, end)
        if i == -1:
            return -1
        j = _backtick_run(text, i, end)
        if j - i == n:
            return i
        i = j


def _locate_span(text: str, start: int, end: int, n: int, content: str) -> tuple[int, int] | None:
    """Find the code span with an ``n``-backtick fence and ``content`` in ``text[start:end]``.

    Prefers an exact content match; falls back to the first well-formed span (content can
    differ when a multi-line span crosses container prefixes such as ``> ``).
    """
    loose: tuple[int, int] | None = None
    i = start
    while i < end:
        c = text[i]
        if c == "\\":  # backslash escapes apply outside code spans
            i += 2
            continue
        if c != "`":
            i += 1
            continue
        j = _backtick_run(text, i, end)
        if j - i == n:
            close = _closing_run(text, j, end, n)
            if close != -1:
                if _span_content(text[j:close]) == content:
                    return (i, close + n)
                if loose is None:
                    loose = (i, close + n)
        i = j
    return loose


def _walk_inline(tokens: list[Token]) -> list[Token]:
    out: list[Token] = []
    for tok in tokens:
        if tok.type == "code_inline":
            out.append(tok)
        elif tok.children:
            out.extend(_walk_inline(tok.children))
    return out


def code_regions(text: str) -> list[tuple[int, int]]:
    """Sorted ``[start, end)`` char offsets of fenced/indented code blocks and code spans."""
    starts = _line_starts(text)

    def offset(line: int) -> int:
        return starts[line] if line < len(starts) else len(text)

    regions: list[tuple[int, int]] = []
    cursor = 0
    for tok in _parser().parse(text):
        if tok.map is None:
            continue
        lo, hi = offset(tok.map[0]), offset(tok.map[1])
        if tok.type in ("fence", "code_block"):
            regions.append((lo, hi))
        elif tok.type == "inline" and tok.children:
            cursor = max(cursor, lo)
            for span in _walk_inline(tok.children):
                hit = _locate_span(text, cursor, hi, len(span.markup), span.content)
                if hit is not None:
                    regions.append(hit)
                    cursor = hit[1]
    regions.sort()
    return regions


def _in_regions(pos: int, regions: list[tuple[int, int]], region_starts: list[int]) -> bool:
    # Regions are disjoint: block tokens never overlap and the span cursor only moves forward.
    k = bisect.bisect_right(region_starts, pos) - 1
    return k >= 0 and pos < regions[k][1]


def _live_imports(text: str) -> list[tuple[int, int, str]]:
    toks = find_imports(text)
    if not toks:
        return toks
    regions = code_regions(text)
    starts = [s for s, _ in regions]
    return [t for t in toks if not _in_regions(t[0], regions, starts)]


# --------------------------------------------------------------------------- processing


class _Unreadable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_PATH_SUFFIXES = (".md", ".markdown", ".mdx", ".txt", ".rst")


def looks_like_path(target: str) -> bool:
    """``@target`` names a file (has a directory part or a text-file suffix), as opposed to a
    mention like ``@alice`` or ``@types``."""
    return "/" in target or target.lower().endswith(_PATH_SUFFIXES)


def _utf8_boundary(data: bytes, cap: int) -> int:
    k = min(cap, len(data))
    while 0 < k < len(data) and (data[k] & 0xC0) == 0x80:
        k -= 1
    return k


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root if root.endswith(os.sep) else root + os.sep)


@dataclass
class _Ctx:
    root: str
    real_root: str
    max_depth: int
    cap: int
    read: Callable[[Path], str] | None
    imports: list[Path] = field(default_factory=list)
    seen_imports: set[str] = field(default_factory=set)
    problems: list[ImportProblem] = field(default_factory=list)
    seen_problems: set[tuple[str, str, str]] = field(default_factory=set)

    def problem(self, file: str, target: str, kind: str, message: str) -> None:
        key = (file, target, kind)
        if key in self.seen_problems:
            return
        self.seen_problems.add(key)
        self.problems.append(ImportProblem(file, target, kind, message))
        log.warning("import_problem", kind=kind, file=file, target=target, detail=message)

    def missing(self, file: str, target: str) -> None:
        """A missing target that looks like a path (not ``@someone`` in prose): a problem, so a
        mistyped ``@import`` does not pass silently; the text stays as written."""
        if looks_like_path(target):
            self.problem(file, target, "missing", f"@{target}: no such file")

    def imported(self, path: str) -> None:
        if path not in self.seen_imports:
            self.seen_imports.add(path)
            self.imports.append(Path(path))

    def resolve(self, file: str, base_dir: str, target: str) -> tuple[str, str] | None:
        """``(lexical, real)`` absolute paths, or None after recording why it was refused."""
        if target.lower().startswith(_URL_PREFIXES):
            self.problem(file, target, "url", f"URL imports are not allowed: {target}")
            return None
        if "\x00" in target:
            self.problem(file, target, "traversal", "path contains a NUL byte")
            return None
        lexical = os.path.normpath(os.path.join(base_dir, target))
        real = os.path.realpath(lexical)
        if not (_inside(lexical, self.root) and _inside(real, self.real_root)):
            self.problem(file, target, "traversal", f"{target} resolves outside the project root")
            return None
        return lexical, real

    def load(self, file: str, target: str, lexical: str, label: str) -> str | None:
        """File text (capped), None if missing; raises _Unreadable for other failures."""
        try:
            if self.read is not None:
                data = self.read(Path(lexical)).encode("utf-8", "surrogatepass")
                size = len(data)
            else:
                data, size = self._read_disk(lexical)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except IsADirectoryError as exc:
            raise _Unreadable("is a directory") from exc
        except PermissionError as exc:
            raise _Unreadable("permission denied") from exc
        except UnicodeError as exc:
            raise _Unreadable("not valid UTF-8") from exc
        except OSError as exc:
            raise _Unreadable(exc.strerror or type(exc).__name__) from exc
        cut = _utf8_boundary(data, self.cap) if size > self.cap else len(data)
        try:
            text = data[:cut].decode("utf-8", "surrogatepass" if self.read else "strict")
        except UnicodeDecodeError as exc:
            raise _Unreadable("not valid UTF-8") from exc
        if size > self.cap:
            note = f"truncated: {label} is {size} bytes, over the {self.cap}-byte cap"
            text = (text if text.endswith("\n") or not text else text + "\n") + f"[... {note} ...]"
            self.problem(file, target, "too_large", note)
        return text

    def _read_disk(self, path: str) -> tuple[bytes, int]:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(path)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(0, "not a regular file")
            data = fh.read(self.cap + 1)
            return data, max(st.st_size, len(data))

    def depth_stop(self, file: str, tokens: list[tuple[int, int, str]]) -> None:
        if tokens:
            self.problem(
                file,
                tokens[0][2],
                "depth",
                f"maximum import depth ({self.max_depth}) reached; imports left unexpanded",
            )


def _tree(ctx: _Ctx, text: str, base_dir: str, file: str, chain: frozenset[str], depth: int) -> str:
    tokens = _live_imports(text)
    if depth >= ctx.max_depth:
        ctx.depth_stop(file, tokens)
        return text
    out: list[str] = []
    pos = 0
    for start, end, target in tokens:
        out.append(text[pos:start])
        pos = end
        resolved = ctx.resolve(file, base_dir, target)
        if resolved is None:
            out.append(f"<!-- Import failed: {target} - Path traversal attempt -->")
            continue
        lexical, real = resolved
        if real in chain:
            ctx.problem(file, target, "cycle", f"{target} is already being imported in this chain")
            out.append(f"<!-- File already processed: {target} -->")
            continue
        try:
            body = ctx.load(file, target, lexical, target)
        except _Unreadable as exc:
            ctx.problem(file, target, "unreadable", exc.reason)
            out.append(f"<!-- Import failed: {target} - {exc.reason} -->")
            continue
        if body is None:  # missing: prose that mentions @something, or a mistyped path
            ctx.missing(file, target)
            out.append(text[start:end])
            continue
        ctx.imported(lexical)
        inner = _tree(ctx, body, os.path.dirname(lexical), lexical, chain | {real}, depth + 1)
        out.append(
            f"<!-- Imported from: {target} -->\n{inner}\n<!-- End of import from: {target} -->"
        )
    out.append(text[pos:])
    return "".join(out)


def _display(ctx: _Ctx, lexical: str) -> str:
    return os.path.relpath(lexical, ctx.root).replace(os.sep, "/")


def _flat(ctx: _Ctx, content: str, base_dir: str, file: str, root_real: str | None) -> str:
    # Nodes are keyed by real path; each holds (problem label, base dir, text, lexical path).
    root_key = root_real if root_real is not None else "\x00root"
    nodes: dict[str, tuple[str, str, str, str]] = {root_key: (file, base_dir, content, file)}
    order: list[str] = []  # imported keys in first-encounter order
    best: dict[str, int] = {}  # shallowest depth each node has been expanded from
    stopped: dict[str, list[tuple[int, int, str]]] = {}

    def visit(key: str, depth: int) -> None:
        best[key] = depth
        label, base, text, _ = nodes[key]
        tokens = _live_imports(text)
        if depth >= ctx.max_depth:
            stopped[key] = tokens
            return
        stopped.pop(key, None)  # reached again closer to the root: now fully expanded
        for _start, _end, target in tokens:
            resolved = ctx.resolve(label, base, target)
            if resolved is None:
                continue
            lexical, child = resolved
            if child in best and best[child] <= depth + 1:
                continue  # already included at least this shallow (also covers cycles)
            if child not in nodes:
                try:
                    body = ctx.load(label, target, lexical, _display(ctx, lexical))
                except _Unreadable as exc:
                    ctx.problem(label, target, "unreadable", exc.reason)
                    continue
                if body is None:
                    ctx.missing(label, target)
                    continue
                nodes[child] = (lexical, os.path.dirname(lexical), body, lexical)
                order.append(child)
                ctx.imported(lexical)
            visit(child, depth + 1)

    visit(root_key, 0)
    for key, tokens in stopped.items():
        ctx.depth_stop(nodes[key][0], tokens)
    blocks = [content.strip()] if content.strip() else []
    for key in order:
        _, _, text, lexical = nodes[key]
        shown = _display(ctx, lexical)
        blocks.append(f"--- File: {shown} ---\n{text.strip()}\n--- End of File: {shown} ---")
    return "\n\n".join(blocks)


def process_imports(
    content: str,
    base_dir: Path,
    *,
    project_root: Path,
    current_file: Path | None = None,
    fmt: Literal["tree", "flat"] = "tree",
    max_depth: int = 5,
    max_file_bytes: int = 64 * 1024,
    read: Callable[[Path], str] | None = None,
) -> ImportResult:
    """Expand the ``@path`` imports in ``content`` (whose relative imports resolve from
    ``base_dir``); see the module docstring for the formats and path rules.

    ``read`` replaces the default strict-UTF-8 disk reader; it may raise ``OSError`` or
    ``UnicodeError`` subclasses, which become problems (``FileNotFoundError`` means missing).
    """
    if fmt not in ("tree", "flat"):
        raise ValueError(f"unknown import format {fmt!r}")
    root = os.path.normpath(os.path.abspath(project_root))
    ctx = _Ctx(root, os.path.realpath(root), max_depth, max_file_bytes, read)
    base = os.path.normpath(os.path.abspath(base_dir))
    file = os.path.normpath(os.path.abspath(current_file)) if current_file is not None else ""
    root_real = os.path.realpath(file) if file else None
    if fmt == "tree":
        chain = frozenset([root_real]) if root_real else frozenset()
        text = _tree(ctx, content, base, file, chain, 0)
    else:
        text = _flat(ctx, content, base, file, root_real)
    return ImportResult(text=text, imports=ctx.imports, problems=ctx.problems)
