"""One session's state, split by concern: :class:`Session` composes the parts.

* :class:`SessionOptions` — what the client chose at open (window, auto-compact threshold,
  tools and their roles, agent, keep_reasoning): recorded as an ``options`` record, restored
  on resume.
* :class:`History` — the messages, per-message token estimates and their running total, and
  the epoch rules of incremental replies (appends keep the epoch, rewrites bump it).
* :class:`UsageAnchor` — the API-anchored prompt-token figure.
* :class:`CompactionState` — the breaker, the image-overflow count, the last usage level.
* :class:`Deliveries` — touched paths and what rules, skills and memory have been delivered.
* :class:`TurnState` — the agent loop's turn bookkeeping: whether a user turn is open, whether
  the main agent wrote memory in it, the tool results seen, the calls the daemon answered.
* :class:`SessionTable` — the open sessions by id (the manager's, read by the pipeline).

What stays on :class:`Session` itself: identity (id, cwd, its resolved project, model, env, title),
the transcript (path and writer; its fsync policy is the store's), the lock, and the activity
clock (``started_at``, ``updated_at``, ``last_model_reply_at``; see :class:`TurnState` for why
the last reply's time is not turn state).

Token accounting: the prompt count the client reports for a model reply (``record_model``
usage) is authoritative for everything up to that reply; later messages, and any change in
the system prompt since, are estimated with the one estimator. Without an anchor the whole
prompt (system + tools + history) is estimated. Changes that touch several parts (append,
pop, replace: the history moves and the anchor follows) go through :class:`Session`.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from qwenctxd.compaction.thresholds import Breaker
from qwenctxd.protocol import errors
from qwenctxd.sessions.jsonl_writer import JsonlWriter
from qwenctxd.skills.listing import SKILL_NAME
from qwenctxd.tokens import message_tokens, tool_result_chars

if TYPE_CHECKING:
    from qwenctxd.project import Project

Message = dict[str, Any]
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking", "reasoning_details")


def no_null_content(msg: Message) -> Message:
    """``msg`` with ``content: ""`` instead of a missing or null content (protocol C4)."""
    if msg.get("role") == "assistant" and msg.get("content") is None:
        return {**msg, "content": ""}
    return msg


@dataclass
class Anchor:
    total: int  # API prompt + completion tokens for messages[:index]
    index: int  # how many history messages the API count covers
    system_tokens: int  # estimated system+tools tokens when it was taken


@dataclass
class History:
    """The message list as a client holds it: per-message token estimates and their running
    total, the counts that say when the wire copy must differ (extension fields, reasoning,
    tool-result characters), and the epoch rules of incremental replies.

    The epoch is ``<base>-<rewrites>``; the base is new for every load of the session (a
    restart or resume), ``rewrites`` counts the changes to messages a client may already hold.
    ``last_user`` is the index of the latest user message (-1: none), ``wire_cut`` the index
    before which the last reply dropped reasoning fields (keep_reasoning "current_turn").
    """

    image_tokens: int = 1600
    messages: list[Message] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # one estimate per message
    total: int = 0  # sum(tokens)
    last_user: int = -1
    wire_cut: int = 0
    ext_count: int = 0  # messages carrying our extension fields (stripped on the wire)
    tool_chars: int = 0  # running total of tool-result characters (size trigger)
    reasoning_count: int = 0  # assistant messages carrying reasoning fields
    epoch_base: str = field(default_factory=lambda: secrets.token_hex(6))
    rewrites: int = 0

    @property
    def epoch(self) -> str:
        return f"{self.epoch_base}-{self.rewrites}"

    def rewrote(self) -> None:
        """Earlier messages changed (as a client holds them): a new epoch."""
        self.rewrites += 1

    def append(self, msg: Message) -> None:
        msg = no_null_content(msg)
        self.messages.append(msg)
        if msg.get("role") == "user":
            self.last_user = len(self.messages) - 1
        self._count(msg, 1)
        tok = message_tokens(msg, image_tokens=self.image_tokens)
        self.tokens.append(tok)
        self.total += tok

    def pop_last(self) -> Message:
        """Take the last message back out (a merge or a rewind): a new epoch."""
        msg = self.messages.pop()
        self.total -= self.tokens.pop()
        self._count(msg, -1)
        self.rewrote()
        if self.last_user >= len(self.messages):
            self._find_last_user()
        self.wire_cut = min(self.wire_cut, len(self.messages))
        return msg

    def replace(self, messages: list[Message]) -> None:
        """Swap the whole list (compaction, resume): re-estimated, a new epoch."""
        self.messages, self.tokens = [], []
        self.total = self.ext_count = self.tool_chars = self.reasoning_count = 0
        self.last_user = -1
        for m in messages:
            self.append(m)
        self.rewrote()
        self.wire_cut = max(0, self.last_user)

    def tail_tokens(self, start: int) -> int:
        """The estimate of ``messages[start:]``: summed directly when short, else from the
        running total."""
        n = len(self.messages)
        return (sum(self.tokens[start:]) if n - start <= 64
                else self.total - sum(self.tokens[:start]))

    def user_turn_starts(self) -> list[int]:
        """Where each user turn starts: a user message first or right after a reply."""
        msgs = self.messages
        return [i for i, m in enumerate(msgs) if m.get("role") == "user"
                and (i == 0 or msgs[i - 1].get("role") == "assistant")]

    def reply_start(self, keep_reasoning: str, epoch: str | None = None, count: int = 0) -> int:
        """Where a reply's messages start for a client holding ``count`` messages of
        ``epoch`` (0 when its copy is of another epoch, or none). Reasoning dropped from a
        finished turn ("current_turn") changes messages the client holds, so it starts a new
        epoch first."""
        cut = self.last_user if self.last_user > 0 else 0
        if cut > self.wire_cut:
            if (self.reasoning_count and keep_reasoning == "current_turn"
                    and any(m.get("role") == "assistant" and any(k in m for k in REASONING_KEYS)
                            for m in self.messages[self.wire_cut:cut])):
                self.rewrote()
            self.wire_cut = cut
        if epoch is None or epoch != self.epoch or count > len(self.messages):
            return 0
        return count

    def pending_tool_calls(self) -> list[str]:
        """Ids of the last assistant message's tool calls that have no result yet."""
        for i in range(len(self.messages) - 1, -1, -1):
            m = self.messages[i]
            if m.get("role") == "assistant":
                ids = [c.get("id") for c in m.get("tool_calls") or [] if c.get("id")]
                answered = {x.get("tool_call_id") for x in self.messages[i + 1:]
                            if x.get("role") == "tool"}
                return [c for c in ids if c not in answered]
            if m.get("role") == "user":
                return []
        return []

    def _find_last_user(self) -> None:
        self.last_user = next((i for i in range(len(self.messages) - 1, -1, -1)
                               if self.messages[i].get("role") == "user"), -1)

    def _count(self, msg: Message, sign: int) -> None:
        if "is_error" in msg:
            self.ext_count += sign
        if msg.get("role") == "tool":
            self.tool_chars += sign * tool_result_chars([msg])
        elif msg.get("role") == "assistant" and any(k in msg for k in REASONING_KEYS):
            self.reasoning_count += sign


