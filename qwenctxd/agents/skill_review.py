"""Skill review: after enough tool calls in a session, a background agent turns the procedure
the session followed into a project skill — staged for the user's confirmation by default.

When it runs. After a user-query turn (and on ``skills.review.run``) the reviewer checks, in
order: ``disabled`` (``memory.enableAutoSkill`` off) → ``no_model`` → ``no_project`` (no
project root, or the root is the home dir) → ``below_threshold`` (fewer than
``memory.autoSkillToolCalls`` (20) tool results since this session's last review; skipped by a
manual run) → ``skills_edited`` (an assistant tool call of the session wrote under a
``.qwen/skills`` or ``.agents/skills`` path: the user is already curating skills) →
``memory_pressure`` → ``running`` (a review of the project is in flight; task key
``skill-review:<root>``). The per-session tool-call baseline lives here, keyed by session id.

What it does. A forked agent over a copy of the session's history, with read tools and
``write_file``/``edit`` only (no shell), budgets 8 turns / ``memory.agentTimeoutMinutes``
(default 5 min), studies the procedure the session followed. If it is a reusable multi-step
procedure no existing skill covers, it drafts ONE ``SKILL.md`` (``name``/``description``
frontmatter, concise steps) or revises an existing project skill; otherwise it changes nothing
(the usual outcome). Its writes are confined to one ``<name>/`` folder under its write root:

- ``memory.autoSkillConfirm`` true (default): the staging dir
  ``$XDG_STATE_HOME/qwenctxd/skill-drafts/<project-slug>/<draft-id>/<name>/SKILL.md``. A draft
  becomes visible (``list_drafts``) only when the run finished and left a ``SKILL.md``: the
  daemon then writes ``<draft-id>/.draft.json``; a failed, timed-out, cancelled or empty run's
  staging dir is removed, and one left by a crash (no ``.draft.json``) is pruned by the next
  review of the project or the next listing. ``accept`` copies the draft into ``<root>/.qwen/skills/<name>/`` (each
  file atomically, through the audit log, ``SKILL.md`` last so the skills watcher sees a
  complete folder) and removes the draft; ``discard`` removes it.
- false: the project's ``<root>/.qwen/skills`` directly (the skills watcher picks it up).

Every write — staged or not — goes through the audit log (``qwenctl memory log`` / ``undo``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import structlog

from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.extraction import PATH_ARGS, WRITE_TOOLS
from qwenctxd.agents.permissions import Decision, MemoryWriteScope, ReadScope, Verdict
from qwenctxd.agents.runner import AgentOutcome, AgentSpec, run_agent
from qwenctxd.agents.skill_review_prompts import MODE_CONFIRM, MODE_DIRECT, SYSTEM, TASK
from qwenctxd.agents.tools import ToolContext
from qwenctxd.fsutil import read_regular
from qwenctxd.paths import home as home_dir
from qwenctxd.paths import project_slug, qwen_home, state_dir
from qwenctxd.skills.parse import parse_skill, validate_name

if TYPE_CHECKING:
    from qwenctxd.config.schema import Settings
    from qwenctxd.model import ModelClient
    from qwenctxd.tasks import TaskRegistry

log = structlog.get_logger("qwenctxd.skill_review")

JOB = "skill-review"  # task kind and the name reported in ``scheduled``
AGENT_NAME = "skill-review"  # the audit log's ``agent``
REVIEW_TOOLS = ("read_file", "list_directory", "glob", "grep_search", "write_file", "edit")
MAX_TURNS = 8
MAX_TIME_S = 300.0
SKILL_FILE = "SKILL.md"
MARKER = ".draft.json"
SKILL_DIRS = (".qwen/skills", ".agents/skills")
MAX_LISTED_SKILLS = 100
DRAFT_ID_RE = re.compile(r"[0-9]{10,}-[0-9a-f]{8}")
GATE_ORDER: tuple[str, ...] = ("disabled", "no_model", "no_project", "below_threshold",
                               "skills_edited", "memory_pressure", "running")

# -- helpers ------------------------------------------------------------------------------------


def project_skills_dir(root: Path) -> Path:
    return Path(root) / ".qwen" / "skills"


def drafts_dir(root: Path) -> Path:
    """``$XDG_STATE_HOME/qwenctxd/skill-drafts/<project-slug>``."""
    return state_dir() / "skill-drafts" / project_slug(os.path.normpath(root))


def _is_skills_path(raw: str) -> bool:
    p = "/" + raw.replace("\\", "/").strip().lstrip("/")
    return any(f"/{d}/" in p or p.endswith(f"/{d}") for d in SKILL_DIRS)


def edited_skills(history: Sequence[dict[str, Any]]) -> bool:
    """Whether an assistant message of ``history`` calls a write tool on a path under a
    ``.qwen/skills`` or ``.agents/skills`` directory (an approximation of "the session edited
    skills": shell commands are not inspected)."""
    for m in history:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            if fn.get("name") not in WRITE_TOOLS:
                continue
            raw_args = fn.get("arguments") or "{}"
            try:
                args = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args)
            except (ValueError, TypeError):
                continue
            if not isinstance(args, dict):
                continue
            for key in PATH_ARGS:
                raw = args.get(key)
                if isinstance(raw, str) and raw and _is_skills_path(raw):
                    return True
    return False


