"""Read ``.env`` files the way Qwen Code users write them (``~/.qwen/.env``, ``<project>/.qwen/.env``).

Qwen Code loads ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` / ``OPENAI_MODEL`` from these files
without overriding variables already set in its environment, so that is where many users keep
their model key. :func:`read_dotenv` parses the dotenv dialect: ``KEY=VALUE`` lines, an optional
``export`` prefix, ``#`` comment lines and `` #`` trailing comments on unquoted values, single
quotes (literal) and double quotes (``\\n``, ``\\t``, ``\\"`` and ``\\\\`` escapes). A missing or
unreadable file is empty; a malformed line is skipped, never raised.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from qwenctxd.fsutil import read_regular

MAX_DOTENV_BYTES = 256 * 1024
_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*)$")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def parse_dotenv(text: str) -> dict[str, str]:
    """``{name: value}`` of a dotenv text; later lines win."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or line.lstrip().startswith("#"):
            continue
        key, raw = m.group(1), m.group(2).strip()
        if raw[:1] == "'":
            end = raw.find("'", 1)
            value = raw[1:end] if end > 0 else raw[1:]
        elif raw[:1] == '"':
            chars: list[str] = []
            i = 1
            while i < len(raw) and raw[i] != '"':
                if raw[i] == "\\" and i + 1 < len(raw):
                    chars.append(_ESCAPES.get(raw[i + 1], "\\" + raw[i + 1]))
                    i += 2
                    continue
                chars.append(raw[i])
                i += 1
            value = "".join(chars)
        else:
            value = re.split(r"\s+#", raw, maxsplit=1)[0].strip()
        out[key] = value
    return out


def read_dotenv(path: str | os.PathLike[str]) -> dict[str, str]:
    """The variables of the ``.env`` file at ``path`` (empty when missing or unreadable)."""
    try:
        raw = read_regular(Path(path))
    except OSError:
        return {}
    return parse_dotenv(raw[:MAX_DOTENV_BYTES].decode("utf-8", errors="replace"))
