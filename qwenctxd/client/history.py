"""A client's copy of one session's history, kept current from incremental ``session.turn`` replies.

``session.turn`` with ``known: {epoch, count}`` returns only the messages from ``count`` on when
the client's copy is of the daemon's current ``epoch`` (``messages_from == count``); after a
compaction, micro-compaction, rewind, merged user turn or restart the epoch differs and the
reply carries the whole history (``messages_from == 0``). :class:`SessionHistory` sends
``known`` and splices the reply, so the caller always sees the full message list::

    view = SessionHistory(session_id)
    prompt = client.call(methods.SESSION_TURN, view.params({"kind": "user", "text": "hi"}))
    messages = view.apply(prompt)          # the full history, as a known-less call returns it

or, in one step, ``view.turn(client, params)`` / ``await view.aturn(async_client, params)``.
The copy holds the messages as the daemon sent them (JSON, as a client forwards them on: the
proxy); ``session.record_model`` needs no local append (the next reply carries the recorded
message in its wire form). The call names the method through the table
(``methods.SESSION_TURN``), params and reply stay JSON.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


class SessionHistory:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.epoch: str | None = None
        self.messages: list[Message] = []
        self.full_replies = 0  # replies that carried the whole history (for diagnostics)

    def known(self) -> dict[str, Any] | None:
        """The ``known`` to send, or None before the first reply."""
        if self.epoch is None:
            return None
        return {"epoch": self.epoch, "count": len(self.messages)}

    def params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``session.turn`` params with ``session_id`` and ``known`` filled in."""
        out = {"session_id": self.session_id, **params}
        known = self.known()
        if known is not None:
            out["known"] = known
        else:
            out.pop("known", None)
        return out

    def apply(self, prompt: dict[str, Any]) -> list[Message]:
        """Splice an AssembledPrompt (a dict as the socket returns it) into the copy; returns the
        full history. A reply from a daemon without the feature (no ``epoch``) is taken whole."""
        start = prompt.get("messages_from") or 0
        epoch = prompt.get("epoch")
        if not isinstance(start, int) or start < 0 or start > len(self.messages):
            start = 0  # not something this copy can extend: trust the reply alone
        if start == 0:
            self.messages = list(prompt["messages"])
            self.full_replies += 1
        else:
            del self.messages[start:]
            self.messages.extend(prompt["messages"])
        self.epoch = epoch if isinstance(epoch, str) and epoch else None
        return self.messages

    def reset(self) -> None:
        """Forget the copy (the next reply carries the whole history)."""
        self.epoch = None
        self.messages = []

    def full_prompt(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """``prompt`` applied, returned with the full history as ``messages`` (a copy)."""
        messages = self.apply(prompt)
        return {**prompt, "messages": list(messages), "messages_from": 0}

    def turn(self, client: Any, params: dict[str, Any]) -> dict[str, Any]:
        """One ``session.turn`` through a blocking :class:`~qwenctxd.client.Client`."""
        from qwenctxd.protocol import methods  # lazy: the client package stays cheap to import

        return self.full_prompt(client.call(methods.SESSION_TURN, self.params(params)))

    async def aturn(self, client: Any, params: dict[str, Any]) -> dict[str, Any]:
        """One ``session.turn`` through an :class:`~qwenctxd.client.AsyncClient` (or anything
        with an awaitable ``call(method, params)``)."""
        from qwenctxd.protocol import methods  # lazy: the client package stays cheap to import

        return self.full_prompt(await client.call(methods.SESSION_TURN, self.params(params)))