def new_draft_id(now: float | None = None) -> str:
    return f"{int(now if now is not None else time.time())}-{uuid.uuid4().hex[:8]}"


@dataclass
class _SingleSkillScope(MemoryWriteScope):
    """A write scope over one skills base: every write must land inside ``<base>/<name>/`` for
    one valid skill name, and the first allowed write fixes the name for the run."""

    skill: str | None = None

    def check_write(self, raw: str | Path) -> Verdict:
        verdict = super().check_write(raw)
        if not verdict.allowed:
            return verdict
        base = Path(os.path.normpath(self.writable_roots[0]))
        rel = Path(os.path.normpath(raw)).relative_to(base) if Path(
            os.path.normpath(raw)).is_relative_to(base) else None
        if rel is None or len(rel.parts) < 2:
            return Verdict(Decision.DENY, f"write refused: write the skill as {base}/<name>/"
                                          f"{SKILL_FILE}")
        name = rel.parts[0]
        problem = validate_name(name)
        if problem:
            return Verdict(Decision.DENY, f"write refused: bad skill folder name: {problem}")
        if self.skill is None:
            self.skill = name
        elif self.skill != name:
            return Verdict(Decision.DENY, f"write refused: this review already writes skill "
                                          f"{self.skill!r}; one skill per review")
        return verdict


@dataclass
class Draft:
    id: str
    name: str
    description: str
    path: str  # the draft's SKILL.md
    created_at: float
    updates_existing: bool
    session_id: str | None = None
    problem: str | None = None  # why it would not load as a skill (accept refuses it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReviewResult:
    status: str  # completed | noop | failed | cancelled | skipped
    reason: str | None = None
    files: list[str] = field(default_factory=list)
    draft_id: str | None = None
    skill: str | None = None
    finished_at: float | None = None


# -- the reviewer -------------------------------------------------------------------------------


class CountsToolCalls(Protocol):
    """What the review reads of a session's turn state: the tool results it has seen."""

    tool_calls_seen: int


class ReviewedSession(Protocol):
    """The part of a session the review's threshold needs (a ``sessions.state.Session``)."""

    id: str
    turn: CountsToolCalls