@dataclass
class UsageAnchor:
    """The prompt-token figure: anchored on the API's count for the last model reply, the rest
    estimated. ``prompt_tokens`` is the figure of the last assembled prompt,
    ``last_system_tokens`` the system+tools estimate of it (what the API's count for the reply
    covers: record_model anchors on it without re-building the system prompt)."""

    anchor: Anchor | None = None
    prompt_tokens: int = 0
    last_system_tokens: int | None = None

    def estimate(self, history: History, system_tokens: int) -> tuple[int, bool]:
        """(prompt tokens, anchored?) for ``history`` plus a system+tools of ``system_tokens``."""
        a = self.anchor
        if a is not None and a.index <= len(history.messages):
            return max(0, a.total + history.tail_tokens(a.index)
                       + (system_tokens - a.system_tokens)), True
        return system_tokens + history.total, False

    def set(self, prompt_tokens: int, completion_tokens: int, system_tokens: int,
            index: int) -> None:
        """The API counted ``prompt + completion`` tokens for the first ``index`` messages."""
        self.anchor = Anchor(total=prompt_tokens + completion_tokens, index=index,
                             system_tokens=system_tokens)

    def truncated(self, length: int) -> None:
        """The history shrank to ``length`` messages: an anchor past the end no longer holds."""
        if self.anchor is not None and self.anchor.index > length:
            self.anchor = None

    def replaced(self, length: int, keep_delta: int | None) -> None:
        """The history was swapped for ``length`` messages. ``keep_delta``: keep the anchor,
        shifted down by that many tokens (micro-compaction keeps positions); else drop it."""
        if keep_delta is not None and self.anchor is not None:
            self.anchor = Anchor(total=max(0, self.anchor.total - keep_delta),
                                 index=min(self.anchor.index, length),
                                 system_tokens=self.anchor.system_tokens)
        else:
            self.anchor = None


