"""Wire types of the ``memory.*`` methods."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from qwenctxd.protocol.daemon import Params

Scope = Literal["project", "user", "team"]


class ListParams(Params):
    cwd: str
    scope: Scope | None = None


class DocInfo(msgspec.Struct, kw_only=True):
    path: str
    scope: str
    type: str
    name: str
    description: str
    age: str
    hits: int = 0


class ListResult(msgspec.Struct, kw_only=True):
    docs: list[DocInfo]
    problems: list[dict[str, str]] = msgspec.field(default_factory=list)


class RecallParams(Params):
    cwd: str
    query: str
    active_tools: list[str] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=20)] = 5  # documents returned (top-k)


class RecallWhy(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Where a recalled document stood in each tier (``qwenctl memory recall --explain``)."""

    final_rank: int
    lexical_rank: int | None = None
    lexical_score: float | None = None  # its BM25 (higher is better)
    semantic: float | None = None  # the best cosine over the embedders
    semantic_ranks: dict[str, int] | None = None  # embedder -> rank
    selector_rank: int | None = None  # its place in the selector's answer


class RecalledDoc(msgspec.Struct, kw_only=True):
    path: str
    scope: str
    type: str
    name: str
    score: float | None = None
    why: RecallWhy | None = None


class RecallTier(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str  # lexical | semantic | selector
    ms: float
    status: Literal["ok", "late", "failed", "off"]
    detail: str | None = None  # why a tier is late, failed or off
    models: list[str] | None = None  # the semantic tier: the embedders that answered


class RecallResult(msgspec.Struct, kw_only=True):
    strategy: Literal["model", "heuristic", "none"]
    docs: list[RecalledDoc]
    prompt: str
    fell_back: str | None = None
    tiers: list[RecallTier] = msgspec.field(default_factory=list)


class ForgetCandidatesParams(Params):
    cwd: str
    query: str
    limit: int = 5


class Candidate(msgspec.Struct, kw_only=True):
    path: str
    scope: str
    name: str
    reason: str


class ForgetCandidatesResult(msgspec.Struct, kw_only=True):
    candidates: list[Candidate]


class ForgetParams(Params):
    cwd: str
    paths: list[str]


class ForgetResult(msgspec.Struct, kw_only=True):
    removed: list[str]


class CheckWriteParams(Params):
    cwd: str
    path: str
    content: str


class RuleHit(msgspec.Struct, kw_only=True):
    id: str
    label: str


class RedactedRule(msgspec.Struct, kw_only=True):
    """How many secrets one rule replaced by ``[redacted: <rule>]`` in a memory write."""

    rule: str
    count: int


class CheckWriteResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``verdict``: ``allow`` (written as is), ``redact`` (project/user memory: written with
    ``redacted`` secrets replaced) or ``refuse`` (team memory holding a secret, or a path a
    symlink takes out of its memory directory: ``reason``); ``redacted`` and ``reason`` are
    left out when empty."""

    allowed: bool
    scope: str | None
    rules: list[RuleHit]
    verdict: Literal["allow", "redact", "refuse"]
    redacted: list[RedactedRule] = msgspec.field(default_factory=list)
    reason: str | None = None


class StatusParams(Params):
    cwd: str


class StatusResult(msgspec.Struct, kw_only=True):
    roots: dict[str, str | None]
    counts: dict[str, int]
    index_bytes: int
    cursor: dict[str, Any]
    last_dream_at: str | None
    sessions_since_dream: int | None
    lock: dict[str, Any] | None
    problems: list[dict[str, str]] = msgspec.field(default_factory=list)


class ExtractParams(Params):
    session_id: str


class ScheduledResult(msgspec.Struct, kw_only=True):
    scheduled: bool
    reason: str | None = None
    skipped_reason: str | None = None


class DreamScheduledResult(ScheduledResult, omit_defaults=True):
    """memory.dream's reply; when skipped: whether ``force: true`` skips that gate, and for a
    time gate (``scan_throttled``, ``min_hours``) when it passes again (POSIX seconds)."""

    retry_at: float | None = None
    force_skips: bool | None = None


class LogParams(Params):
    limit: int = 50


class LogResult(msgspec.Struct, kw_only=True):
    entries: list[dict[str, Any]]


class UndoParams(Params):
    id: str


class UndoneEntry(msgspec.Struct, kw_only=True):
    """The audit entry an undo reverted: its id, the agent and the action it had taken."""

    id: str
    agent: str
    action: str


class UndoResult(msgspec.Struct, kw_only=True):
    restored: str
    action: str  # the change the undo made (a "delete" when it undoes a "create")
    undone: UndoneEntry | None = None
    message: str | None = None  # for people: what the undo did


class DreamParams(Params):
    cwd: str
    force: bool = False


MemoryTypeName = Literal["user", "feedback", "project", "reference"]


class SaveParams(Params):
    cwd: str
    type: MemoryTypeName
    name: str
    description: str
    body: str
    scope: Scope = "project"


class SaveResult(msgspec.Struct, kw_only=True):
    path: str
    scope: str
    created: bool
    warnings: list[str] = msgspec.field(default_factory=list)  # written; the index was not
    redacted: list[RedactedRule] = msgspec.field(default_factory=list)
