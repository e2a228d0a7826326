"""Dream: offline consolidation of a project's memory by a background agent.

Gates, in order (:data:`GATE_ORDER`), each failing one returning its ``skipped_reason``:
``disabled`` (managed auto-dream off) → ``memory_pressure`` → ``same_session`` (this session
already dreamed) → ``min_hours`` (under 24 h since the last dream) → ``scan_throttled`` (the
session files were scanned less than 10 min ago) → ``min_sessions`` (fewer than 5 other
sessions' JSONL files modified since the last dream) → ``locked`` (a live holder has the
project's consolidation lock) → ``running`` (this daemon already has a dream in flight or
queued for the project). ``force`` (a manual ``memory.dream``) skips ``same_session``,
``min_hours``, ``scan_throttled`` and ``min_sessions``, never the others. The session scan is
done lazily: only when every earlier gate passed, and only then does it count as a scan for
the throttle.

A run takes the lock (:mod:`qwenctxd.agents.lock`), then forks an agent — no conversation
history, budgets 8 turns / 5 min, tools ``read_file write_file edit list_directory glob
grep_search`` (no shell), writes allowed inside the project memory root only (never user or
team memory), every write audited — with a four-phase task written for this daemon: orient,
gather recent signal from the session transcripts with narrow greps, consolidate, update the
index.

Deletion. The daemon's agent tools cannot delete, and a dream must be able to remove the
duplicates it merged. The agent therefore *lists* the files to delete by writing their paths,
one per line, to ``<project memory>/.dream-deletions`` with ``write_file``. That write is
captured in memory by the dream's tool context (nothing reaches the disk, so a crash leaves no
stray plan file and the audit log only shows real memory changes). After the agent finished,
the daemon applies the plan: each path must pass the same write scope as a write, be a regular
``*.md`` topic file (never ``MEMORY.md``), exist, and not be a file written in this run; each
accepted deletion goes through :meth:`AuditLog.delete_file` (logged with a backup, undoable).
The plan is applied only when the agent finished (completed, or out of turns) and every memory
document it wrote parses as a valid memory — otherwise merged content could be lost.

Afterwards — and only after success (``completed`` or ``noop``) — ``meta.json`` records
``lastDreamAt``, ``lastDreamSessionId``, ``lastDreamTouchedTopics``, ``lastDreamStatus``
(``updated``/``noop``) and ``recentSessionIdsSinceDream=[]``; the project index is rebuilt when
any file changed (also after a failed run that wrote files, so MEMORY.md matches the disk). The
lock is always released. A cancelled run releases the lock, writes no metadata and re-raises.
"""

from __future__ import annotations

import datetime as dt
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from qwenctxd.agents.audit import AuditEntry, AuditLog
from qwenctxd.agents.dream_prompts import SYSTEM, TASK
from qwenctxd.agents.lock import ConsolidationLock
from qwenctxd.agents.permissions import MemoryWriteScope, ReadScope
from qwenctxd.agents.runner import AgentOutcome, AgentSpec, run_agent
from qwenctxd.agents.tools import ToolContext
from qwenctxd.fsutil import read_regular
from qwenctxd.memory import store
from qwenctxd.memory.index import rebuild_index
from qwenctxd.memory.outbound import OUTBOUND
from qwenctxd.memory.paths import INDEX_FILENAME, LOCK_FILENAME, MemoryRoots
from qwenctxd.model import ModelClient
from qwenctxd.paths import SESSION_FILE_RE, chats_dir

if TYPE_CHECKING:
    from qwenctxd.tasks import TaskRecord, TaskRegistry

log = structlog.get_logger("qwenctxd.dream")

GATE_ORDER: tuple[str, ...] = ("disabled", "memory_pressure", "same_session", "min_hours",
                               "scan_throttled", "min_sessions", "locked", "running")
FORCE_SKIPS = frozenset({"same_session", "min_hours", "scan_throttled", "min_sessions"})
DEFAULT_MIN_HOURS = 24.0
DEFAULT_MIN_SESSIONS = 5
SESSION_SCAN_INTERVAL_S = 600.0
MAX_TURNS = 8
MAX_TIME_S = 300.0
AGENT_NAME = "dream"
PLAN_FILENAME = ".dream-deletions"
DREAM_TOOLS = ("read_file", "write_file", "edit", "list_directory", "glob", "grep_search")
MAX_LISTED_FILES = 200
MEMORY_PRESSURE_FRACTION = 0.05

