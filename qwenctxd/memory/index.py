"""MEMORY.md: generating each scope's index from its topic files, and loading it into a prompt.

An index has one line per memory, ``- [Title](target) — hook``, in the format Qwen Code writes:

* titles and hooks pass :func:`sanitize_index_field` (controls, zero-width and bidi characters,
  lone surrogates, backticks and ``](`` defanged, whitespace collapsed, 120 characters), since a
  team index is committed and lands verbatim in every collaborator's prompt;
* the target is the topic file's relative path run through :func:`encode_index_target`
  (percent-encoded UTF-8 outside a small safe set) so it can neither break out of the link nor
  the line, and ``urllib.parse.unquote`` still gives back the real path. It is never shortened;
* a line is at most 150 characters: the hook takes the room the link leaves and is dropped when
  it would have to be cut below 24 characters; cut fields back off to a word boundary only when
  that keeps 60 % of the room, and end in ``…``. Beyond Qwen Code, a long *title* is shortened
  too (to no less than 16 characters) so that a long target still fits a line when it can;
* at most 200 lines and 25 000 characters (UTF-16 units): over budget, short lines are kept
  first, then long ones, in order, and a WARNING line says the index was cut.

Private indexes follow the scan order (newest first). The team index is ordered by relative
path in code-unit order and merges memories with the same normalized description into one
line with ``(also: a.md, b.md)``. :func:`rebuild_index` skips a byte-identical rewrite and
refuses a team root that is, or sits below, a symlink (:class:`TeamMemoryRootSecurityError`,
deliberately not an ``OSError``: it must block git sync, an I/O error must not).

:func:`index_for_prompt` applies the injection limits of the system prompt to an index read
from disk (first 200 lines, then a cut at the last newline before 25 000 characters) and
returns the warning to show with it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import structlog

from qwenctxd.fsutil import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, atomic_write, read_regular
from qwenctxd.memory.paths import INDEX_FILENAME, Scope
from qwenctxd.memory.store import (
    MemoryDoc,
    drop_lone_surrogates,
    scan,
    utf16_len,
    utf16_prefix,
)

log = structlog.get_logger("qwenctxd.memory.index")

MAX_INDEX_LINE_CHARS = 150
MAX_INDEX_LINES = 200
MAX_INDEX_CHARS = 25_000
MAX_INDEX_FIELD_CHARS = 120
MIN_INDEX_HOOK_CHARS = 24
MIN_INDEX_TITLE_CHARS = 16
INDEX_HOOK_SEPARATOR = " — "
INDEX_ALSO_OPEN = " (also: "
INDEX_TRUNCATION_WARNING = (
    "> WARNING: MEMORY.md is too large; only part of it was written. Keep index entries "
    "concise and move detail into topic files."
)
INDEX_TRUNCATION_NOTICE = f"\n\n{INDEX_TRUNCATION_WARNING}"

MAX_PROMPT_INDEX_LINES = 200
MAX_PROMPT_INDEX_CHARS = 25_000

_CONTROL = re.compile("[\u0000-\u001f\u007f-\u009f]")
_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
_WHITESPACE = re.compile(r"\s+")
_TRAILING_WORD = re.compile(r"\s+\S*$")
_TRAILING_PUNCT = re.compile("[.,;:!?)\\]}'\"`]+$")
_SAFE_ASCII = frozenset("/ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-")
# Default-ignorable characters that are not format (Cf) characters: invisible, so encoded.
_INVISIBLE_NON_CF = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0,
     *range(0x180B, 0x1810), *range(0x2060, 0x2070), *range(0xFE00, 0xFE10)]
)
# JavaScript's String.prototype.trim set
_JS_TRIM = " \t\n\v\f\r\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008" \
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


class TeamMemoryRootSecurityError(Exception):
    """The team memory root is, or sits below, a symlink that could redirect the committed
    index outside the repository. A security refusal, distinct from operational I/O errors."""


@dataclass(frozen=True, slots=True)
class IndexResult:
    path: Path
    changed: bool
    truncated: bool
    lines: int


# -- fields -----------------------------------------------------------------------------------


def truncate_index_field(value: str, limit: int) -> str:
    """``value`` within ``limit`` UTF-16 units, ending in ``…`` when cut; backs off to a word
    boundary only when that keeps at least 60 % of ``limit``."""
    if utf16_len(value) <= limit:
        return value
    if limit <= 0:
        return ""
    head = utf16_prefix(value, limit - 1)
    boundary = _TRAILING_WORD.sub("", head).rstrip()
    cut = boundary if utf16_len(boundary) >= limit * 0.6 else head
    return f"{cut.rstrip()}…"


def sanitize_index_field(value: str) -> str:
    """A title or description made safe for one committed index line (at most 120 units)."""
    text = _CONTROL.sub(" ", value)
    text = _INVISIBLE.sub("", text)
    text = drop_lone_surrogates(text)
    text = text.replace("`", "'").replace("](", "] (")
    text = _WHITESPACE.sub(" ", text).strip()
    return truncate_index_field(text, MAX_INDEX_FIELD_CHARS)


def _raw_in_target(ch: str) -> bool:
    if ch in _SAFE_ASCII:
        return True
    code = ord(ch)
    if code < 0xA0 or code > 0xFFFF or 0xD800 <= code <= 0xDFFF:
        return False  # other ASCII, C1 controls, astral characters, surrogates
    return ch.isprintable() and not ch.isspace() and code not in _INVISIBLE_NON_CF


def _utf8(ch: str) -> bytes:
    try:
        return ch.encode("utf-8", "surrogateescape")  # undecodable filename bytes round-trip
    except UnicodeEncodeError:
        return ch.encode("utf-8", "surrogatepass")


def encode_index_target(relative_path: str) -> str:
    """The link target for ``relative_path``: ``/``, ``[A-Za-z0-9._~-]`` and visible BMP
    non-ASCII stay; everything else becomes uppercase ``%XX`` UTF-8 escapes."""
    out: list[str] = []
    for ch in relative_path:
        if _raw_in_target(ch):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in _utf8(ch))
    return "".join(out)


# -- lines ------------------------------------------------------------------------------------


def index_line(doc: MemoryDoc, others: Sequence[MemoryDoc] = ()) -> str:
    """One entry: the link first and whole, then grouped siblings, then what room is left for
    the hook."""
    target = encode_index_target(doc.relative_path)
    title = sanitize_index_field(doc.name) or doc.type
    title_room = MAX_INDEX_LINE_CHARS - utf16_len(f"- []({target})")
    if utf16_len(title) > title_room:
        title = truncate_index_field(title, max(title_room, MIN_INDEX_TITLE_CHARS))
    link = f"- [{title}]({target})"
    link_len = utf16_len(link)
    also = ""
    for other in others:
        candidate = encode_index_target(other.relative_path)
        joined = f"{also}, {candidate}" if also else candidate
        if link_len + len(INDEX_ALSO_OPEN) + utf16_len(joined) + 1 > MAX_INDEX_LINE_CHARS:
            continue  # dropped whole; a later, shorter sibling may still fit
        also = joined
    suffix = f"{INDEX_ALSO_OPEN}{also})" if also else ""
    room = MAX_INDEX_LINE_CHARS - link_len - utf16_len(suffix) - len(INDEX_HOOK_SEPARATOR)
    hook = sanitize_index_field(doc.description) or doc.type
    if utf16_len(hook) > room and room < MIN_INDEX_HOOK_CHARS:
        return f"{link}{suffix}"
    return f"{link}{INDEX_HOOK_SEPARATOR}{truncate_index_field(hook, room)}{suffix}"


def trim_to_budget(lines: Sequence[str]) -> list[str]:
    """The first 200 lines; over 25 000 units, lines of at most 150 are kept first, then the
    longer ones, each while the total still fits, in their original order."""
    entries = list(lines[:MAX_INDEX_LINES])
    lengths = [utf16_len(line) for line in entries]
    if sum(lengths) + max(len(entries) - 1, 0) <= MAX_INDEX_CHARS:
        return entries
    kept: set[int] = set()
    size = 0
    for limit in (MAX_INDEX_LINE_CHARS, MAX_INDEX_CHARS):
        for i, length in enumerate(lengths):
            if i in kept or length > limit:
                continue
            grown = size + (1 if kept else 0) + length
            if grown > MAX_INDEX_CHARS:
                continue
            size = grown
            kept.add(i)
    return [line for i, line in enumerate(entries) if i in kept]


def _assemble(lines: Sequence[str]) -> tuple[str, bool, int]:
    kept = trim_to_budget(lines)
    text = "\n".join(kept)
    if len(kept) == len(lines):
        return text, False, len(kept)
    return f"{text}{INDEX_TRUNCATION_NOTICE}", True, len(kept)


def _normalize_description(description: str) -> str:
    text = _WHITESPACE.sub(" ", description.lower()).strip()
    return _TRAILING_PUNCT.sub("", text).strip()


def _code_units(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def group_team_docs(docs: Sequence[MemoryDoc]) -> list[tuple[MemoryDoc, list[MemoryDoc]]]:
    """Team docs in code-unit path order, those sharing a normalized (non-empty) description
    merged under the first of them."""
    groups: dict[str, list[MemoryDoc]] = {}
    for doc in sorted(docs, key=lambda d: _code_units(d.relative_path)):
        norm = _normalize_description(doc.description)
        key = f"d:{norm}" if norm else f"u:{doc.relative_path}"
        groups.setdefault(key, []).append(doc)
    return [(members[0], members[1:]) for members in groups.values()]


def _render(docs: Sequence[MemoryDoc], *, team: bool) -> tuple[str, bool, int]:
    if team:
        lines = [index_line(primary, others) for primary, others in group_team_docs(docs)]
    else:
        lines = [index_line(doc) for doc in docs]
    return _assemble(lines)


def render_index(docs: Sequence[MemoryDoc], *, team: bool) -> tuple[str, bool]:
    """The MEMORY.md text for ``docs`` (no trailing newline) and whether anything was cut."""
    text, truncated, _ = _render(docs, team=team)
    return text, truncated


# -- rebuild ----------------------------------------------------------------------------------


def check_team_root(root: Path) -> bool:
    """False when ``root`` does not exist; raises when it or a parent below the repository
    root is a symlink (its realpath must equal the repository's realpath + the literal tail)."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise TeamMemoryRootSecurityError(
            f"refusing to write the team memory index: {root} is a symlink, which could "
            "redirect the committed index outside the repository"
        )
    repo = root.parent.parent
    expected = os.path.join(os.path.realpath(repo), root.parent.name, root.name)
    actual = os.path.realpath(root)
    if actual != expected:
        raise TeamMemoryRootSecurityError(
            f"refusing to write the team memory index: {root} resolves to {actual}, outside "
            "the repository; a parent directory symlink may be redirecting it"
        )
    return True


