"""Handler of ``session.search`` (every past conversation, searchable) and the index's line in
``daemon.status``; the work is :class:`qwenctxd.sessions.search.SessionSearch`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import daemon as daemon_wire
from qwenctxd.protocol import methods
from qwenctxd.protocol import session as wire
from qwenctxd.server.dispatch import bind
from qwenctxd.server.methods.instructions_methods import checked_cwd

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection


def register(daemon: Daemon) -> None:
    async def search(ctx: Connection, p: wire.SearchParams) -> wire.SearchResult:
        cwd = checked_cwd(p.cwd) if p.cwd is not None else None
        return await daemon.search.search(p, cwd)

    def status(st: daemon_wire.StatusResult) -> None:
        st.search = daemon.search.status()

    daemon.dispatcher.register(bind(methods.SESSION_SEARCH, search))
    daemon.status_contributors.append(status)
