"""Handler of ``session.transcript`` (the recorded conversation, for ``qwenctl sessions show
--messages``); kept apart from ``session_methods`` so the turn-path handlers stay small."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenctxd.protocol import methods
from qwenctxd.protocol import session as wire
from qwenctxd.server.dispatch import handler

if TYPE_CHECKING:
    from qwenctxd.server.connection import Connection
    from qwenctxd.sessions.manager import SessionManager


class TranscriptHandlers:
    def __init__(self, *, sessions: SessionManager) -> None:
        self.sessions = sessions

    @handler(methods.SESSION_TRANSCRIPT)
    async def transcript(self, ctx: Connection, p: wire.SessionIdParams) -> wire.TranscriptResult:
        from qwenctxd.sessions.transcript import transcript as read

        return await read(self.sessions, p.session_id)