def rebuild_index(root: Path, scope: Scope) -> IndexResult:
    """Regenerate ``root/MEMORY.md`` from every topic file below ``root``.

    Nothing is written when the root does not exist, when the content is byte-identical to
    what is there (a symlinked MEMORY.md is always replaced by a regular file), or when a
    non-user root is itself a symlink (team: :class:`TeamMemoryRootSecurityError`).
    """
    root = Path(root)
    index = root / INDEX_FILENAME
    if scope == "team":
        if not check_team_root(root):
            return IndexResult(index, False, False, 0)
    else:
        try:
            root_st = os.lstat(root)
        except FileNotFoundError:
            return IndexResult(index, False, False, 0)
        if stat.S_ISLNK(root_st.st_mode) and scope != "user":
            log.warning("memory.index_root_symlink", root=str(root), scope=scope)
            return IndexResult(index, False, False, 0)
    docs = scan(root, scope, uncapped=True).docs
    text, truncated, count = _render(docs, team=scope == "team")
    data = text.encode("utf-8")
    try:
        if not os.path.islink(index) and read_regular(index) == data:
            return IndexResult(index, False, truncated, count)
    except OSError:
        pass
    atomic_write(index, text, mode=PRIVATE_FILE_MODE, dir_mode=PRIVATE_DIR_MODE)
    return IndexResult(index, True, truncated, count)


