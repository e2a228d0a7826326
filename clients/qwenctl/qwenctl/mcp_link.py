"""The MCP server's side of the daemon: one reconnecting link, the project, the texts tools show.

:class:`DaemonLink` holds one blocking ``qwenctxd.client.Client`` (made by
``daemon_link.connect``, so the daemon is auto-started like for every qwenctl command) and
runs each call in a worker thread, one at a time. When the daemon went away underneath (killed,
restarted, upgraded), the call reconnects — starting a daemon when none answers — and is sent
once more; a daemon error is never retried. :class:`ToolFailure` carries the text an MCP tool
error shows: the daemon's message (with the rule ids of a secret refusal).

The ``render_*`` functions turn daemon results into the plain text a model reads.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlparse

import anyio

from qwenctl.daemon_link import Unreachable, connect
from qwenctxd.client import Client, ConnectionLost, DaemonUnreachable, RemoteError
from qwenctxd.protocol import instructions as iwire
from qwenctxd.protocol import memory as mwire
from qwenctxd.protocol import skills as kwire
from qwenctxd.protocol.methods import Method

P = TypeVar("P")
R = TypeVar("R")
REPLY_TIMEOUT_S = 120.0
INSTRUCTION_SECTIONS = ("instructions", "memory")


class ToolFailure(Exception):
    """A failure to show the MCP client as a tool (or resource / prompt) error."""


def describe_remote(exc: RemoteError) -> str:
    text = f"qwenctxd error {exc.code}: {exc.message}"
    data = exc.data if isinstance(exc.data, dict) else {}
    rules = data.get("rules")
    if isinstance(rules, list) and rules:
        text += " (rules: " + ", ".join(str(r) for r in rules) + ")"
    elif data.get("field"):
        text += f" (field: {data['field']})"
    return text


class DaemonLink:
    """A thread-safe, reconnecting call path to the daemon."""

    def __init__(self, socket: str | None, *, autostart: bool = True,
                 timeout: float = REPLY_TIMEOUT_S) -> None:
        self._socket = socket
        self._autostart = autostart
        self._timeout = timeout
        self._client: Client | None = None
        self._lock = threading.Lock()
        self.reconnects = 0

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def request_sync(self, method: Method[P, R], params: P) -> R:
        """The typed call of a table method (see the module docstring for retries)."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._client is None:
                        self._client = connect(self._socket, autostart=self._autostart,
                                               timeout=self._timeout)
                    return self._client.request(method, params)
                except RemoteError as exc:
                    raise ToolFailure(describe_remote(exc)) from None
                except Unreachable as exc:
                    self._drop()
                    raise ToolFailure(str(exc)) from None
                except TimeoutError:
                    self._drop()  # a late reply would confuse the next call
                    raise ToolFailure(f"qwenctxd did not answer {method} within "
                                      f"{self._timeout:.0f} s") from None
                except (ConnectionLost, DaemonUnreachable, OSError) as exc:
                    self._drop()  # the daemon went away: reconnect (autostart) and send again
                    if attempt == 2:
                        raise ToolFailure(f"lost qwenctxd: {exc}") from None
                    self.reconnects += 1
            raise AssertionError("unreachable")

    async def request(self, method: Method[P, R], params: P) -> R:
        return await anyio.to_thread.run_sync(self.request_sync, method, params)

    def close(self) -> None:
        with self._lock:
            self._drop()


def root_to_dir(uri: str) -> Path | None:
    """A ``file://`` root announced by the MCP client as a directory path."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    path = Path(unquote(parsed.path))
    return path if path.is_absolute() and path.is_dir() else None


# -- texts --------------------------------------------------------------------------------------
def render_recall(query: str, result: mwire.RecallResult) -> str:
    text = result.prompt or ""
    return text if text.strip() else f"No saved memory is relevant to: {query}"


def render_candidates(query: str, candidates: list[mwire.Candidate]) -> str:
    if not candidates:
        return f"No memory matches: {query}"
    lines = ["Memories that match (call forget_memory again with `paths` to remove them):"]
    lines += [f"- {c.path} [{c.scope}] {c.name} — {c.reason}" for c in candidates]
    return "\n".join(lines)


def render_removed(removed: list[str]) -> str:
    if not removed:
        return "Nothing was removed."
    return "Removed:\n" + "\n".join(f"- {p}" for p in removed)


def render_skills(result: kwire.ListResult) -> str:
    skills = [s for s in result.skills if s.model_invocable]
    if not skills:
        return "No skills are available in this project."
    lines = ["Available skills (load one with load_skill {name}):"]
    for s in skills:
        state = "" if s.active else " (inactive until a matching file is touched)"
        lines.append(f"- {s.name} [{s.level}]: {s.description}{state}")
    return "\n".join(lines)


def section_text(prompt: iwire.PromptSystemResult,
                 names: tuple[str, ...] = INSTRUCTION_SECTIONS) -> str:
    """The parts of a ``prompt.system`` text its ``sections`` name (they partition it)."""
    text, pos, parts = prompt.text, 0, []
    for sec in prompt.sections:
        end = pos + sec.chars
        if sec.name in names:
            parts.append(text[pos:end])
        pos = end
    return "".join(parts).strip().removeprefix("---").strip()


def render_instructions(prompt: iwire.PromptSystemResult,
                        files: iwire.InstructionsFilesResult) -> str:
    body = section_text(prompt) or "(no project instructions or memory index)"
    listed: list[str] = [f"- {f.path} ({f.type})" for f in prompt.files]
    listed += [f"- {r.path} (rule{', conditional' if r.conditional else ''})"
               for r in files.rules]
    tail = "\n".join(listed) if listed else "- (none)"
    return f"{body}\n\n---\nFiles:\n{tail}"


def memory_uri(doc: mwire.DocInfo) -> str:
    path = Path(doc.path)
    return f"qwenctx://memory/{doc.scope}/{path.parent.name}/{path.name}"
