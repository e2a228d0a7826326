"""The method table: every JSON-RPC method's name, params struct and result type.

One declarative list shared by the three parties that need it: the server binds a handler to
each entry (``qwenctxd.server.dispatch.bind``; registering a method that is not here fails),
``rpc.discover`` reads the result schemas from it, and the typed client
(``qwenctxd.client.Client.request``) encodes params and decodes results with it. No handlers
and nothing of the server here, so clients import it cheaply::

    from qwenctxd.protocol import methods
    prompt = client.request(methods.SESSION_TURN, TurnParams(session_id=sid, ...))
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from qwenctxd.protocol import (
    daemon,
    debug,
    instructions,
    memory,
    model,
    session,
    skills,
    speculation,
)

P = TypeVar("P")
R = TypeVar("R")


class Method(Generic[P, R]):
    """One method of the wire contract: ``name`` takes ``params`` and answers ``result``."""

    __slots__ = ("name", "params", "result")

    def __init__(self, name: str, params: type[P], result: Any) -> None:
        self.name = name
        self.params = params
        self.result: Any = result

    def __repr__(self) -> str:
        return f"Method({self.name!r})"

    def __str__(self) -> str:  # messages and logs show the wire name
        return self.name


def _m(name: str, params: type[P], result: type[R] | Any) -> Method[P, R]:
    return Method(name, params, result)


# -- daemon.*, rpc.* ---------------------------------------------------------------------------
DAEMON_HELLO = _m("daemon.hello", daemon.HelloParams, daemon.HelloResult)
DAEMON_PING = _m("daemon.ping", daemon.Empty, str)
DAEMON_STATUS = _m("daemon.status", daemon.Empty, daemon.StatusResult)
DAEMON_DRAIN = _m("daemon.drain", daemon.DrainParams, daemon.DrainResult)
DAEMON_SHUTDOWN = _m("daemon.shutdown", daemon.ShutdownParams, daemon.OkResult)
DAEMON_SUBSCRIBE = _m("daemon.subscribe", daemon.SubscribeParams, daemon.OkResult)
RPC_DISCOVER = _m("rpc.discover", daemon.Empty, dict[str, Any])
RPC_CANCEL = _m("rpc.cancel", daemon.CancelParams, daemon.CancelResult)
CANCEL_REQUEST = _m("$/cancelRequest", daemon.CancelParams, daemon.CancelResult)

# -- prompt.system, instructions.* -------------------------------------------------------------
PROMPT_SYSTEM = _m("prompt.system", instructions.PromptSystemParams,
                   instructions.PromptSystemResult)
INSTRUCTIONS_MATCH_RULES = _m("instructions.match_rules", instructions.MatchRulesParams,
                              instructions.MatchRulesResult)
INSTRUCTIONS_FILES = _m("instructions.files", instructions.CwdParams,
                        instructions.InstructionsFilesResult)
INSTRUCTIONS_ADD_MEMORY = _m("instructions.add_memory", instructions.AddMemoryParams,
                             instructions.AddMemoryResult)

# -- session.* ---------------------------------------------------------------------------------
SESSION_OPEN = _m("session.open", session.OpenParams, session.OpenResult)
SESSION_TURN = _m("session.turn", session.TurnParams, session.AssembledPrompt)
SESSION_RECORD_MODEL = _m("session.record_model", session.RecordModelParams,
                          session.RecordModelResult)
SESSION_COMPRESS = _m("session.compress", session.CompressParams, session.CompressResult)
SESSION_REWIND = _m("session.rewind", session.RewindParams, session.RewindResult)
SESSION_LIST = _m("session.list", session.ListParams, session.ListResult)
SESSION_RECAP = _m("session.recap", session.SessionIdParams, session.RecapResult)
SESSION_PROJECT_SUMMARY = _m("session.project_summary", session.SessionIdParams,
                             session.ProjectSummaryResult)
SESSION_DELETE = _m("session.delete", session.SessionIdParams, session.DeleteResult)
SESSION_SET_TITLE = _m("session.set_title", session.SetTitleParams, session.SetTitleResult)
SESSION_CLOSE = _m("session.close", session.SessionIdParams, daemon.OkResult)
SESSION_CONTEXT = _m("session.context", session.SessionIdParams, session.ContextResult)
SESSION_TRANSCRIPT = _m("session.transcript", session.SessionIdParams, session.TranscriptResult)
SESSION_SEARCH = _m("session.search", session.SearchParams, session.SearchResult)

# -- model.* -----------------------------------------------------------------------------------
MODEL_PROBE = _m("model.probe", model.ProbeParams, model.ProbeResult)

# -- skills.* ----------------------------------------------------------------------------------
SKILLS_LIST = _m("skills.list", skills.ListParams, skills.ListResult)
SKILLS_LOAD = _m("skills.load", skills.LoadParams, skills.LoadResult)
SKILLS_REVIEW_LIST = _m("skills.review.list", skills.ReviewListParams, skills.ReviewListResult)
SKILLS_REVIEW_ACCEPT = _m("skills.review.accept", skills.ReviewDraftParams,
                          skills.ReviewAcceptResult)
SKILLS_REVIEW_DISCARD = _m("skills.review.discard", skills.ReviewDraftParams,
                           skills.ReviewDiscardResult)
SKILLS_REVIEW_RUN = _m("skills.review.run", skills.ReviewRunParams, skills.ReviewRunResult)

# -- memory.* ----------------------------------------------------------------------------------
MEMORY_DREAM = _m("memory.dream", memory.DreamParams, memory.DreamScheduledResult)
MEMORY_EXTRACT = _m("memory.extract", memory.ExtractParams, memory.ScheduledResult)
MEMORY_LOG = _m("memory.log", memory.LogParams, memory.LogResult)
MEMORY_UNDO = _m("memory.undo", memory.UndoParams, memory.UndoResult)
MEMORY_LIST = _m("memory.list", memory.ListParams, memory.ListResult)
MEMORY_RECALL = _m("memory.recall", memory.RecallParams, memory.RecallResult)
MEMORY_FORGET_CANDIDATES = _m("memory.forget_candidates", memory.ForgetCandidatesParams,
                              memory.ForgetCandidatesResult)
MEMORY_FORGET = _m("memory.forget", memory.ForgetParams, memory.ForgetResult)
MEMORY_SAVE = _m("memory.save", memory.SaveParams, memory.SaveResult)
MEMORY_CHECK_WRITE = _m("memory.check_write", memory.CheckWriteParams, memory.CheckWriteResult)
MEMORY_STATUS = _m("memory.status", memory.StatusParams, memory.StatusResult)

# -- speculation.* -----------------------------------------------------------------------------
SPECULATION_START = _m("speculation.start", speculation.StartParams, speculation.StartResult)
SPECULATION_ACCEPT = _m("speculation.accept", speculation.IdParams, speculation.AcceptResult)
SPECULATION_ABORT = _m("speculation.abort", speculation.IdParams, speculation.AbortResult)
SPECULATION_STATUS = _m("speculation.status", speculation.IdParams, speculation.StatusResult)

# -- debug.* (served only with QWENCTXD_DEBUG_METHODS=1) ---------------------------------------
DEBUG_SLEEP_TASK = _m("debug.sleep_task", debug.SleepTaskParams, debug.SleepTaskResult)
DEBUG_PUBLISH = _m("debug.publish", debug.PublishParams, dict[str, bool])

DEBUG_METHODS: dict[str, Method[Any, Any]] = {
    m.name: m for m in (DEBUG_SLEEP_TASK, DEBUG_PUBLISH)
}
METHODS: dict[str, Method[Any, Any]] = {
    m.name: m for m in globals().values()
    if isinstance(m, Method) and m.name not in DEBUG_METHODS
}
"""Every method a daemon serves (``DEBUG_METHODS`` come on top when enabled), by name."""


def lookup(name: str) -> Method[Any, Any] | None:
    """The table entry for ``name`` (debug methods included), or None."""
    return METHODS.get(name) or DEBUG_METHODS.get(name)