# -- prompt injection -------------------------------------------------------------------------


def _kb(units: int) -> str:
    value = (Decimal(units) / Decimal(1024)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    return str(value)


def index_for_prompt(text: str) -> tuple[str, str | None]:
    """``text`` within the prompt limits, and the warning to show after it when it was cut."""
    trimmed = text.strip(_JS_TRIM)
    lines = trimmed.split("\n")
    units = utf16_len(trimmed)
    over_lines = len(lines) > MAX_PROMPT_INDEX_LINES
    over_chars = units > MAX_PROMPT_INDEX_CHARS
    if not over_lines and not over_chars:
        return trimmed, None
    body = "\n".join(lines[:MAX_PROMPT_INDEX_LINES]) if over_lines else trimmed
    if utf16_len(body) > MAX_PROMPT_INDEX_CHARS:
        cut = utf16_prefix(body, MAX_PROMPT_INDEX_CHARS + 1).rfind("\n")
        body = body[:cut] if cut > 0 else utf16_prefix(body, MAX_PROMPT_INDEX_CHARS)
    if over_chars and not over_lines:
        reason = (f"{_kb(units)} KB (limit: {_kb(MAX_PROMPT_INDEX_CHARS)} KB) — index entries "
                  "are too long")
    elif over_lines and not over_chars:
        reason = f"{len(lines)} lines (limit: {MAX_PROMPT_INDEX_LINES})"
    else:
        reason = f"{len(lines)} lines and {_kb(units)} KB"
    warning = (f"> WARNING: MEMORY.md is {reason}. Only part of it was loaded. Keep index "
               "entries to one line under ~200 chars; move detail into topic files.")
    return body, warning
