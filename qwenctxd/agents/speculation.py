"""Follow-up speculation (§8): run the suggested next user message ahead of time, in a sandbox.

When a client shows a suggested follow-up ("add tests for it"), ``speculation.start`` forks
an agent over a copy of the session history with the suggestion as the user's message. The
agent's file changes go into a copy-on-write :class:`~qwenctxd.agents.overlay.OverlayFS`:
writes land in the overlay, reads see the overlay first, writes outside the project are
refused (the model reads the refusal as the tool result). When the user accepts, the overlay
is copied back and the produced messages (assistant + tool, reasoning dropped) are returned
for appending to the session; when the user types something else, abort cancels the agent and
removes the overlay, leaving the project byte-identical.

Tool gate (as upstream's ``speculationToolGate``):

* ``read_file``, ``list_directory``, ``glob``, ``grep_search`` — run, reading overlay-first
  (merged directory listings, deleted files hidden, files created in the overlay visible);
* ``write_file``, ``edit`` — redirected into the overlay (``allow_writes=False`` — upstream's
  approval modes other than auto-edit/yolo — makes them a boundary instead);
* ``run_shell_command`` — only when the tree-sitter classifier proves the command read-only;
  it runs in the REAL working directory (safe: it cannot write), so it does not see overlay
  changes — its result says so and lists the changed paths when there are any;
* anything else (unknown, MCP, agent, memory, web...) is a *boundary*: the speculation stops
  there and the unexecuted calls are stripped from the assistant message, so the messages stay
  a valid conversation (every tool call answered).

Limits: 20 model turns and 100 produced messages (whichever comes first; a reply whose calls
would overflow the message cap is trimmed), plus a wall-clock budget. Accepting a speculation
that is still running stops it at the next safe point (an in-flight model call is cancelled,
an in-flight tool batch finishes) and accepts what is done.

This module runs and manages speculations; the tools are the agents' one tool set
(:mod:`qwenctxd.agents.tools`) over the overlay filesystem
(:class:`~qwenctxd.agents.fs.OverlayTreeFS`).
"""

from __future__ import annotations

import itertools
import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

from qwenctxd.agents.overlay import OverlayFS
from qwenctxd.agents.runner import fork_history
from qwenctxd.agents.tools import DECLARATIONS, ToolContext, call_tool
from qwenctxd.model import ModelClient
from qwenctxd.protocol.errors import InvalidParams, ModelUnavailable, PathOutsideProject

__all__ = [
    "MAX_SPECULATION_MESSAGES",
    "MAX_SPECULATION_TURNS",
    "AcceptResult",
    "Speculation",
    "SpeculationManager",
    "SpeculationRun",
]

log = structlog.get_logger("qwenctxd.speculation")

MAX_SPECULATION_TURNS = 20
MAX_SPECULATION_MESSAGES = 100
DEFAULT_MAX_TIME_S = 300.0
ACCEPT_STOP_TIMEOUT_S = 30.0
READ_TOOLS = ("read_file", "list_directory", "glob", "grep_search")
WRITE_TOOLS = ("write_file", "edit")
SHELL_TOOL = "run_shell_command"
_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)

SYSTEM = """\
You are an AI coding assistant working in the project at {project} (working directory \
{cwd}). Continue the conversation: carry out the user's latest request directly, using the \
tools to read and change files (absolute paths). Keep the final answer short."""


# -- one speculation ----------------------------------------------------------------------------
@dataclass
class AcceptResult:
    applied: list[str]  # absolute paths written or deleted in the project
    messages: list[dict[str, Any]]  # to append to the session, starting with the user message
    complete: bool  # the last message is a final assistant answer (no open tool calls)
    outcome: str | None
    conflicts: list[str] = field(default_factory=list)  # changed in the project meanwhile


@dataclass(frozen=True, slots=True)
class SpeculationRun:
    """What a speculation job hands the task registry: ``status`` ``"failed"`` when the model
    failed or the deadline passed (counted as a failed run in ``daemon.status``, ``reason`` the
    cause), else the run's outcome; ``speculation`` is its final :meth:`Speculation.status`."""

    status: str
    reason: str | None
    speculation: dict[str, Any]


