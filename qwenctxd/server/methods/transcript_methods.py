"""Handler of ``session.transcript`` (the recorded conversation, for ``qwenctl sessions show
--messages``); kept apart from ``session_methods`` so the turn-path handlers stay small."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import methods
from qwenctxd.protocol import session as wire
from qwenctxd.server.dispatch import bind

if TYPE_CHECKING:
    from qwenctxd.server.app import Daemon
    from qwenctxd.server.connection import Connection


def register(daemon: Daemon) -> None:
    async def transcript(ctx: Connection, p: wire.SessionIdParams) -> wire.TranscriptResult:
        from qwenctxd.sessions.transcript import transcript as read

        return await read(daemon.sessions, p.session_id)

    daemon.dispatcher.register(bind(methods.SESSION_TRANSCRIPT, transcript))
