"""Handler of ``session.search`` (every past conversation, searchable); the work is
:class:`qwenctxd.sessions.search.SessionSearch`'s, its figures in ``daemon.status`` come from
the daemon (``Daemon._search_status``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import methods
from qwenctxd.protocol import session as wire
from qwenctxd.server.dispatch import handler
from qwenctxd.server.methods.instructions_methods import checked_project

if TYPE_CHECKING:
    from qwenctxd.project import ProjectRegistry
    from qwenctxd.server.connection import Connection
    from qwenctxd.sessions.search import SessionSearch


class SearchHandlers:
    def __init__(self, *, search: SessionSearch, projects: ProjectRegistry) -> None:
        self.search = search
        self.projects = projects

    @handler(methods.SESSION_SEARCH)
    async def search_sessions(self, ctx: Connection, p: wire.SearchParams) -> wire.SearchResult:
        scope = checked_project(self.projects, p.cwd) if p.cwd is not None else None
        return await self.search.search(p, scope)
