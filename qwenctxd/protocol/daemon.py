"""Wire types of the ``daemon.*`` methods (params and results as msgspec Structs)."""

from __future__ import annotations

from typing import Any

import msgspec


class Params(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """Base of every params struct: unknown fields are refused with their name. A client
    sends only the fields it sets (a field left at its default is left out), so a daemon that
    predates an optional field still takes every call that does not use it."""


class Empty(Params):
    """Params of a method that takes none."""


class ClientInfo(msgspec.Struct, kw_only=True):
    name: str
    version: str = ""


class HelloParams(Params):
    client: ClientInfo | None = None
    protocol: int = 1


class HelloResult(msgspec.Struct, kw_only=True):
    protocol: int
    version: str
    pid: int
    capabilities: list[str]


class SessionSummary(msgspec.Struct, kw_only=True):
    session_id: str
    cwd: str
    model: str
    messages: int
    prompt_tokens: int
    window_tokens: int
    level: str


class ProjectSummary(msgspec.Struct, kw_only=True):
    root: str
    watchers: int = 0
    memory_docs: int = 0
    skills: int = 0


class InFlightTask(msgspec.Struct, kw_only=True):
    id: int
    kind: str
    project: str | None
    started_at: float
    description: str = ""


class FailedTask(msgspec.Struct, kw_only=True):
    """A background run that failed, with its cause (a model error reason, ``timeout``…)."""

    id: int
    kind: str
    project: str | None
    cause: str | None
    finished_at: float | None


class BackgroundStatus(msgspec.Struct, kw_only=True):
    in_flight: list[InFlightTask]
    queued: int
    last_extract_at: float | None = None
    last_dream_at: float | None = None
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    failed_by_kind: dict[str, int] = msgspec.field(default_factory=dict)
    recent_failures: list[FailedTask] = msgspec.field(default_factory=list)


class ConfigStatus(msgspec.Struct, kw_only=True):
    files: list[str]
    generation: int
    last_error: str | None = None


class LogStatus(msgspec.Struct, kw_only=True):
    """The daemon's stderr log: lines dropped (pipe full or gone), lines waiting to be written."""

    dropped: int = 0
    buffered: int = 0
    sink: str = "file"  # "file" (written inline) | "pipe" (a writer thread) | "dead"


class WatchStatus(msgspec.Struct, kw_only=True):
    """The file-watch hub: what it watches and how much it has handled since start-up."""

    directories: int = 0  # registered with the kernel (incl. ancestors of missing ones)
    subscriptions: int = 0
    synced: bool = True  # every requested directory is registered (False while (re)starting)
    batches: int = 0  # change batches the watcher reported
    changes: int = 0  # file changes handed to every interested subscriber (callbacks returned)
    restarts: int = 0  # the watcher restarted because the directory set changed
    last_error: str | None = None


class StatusResult(msgspec.Struct, kw_only=True):
    version: str
    pid: int
    uptime_s: float
    protocol: int
    socket: str
    sessions: list[SessionSummary]
    projects: list[ProjectSummary]
    background: BackgroundStatus
    rss_bytes: int
    state: str = "serving"
    connections: int = 0
    requests: int = 0
    activated: bool = False
    model: dict[str, Any] = msgspec.field(default_factory=dict)
    config: ConfigStatus | None = None
    inotify_watches: int = 0
    watch: WatchStatus | None = None
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    log: LogStatus | None = None
    # secrets replaced in memory writes / in memory text on its way out; team writes refused
    secrets: dict[str, int] = msgspec.field(default_factory=dict)
    # session search: files and entries indexed, files pending, torn lines and junk files skipped
    search: dict[str, int] = msgspec.field(default_factory=dict)
    # memory.embedder {model, source, vectors, built_at}: the embedder recall ranks with first;
    # memory.embedders: every one; memory.worker: the embedding worker process
    memory: dict[str, Any] = msgspec.field(default_factory=dict)


class CancelParams(msgspec.Struct, kw_only=True):
    """``rpc.cancel`` / ``$/cancelRequest``: the id of an in-flight request on this connection."""

    id: int | str


class CancelResult(msgspec.Struct, kw_only=True):
    cancelled: bool  # False: no request of that id was in flight (already answered, or unknown)


class DrainParams(Params):
    timeout_s: float | None = msgspec.field(default=None)


class DrainResult(msgspec.Struct, kw_only=True):
    drained: bool
    pending: int


class ShutdownParams(Params):
    drain: bool = True
    timeout_s: float | None = None


class OkResult(msgspec.Struct, kw_only=True):
    ok: bool = True


TOPICS = (
    "session/usage",
    "session/compressed",
    "skills/changed",
    "memory/changed",
    "background/progress",
    "config/changed",
)


class SubscribeParams(Params):
    topics: list[str] | None = None
