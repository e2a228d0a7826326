"""Wire types of the ``session.*`` methods and the AssembledPrompt."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from qwenctxd.protocol.daemon import Params

Message = dict[str, Any]


class AgentInfo(msgspec.Struct, kw_only=True):
    name: str
    version: str | None = None


class OpenParams(Params):
    cwd: str
    model: str
    window_tokens: int | None = None
    # where window_tokens came from: "upstream" when the client (the proxy) learned it from the
    # model server; anything else counts as the client's own choice
    window_source: Literal["client", "upstream"] | None = None
    session_id: str | None = None
    resume: bool = False
    # the client's tool declarations (OpenAI "tools" entries); constant for the session, part
    # of the cacheable prefix
    tools: list[dict[str, Any]] | None = None
    # the client's environment variables that shape the system prompt (see prompt.system)
    env: dict[str, str] | None = None
    auto_compact_threshold: float | None = msgspec.field(default=None)
    # who the client is: the base prompt's identity (protocol C5)
    agent: AgentInfo | None = None
    # which reasoning fields returned messages keep (protocol C4)
    keep_reasoning: Literal["none", "current_turn", "all"] | None = None
    # the OpenAI-compatible base URL the client's agent sends its requests to (the proxy's
    # upstream): the daemon's side queries yield to this session's requests on that server
    model_base_url: str | None = None
    # the session's first turn, run in the same call when the opened session holds no
    # messages (a new conversation: one round trip instead of open + turn)
    first_turn: TurnInput | None = None


class OpenResult(msgspec.Struct, kw_only=True):
    session_id: str
    resumed: bool
    messages: int
    prompt_tokens: int
    window_tokens: int
    path: str
    # client | upstream | config | settings | default (sessions/window.py has the precedence)
    window_source: str = "default"
    torn_lines: list[int] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    # the prompt of ``first_turn`` when it ran; left out of the reply when it did not (the
    # session already held messages, or no first turn was asked for)
    prompt: AssembledPrompt | msgspec.UnsetType = msgspec.UNSET


class ToolResult(msgspec.Struct, kw_only=True):
    tool_call_id: str
    name: str | None = None
    content: str | list[dict[str, Any]]
    is_error: bool = False


class KnownHistory(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What the client already holds: the ``epoch`` of its copy and how many messages."""
    epoch: str
    count: int


class TurnInput(Params):
    """What a turn brings: ``session.turn``'s params but the session and ``known``; alone, it
    is ``session.open``'s ``first_turn``."""
    kind: Literal["user", "tool_results", "cron"]
    text: str | None = None
    images: list[dict[str, Any]] | None = None
    tool_results: list[ToolResult] | None = None
    touched_paths: list[str] | None = None
    active_tools: list[str] | None = None

    def turn_params(self, session_id: str) -> TurnParams:
        """These inputs as a ``session.turn`` of ``session_id`` (nothing known of it)."""
        return TurnParams(session_id=session_id, **msgspec.structs.asdict(self))


class TurnParams(TurnInput, kw_only=True):
    session_id: str
    # the client's copy of the history: with a matching epoch only what is new comes back
    known: KnownHistory | None = None


class Thresholds(msgspec.Struct, kw_only=True):
    warn: int
    auto: int
    hard: int


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    window_tokens: int
    thresholds: Thresholds
    level: Literal["ok", "warn", "auto", "hard"]
    context_left_pct: float
    anchored: bool = False


class Reminder(msgspec.Struct, kw_only=True):
    kind: str
    text: str


class AssembledPrompt(msgspec.Struct, kw_only=True):
    system: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    reminders: list[Reminder]
    usage: Usage
    # turn_events Structs as objects (turn_events.parse); plain here so an unknown type from a
    # newer daemon never fails the reply
    events: list[dict[str, Any]]
    prefix_hash: str
    session_id: str = ""
    # changes whenever earlier messages are rewritten (compaction, micro-compaction, rewind, a
    # merged user turn, reasoning dropped from an earlier turn, a restart); ``messages`` starts
    # at index ``messages_from`` of the history
    epoch: str = ""
    messages_from: int = 0


class ApiUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int = 0


class RecordModelParams(Params):
    session_id: str
    message: Message
    usage: ApiUsage | None = None


class AnsweredCall(msgspec.Struct, kw_only=True):
    tool_call_id: str
    name: str
    content: str


class RecordModelResult(msgspec.Struct, kw_only=True):
    turn_complete: bool
    scheduled: list[str]
    # calls the daemon answered itself (its own ``skill`` tool)
    answered: list[AnsweredCall] = msgspec.field(default_factory=list)


class RewindParams(Params):
    session_id: str
    turns: int = 1


class RewindResult(msgspec.Struct, kw_only=True):
    removed_messages: int
    messages: int


class CompressParams(Params):
    session_id: str
    mode: Literal["full", "fast"] = "full"
    instructions: str | None = None


class CompressResult(msgspec.Struct, kw_only=True):
    status: str
    tokens_before: int
    tokens_after: int
    events: list[dict[str, Any]] = msgspec.field(default_factory=list)  # as AssembledPrompt's


class ListParams(Params):
    cwd: str | None = None


class SessionInfo(msgspec.Struct, kw_only=True):
    session_id: str
    cwd: str
    started_at: str | None
    updated_at: str | None
    messages: int
    title: str | None
    open: bool = False


class ListResult(msgspec.Struct, kw_only=True):
    sessions: list[SessionInfo]


class SessionIdParams(Params):
    session_id: str


class RecapResult(msgspec.Struct, kw_only=True):
    text: str | None
    status: str
    reason: str | None = None


class ProjectSummaryResult(msgspec.Struct, kw_only=True):
    path: str
    text: str


class DeleteResult(msgspec.Struct, kw_only=True):
    deleted: bool


class SetTitleParams(Params):
    session_id: str
    title: str


class SetTitleResult(msgspec.Struct, kw_only=True):
    session_id: str
    title: str


# -- session.context --------------------------------------------------------------------------
class ContextPart(msgspec.Struct, kw_only=True):
    name: str
    tokens: int
    pct: float  # of the window, 0–100


class ContextResult(msgspec.Struct, kw_only=True):
    session_id: str
    window_tokens: int
    prompt_tokens: int
    anchored: bool
    thresholds: Thresholds
    level: Literal["ok", "warn", "auto", "hard"]
    parts: list[ContextPart]
    free_tokens: int
    free_pct: float
    window_source: str = "default"


# -- session.transcript (operations addition) ---------------------------------------------------
class TranscriptCall(msgspec.Struct, kw_only=True):
    id: str | None = None
    name: str
    arguments: str


class TranscriptEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    kind: str  # "message" | "compression"
    role: str  # user | assistant | tool | system
    text: str = ""
    time: str | None = None
    tool_calls: list[TranscriptCall] = msgspec.field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    model: str | None = None


class TranscriptResult(msgspec.Struct, kw_only=True):
    session_id: str
    path: str
    entries: list[TranscriptEntry]
    torn_lines: int = 0


# -- session.search ----------------------------------------------------------------------------
SearchRole = Literal["user", "assistant", "tool"]


class SearchParams(Params):
    """``session.search``: every word must match (``"a phrase"`` in order; CJK as substrings)."""

    query: str
    cwd: str | None = None  # the project that holds it; None: every project
    session_id: str | None = None
    roles: list[SearchRole] = msgspec.field(default_factory=lambda: ["user", "assistant"])
    since: str | None = None  # ISO-8601
    limit: int = 20  # 1..100


class SearchHit(msgspec.Struct, kw_only=True):
    session_id: str
    cwd: str | None
    title: str | None
    entry: int  # index into the session's session.transcript entries
    role: str
    time: str | None
    snippet: str  # ≤ 300 chars around the first match
    score: float


class SearchIndexed(msgspec.Struct, kw_only=True):
    sessions: int
    entries: int
    pending: int  # session files not indexed yet


class SearchResult(msgspec.Struct, kw_only=True):
    hits: list[SearchHit]
    indexed: SearchIndexed
