"""The proxy's session mapping against a daemon that predates ``session.open``'s ``first_turn``
(a daemon upgraded on disk but not yet restarted): new conversations still map, in two calls.

The daemon is a real spawned one; the link in front of it refuses ``first_turn`` exactly as a
daemon without the field does (its params refuse unknown fields: -32602 naming the field)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from qwenctl.proxy.conversation import parse
from qwenctl.proxy.mapping import SessionMap

from qwenctxd.client import AsyncClient, RemoteError
from qwenctxd.protocol import methods
from qwenctxd.testing.spawn import SpawnedDaemon


class OlderDaemon:
    """A link to a real daemon that answers ``session.open`` with ``first_turn`` as a daemon
    from before that field did; every other call goes through unchanged."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.calls: list[str] = []

    async def call(self, method: Any, params: Any = None) -> Any:
        self.calls.append(method.name)
        if method is methods.SESSION_OPEN and "first_turn" in msgspec.to_builtins(params):
            raise RemoteError.from_wire({
                "code": -32602, "data": {"field": "first_turn"},
                "message": "Invalid params: Object contains unknown field `first_turn`"})
        return await self.client.call(method, params)

    async def request(self, method: Any, params: Any) -> Any:
        self.calls.append(method.name)
        return await self.client.request(method, params)


def conversation(text: str) -> Any:
    return parse([{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": text}])


@pytest.mark.asyncio
async def test_new_conversations_map_in_two_calls_on_an_older_daemon(
        daemon: SpawnedDaemon) -> None:
    cwd = daemon.home / "proj"
    cwd.mkdir()
    async with AsyncClient(daemon.socket) as client:
        link = OlderDaemon(client)
        sessions = SessionMap(link)
        for n, text in enumerate(("first question", "second question")):
            conv = conversation(text)
            st = sessions.state(conv.conversation_id(str(cwd)))
            async with st.lock:
                prompt = await sessions.map(st, cwd=str(cwd), model="m", conv=conv, tools=None)
            assert prompt["session_id"] == st.session_id
            assert prompt["messages"][-1]["role"] == "user"
            assert prompt["messages"][-1]["content"][-1]["text"] == text
            # refused once, then never asked again: open, then turn
            assert link.calls == (["session.open", "session.open", "session.turn"] if n == 0
                                  else ["session.open", "session.turn"]), link.calls
            link.calls.clear()
        assert sessions.first_turn is False
        listed = await client.call(methods.SESSION_LIST, {"cwd": str(cwd)})
        assert len(listed["sessions"]) == 2
