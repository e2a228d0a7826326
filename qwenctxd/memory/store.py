"""Memory files on disk: scaffold, topic documents, state files (meta.json, extract cursor).

* :func:`ensure_scaffold` — idempotent: creates the project and user roots, their four topic
  directories and empty ``MEMORY.md`` indexes, and the project's default ``meta.json`` and
  ``extract-cursor.json``; existing files are never touched (create-if-missing, ``O_EXCL``).
  Team memory is created lazily by its first write, never here.
* :func:`scan` — every ``*.md`` below a root except ``MEMORY.md``, parsed as a
  :class:`MemoryDoc`. A file without frontmatter, with broken frontmatter or with a ``type``
  outside the four types is ignored and reported in ``problems``; so are symlinks inside the
  root (never followed). Private scopes are ordered newest first (mtime desc, then file name,
  then relative path), team by relative path in UTF-16 code-unit order so the committed index
  is the same on every machine; at most 200 documents unless ``uncapped``.
* :func:`sanitize_prompt_field` — a frontmatter value made safe for a prompt line.
* :func:`read_meta` / :func:`write_meta` / :func:`read_cursor` / :func:`write_cursor` — the
  state files, written atomically as 2-space JSON plus a newline, as Qwen Code writes them.

Lengths of prompt text are measured in UTF-16 code units, as Qwen Code (JavaScript) measures
them; :func:`utf16_len` and :func:`utf16_prefix` do that without splitting a surrogate pair.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import stat
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from qwenctxd.frontmatter import parse as parse_frontmatter
from qwenctxd.fsutil import (
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    atomic_write,
    make_dirs,
    read_regular,
)
from qwenctxd.memory.paths import (
    CURSOR_FILENAME,
    INDEX_FILENAME,
    MEMORY_TYPES,
    META_FILENAME,
    MemoryRoots,
    Scope,
)

log = structlog.get_logger("qwenctxd.memory.store")

MAX_SCANNED_MEMORY_FILES = 200
MAX_MEMORY_KEYWORDS = 8
MAX_MEMORY_KEYWORD_CHARS = 64
MAX_MEMORY_KEYWORDS_TOTAL_CHARS = 512
METADATA_VERSION = 1
EPOCH_ISO = "1970-01-01T00:00:00.000Z"

_SURROGATE = re.compile("[\ud800-\udfff]")
_WHITESPACE = re.compile(r"\s+")


# -- text helpers -----------------------------------------------------------------------------


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (JavaScript's ``string.length``)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def utf16_prefix(text: str, units: int) -> str:
    """The longest prefix of ``text`` at most ``units`` UTF-16 code units long (whole chars)."""
    if units <= 0:
        return ""
    if len(text) <= units // 2 or utf16_len(text) <= units:
        return text
    used = 0
    for i, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > units:
            return text[:i]
    return text


def drop_lone_surrogates(text: str) -> str:
    """Join surrogate pairs (as YAML ``\\ud83d\\ude00`` escapes yield them) and drop lone ones."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "ignore")


def sanitize_prompt_field(value: str, max_chars: int) -> str:
    """NFKC, control chars to spaces, format chars dropped, whitespace collapsed, trimmed and cut
    to ``max_chars`` UTF-16 units without leaving half a surrogate pair."""
    text = unicodedata.normalize("NFKC", drop_lone_surrogates(value))
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat == "Cc":
            out.append(" ")
        elif cat != "Cf":
            out.append(ch)
    cleaned = _WHITESPACE.sub(" ", "".join(out)).strip()
    return utf16_prefix(cleaned, max_chars)


def now_iso() -> str:
    """``new Date().toISOString()``: UTC, milliseconds, ``Z``."""
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def to_json(data: dict[str, Any]) -> str:
    """``JSON.stringify(data, null, 2) + "\\n"``."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# -- scaffold ---------------------------------------------------------------------------------


def _create_if_missing(path: Path, text: str) -> bool:
    """Create ``path`` with ``text`` unless something (even a dangling link) is already there."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    os.fchmod(fd, PRIVATE_FILE_MODE)  # whatever the umask
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return True


def _scaffold_root(root: Path, created: list[Path]) -> None:
    for directory in (root, *(root / t for t in MEMORY_TYPES)):
        if not directory.is_dir():
            make_dirs(directory, PRIVATE_DIR_MODE)
            created.append(directory)
    if _create_if_missing(root / INDEX_FILENAME, ""):
        created.append(root / INDEX_FILENAME)


