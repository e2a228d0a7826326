"""User overrides of the system prompt through environment variables.

* ``QWEN_SYSTEM_MD`` — replace the whole built-in base prompt with a file's text.
* ``QWEN_WRITE_SYSTEM_MD`` — write the base prompt out to a file (to diff or edit it).
* ``QWEN_SYSTEM_IDENTITY_MD`` — replace only the identity sentence with a file's text.

The first two share one parser (:func:`resolve_path_from_env`): after trimming, ``0``/
``false``/``1``/``true`` (any case) are switches — on means ``<cwd>/.qwen/system.md`` — and
anything else is a path, with a leading ``~`` or ``~/`` expanded against ``home`` and relative
paths resolved against ``cwd`` (the session's directory; the daemon has no meaningful process
cwd). The identity variable accepts only a path. A configured file that is missing is an
error the user sees, never a silent fallback to the built-in text.

These functions do blocking file I/O; call them from a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import structlog

from qwenctxd.fsutil import atomic_write, read_regular
from qwenctxd.protocol.errors import Reason, SystemPromptFileError, client_path

log = structlog.get_logger(__name__)

SYSTEM_MD_ENV = "QWEN_SYSTEM_MD"
WRITE_SYSTEM_MD_ENV = "QWEN_WRITE_SYSTEM_MD"
IDENTITY_ENV = "QWEN_SYSTEM_IDENTITY_MD"

_OFF = frozenset({"0", "false"})
_ON = frozenset({"1", "true"})

class SystemPromptFileMissing(SystemPromptFileError):
    """``QWEN_SYSTEM_MD`` is enabled but its file does not exist."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(f"missing system prompt file '{path}'", path=str(path), reason="missing")


class SystemIdentityFileError(SystemPromptFileError):
    """``QWEN_SYSTEM_IDENTITY_MD`` names a file that is missing, empty or unresolvable."""

    _MESSAGES: Mapping[str, str] = {
        "missing": "missing system identity file '{}'",
        "empty": "empty system identity file '{}'",
        "unresolvable": "failed to resolve system identity path '{}'",
        "unreadable": "unreadable system identity file '{}'",
    }

    def __init__(self, path: Path | str, reason: Reason) -> None:
        super().__init__(self._MESSAGES[reason].format(path), path=str(path), reason=reason)


def default_system_md_path(cwd: Path) -> Path:
    """Where the switch form (``1``/``true``) points: ``<cwd>/.qwen/system.md``."""
    return _absolute(cwd) / ".qwen" / "system.md"


def _absolute(p: Path) -> Path:
    """``p`` made absolute and normalised lexically (symlinks are not followed)."""
    return Path(os.path.normpath(os.path.abspath(p)))


def _expand(value: str, *, cwd: Path | None, home: Path | None) -> Path | None:
    """A path value with ``~``/``~/`` expanded and made absolute; None when that is impossible."""
    if value == "~" or value.startswith("~/"):
        if home is None:
            return None
        candidate = home / value[2:] if value != "~" else home
    else:
        candidate = Path(value)
    if not candidate.is_absolute():
        if cwd is None:
            return None
        candidate = cwd / candidate
    return _absolute(candidate)


def resolve_path_from_env(value: str | None, *, cwd: Path, home: Path) -> tuple[bool, Path | None]:
    """Parse a switch-or-path env value into ``(enabled, path)``.

    Unset, blank, ``0`` or ``false`` → ``(False, None)``; ``1``/``true`` → ``(True,
    <cwd>/.qwen/system.md)``; anything else → ``(True, <that path>)``.
    """
    if value is None:
        return False, None
    v = value.strip()
    if not v or v.lower() in _OFF:
        return False, None
    if v.lower() in _ON:
        return True, default_system_md_path(cwd)
    return True, _expand(v, cwd=cwd, home=home)


def load_system_md(environ: Mapping[str, str], cwd: Path, home: Path) -> str | None:
    """The ``QWEN_SYSTEM_MD`` replacement text, verbatim, or None for the built-in prompt.

    Raises :class:`SystemPromptFileMissing` when enabled and the file does not exist.
    """
    enabled, path = resolve_path_from_env(environ.get(SYSTEM_MD_ENV), cwd=cwd, home=home)
    if not enabled or path is None:
        return None
    with client_path(f"env.{SYSTEM_MD_ENV}"):  # e.g. a name too long: the client's path
        is_file = path.is_file()
    if not is_file:
        raise SystemPromptFileMissing(path)
    try:
        return read_regular(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise SystemPromptFileMissing(path) from None
    except OSError as exc:
        log.warning("system_md.unreadable", path=str(path), error=type(exc).__name__)
        raise SystemPromptFileError(
            f"unreadable system prompt file '{path}'", path=str(path), reason="unreadable"
        ) from None


def write_system_md(
    environ: Mapping[str, str], cwd: Path, home: Path, base_prompt: str
) -> Path | None:
    """Write ``base_prompt`` where ``QWEN_WRITE_SYSTEM_MD`` says; the path written, or None.

    Parent directories are created; the write is atomic (temp file + ``os.replace``) and
    skipped when the file already holds exactly this text, so rebuilding the prompt on every
    assembly does not churn the file or its watchers. A failed write is logged and returns
    None: a debugging aid must not break prompt assembly.
    """
    enabled, path = resolve_path_from_env(environ.get(WRITE_SYSTEM_MD_ENV), cwd=cwd, home=home)
    if not enabled or path is None:
        return None
    data = base_prompt.encode("utf-8")
    try:
        if path.is_file() and read_regular(path) == data:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    except OSError as exc:
        log.warning("system_md.write_failed", path=str(path), error=type(exc).__name__)
        return None
    return path


def load_identity(
    environ: Mapping[str, str], home: Path | None, *, cwd: Path | None = None
) -> str | None:
    """The ``QWEN_SYSTEM_IDENTITY_MD`` identity text (trailing whitespace removed), or None.

    Only a path enables it: unset, blank and the switch values are ignored. A relative path
    needs ``cwd`` and ``~`` needs ``home``; without them the path is unresolvable. Raises
    :class:`SystemIdentityFileError` with reason ``missing``, ``empty``, ``unresolvable`` or
    ``unreadable``.
    """
    raw = environ.get(IDENTITY_ENV)
    if raw is None:
        return None
    v = raw.strip()
    if not v or v.lower() in _OFF | _ON:
        return None
    path = _expand(v, cwd=cwd, home=home)
    if path is None:
        raise SystemIdentityFileError(v, "unresolvable")
    with client_path(f"env.{IDENTITY_ENV}"):
        is_file = path.is_file()
    if not is_file:
        raise SystemIdentityFileError(path, "missing")
    try:
        text = read_regular(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise SystemIdentityFileError(path, "missing") from None
    except OSError:
        raise SystemIdentityFileError(path, "unreadable") from None
    if not text.strip():
        raise SystemIdentityFileError(path, "empty")
    return text.rstrip()