# -- gates ------------------------------------------------------------------------------------------


def _parse_iso(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def last_dream_ts(meta: Mapping[str, Any]) -> float | None:
    """``meta.lastDreamAt`` as a POSIX timestamp (None when absent or unreadable)."""
    return _parse_iso(meta.get("lastDreamAt"))


def check_gates(*, enabled: bool, memory_pressure: bool, meta: Mapping[str, Any],
                session_id: str | None, now: float, sessions_since: int | Callable[[], int],
                last_scan_at: float | None, lock_holder: Mapping[str, Any] | None,
                running: bool, force: bool, min_hours: float = DEFAULT_MIN_HOURS,
                min_sessions: int = DEFAULT_MIN_SESSIONS,
                scan_interval_s: float = SESSION_SCAN_INTERVAL_S) -> str | None:
    """The first failing gate's skipped_reason (in :data:`GATE_ORDER`), or None to dream.

    ``now`` and ``last_scan_at`` are POSIX timestamps. ``sessions_since`` may be a callable:
    it is called (the session scan is done) only when every earlier gate passed.
    ``lock_holder`` is :meth:`ConsolidationLock.holder` output; only a live one blocks.
    """
    if not enabled:
        return "disabled"
    if memory_pressure:
        return "memory_pressure"
    if not force:
        if session_id is not None and meta.get("lastDreamSessionId") == session_id:
            return "same_session"
        last = last_dream_ts(meta)
        if last is not None and (now - last) / 3600.0 < min_hours:
            return "min_hours"
        if last_scan_at is not None and now - last_scan_at < scan_interval_s:
            return "scan_throttled"
        count = sessions_since() if callable(sessions_since) else sessions_since
        if count < min_sessions:
            return "min_sessions"
    if lock_holder is not None and lock_holder.get("live"):
        return "locked"
    if running:
        return "running"
    return None


def count_sessions_since(project: str | os.PathLike[str], since_ts: float | None, *,
                         exclude_session: str | None = None) -> int:
    """How many session transcripts of ``project`` (``chats_dir(project)/*.jsonl``
    named like a session id) were modified after ``since_ts``, the current one excluded."""
    directory = chats_dir(project)
    skip = f"{exclude_session}.jsonl" if exclude_session else None
    since = since_ts if since_ts is not None else float("-inf")
    count = 0
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name == skip or not SESSION_FILE_RE.match(entry.name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_mtime > since:
                    count += 1
    except OSError:
        return 0
    return count


#: how long a reading of /proc/meminfo answers :func:`memory_pressure` (the dream gate asks
#: after every turn; reading and parsing the file each time was a third of that gate's cost)
MEMINFO_TTL_S = 5.0
_meminfo_cache: dict[float, tuple[float, bool]] = {}


def memory_pressure(fraction: float = MEMORY_PRESSURE_FRACTION) -> bool:
    """True when the machine is short of memory (MemAvailable under ``fraction`` of MemTotal;
    False when /proc/meminfo cannot be read), as of a reading at most :data:`MEMINFO_TTL_S`
    old. The daemon may use its own judgement instead."""
    now = time.monotonic()
    hit = _meminfo_cache.get(fraction)
    if hit is not None and now - hit[0] < MEMINFO_TTL_S:
        return hit[1]
    pressed = _read_memory_pressure(fraction)
    _meminfo_cache[fraction] = (now, pressed)
    return pressed


def _read_memory_pressure(fraction: float) -> bool:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {k.strip(): v for k, _, v in (line.partition(":") for line in f)}
        total = int(info["MemTotal"].split()[0])
        available = int(info["MemAvailable"].split()[0])
    except (OSError, KeyError, ValueError, IndexError):
        return False
    return total > 0 and available / total < fraction


# -- results ------------------------------------------------------------------------------------------


@dataclass
class DreamResult:
    status: str  # completed | noop | failed | cancelled | skipped
    skipped_reason: str | None = None
    files: list[str] = field(default_factory=list)  # written (created or edited)
    deleted: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    reason: str | None = None  # why a run failed (model error, timed_out, invalid document…)
    rejected: list[dict[str, str]] = field(default_factory=list)  # deletions refused: path, why
    problems: list[dict[str, str]] = field(default_factory=list)  # invalid written documents
    agent_status: str | None = None  # the runner's outcome (completed, budget_exhausted, …)
    turns: int = 0
    finished_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the plan file: captured, never written ----------------------------------------------------------


class _PlanCapturingAudit(AuditLog):
    """The dream's audit log: writes to the deletion plan are kept in memory (they are not a
    memory change); every other write or delete goes to the daemon's audit log."""

    def __init__(self, inner: AuditLog, plan: Path) -> None:
        super().__init__(inner.directory)
        self._inner = inner
        self._plan = Path(os.path.normpath(plan))
        self.plan_text: str | None = None

    def _is_plan(self, path: Path) -> bool:
        return Path(os.path.normpath(path)) == self._plan

    def write_file(self, path: Path, text: str | bytes, *, agent: str, session: str | None,
                   mode: int = 0o600, dir_mode: int | None = 0o700,
                   redacted: list[dict[str, Any]] | None = None) -> AuditEntry:
        if not self._is_plan(path):
            return self._inner.write_file(path, text, agent=agent, session=session,
                                          mode=mode, dir_mode=dir_mode, redacted=redacted)
        text = text.decode() if isinstance(text, bytes) else text
        action = "create" if self.plan_text is None else "edit"
        self.plan_text = text
        return AuditEntry(id="dream-plan", time=time.time(), agent=agent, session=session,
                          path=str(path), action=action)

    def delete_file(self, path: Path, *, agent: str, session: str | None) -> AuditEntry | None:
        return self._inner.delete_file(path, agent=agent, session=session)


def parse_plan(text: str | None) -> list[str]:
    """Paths listed in a deletion plan: one per line; blanks, ``#`` comments, list bullets and
    surrounding quotes/backticks are tolerated."""
    out: list[str] = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        for prefix in ("- ", "* "):
            if line.startswith(prefix):
                line = line[len(prefix):].strip()
        line = line.strip("`'\"").strip()
        if line and line not in out:
            out.append(line)
    return out


def _existing_listing(root: Path) -> str:
    docs = store.scan(root, "project").docs[:MAX_LISTED_FILES]
    lines = [f"- {d.path} — [{d.type}] {d.name}: {d.description}"[:400] for d in docs]
    return OUTBOUND.text("\n".join(lines), escape=False) or "(none)"  # redacted for the model


def _validate_written(root: Path, written: list[str]) -> list[dict[str, str]]:
    """Memory documents written in this run that do not parse as a valid memory."""
    problems = []
    for raw in written:
        path = Path(raw)
        if path.suffix != ".md" or path.name == INDEX_FILENAME:
            continue
        try:
            st = os.lstat(path)
            text = read_regular(path).decode("utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append({"path": raw, "problem": f"cannot read: {exc.strerror or exc}"})
            continue
        try:
            root_of = root if path.is_relative_to(root) else path.parent
            got = store.parse_doc(path, root_of, "project", text, st)
        except ValueError as exc:
            problems.append({"path": raw, "problem": str(exc)})
            continue
        if isinstance(got, str):
            problems.append({"path": raw, "problem": got})
    return problems


# -- the dreamer --------------------------------------------------------------------------------------


class Dreamer:
    """Gates, schedules and runs dreams; one instance per daemon.

    State kept per project (key: the project memory root): the time of the last session scan
    (for ``scan_throttled``), whether a dream is running or queued (``running``), the last
    result, and one :class:`ConsolidationLock` per lock file (so a failed release self-heals).
    """

    def __init__(self, *, min_hours: float = DEFAULT_MIN_HOURS,
                 min_sessions: int = DEFAULT_MIN_SESSIONS,
                 scan_interval_s: float = SESSION_SCAN_INTERVAL_S, max_turns: int = MAX_TURNS,
                 max_time_s: float = MAX_TIME_S, clock: Callable[[], float] = time.time) -> None:
        self.min_hours = min_hours
        self.min_sessions = min_sessions
        self.scan_interval_s = scan_interval_s
        self.max_turns = max_turns
        self.max_time_s = max_time_s
        self.clock = clock
        self.last: dict[str, DreamResult] = {}
        self._last_scan: dict[str, float] = {}
        self._running: set[str] = set()
        self._records: dict[str, TaskRecord] = {}
        self._locks: dict[Path, ConsolidationLock] = {}

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def _key(roots: MemoryRoots) -> str:
        if roots.project is None:
            raise ValueError("a dream needs a project memory root")
        return str(roots.project)

    @staticmethod
    def lock_path(roots: MemoryRoots) -> Path:
        if roots.project is None:
            raise ValueError("a dream needs a project memory root")
        return (roots.state or roots.project.parent) / LOCK_FILENAME

    def lock_for(self, roots: MemoryRoots) -> ConsolidationLock:
        path = self.lock_path(roots)
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = ConsolidationLock(path)
        return lock

    def running(self, roots: MemoryRoots) -> bool:
        return self._key(roots) in self._running

    def sessions_since(self, roots: MemoryRoots, project_key: str | os.PathLike[str], *,
                       session_id: str | None = None) -> int:
        """Sessions modified since the last dream (for ``memory.status``; not a throttled scan)."""
        meta = store.read_meta(roots.state) if roots.state is not None else {}
        return count_sessions_since(project_key, last_dream_ts(meta),
                                    exclude_session=session_id)

    def status(self, roots: MemoryRoots) -> dict[str, Any]:
        """Lock holder, whether a dream is running, and the last result, for status replies."""
        lock = self.lock_for(roots)
        last = self.last.get(self._key(roots))
        return {"lock": lock.holder(), "running": self.running(roots),
                "release_failed": lock.release_failed,
                "last": last.to_dict() if last is not None else None}

    def retry_at(self, roots: MemoryRoots, reason: str | None) -> float | None:
        """When a dream skipped for ``reason`` may pass that gate again (POSIX time): the next
        session scan for ``scan_throttled``, ``min_hours`` after the last dream for
        ``min_hours``; None for the other reasons (no time makes them pass)."""
        if reason == "scan_throttled":
            last = self._last_scan.get(self._key(roots))
            return None if last is None else last + self.scan_interval_s
        if reason == "min_hours":
            meta = store.read_meta(roots.state) if roots.state is not None else {}
            last = last_dream_ts(meta)
            return None if last is None else last + self.min_hours * 3600.0
        return None

    # -- gates ------------------------------------------------------------------------------------
    def gate(self, *, roots: MemoryRoots, project_key: str | os.PathLike[str],
             session_id: str | None, enabled: bool, memory_pressure: bool = False,
             force: bool = False, now: float | None = None) -> str | None:
        """Evaluate every gate for a project (blocking file I/O: meta.json, the chats dir, the
        lock file); the first skipped_reason, or None when a dream may start."""
        if not enabled:  # the gates' order, before any file is read (asked after every turn)
            return "disabled"
        if memory_pressure:
            return "memory_pressure"
        key = self._key(roots)
        now = self.clock() if now is None else now
        meta = store.read_meta(roots.state) if roots.state is not None else {}
        lock = self.lock_for(roots)
        lock.heal()

        def scan() -> int:
            self._last_scan[key] = now
            return count_sessions_since(project_key, last_dream_ts(meta),
                                        exclude_session=session_id)

        return check_gates(enabled=enabled, memory_pressure=memory_pressure, meta=meta,
                           session_id=session_id, now=now, sessions_since=scan,
                           last_scan_at=self._last_scan.get(key), lock_holder=lock.holder(),
                           running=key in self._running, force=force,
                           min_hours=self.min_hours, min_sessions=self.min_sessions,
                           scan_interval_s=self.scan_interval_s)

    def schedule(self, tasks: TaskRegistry, model: Callable[[], ModelClient], *,
                 roots: MemoryRoots, cwd: Path, session_id: str | None, audit: AuditLog,
                 project_key: str | os.PathLike[str] | None = None, enabled: bool,
                 memory_pressure: bool = False, force: bool = False
                 ) -> tuple[bool, str | None]:
        """Check the gates and, when they pass, submit a dream job (kind ``dream``, key
        ``dream:<project memory root>``) to the task registry. The project counts as
        ``running`` from this moment. Returns (scheduled, skipped_reason)."""
        pkey = project_key if project_key is not None else cwd
        reason = self.gate(roots=roots, project_key=pkey, session_id=session_id,
                           enabled=enabled, memory_pressure=memory_pressure, force=force)
        if reason is not None:
            self.last[self._key(roots)] = DreamResult(status="skipped", skipped_reason=reason,
                                                      finished_at=self.clock())
            return False, reason
        if not tasks.accepting:
            return False, "shutting_down"
        key = self._key(roots)
        self._running.add(key)

        async def job() -> DreamResult:
            return await self._run(model(), roots=roots, cwd=cwd, session_id=session_id,
                                   audit=audit, project_key=pkey, reserved=True)

        try:
            self._records[key] = tasks.submit(
                # the job belongs to the project (its anchor: the git root, else the cwd)
                "dream", job, key=f"dream:{key}", project=str(roots.git_root or pkey),
                description="forced" if force else (f"session {session_id[:8]}"
                                                    if session_id else "idle"))
        except BaseException:
            self._running.discard(key)
            raise
        return True, None

    def cancel(self, tasks: TaskRegistry, roots: MemoryRoots) -> bool:
        """Cancel the project's scheduled or running dream (a user turn takes priority)."""
        rec = self._records.get(self._key(roots))
        if rec is None or rec.outcome is not None:
            return False
        tasks.cancel(rec)
        return True

    # -- a run ------------------------------------------------------------------------------------
    async def run(self, model: ModelClient, *, roots: MemoryRoots, cwd: Path,
                  session_id: str | None, audit: AuditLog,
                  project_key: str | os.PathLike[str] | None = None) -> DreamResult:
        """Dream now (no gates but ``locked`` and ``running``): take the lock, run the agent,
        apply its deletions, write metadata on success, rebuild the index, release the lock.
        Cancellation re-raises after releasing the lock, without metadata."""
        return await self._run(model, roots=roots, cwd=cwd, session_id=session_id,
                               audit=audit, project_key=project_key if project_key is not None
                               else cwd, reserved=False)

    async def _run(self, model: ModelClient, *, roots: MemoryRoots, cwd: Path,
                   session_id: str | None, audit: AuditLog,
                   project_key: str | os.PathLike[str], reserved: bool) -> DreamResult:
        key = self._key(roots)
        owned = reserved  # whether the project's "running" mark is ours to clear
        try:
            lock = self.lock_for(roots)
            lock.heal()
            holder = lock.holder()
            if holder is not None and holder["live"]:
                return self._done(key, DreamResult(status="skipped", skipped_reason="locked"))
            if not reserved and key in self._running:
                return self._done(key, DreamResult(status="skipped", skipped_reason="running"))
            self._running.add(key)
            owned = True
            if not lock.acquire():
                return self._done(key, DreamResult(status="skipped", skipped_reason="locked"))
            try:
                return await self._dream(model, roots=roots, cwd=cwd, session_id=session_id,
                                         audit=audit, project_key=project_key)
            finally:
                lock.release()
        finally:
            if owned:
                self._running.discard(key)
                self._records.pop(key, None)

    async def _dream(self, model: ModelClient, *, roots: MemoryRoots, cwd: Path,
                     session_id: str | None, audit: AuditLog,
                     project_key: str | os.PathLike[str]) -> DreamResult:
        key = self._key(roots)
        root = roots.project
        assert root is not None
        plan_path = root / PLAN_FILENAME
        scope = MemoryWriteScope.memory([root], team_root=roots.team)
        dream_audit = _PlanCapturingAudit(audit, plan_path)
        transcripts = chats_dir(project_key)
        ctx = ToolContext.real_tree(root, scope, dream_audit, agent=AGENT_NAME,
                                    session=session_id, allow_shell=False,
                                    read_scope=ReadScope.of(root, roots.user, transcripts))
        existing = await anyio.to_thread.run_sync(_existing_listing, root)
        spec = AgentSpec(
            name="memory-dreamer", system=SYSTEM,
            task=TASK.format(root=root, index=root / INDEX_FILENAME, transcripts=transcripts,
                             plan=plan_path, today=dt.date.today().isoformat(),
                             turns=self.max_turns, existing=existing),
            tools=list(DREAM_TOOLS), max_turns=self.max_turns, max_time_s=self.max_time_s)
        try:
            outcome: AgentOutcome = await run_agent(model, spec, ctx)
        except anyio.get_cancelled_exc_class():
            self._done(key, DreamResult(status="cancelled"))
            raise
        result = DreamResult(status="failed", agent_status=outcome.status,
                             turns=outcome.turns)

        def after() -> None:
            plan_norm = os.path.normpath(plan_path)
            written = [f for f in outcome.files_written if os.path.normpath(f) != plan_norm]
            result.files = written
            if outcome.status in ("failed", "timed_out"):
                result.reason = outcome.error or outcome.status
                ctx.fs.roll_back()  # the endpoint failed mid-run: leave the memories as found
                result.files = []
            else:
                result.problems = _validate_written(root, written)
                if result.problems:
                    result.reason = "invalid_memory_document"
                else:
                    self._apply_plan(result, dream_audit.plan_text, scope, root, audit,
                                     session_id, set(written))
                    changed = bool(result.files or result.deleted)
                    result.status = "completed" if changed else "noop"
            result.topics = sorted({t for f in (*result.files, *result.deleted)
                                    if (t := scope.touched_topic(f))})
            if result.status in ("completed", "noop") and roots.state is not None:
                try:
                    store.write_meta(roots.state, lastDreamAt=store.now_iso(),
                                     lastDreamSessionId=session_id,
                                     lastDreamTouchedTopics=result.topics,
                                     lastDreamStatus="updated" if result.status == "completed"
                                     else "noop",
                                     recentSessionIdsSinceDream=[])
                except OSError:
                    log.exception("dream metadata write failed")
                    result.reason = "meta_write_failed"
            if result.files or result.deleted:
                try:
                    rebuild_index(root, "project")
                except Exception:
                    log.exception("project index rebuild after dream failed")
                    result.reason = result.reason or "index_rebuild_failed"

        await anyio.to_thread.run_sync(after)
        return self._done(key, result)

    def _apply_plan(self, result: DreamResult, plan_text: str | None, scope: MemoryWriteScope,
                    root: Path, audit: AuditLog, session_id: str | None,
                    written: set[str]) -> None:
        written_norm = {os.path.normpath(w) for w in written}
        for raw in parse_plan(plan_text):
            path = Path(raw) if os.path.isabs(raw) else root / raw
            path = Path(os.path.normpath(path))
            why = self._refuse_delete(path, scope, written_norm)
            if why is None:
                try:
                    entry = audit.delete_file(path, agent=AGENT_NAME, session=session_id)
                except OSError as exc:
                    why = f"delete failed: {exc.strerror or exc}"
                else:
                    if entry is None:
                        why = "does not exist"
                    else:
                        result.deleted.append(str(path))
                        continue
            result.rejected.append({"path": raw, "reason": why})
            log.info("dream deletion refused", path=raw, reason=why)

    @staticmethod
    def _refuse_delete(path: Path, scope: MemoryWriteScope, written: set[str]) -> str | None:
        verdict = scope.check_write(path)
        if not verdict.allowed:
            return verdict.reason
        if path.name == INDEX_FILENAME:
            return "the index is never deleted"
        if path.suffix != ".md":
            return "only memory files (*.md) can be deleted"
        if str(path) in written:
            return "written in this run"
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return "does not exist"
        except OSError as exc:
            return f"cannot stat: {exc.strerror or exc}"
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        return None

    def _done(self, key: str, result: DreamResult) -> DreamResult:
        result.finished_at = self.clock()
        self.last[key] = result
        log.info("dream", project=key, status=result.status, skipped=result.skipped_reason,
                 reason=result.reason, files=len(result.files), deleted=len(result.deleted),
                 topics=result.topics)
        return result