def ensure_scaffold(roots: MemoryRoots) -> list[Path]:
    """Create whatever is missing of the project and user layout; returns what was created."""
    created: list[Path] = []
    if roots.project is not None:
        _scaffold_root(roots.project, created)
    if roots.state is not None:
        make_dirs(roots.state, PRIVATE_DIR_MODE)
        stamp = now_iso()
        meta = {"version": METADATA_VERSION, "createdAt": stamp, "updatedAt": stamp}
        if _create_if_missing(roots.state / META_FILENAME, to_json(meta)):
            created.append(roots.state / META_FILENAME)
        if _create_if_missing(roots.state / CURSOR_FILENAME, to_json({"updatedAt": stamp})):
            created.append(roots.state / CURSOR_FILENAME)
    _scaffold_root(roots.user, created)
    return created


# -- documents --------------------------------------------------------------------------------


@dataclass
class MemoryDoc:
    """One topic file. ``name`` falls back to ``title`` then the file stem; ``description`` to
    ``""``; ``relative_path`` uses ``/`` and is relative to the scope root."""

    path: Path
    scope: Scope
    type: str
    name: str
    description: str
    body: str
    mtime: float
    size: int
    relative_path: str
    keywords: tuple[str, ...] = ()


@dataclass
class ScanResult:
    docs: list[MemoryDoc] = field(default_factory=list)
    problems: list[tuple[Path, str]] = field(default_factory=list)


def _scalar(value: Any) -> str:
    """A frontmatter value as text: scalars as written, anything else (lists, maps) as ``""``."""
    if value is None or isinstance(value, (list, dict, set, tuple)):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).strip()


def _keywords(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, list):
        items = value
    else:
        return ()
    out: list[str] = []
    total = 0
    for item in items:
        word = sanitize_prompt_field(_scalar(item), MAX_MEMORY_KEYWORD_CHARS)
        if not word or word in out:
            continue
        if total + len(word) > MAX_MEMORY_KEYWORDS_TOTAL_CHARS:
            break
        out.append(word)
        total += len(word)
        if len(out) >= MAX_MEMORY_KEYWORDS:
            break
    return tuple(out)


def parse_doc(path: Path, root: Path, scope: Scope, text: str, st: os.stat_result
              ) -> MemoryDoc | str:
    """A :class:`MemoryDoc` from a file's text, or the reason it is not a memory."""
    fm = parse_frontmatter(text)
    if not fm.present:
        return "no frontmatter (a memory starts with a --- block holding name, description, type)"
    if fm.error:
        return fm.error
    mem_type = fm.data.get("type")
    if not isinstance(mem_type, str) or mem_type.strip() not in MEMORY_TYPES:
        return f"type must be one of {', '.join(MEMORY_TYPES)} (got {mem_type!r})"
    name = _scalar(fm.data.get("name")) or _scalar(fm.data.get("title")) or path.stem
    return MemoryDoc(
        path=path,
        scope=scope,
        type=mem_type.strip(),
        name=name,
        description=_scalar(fm.data.get("description")),
        body=fm.body.strip(),
        mtime=st.st_mtime,
        size=st.st_size,
        relative_path=path.relative_to(root).as_posix(),
        keywords=_keywords(fm.data.get("keywords")),
    )


def _walk(root: Path, problems: list[tuple[Path, str]]) -> Iterable[tuple[Path, os.stat_result]]:
    """Regular ``*.md`` files below ``root`` (``MEMORY.md`` excluded), symlinks never followed."""
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            if directory != root:
                problems.append((directory, f"cannot list directory: {exc.strerror or exc}"))
            continue
        for entry in entries:
            path = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                if entry.name.endswith(".md") or os.path.isdir(path):
                    problems.append((path, "symlink inside a memory directory; not followed"))
                continue
            if stat.S_ISDIR(st.st_mode):
                pending.append(path)
            elif stat.S_ISREG(st.st_mode) and entry.name.endswith(".md"):
                if entry.name != INDEX_FILENAME:
                    yield path, st


def _code_units(text: str) -> bytes:
    """Sort key giving JavaScript's code-unit string order."""
    return text.encode("utf-16-be", "surrogatepass")


