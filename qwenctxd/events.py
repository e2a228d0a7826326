"""The event bus: subsystems publish notifications, the server fans them out to subscribers.

Publishing never blocks and never fails the publisher: each subscriber has a bounded queue and a
subscriber that falls behind loses its oldest events (counted in ``dropped``) instead of
stalling a turn.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import anyio


class Subscription:
    """One subscriber's bounded queue of ``(topic, params)`` pairs."""

    def __init__(self, topics: Iterable[str] | None, maxlen: int = 1024) -> None:
        self.topics = frozenset(topics) if topics else None
        self._queue: collections.deque[tuple[str, Any]] = collections.deque(maxlen=maxlen)
        self._ready = anyio.Event()
        self.dropped = 0
        self.closed = False

    def wants(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics

    def put(self, topic: str, params: Any) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append((topic, params))
        self._ready.set()

    async def get(self) -> tuple[str, Any]:
        while not self._queue:
            if self.closed:
                raise anyio.EndOfStream
            await self._ready.wait()
            self._ready = anyio.Event()
        return self._queue.popleft()

    def close(self) -> None:
        self.closed = True
        self._ready.set()


class EventBus:
    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self.published = 0

    def subscribe(self, topics: Iterable[str] | None = None) -> Subscription:
        sub = Subscription(topics)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        sub.close()
        if sub in self._subs:
            self._subs.remove(sub)

    def publish(self, topic: str, params: Any) -> None:
        self.published += 1
        for sub in self._subs:
            if sub.wants(topic):
                sub.put(topic, params)

    def wanted(self, topic: str) -> bool:
        """Whether a subscriber would get ``topic`` (a publisher can skip building it)."""
        return any(sub.wants(topic) for sub in self._subs)

    @property
    def subscribers(self) -> int:
        return len(self._subs)