class Speculation:
    """One speculative run. Create through :meth:`SpeculationManager.start`."""

    def __init__(self, *, model: ModelClient, session_history: Sequence[dict[str, Any]],
                 cwd: Path, project_root: Path, suggestion: str, session_id: str | None,
                 system: str | None, overlay: OverlayFS, max_turns: int, max_messages: int,
                 max_time_s: float, fast: bool, allow_shell: bool, allow_writes: bool) -> None:
        self.id = uuid.uuid4().hex
        self.session_id = session_id
        self.suggestion = suggestion
        self.cwd = cwd
        self.project_root = project_root
        self.overlay = overlay
        self.max_turns = max_turns
        self.max_messages = max_messages
        self.max_time_s = max_time_s
        self.fast = fast
        self.allowed_tools = [*READ_TOOLS, *(WRITE_TOOLS if allow_writes else ()),
                              *((SHELL_TOOL,) if allow_shell else ())]
        self.ctx = ToolContext.over_overlay(cwd, overlay, allow_shell=allow_shell)
        self._model = model
        self._system = system if system is not None else SYSTEM.format(project=project_root,
                                                                       cwd=cwd)
        self._history = fork_history(session_history)
        self.user_message: dict[str, Any] = {"role": "user", "content": suggestion}
        self.messages: list[dict[str, Any]] = []  # produced: assistant + tool
        self.state = "pending"  # pending | running | ready | accepted | aborted
        self.outcome: str | None = None
        self.error: str | None = None
        self.boundary_tool: str | None = None
        self.turns = 0
        self.tool_calls = 0
        self.created_at = time.time()
        self.elapsed_s = 0.0
        self.applied: list[str] = []  # after accept: the absolute paths applied
        self._done = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._model_scope: anyio.CancelScope | None = None
        self._stop_requested = False
        self._ids = itertools.count(1)

    # -- observation ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "speculation_id": self.id,
            "session_id": self.session_id,
            "state": self.state,
            "outcome": self.outcome,
            "turns": self.turns,
            "messages": len(self.messages),
            "tool_calls": self.tool_calls,
            "changed": self.applied if self.overlay.closed else
            [str(p) for p in self.overlay.changed()],
            "boundary_tool": self.boundary_tool,
            "error": self.error,
            "elapsed_s": self.elapsed_s,
        }

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> None:
        await self._done.wait()

    # -- the job --------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        """The agent loop; schedule it as a background job. Returns :meth:`status`."""
        if self.state != "pending":
            self._done.set()
            return self.status()
        self.state = "running"
        started = time.monotonic()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                with anyio.move_on_after(self.max_time_s) as deadline:
                    try:
                        self.outcome = await self._loop(started)
                    except ModelUnavailable as exc:
                        self.outcome = "failed"
                        data = exc.data if isinstance(exc.data, dict) else {}
                        self.error = data.get("reason", exc.message)
                if deadline.cancelled_caught and self.outcome is None:
                    self.outcome = "timed_out"
            if self.outcome is None:  # our own scope was cancelled: abort, or a forced stop
                self.outcome = "cancelled" if self.state == "aborted" else "stopped"
        except anyio.get_cancelled_exc_class():
            # cancelled from outside (daemon shutdown): nobody can accept it any more
            self.outcome = "cancelled"
            self.state = "aborted"
            self.overlay.discard()  # synchronous: awaiting here would be cancelled again
            raise
        finally:
            self._scope = None
            self.elapsed_s = round(time.monotonic() - started, 3)
            if self.state == "running":
                self.state = "ready"
            self._done.set()
            log.info("speculation finished", speculation=self.id, session=self.session_id,
                     state=self.state, outcome=self.outcome, turns=self.turns,
                     messages=len(self.messages), tool_calls=self.tool_calls)
        return self.status()

    def _gate(self, calls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
        """Calls up to the first boundary tool, and that tool's name (None: no boundary)."""
        for i, call in enumerate(calls):
            name = (call.get("function") or {}).get("name", "")
            if name not in self.allowed_tools:
                return calls[:i], name or "(unnamed)"
        return calls, None

    async def _loop(self, started: float) -> str:
        decls = [DECLARATIONS[t] for t in self.allowed_tools]
        convo: list[dict[str, Any]] = [{"role": "system", "content": self._system},
                                       *self._history, self.user_message]
        for turn in range(1, self.max_turns + 1):
            if self._stop_requested:
                return "stopped"
            if len(self.messages) >= self.max_messages:
                return "message_limit"
            self.turns = turn
            left = max(1.0, self.max_time_s - (time.monotonic() - started))
            with anyio.CancelScope() as model_scope:
                self._model_scope = model_scope
                if self._stop_requested:
                    model_scope.cancel()
                reply = await self._model.complete(
                    [*convo, *self.messages], tools=decls, fast=self.fast, timeout_s=left,
                    feature="speculation")
            self._model_scope = None
            if model_scope.cancelled_caught:
                return "stopped"
            text = _THINK.sub("", reply.text or "")
            calls = [dict(c) for c in reply.tool_calls]
            for c in calls:
                if not c.get("id"):
                    c["id"] = f"call_spec_{next(self._ids)}"
                c.setdefault("type", "function")
            calls, boundary = self._gate(calls)
            stop: str | None = None
            if boundary is not None:
                stop, self.boundary_tool = "boundary", boundary
            room = self.max_messages - len(self.messages) - 1
            if len(calls) > room:
                calls, stop = calls[:max(0, room)], stop or "message_limit"
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = calls
            if not calls:
                if text:
                    msg["content"] = text
                    self.messages.append(msg)
                return stop or "completed"
            results = await self._run_calls(calls)
            batch = [msg]
            for i, call in enumerate(calls):
                batch.append({"role": "tool", "tool_call_id": call["id"],
                              "name": (call.get("function") or {}).get("name", ""),
                              "content": results[i]})
            self.messages.extend(batch)  # the call and its results land together
            self.tool_calls += len(calls)
            if stop is not None:
                return stop
        return "turn_limit"

    async def _run_calls(self, calls: Sequence[dict[str, Any]]) -> dict[int, str]:
        """One reply's tool calls, concurrently; results by position."""
        results: dict[int, str] = {}

        async def one(i: int, call: dict[str, Any]) -> None:
            fn = call.get("function") or {}
            results[i] = await call_tool(self.ctx, fn.get("name", ""),
                                         fn.get("arguments") or "{}")

        async with anyio.create_task_group() as tg:
            for i, call in enumerate(calls):
                tg.start_soon(one, i, call)
        return results

    # -- control --------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop at the next safe point (an in-flight model call is cancelled; a tool batch
        in progress finishes first)."""
        self._stop_requested = True
        if self._model_scope is not None:
            self._model_scope.cancel()

    def abort(self) -> None:
        """Cancel now and discard the overlay (the project is never touched)."""
        if self.state in ("accepted", "aborted"):
            return
        self.state = "aborted"
        self._stop_requested = True
        if self._scope is not None:
            self._scope.cancel()
        else:
            self._done.set()
        self.overlay.discard()

    def continuation(self) -> list[dict[str, Any]]:
        """The user message and the produced messages, as they would extend the session."""
        return [dict(self.user_message), *(dict(m) for m in self.messages)]


# -- the manager ------------------------------------------------------------------------------
class SpeculationManager:
    """All speculations of the daemon: at most one live per session (a newer one aborts the
    previous), finished records kept for ``status`` (bounded)."""

    def __init__(self, *, overlay_base: Path | None = None, max_kept: int = 32) -> None:
        self.overlay_base = overlay_base
        self.max_kept = max_kept
        self._specs: dict[str, Speculation] = {}

    def _overlay_dir(self) -> Path | None:
        if self.overlay_base is None:
            return None  # OverlayFS picks $XDG_RUNTIME_DIR/qwenctxd/speculation/<pid>/<id>
        return self.overlay_base / str(os.getpid()) / uuid.uuid4().hex[:8]

    def start(self, model: ModelClient, *, session_history: Sequence[dict[str, Any]],
              cwd: Path, project_root: Path, suggestion: str, session_id: str | None = None,
              system: str | None = None, overlay_dir: Path | None = None,
              max_turns: int = MAX_SPECULATION_TURNS,
              max_messages: int = MAX_SPECULATION_MESSAGES,
              max_time_s: float = DEFAULT_MAX_TIME_S, fast: bool = False,
              allow_shell: bool = True, allow_writes: bool = True) -> str:
        """Prepare a speculation and return its id; the caller schedules ``run(id)``.

        InvalidParams for an empty suggestion or a project root that contains the overlay
        directory (``/``, the temp dir); PathOutsideProject when ``cwd`` is not inside
        ``project_root``. A live speculation of the same session is aborted first.
        """
        if not isinstance(suggestion, str) or not suggestion.strip():
            raise InvalidParams("suggestion is empty",
                                data={"field": "suggestion", "message": "empty"})
        root = Path(os.path.abspath(project_root))
        cwd = Path(os.path.abspath(cwd))
        rel = os.path.relpath(os.path.realpath(cwd), os.path.realpath(root))
        if rel == ".." or rel.startswith(".." + os.sep):
            raise PathOutsideProject(f"{cwd} is not inside the project {root}",
                                     data={"path": str(cwd)})
        try:
            overlay = OverlayFS(root, overlay_dir or self._overlay_dir(),
                                remove_empty_parent=overlay_dir is None)
        except ValueError:  # the project root contains where overlays live ("/", /tmp, …)
            raise InvalidParams(
                f"cannot speculate in {root}: the project contains the daemon's overlay "
                "directory; open the session in a project directory",
                data={"field": "session_id", "message": "project root contains the overlay "
                      "directory", "project_root": str(root)}) from None
        if session_id is not None:
            for old in self._specs.values():
                if old.session_id == session_id and old.state in ("pending", "running",
                                                                   "ready"):
                    old.abort()
        spec = Speculation(model=model, session_history=session_history, cwd=cwd,
                           project_root=root, suggestion=suggestion, session_id=session_id,
                           system=system, overlay=overlay, max_turns=max_turns,
                           max_messages=max_messages,
                           max_time_s=min(max_time_s, model.deadline("speculation")), fast=fast,
                           allow_shell=allow_shell, allow_writes=allow_writes)
        self._specs[spec.id] = spec
        self._prune()
        log.info("speculation started", speculation=spec.id, session=session_id,
                 overlay=str(overlay.overlay_dir))
        return spec.id

    def get(self, speculation_id: str) -> Speculation:
        spec = self._specs.get(speculation_id)
        if spec is None:
            raise InvalidParams(f"unknown speculation_id {speculation_id!r}",
                                data={"field": "speculation_id", "message": "unknown"})
        return spec

    async def run(self, speculation_id: str) -> SpeculationRun:
        """The background job for ``speculation_id`` (schedule it in the task registry)."""
        spec = self.get(speculation_id)
        final = await spec.run()
        if spec.outcome in ("failed", "timed_out"):
            return SpeculationRun("failed", spec.error or "timeout", final)
        return SpeculationRun(spec.outcome or "completed", None, final)

    def status(self, speculation_id: str) -> dict[str, Any]:
        return self.get(speculation_id).status()

    async def accept(self, speculation_id: str, *,
                     stop_timeout_s: float = ACCEPT_STOP_TIMEOUT_S) -> AcceptResult:
        """Stop the agent at a safe point if it still runs, copy the overlay into the project
        and return the applied paths and the messages to append to the session.

        InvalidParams when the id is unknown or the speculation was aborted or accepted.
        """
        spec = self.get(speculation_id)
        if spec.state in ("accepted", "aborted"):
            raise InvalidParams(f"speculation {speculation_id} was already {spec.state}",
                                data={"field": "speculation_id", "message": spec.state})
        if spec.state == "running":
            spec.request_stop()
            with anyio.move_on_after(stop_timeout_s):
                await spec.wait()
            if not spec.finished and spec._scope is not None:
                spec._scope.cancel()  # a tool batch overran; its results are not recorded
                await spec.wait()
        if spec.state in ("accepted", "aborted"):  # aborted while we waited
            raise InvalidParams(f"speculation {speculation_id} was already {spec.state}",
                                data={"field": "speculation_id", "message": spec.state})
        spec.state = "accepted"
        spec._done.set()
        conflicts = [str(spec.project_root / p) for p in spec.overlay.conflicts()]
        applied = await anyio.to_thread.run_sync(spec.overlay.apply)
        messages = spec.continuation()
        last = messages[-1]
        complete = last.get("role") == "assistant" and not last.get("tool_calls")
        log.info("speculation accepted", speculation=spec.id, session=spec.session_id,
                 applied=len(applied), messages=len(messages), conflicts=len(conflicts))
        spec.applied = [str(spec.project_root / p) for p in applied]
        return AcceptResult(applied=list(spec.applied),
                            messages=messages, complete=complete, outcome=spec.outcome,
                            conflicts=conflicts)

    def abort(self, speculation_id: str) -> bool:
        """Cancel the agent and remove the overlay; False when it was already accepted or
        aborted (InvalidParams when the id is unknown)."""
        spec = self.get(speculation_id)
        if spec.state in ("accepted", "aborted"):
            return False
        spec.abort()
        log.info("speculation aborted", speculation=spec.id, session=spec.session_id)
        return True

    def abort_session(self, session_id: str) -> list[str]:
        """Abort every live speculation of a session (e.g. the user typed a new message)."""
        out = []
        for spec in list(self._specs.values()):
            if spec.session_id == session_id and spec.state in ("pending", "running", "ready"):
                spec.abort()
                out.append(spec.id)
        return out

    def close(self) -> None:
        """Abort everything (daemon shutdown): no overlay outlives the daemon."""
        for spec in list(self._specs.values()):
            spec.abort()

    def _prune(self) -> None:
        dead = [s for s in self._specs.values() if s.state in ("accepted", "aborted")]
        for spec in dead[:max(0, len(dead) - self.max_kept)]:
            del self._specs[spec.id]