@dataclass
class SessionOptions:
    """What the client chose at open, recorded as an ``options`` record and restored on resume:
    the context window, the auto-compact threshold (percent of the window), the declared tools
    (with the daemon's ``skill`` tool) and what they are for (C5, file detection), the client's
    identity and reasoning policy (C4), and whether ``skill`` is the daemon's own tool."""

    window_tokens: int
    auto_compact_threshold: float
    tools: list[dict[str, Any]]
    tool_roles: Any = None
    agent: dict[str, Any] | None = None
    keep_reasoning: str = "current_turn"
    own_skill: bool = True
    window_source: str = "default"  # sessions/window.py: client|upstream|settings|config|default

    def restoration_tools(self) -> dict[str, str] | None:
        """The file tools whose calls name the files to restore after compaction: the declared
        ones, Qwen Code's when the client declared none (the daemon's own ``skill`` tool, added
        to every session, is not a declaration)."""
        if self.tool_roles is None:
            return None
        own = frozenset({SKILL_NAME}) if self.own_skill else frozenset()
        return self.tool_roles.restoration_tools(own=own)


@dataclass
class CompactionState:
    """What the compaction triggers remember between turns: the breaker over failed summaries
    (an open breaker skips auto compaction; hard overflow still forces it), the tool-result
    images since the last summary (the image-overflow trigger) and the usage level of the last
    assembled prompt."""

    breaker: Breaker = field(default_factory=Breaker)
    tool_images: int = 0
    last_level: str = "ok"


@dataclass
class Deliveries:
    """What the reminders have delivered to the model in this session, and what they need to
    pick the next one: the paths touched so far (file tracking: rules and conditional skills
    re-match on them, compaction keeps their files), the conditional rules delivered; skills:
    names already announced (None: the snapshot is still due), the conditional skills active,
    the skill-set generation seen (a refresh resets activation), the skills loaded; memory: the
    recall prefetch started by the last user turn, whether it was delivered, and the memory
    files already surfaced (not offered again)."""

    touched: dict[str, None] = field(default_factory=dict)
    delivered_rules: set[str] = field(default_factory=set)
    skills_delivered: set[str] | None = None
    skills_activated: set[str] = field(default_factory=set)
    skills_generation: int = 0
    skills_used: set[str] = field(default_factory=set)
    prefetch: Any = None
    prefetch_delivered: bool = True
    #: the running prefetch's lexical answer ({"outcome": RecallOutcome}), delivered when the
    #: selector misses the user turn's grace; the selector's later picks follow on a later turn
    prefetch_early: dict[str, Any] = field(default_factory=dict)
    #: memory docs a finished prefetch chose that no turn delivered yet (the next user turn
    #: carries them)
    carried: list[Any] = field(default_factory=list)
    surfaced: set[str] = field(default_factory=set)

    def snapshot(self) -> Deliveries:
        """A copy to go back to: what had been delivered before a user turn began."""
        return Deliveries(
            touched=dict(self.touched), delivered_rules=set(self.delivered_rules),
            skills_delivered=None if self.skills_delivered is None else set(self.skills_delivered),
            skills_activated=set(self.skills_activated), skills_generation=self.skills_generation,
            skills_used=set(self.skills_used), prefetch=self.prefetch,
            prefetch_delivered=self.prefetch_delivered, prefetch_early=dict(self.prefetch_early),
            carried=list(self.carried), surfaced=set(self.surfaced))