def scan(root: Path, scope: Scope, *, uncapped: bool = False) -> ScanResult:
    """The memory documents below ``root`` and the files that were skipped, with why."""
    result = ScanResult()
    try:
        root_st = os.lstat(root)
    except FileNotFoundError:
        return result
    except OSError as exc:
        result.problems.append((root, f"cannot read memory root: {exc.strerror or exc}"))
        return result
    if stat.S_ISLNK(root_st.st_mode) and scope != "user":
        result.problems.append((root, f"{scope} memory root is a symlink; not scanned"))
        return result
    for path, st in _walk(root, result.problems):
        try:
            text = read_regular(path).decode("utf-8", errors="replace")
        except OSError as exc:
            result.problems.append((path, f"cannot read: {exc.strerror or exc}"))
            continue
        doc = parse_doc(path, root, scope, text, st)
        if isinstance(doc, str):
            result.problems.append((path, doc))
        else:
            result.docs.append(doc)
    if scope == "team":
        result.docs.sort(key=lambda d: _code_units(d.relative_path))
    else:
        result.docs.sort(key=lambda d: (-d.mtime, _code_units(d.path.name),
                                        _code_units(d.relative_path)))
    if not uncapped:
        del result.docs[MAX_SCANNED_MEMORY_FILES:]
    return result


def remove_docs(paths: Iterable[Path]) -> list[Path]:
    """Delete the given topic files; returns those actually removed (missing ones are skipped,
    directories are never removed)."""
    removed: list[Path] = []
    for path in paths:
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                log.warning("memory.remove_skipped_directory", path=str(path))
                continue
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("memory.remove_failed", path=str(path), error=str(exc))
            continue
        removed.append(path)
    return removed


# -- state files ------------------------------------------------------------------------------


#: parsed state files by path, with the stat they were read at: ``meta.json`` and the extract
#: cursor are asked for after every turn (the dream and extraction gates) and change rarely,
#: so a hit costs one ``stat`` instead of an open, a read and a parse
_JSON_CACHE: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}
_JSON_CACHE_MAX = 256


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a regular file), or None when missing, unreadable or not an
    object. A top-level copy: callers may add or replace keys, not edit nested values."""
    key = str(path)
    try:
        st = os.stat(path)
    except OSError:
        _JSON_CACHE.pop(key, None)
        return None
    seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    hit = _JSON_CACHE.get(key)
    if hit is not None and hit[0] == seen and stat.S_ISREG(st.st_mode):
        return dict(hit[1])
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if len(_JSON_CACHE) >= _JSON_CACHE_MAX:
        _JSON_CACHE.clear()
    _JSON_CACHE[key] = (seen, data)
    return dict(data)


def read_meta(state: Path) -> dict[str, Any]:
    """``meta.json`` of a project state dir; ``{}`` when missing or unreadable."""
    return _read_json(state / META_FILENAME) or {}


def write_meta(state: Path, **updates: Any) -> dict[str, Any]:
    """Merge ``updates`` (camelCase keys; ``None`` deletes a key) into ``meta.json``.

    ``updatedAt`` is set to now unless given; a missing file starts from the default record.
    Returns what was written.
    """
    stamp = now_iso()
    meta = read_meta(state) or {"version": METADATA_VERSION, "createdAt": stamp}
    meta.setdefault("version", METADATA_VERSION)
    meta.setdefault("createdAt", stamp)
    meta["updatedAt"] = stamp
    for key, value in updates.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    atomic_write(state / META_FILENAME, to_json(meta), mode=PRIVATE_FILE_MODE,
                 dir_mode=PRIVATE_DIR_MODE)
    return meta


def read_cursor(state: Path) -> dict[str, Any]:
    """``extract-cursor.json``; ``{"updatedAt": epoch}`` when missing or unreadable."""
    data = _read_json(state / CURSOR_FILENAME)
    if data is None:
        return {"updatedAt": EPOCH_ISO}
    data.setdefault("updatedAt", EPOCH_ISO)
    return data


def write_cursor(state: Path, session_id: str, offset: int) -> dict[str, Any]:
    """Record that ``session_id`` was extracted up to history ``offset``."""
    cursor = {"sessionId": session_id, "processedOffset": offset, "updatedAt": now_iso()}
    atomic_write(state / CURSOR_FILENAME, to_json(cursor), mode=PRIVATE_FILE_MODE,
                 dir_mode=PRIVATE_DIR_MODE)
    return cursor
