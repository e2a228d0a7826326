"""Saving one memory document on a client's behalf (``memory.save``, used by ``qwenctl mcp``).

A save lands like any other memory write: the document is rendered as a topic file
(frontmatter ``name`` / ``description`` / ``type`` + body) at ``<scope root>/<type>/<slug>.md``,
vetted by the secret guard (:mod:`qwenctxd.memory.secrets`): into team memory a secret is
refused (:class:`~qwenctxd.protocol.errors.SecretDetected` naming rule ids only), into project
or user memory each secret in the name, description or body is replaced by
``[redacted: <rule id>]`` before anything is written (the file name is the slug of the
redacted name, and the outcome's ``redacted`` says ``[{rule, count}]``), refused when the
target resolves outside its scope (a symlinked topic directory), written through the caller's
``write`` (the daemon passes the audit log's atomic, logged write), and followed by the scope's
``MEMORY.md`` rebuild and :meth:`MemoryService.landed` (re-scan + ``memory/changed``). A write
that landed is never reported as failed: an index that cannot be rebuilt (MEMORY.md is a
directory) becomes a warning in the outcome.

The file name is the slug of ``name``, so saving the same name again updates that memory.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import structlog
import yaml

from qwenctxd.fsutil import PRIVATE_DIR_MODE, make_dirs
from qwenctxd.memory import index as mindex
from qwenctxd.memory import paths as mpaths
from qwenctxd.memory import secrets
from qwenctxd.memory.service import MemoryService
from qwenctxd.project import Project
from qwenctxd.protocol.errors import (
    InvalidParams,
    PathOutsideProject,
    SecretDetected,
    client_path,
)
from qwenctxd.secrets import COUNTERS

log = structlog.get_logger("qwenctxd.memory")

MAX_NAME_CHARS = 200
MAX_DESCRIPTION_CHARS = 1_000
MAX_BODY_BYTES = 64 * 1024
MAX_SLUG_CHARS = 80
MAX_SLUG_BYTES = 160  # UTF-8: a file name is at most 255 bytes, and the temp name adds more

Writer = Callable[[Path, str, list[dict[str, object]]], None]


@dataclass(frozen=True)
class SaveOutcome:
    path: Path
    scope: str
    created: bool
    warnings: tuple[str, ...] = ()  # the memory is written; something after it was not
    redacted: list[dict[str, object]] = field(default_factory=list)


def slug(name: str) -> str:
    """A file stem for ``name``: word characters (any script) joined by ``-``, lower case, at
    most MAX_SLUG_CHARS characters and MAX_SLUG_BYTES bytes of UTF-8 (cut at a character)."""
    out = re.sub(r"[^\w]+", "-", name.lower()).strip("-_")[:MAX_SLUG_CHARS].strip("-_")
    raw = out.encode("utf-8", errors="surrogatepass")
    if len(raw) > MAX_SLUG_BYTES:
        out = raw[:MAX_SLUG_BYTES].decode("utf-8", errors="ignore").strip("-_")
    return out or "memory-" + hashlib.sha256(
        name.encode("utf-8", errors="surrogatepass")).hexdigest()[:8]


def one_line(value: str) -> str:
    return " ".join(value.split())


def render_document(mem_type: str, name: str, description: str, body: str) -> str:
    head = yaml.safe_dump({"name": name, "description": description, "type": mem_type},
                          sort_keys=False, allow_unicode=True, width=10_000)
    return f"---\n{head}---\n\n{body.strip()}\n"


def _bad(field: str, message: str) -> InvalidParams:
    return InvalidParams(f"{field}: {message}", data={"field": field, "message": message})


def validated(name: str, description: str, body: str) -> tuple[str, str, str]:
    name, description = one_line(name), one_line(description)
    if not name:
        raise _bad("name", "empty")
    if len(name) > MAX_NAME_CHARS:
        raise _bad("name", f"longer than {MAX_NAME_CHARS} characters")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise _bad("description", f"longer than {MAX_DESCRIPTION_CHARS} characters")
    if not body.strip():
        raise _bad("body", "empty")
    if len(body.encode("utf-8", errors="surrogatepass")) > MAX_BODY_BYTES:
        raise _bad("body", f"larger than {MAX_BODY_BYTES} bytes")
    return name, description, body


async def save(service: MemoryService, project: Project, *, mem_type: str, name: str,
               description: str, body: str, scope: str, write: Writer) -> SaveOutcome:
    name, description, body = validated(name, description, body)
    roots = service.roots(project)
    root = roots.for_scope(scope)
    if root is None:
        raise _bad("scope", "team memory is off here (memory.enableTeamMemory, needs a git "
                            "repository)" if scope == "team" else "not available")
    await service.load(project)  # scaffolds the project and user roots
    redacted: dict[str, int] = {}
    fields = []
    for value in (name, description, body):
        verdict = secrets.vet_write(scope, value)
        if verdict.action == "refuse":
            hits = secrets.scan(render_document(mem_type, name, description, body))
            COUNTERS.add("refused")
            raise SecretDetected(secrets.block_message(hits),
                                 data={"rules": [h.rule_id for h in hits]})
        for r in verdict.redacted:
            redacted[str(r["rule"])] = redacted.get(str(r["rule"]), 0) + int(str(r["count"]))
        fields.append(verdict.text)
    name, description, body = fields
    summary: list[dict[str, object]] = [{"rule": r, "count": n} for r, n in redacted.items()]
    target = root / mem_type / f"{slug(name)}.md"
    text = render_document(mem_type, name, description, body)

    def land() -> tuple[bool, tuple[str, ...]]:
        if scope == "team":
            make_dirs(root / mem_type, PRIVATE_DIR_MODE)
            try:
                mindex.check_team_root(root)
            except mindex.TeamMemoryRootSecurityError as exc:
                raise PathOutsideProject(str(exc), data={"path": str(target)}) from None
        if mpaths.scope_of(target, roots) != scope:
            raise PathOutsideProject(f"{target} resolves outside the {scope} memory",
                                     data={"path": str(target)})
        created = not target.exists()
        with client_path("name"):  # the file name is the name's slug
            write(target, text, summary)
        # The memory is written: nothing after this point may report the save as failed.
        try:
            mindex.rebuild_index(root, scope)  # type: ignore[arg-type]
        except OSError as exc:  # e.g. MEMORY.md is a directory
            log.warning("memory.save_index_failed", index=str(root / mpaths.INDEX_FILENAME),
                        error=f"{type(exc).__name__}: {exc.strerror or exc}")
            return created, (f"the memory was saved, but its index {mpaths.INDEX_FILENAME} "
                             f"could not be rebuilt: {exc.strerror or type(exc).__name__}",)
        return created, ()

    created, warnings = await anyio.to_thread.run_sync(land)
    COUNTERS.add("redacted_writes", sum(redacted.values()))
    await service.landed(project, {"saved": str(target), "scope": scope})
    return SaveOutcome(path=target, scope=scope, created=created, warnings=warnings,
                       redacted=summary)