class SkillReviewer:
    """Gates, schedules and runs skill reviews; handles the staged drafts. One per daemon."""

    def __init__(self, *, audit: AuditLog | None = None,
                 memory_pressure: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = time.time,
                 home: Path | None = None, qwen_dir: Path | None = None) -> None:
        from qwenctxd.agents.dream import memory_pressure as default_pressure

        # the user's home and ~/.qwen, as the daemon's project registry resolved them
        self.home = home if home is not None else home_dir()
        self.qwen_dir = qwen_dir if qwen_dir is not None else qwen_home()
        self.audit = audit
        self.memory_pressure = memory_pressure or default_pressure
        self.clock = clock
        self.last: dict[str, ReviewResult] = {}  # by project root
        self._baseline: dict[str, int] = {}  # session id -> tool calls at its last review
        self._running: set[str] = set()
        self._at_home: dict[Path, bool] = {}  # project root -> it is the home directory

    # -- gates ----------------------------------------------------------------------------------
    def project_root(self, session: Any) -> Path | None:
        """The root of the session's project, None outside one or when it is the home
        directory."""
        root = session.project.root
        if root is None:
            return None
        at_home = self._at_home.get(root)
        if at_home is None:  # asked after every turn: two realpath walks once per root
            try:
                at_home = os.path.realpath(root) == os.path.realpath(self.home)
            except OSError:
                at_home = False
            if len(self._at_home) > 1024:
                self._at_home.clear()
            self._at_home[root] = at_home
        return None if at_home else root  # at home, project skill dirs would be the user's

    def calls_since_review(self, session: ReviewedSession) -> int:
        seen = session.turn.tool_calls_seen
        base = self._baseline.get(session.id, 0)
        if base > seen:  # the session was reopened and counts from 0 again
            base = self._baseline[session.id] = 0
        return seen - base

    def gate(self, session: Any, model: ModelClient, settings: Settings, *,
             force: bool = False) -> str | None:
        """The first failing condition's reason (:data:`GATE_ORDER`), or None to review."""
        mem = settings.memory
        if not mem.enable_auto_skill:
            return "disabled"
        if not model.configured:
            return "no_model"
        root = self.project_root(session)
        if root is None:
            return "no_project"
        if not force and self.calls_since_review(session) < mem.auto_skill_tool_calls:
            return "below_threshold"
        if edited_skills(session.history.messages):
            return "skills_edited"
        if self.memory_pressure():
            return "memory_pressure"
        if str(root) in self._running:
            return "running"
        return None

    def running(self, root: Path) -> bool:
        return str(root) in self._running

    # -- scheduling -----------------------------------------------------------------------------
    def schedule(self, session: Any, tasks: TaskRegistry, model: ModelClient, audit: AuditLog,
                 settings: Settings, *, force: bool = False) -> tuple[str | None, str | None]:
        """(job name, None) when a review was submitted, else (None, skipped reason)."""
        reason = self.gate(session, model, settings, force=force)
        root = self.project_root(session)
        if reason is None and not tasks.accepting:
            reason = "shutting_down"
        if reason is not None:
            if root is not None and reason != "below_threshold":
                self.last[str(root)] = ReviewResult(status="skipped", reason=reason,
                                                    finished_at=self.clock())
            log.debug("skill review skipped", session=session.id, reason=reason)
            return None, reason
        assert root is not None
        self.audit = self.audit or audit
        key = str(root)
        self._running.add(key)
        self._baseline[session.id] = session.turn.tool_calls_seen
        history = [dict(m) for m in session.history.messages]
        used = sorted(session.deliveries.skills_used)
        session_id, cwd = session.id, Path(session.cwd)

        async def job() -> ReviewResult:
            return await self.run(model, root=root, cwd=cwd, session_id=session_id,
                                  history=history, settings=settings, audit=audit,
                                  skills_used=used)

        try:
            tasks.submit(JOB, job, key=f"{JOB}:{root}", project=str(root),
                         description=("manual " if force else "") + f"session {session_id[:8]}")
        except BaseException:
            self._running.discard(key)
            raise
        log.info("skill review scheduled", session=session_id, root=str(root), force=force)
        return JOB, None

    def maybe_schedule(self, session: Any, tasks: TaskRegistry, model: ModelClient,
                       audit: AuditLog, settings: Settings) -> str | None:
        """After a user turn: the scheduled job's name, or None (reason in the debug log)."""
        job, _reason = self.schedule(session, tasks, model, audit, settings)
        return job

    # -- a run ----------------------------------------------------------------------------------
    async def run(self, model: ModelClient, *, root: Path, cwd: Path, session_id: str | None,
                  history: Sequence[dict[str, Any]], settings: Settings, audit: AuditLog,
                  skills_used: Sequence[str] = ()) -> ReviewResult:
        key = str(root)
        self._running.add(key)
        confirm = settings.memory.auto_skill_confirm
        draft_id = new_draft_id(self.clock())
        base = drafts_dir(root) / draft_id if confirm else project_skills_dir(root)
        scope = _SingleSkillScope(writable_roots=[base])
        reads = ReadScope.of(root, cwd, base, self.qwen_dir / "skills")
        ctx = ToolContext.real_tree(cwd, scope, audit, agent=AGENT_NAME,
                                    session=session_id, allow_shell=False, read_scope=reads)
        minutes = settings.memory.agent_timeout_minutes
        try:
            if confirm:
                await anyio.to_thread.run_sync(
                    lambda: self.prune_orphans(root, keep=draft_id))
            existing = await anyio.to_thread.run_sync(
                _existing_skills, root, cwd, settings, self.home, self.qwen_dir)
            spec = AgentSpec(
                name="skill-reviewer", system=SYSTEM,
                task=TASK.format(root=root, base=base,
                                 mode=(MODE_CONFIRM if confirm else MODE_DIRECT).format(
                                     base=base),
                                 turns=MAX_TURNS, used=", ".join(skills_used) or "(none)",
                                 existing=existing),
                tools=REVIEW_TOOLS, max_turns=MAX_TURNS,
                max_time_s=(minutes * 60) if minutes else MAX_TIME_S)
            try:
                outcome: AgentOutcome = await run_agent(model, spec, ctx, history)
            except anyio.get_cancelled_exc_class():
                if confirm:
                    shutil.rmtree(base, ignore_errors=True)
                self.last[key] = ReviewResult(status="cancelled", finished_at=self.clock())
                log.info("skill review cancelled", session=session_id, root=key)
                raise
            return await anyio.to_thread.run_sync(
                self._finish, root, base, draft_id if confirm else None, session_id, scope,
                outcome, ctx)
        finally:
            self._running.discard(key)

    def _finish(self, root: Path, base: Path, draft_id: str | None, session_id: str | None,
                scope: _SingleSkillScope, outcome: AgentOutcome, ctx: ToolContext
                ) -> ReviewResult:
        key = str(root)
        files = outcome.files_written
        ok = outcome.status in ("completed", "budget_exhausted")
        if draft_id is None and not ok:  # a failed run leaves the project's skills as found
            ctx.fs.roll_back()
            files = []
            if scope.skill:
                with contextlib.suppress(OSError):  # the folder it made, unless it holds more
                    (base / scope.skill).rmdir()
        if draft_id is None:  # written straight into the project
            result = ReviewResult(status=("completed" if files else "noop") if ok else "failed",
                                  reason=None if ok else (outcome.error or outcome.status),
                                  files=files, skill=scope.skill)
        else:
            skill_md = base / scope.skill / SKILL_FILE if scope.skill else None
            if ok and skill_md is not None and skill_md.is_file():
                meta = {"id": draft_id, "name": scope.skill, "session_id": session_id,
                        "created_at": self.clock(), "agent_status": outcome.status,
                        "files": files}
                from qwenctxd.fsutil import atomic_write

                atomic_write(base / MARKER, json.dumps(meta, indent=2) + "\n")
                result = ReviewResult(status="completed", files=files, draft_id=draft_id,
                                      skill=scope.skill)
            else:
                shutil.rmtree(base, ignore_errors=True)
                if not ok:
                    result = ReviewResult(status="failed", reason=outcome.error or outcome.status,
                                          files=files)
                else:
                    result = ReviewResult(status="noop", files=files,
                                          reason="no_skill_md" if files else None)
        result.finished_at = self.clock()
        self.last[key] = result
        log.info("skill review", root=key, session=session_id, status=result.status,
                 reason=result.reason, skill=result.skill, draft=result.draft_id,
                 files=len(result.files))
        return result

    # -- drafts ---------------------------------------------------------------------------------
    def _draft_dir(self, root: Path, draft_id: str) -> Path:
        if not isinstance(draft_id, str) or not DRAFT_ID_RE.fullmatch(draft_id):
            raise KeyError(draft_id)
        d = drafts_dir(root) / draft_id
        if not (d / MARKER).is_file():
            raise KeyError(draft_id)
        return d

    def _read_draft(self, root: Path, d: Path) -> Draft | None:
        try:
            meta = json.loads((d / MARKER).read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                meta = {}
        except (OSError, ValueError):
            return None
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            dirs = sorted(e.name for e in os.scandir(d)
                          if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
            if not dirs:
                return None
            name = dirs[0]
        skill_md = d / name / SKILL_FILE
        problem = validate_name(name)
        description = ""
        if problem is None:
            skill, errors = parse_skill(skill_md, "project")
            if skill is None:
                problem = errors[0].message if errors else "SKILL.md does not load"
            else:
                description = skill.description
                if skill.name != name:
                    problem = (f"frontmatter name {skill.name!r} differs from the folder "
                               f"name {name!r}")
        created = meta.get("created_at")
        if not isinstance(created, int | float):
            try:
                created = (d / MARKER).stat().st_mtime
            except OSError:
                created = 0.0
        updates = any((Path(root) / sub / name / SKILL_FILE).exists() for sub in SKILL_DIRS)
        sid = meta.get("session_id")
        return Draft(id=d.name, name=name, description=description, path=str(skill_md),
                     created_at=float(created), updates_existing=updates,
                     session_id=sid if isinstance(sid, str) else None, problem=problem)

    def prune_orphans(self, root: Path, *, keep: str | None = None) -> list[str]:
        """Remove staging folders with no ``.draft.json`` left by a crashed or killed run.

        One review per project runs at a time (this daemon is single-instance), so while none
        is running every unmarked folder is an orphan; ``keep`` spares the run's own folder.
        """
        if self.running(root) and keep is None:
            return []
        base = drafts_dir(root)
        removed = []
        try:
            entries = [e.name for e in os.scandir(base)
                       if e.is_dir(follow_symlinks=False) and DRAFT_ID_RE.fullmatch(e.name)]
        except OSError:
            return []
        for name in entries:
            if name == keep or (base / name / MARKER).is_file():
                continue
            shutil.rmtree(base / name, ignore_errors=True)
            removed.append(name)
        if removed:
            log.info("skill review: removed orphan staging folders", root=str(root),
                     drafts=removed)
        return removed

    def list_drafts(self, root: Path) -> list[Draft]:
        """The project's finished drafts, oldest first (orphans of a crash are pruned)."""
        self.prune_orphans(root)
        base = drafts_dir(root)
        try:
            entries = sorted(e.name for e in os.scandir(base)
                             if e.is_dir(follow_symlinks=False) and DRAFT_ID_RE.fullmatch(e.name))
        except OSError:
            return []
        out = []
        for name in entries:
            d = base / name
            if not (d / MARKER).is_file():
                continue  # still being written by the running review
            draft = self._read_draft(root, d)
            if draft is not None:
                out.append(draft)
        out.sort(key=lambda x: (x.created_at, x.id))
        return out

    def get_draft(self, root: Path, draft_id: str) -> Draft:
        d = self._draft_dir(root, draft_id)
        draft = self._read_draft(root, d)
        if draft is None:
            raise KeyError(draft_id)
        return draft

    def accept(self, root: Path, draft_id: str, *, audit: AuditLog | None = None) -> Path:
        """Copy the draft's skill folder into ``<root>/.qwen/skills/<name>/`` (each file
        atomically, through the audit log, SKILL.md last), remove the draft and return the
        installed SKILL.md. KeyError: no such draft; ValueError: the draft is refused (bad
        name, not a loadable skill, a file that cannot be copied or a target outside the
        project's skills directory)."""
        d = self._draft_dir(root, draft_id)
        draft = self._read_draft(root, d)
        if draft is None:
            raise KeyError(draft_id)
        problem = validate_name(draft.name)
        if problem:
            raise ValueError(f"draft {draft_id} has a bad skill name: {problem}")
        if draft.problem:
            raise ValueError(f"draft {draft_id} is not a valid skill: {draft.problem}")
        src = d / draft.name
        dest_base = project_skills_dir(root)
        dest = dest_base / draft.name
        scope = MemoryWriteScope(writable_roots=[dest_base])
        plan: list[tuple[Path, str]] = []
        for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
            dirnames[:] = sorted(n for n in dirnames if not os.path.islink(Path(dirpath) / n))
            for fname in sorted(filenames):
                fp = Path(dirpath) / fname
                if fp.is_symlink() or not fp.is_file():
                    continue
                if fname.startswith(".") and fname.endswith(".tmp"):
                    continue  # an interrupted atomic write
                target = dest / fp.relative_to(src)
                verdict = scope.check_write(target)
                if not verdict.allowed:
                    raise ValueError(verdict.reason)
                try:
                    text = read_regular(fp).decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"{fp} is not UTF-8 text; refusing to copy it") from None
                plan.append((target, text))
        plan.sort(key=lambda item: item[0] == dest / SKILL_FILE)  # SKILL.md last
        log_ = audit or self.audit or AuditLog(state_dir())
        for target, text in plan:
            try:
                if read_regular(target).decode("utf-8") == text:
                    continue
            except (OSError, UnicodeDecodeError):
                pass
            log_.write_file(target, text, agent=AGENT_NAME, session=draft.session_id)
        shutil.rmtree(d, ignore_errors=True)
        log.info("skill draft accepted", root=str(root), draft=draft_id, skill=draft.name,
                 files=len(plan))
        return dest / SKILL_FILE

    def discard(self, root: Path, draft_id: str) -> None:
        """Remove a draft (KeyError when there is none)."""
        d = self._draft_dir(root, draft_id)
        shutil.rmtree(d)
        log.info("skill draft discarded", root=str(root), draft=draft_id)


def _existing_skills(root: Path, cwd: Path, settings: Settings, home: Path,
                     qwen_dir: Path) -> str:
    from qwenctxd.skills import levels

    try:
        bases = levels.base_dirs(root, home=home, settings=settings.skills, cwd=cwd,
                                 qwen_dir=qwen_dir)
        ss = levels.load_skills(bases, settings=settings.skills)
    except Exception:  # the listing is a hint for the agent, never a reason to fail
        log.warning("could not list skills for the review", exc_info=True)
        return "(unknown)"
    lines = [f"- {k.name} [{k.level}] {' '.join(k.description.split())[:200]} — {k.path}"
             for k in list(ss.skills.values())[:MAX_LISTED_SKILLS]]
    return "\n".join(lines) or "(none)"