#: user turns whose starting deliveries a session keeps for a rewind (older ones: the rewind
#: keeps what was delivered since, which only means a reminder is not sent twice)
MAX_DELIVERY_MARKS = 64


@dataclass
class TurnState:
    """Where the agent loop stands in the current user turn, and what it counts across turns.

    * ``user_turn_open`` — a user turn began (``session.turn`` kind ``user``) and no reply
      without tool calls has finished it yet. :meth:`begin_user_turn` opens it;
      :meth:`finish_user_turn` (a complete reply), :meth:`rewound` and :meth:`adopted` (an
      accepted speculation) close it. Background work after a turn runs only for an open one.
    * ``memory_written_this_turn`` — a reply of the open user turn wrote a memory file (the
      extraction then stands down); :meth:`begin_user_turn` clears it.
    * ``tool_calls_seen`` — tool results received since the session opened in this daemon
      (the skill review counts from it); no turn resets it.
    * ``daemon_answered`` — the calls the daemon answered itself (its ``skill`` tool), so a
      client's duplicate result for one is recognised; bounded, cleared on :meth:`rewound`.

    Not here, on purpose: ``last_model_reply_at`` is the session's activity clock, not turn
    state — the idle micro-compaction trigger measures the gap from the last reply to the next
    turn and idle close reads it, so it must survive turn boundaries; it stays on
    :class:`Session` with ``started_at`` and ``updated_at``. The transcript's fsync pacing is
    no turn state either: it is :class:`~qwenctxd.sessions.store.SessionStore`'s.
    """

    user_turn_open: bool = False
    memory_written_this_turn: bool = False
    tool_calls_seen: int = 0
    daemon_answered: set[str] = field(default_factory=set)

    def begin_user_turn(self) -> None:
        """A user turn's message is in the history: the turn is open, no memory written yet."""
        self.user_turn_open = True
        self.memory_written_this_turn = False

    def finish_user_turn(self) -> bool:
        """A reply without tool calls: True when it finished an open user turn (now closed)."""
        was_open, self.user_turn_open = self.user_turn_open, False
        return was_open

    def results_received(self, count: int) -> None:
        self.tool_calls_seen += count

    def wrote_memory(self) -> None:
        self.memory_written_this_turn = True

    def answered_by_daemon(self, call_id: str, *, limit: int) -> None:
        """The daemon answered ``call_id`` itself; at most ``limit`` ids are kept."""
        self.daemon_answered.add(call_id)
        if len(self.daemon_answered) > limit:
            self.daemon_answered.discard(next(iter(self.daemon_answered)))

    def rewound(self) -> None:
        """Turns were taken back: no user turn is open, the daemon's answers are forgotten."""
        self.user_turn_open = False
        self.daemon_answered.clear()

    def adopted(self, *, complete: bool) -> None:
        """Messages produced elsewhere were appended: the user turn stays open unless they
        completed it."""
        self.user_turn_open = not complete


