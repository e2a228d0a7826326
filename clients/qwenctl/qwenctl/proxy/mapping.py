"""Map a client's full chat history onto a daemon session, request after request.

The proxy remembers, per conversation, which client messages it has already turned into
daemon steps (by :func:`conversation.fingerprint`), so each request maps only what is new:
user messages become ``session.turn {kind: "user"}``, tool messages ``session.turn {kind:
"tool_results"}``, assistant messages the proxy did not record itself ``session.record_model``;
the last step (the current input) yields the AssembledPrompt that is forwarded. Each session's
history is kept by a :class:`qwenctxd.client.SessionHistory`, so the daemon sends only the
messages that are new since the last turn (``known``). A request
that repeats the last one exactly (a retry after an upstream error) reuses its prompt. A
history that no longer extends what was mapped (the client regenerated, edited or started
over with the same first message) is mapped onto a fresh daemon session — the old one stays
recorded — so the daemon's history always is the client's.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from qwenctl.proxy.conversation import Conversation, Step, fingerprint, steps
from qwenctl.proxy.reply import unusable_answer
from qwenctxd.client import RemoteError
from qwenctxd.client.history import SessionHistory
from qwenctxd.protocol import instructions as iwire
from qwenctxd.protocol import methods
from qwenctxd.protocol import session as swire

log = structlog.get_logger("qwenctl.proxy")
MAX_CONVERSATIONS = 1024
SEPARATOR = "\n\n---\n\n"


@dataclass
class Mapped:
    key: str
    session_id: str | None = None
    fps: list[bytes] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)  # the role of each mapped message
    #: the last recorded reply was no answer (:func:`reply.unusable_answer`): a
    #: client that asks again retries in the same session instead of regenerating into a
    #: fresh one
    reply_failed: bool = False
    awaiting: bool = False  # the last mapped input has no reply recorded yet
    pending: list[str] = field(default_factory=list)
    last_prompt: dict[str, Any] | None = None
    view: SessionHistory | None = None  # the daemon session's history, kept incrementally
    #: held for a whole exchange; uncontended it is taken without a trip through the loop
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))


class SessionMap:
    def __init__(self, daemon: Any) -> None:
        self.daemon = daemon  # an AsyncClient-like object with ``call(method, params)``
        self._states: OrderedDict[str, Mapped] = OrderedDict()
        #: (cwd, model, prefix_hash) -> appended text: the sections depend on the project and
        #: the daemon's system prompt only, so a new conversation in the same project reuses
        #: them (no prompt.system on its first byte path)
        self._extra: dict[tuple[str, str, str], str] = {}
        #: added to every session.open of the current request (the upstream's URL and window)
        self.open_params: dict[str, Any] = {}
        #: whether the daemon takes ``session.open``'s ``first_turn`` (off for this proxy's
        #: life once a daemon refused it)
        self.first_turn = True

    def state(self, key: str) -> Mapped:
        st = self._states.get(key)
        if st is None:
            st = self._states[key] = Mapped(key)
            while len(self._states) > MAX_CONVERSATIONS:
                old = next(iter(self._states))
                if self._states[old].lock.locked():
                    break
                del self._states[old]
        self._states.move_to_end(key)
        return st

    async def _open(self, st: Mapped, session_id: str, cwd: str, model: str,
                    tools: list[dict[str, Any]] | None,
                    first: Step | None = None) -> tuple[int, dict[str, Any] | None]:
        """Open ``session_id`` for ``st``: the messages it already held, and the prompt of
        ``first`` (the conversation's one turn: a user turn) when the daemon ran it in the same
        call — it does only for a session that held no messages."""
        params = swire.OpenParams(
            cwd=cwd, model=model, session_id=session_id, tools=tools or None,
            first_turn=swire.TurnInput(kind="user", text=first.text, images=first.images or None)
            if first is not None else None,
            **self.open_params)
        try:
            res = await self.daemon.call(methods.SESSION_OPEN, params)  # JSON: its prompt goes on
        except RemoteError as exc:
            if first is None or not (isinstance(exc.data, dict)
                                     and exc.data.get("field") == "first_turn"):
                raise
            # a daemon older than first_turn (upgraded, not yet restarted): open, then turn
            log.info("proxy: the daemon takes no first_turn; opening and turning apart")
            self.first_turn = False
            return await self._open(st, session_id, cwd, model, tools)
        st.session_id, st.fps, st.pending, st.awaiting, st.last_prompt = (
            res["session_id"], [], [], False, None)
        st.roles = []
        st.view = SessionHistory(res["session_id"])
        prompt = res.get("prompt")
        return res["messages"], st.view.full_prompt(prompt) if prompt is not None else None

    async def map(self, st: Mapped, *, cwd: str, model: str, conv: Conversation,
                  tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        """Map ``conv`` onto ``st``'s daemon session and return the prompt to forward.
        Call with ``st.lock`` held."""
        roles, fps = conv.roles, conv.fps
        start = 0
        if st.session_id is None:
            # a conversation that is one user turn (every new one) opens and takes that turn
            # in one call to the daemon
            first = steps(conv.dialogue_from(0), []) \
                if self.first_turn and "assistant" not in roles else []
            first_turn = first[0] if len(first) == 1 and first[0].kind == "user" else None
            known, prompt = await self._open(st, st.key, cwd, model, tools, first_turn)
            if prompt is not None:
                return self._mapped(st, conv, prompt)
            last_reply = max((i for i, r in enumerate(roles) if r == "assistant"), default=-1)
            if known and last_reply >= 0:  # the daemon has this conversation (proxy restarted)
                start = last_reply + 1
                reply = conv.dialogue_from(last_reply)[0]
                st.pending = [c["id"] for c in reply.get("tool_calls") or []]
            elif known:  # same first message, but a new conversation
                known, prompt = await self._open(st, str(uuid.uuid4()), cwd, model, tools,
                                                 first_turn)
                if prompt is not None:
                    return self._mapped(st, conv, prompt)
        else:
            mapped = len(st.fps)
            if fps[:mapped] == st.fps:  # the usual case: the history goes on (one C compare)
                k = mapped
            else:  # the messages both have in common
                k = next((i for i, (a, b) in enumerate(zip(st.fps, fps, strict=False)) if a != b),
                         min(mapped, len(fps)))
            if k == len(st.fps) == len(fps) and st.awaiting and st.last_prompt is not None:
                log.info("proxy retry", session=st.session_id)
                return st.last_prompt
            if self._asked_again(st, roles, k, len(fps)):
                # the client sends its last user message again without the reply it got (a
                # retry after an empty or broken answer): that turn is taken back and mapped
                # anew, in the same session
                await self.daemon.request(methods.SESSION_REWIND,
                                          swire.RewindParams(session_id=st.session_id, turns=1))
                log.info("proxy: the last user turn asked again; rewound",
                         session=st.session_id)
                st.fps, st.roles, st.pending, st.awaiting = st.fps[:k - 1], st.roles[:k - 1], [], False
                start = k - 1
            elif k < len(st.fps) or k == len(fps):
                log.info("proxy history diverged: new daemon session", old=st.session_id,
                         common=k, mapped=len(st.fps), sent=len(fps))
                await self._open(st, str(uuid.uuid4()), cwd, model, tools)
            else:
                start = k
        assert st.session_id is not None
        if st.view is None or st.view.session_id != st.session_id:
            st.view = SessionHistory(st.session_id)
        prompt: dict[str, Any] | None = None
        for step in steps(conv.dialogue_from(start), st.pending):
            if step.kind == "assistant":
                await self.daemon.request(methods.SESSION_RECORD_MODEL, swire.RecordModelParams(
                    session_id=st.session_id, message=step.message))
            else:
                prompt = await st.view.aturn(self.daemon, step.turn_params(st.session_id))
        assert prompt is not None  # conversation.parse refuses a history ending in a reply
        return self._mapped(st, conv, prompt)

    @staticmethod
    def _mapped(st: Mapped, conv: Conversation, prompt: dict[str, Any]) -> dict[str, Any]:
        """``st`` after ``conv`` was mapped up to its last turn, whose ``prompt`` goes on."""
        st.fps, st.awaiting, st.pending, st.last_prompt = conv.fps, True, [], prompt  # conv's own
        st.roles, st.reply_failed = conv.roles, False
        return prompt

    @staticmethod
    def _asked_again(st: Mapped, roles: list[str], common: int, sent: int) -> bool:
        """The client asks its last user message again after getting no answer (an empty or
        cut-off reply, or one stopped by the token budget, as Qwen Code retries): its history is what was mapped up to and
        including that message, and only replies to it were mapped after. (Asking again
        after a real answer is a regenerate: a fresh session, the first one kept.)"""
        return (st.reply_failed and 0 < common == sent < len(st.fps)
                and len(st.roles) == len(st.fps)
                and roles[-1] == "user" and st.roles[common - 1] == "user"
                and "user" not in st.roles[common:])

    async def record(self, st: Mapped, message: dict[str, Any],
                     usage: dict[str, int] | None, finish_reason: str | None = None) -> None:
        """Record the upstream reply (call with ``st.lock`` held). A reply that is no usable
        answer (:func:`reply.unusable_answer`: empty, cut off, stopped by the token budget, or
        one Qwen Code discards as an invalid stream) lets the client ask again in this
        session."""
        await self.daemon.request(methods.SESSION_RECORD_MODEL, swire.RecordModelParams(
            session_id=st.session_id,  # type: ignore[arg-type]  # set by map() under the lock
            message=message,
            usage=swire.ApiUsage(**usage) if usage else None))
        st.fps.append(fingerprint(message))
        st.roles.append("assistant")
        st.reply_failed = unusable_answer(message, finish_reason)
        st.awaiting, st.last_prompt = False, None
        st.pending = [c["id"] for c in message.get("tool_calls") or []]

    def forget(self, st: Mapped) -> None:
        st.session_id, st.fps, st.awaiting, st.last_prompt, st.view = None, [], False, None, None
        st.roles, st.reply_failed = [], False

    async def appended_text(self, cwd: str, model: str, prefix_hash: str) -> str:
        """The project's instructions and memory sections of the daemon's system prompt
        (each behind its ``---`` separator), cached per project and system prompt (its
        ``prefix_hash``): a changed prompt is fetched again."""
        key = (cwd, model, prefix_hash)
        hit = self._extra.get(key) if prefix_hash else None
        if hit is not None:
            return hit
        sp = await self.daemon.request(methods.PROMPT_SYSTEM,
                                       iwire.PromptSystemParams(cwd=cwd, model=model))
        text, pos, parts = sp.text, 0, []
        for sec in sp.sections:
            if sec.name in ("instructions", "memory"):
                parts.append(text[pos:pos + sec.chars])
            pos += sec.chars
        extra = "".join(parts)
        if len(self._extra) > MAX_CONVERSATIONS:
            self._extra.clear()
        self._extra[key] = extra
        return extra


def system_text(client_system: str, appended: str) -> str:
    """The client's system prompt with the project's sections behind ``---``."""
    if not appended:
        return client_system
    if not client_system:
        return appended[len(SEPARATOR):] if appended.startswith(SEPARATOR) else appended
    return client_system + appended