@dataclass
class Session:
    id: str
    cwd: Path
    #: resolved once, when the session opened; services read root, anchor and settings here
    project: Project
    model: str
    options: SessionOptions
    env: dict[str, str]
    path: Path
    writer: JsonlWriter
    history: History = field(default_factory=History)
    usage: UsageAnchor = field(default_factory=UsageAnchor)
    git_snapshot: str | None = None  # the git section taken when the session (re)opened
    compaction: CompactionState = field(default_factory=CompactionState)
    #: held for each turn and reply; uncontended (the usual case) it is taken without a trip
    #: through the event loop (``fast_acquire``: two a proxied request)
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    last_model_reply_at: float | None = None  # activity clock (see TurnState)
    title: str | None = None
    deliveries: Deliveries = field(default_factory=Deliveries)
    #: the deliveries as they stood when each recent user turn began, by the history index of
    #: its first message: a rewind to that turn goes back to them, so what the taken-back
    #: messages carried (the skill listing, recalled memories, rules) is delivered again
    delivery_marks: dict[int, Deliveries] = field(default_factory=dict)
    turn: TurnState = field(default_factory=TurnState)
    #: the model server this session's agent talks to (``session.open`` ``model_base_url``;
    #: the proxy's upstream): its requests are foreground there (model/scheduler.py)
    model_base_url: str | None = None

    # -- changes that touch several parts ------------------------------------------------------
    def append(self, msg: Message) -> None:
        self.history.append(msg)
        self.updated_at = time.time()

    def mark_deliveries(self, at: int, before: Deliveries) -> None:
        """A user turn began at history index ``at`` with ``before`` delivered."""
        self.delivery_marks[at] = before
        while len(self.delivery_marks) > MAX_DELIVERY_MARKS:
            self.delivery_marks.pop(next(iter(self.delivery_marks)))

    def rewind_deliveries(self, cut: int) -> None:
        """The history was cut back to ``cut`` (a rewind): deliveries as they were when the
        turn starting there began, and no marks past it."""
        mark = self.delivery_marks.get(cut)
        if mark is not None:
            self.deliveries = mark
        self.delivery_marks = {i: d for i, d in self.delivery_marks.items() if i < cut}

    def pop_last(self) -> Message:
        """Take the last message back out of the history (a merge or a rewind)."""
        msg = self.history.pop_last()
        self.usage.truncated(len(self.history.messages))
        self.updated_at = time.time()
        return msg

    def replace_history(self, messages: list[Message], *, keep_anchor_delta: int | None = None) -> None:
        """Swap the history (compaction). ``keep_anchor_delta``: keep the API anchor, shifted
        down by that many tokens (micro-compaction keeps positions); else drop it."""
        self.usage.replaced(len(messages), keep_anchor_delta)
        if keep_anchor_delta is None:  # positions moved: no mark points at its turn any more
            self.delivery_marks.clear()
        self.history.replace(messages)
        self.updated_at = time.time()

    def answered_tail(self) -> bool:
        """True when the last reply's calls are all answered and the daemon answered some."""
        msgs = self.history.messages
        i = len(msgs)
        own = False
        while i and msgs[i - 1].get("role") == "tool":
            own = own or msgs[i - 1].get("tool_call_id") in self.turn.daemon_answered
            i -= 1
        return own and i > 0 and msgs[i - 1].get("role") == "assistant"

    def estimate(self, system_tokens: int) -> tuple[int, bool]:
        """(prompt tokens, anchored?) for the history plus a system+tools of ``system_tokens``."""
        return self.usage.estimate(self.history, system_tokens)

    def set_anchor(self, prompt_tokens: int, completion_tokens: int, system_tokens: int) -> None:
        """Anchor on the API's count for the whole history as it stands."""
        self.usage.set(prompt_tokens, completion_tokens, system_tokens, len(self.history.messages))


class SessionTable(dict[str, Session]):
    """The daemon's open sessions by id: the manager opens and closes them, the turn pipeline
    and the compactor look them up."""

    def session(self, session_id: str) -> Session:
        """The open session ``session_id`` (SessionNotFound when none is open)."""
        s = self.get(session_id)
        if s is None:
            raise errors.SessionNotFound(f"unknown session {session_id}",
                                         data={"session_id": session_id})
        return s
