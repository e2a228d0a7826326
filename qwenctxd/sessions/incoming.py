"""A turn's new messages, from the ``session.turn`` params and the history they join.

Tool results must answer exactly the pending calls of the last reply (a duplicate of a call the
daemon answered itself is dropped, with an event); a user or cron turn abandons calls still
pending (each gets a "not executed" error result) and joins an unanswered user message instead
of following it (C1: never two user messages in a row). Client content parts are checked
here; every refusal is -32602 naming the field.
"""

from __future__ import annotations

from typing import Any

from qwenctxd.protocol import errors
from qwenctxd.protocol import session as wire
from qwenctxd.protocol import turn_events as ev
from qwenctxd.sessions.content_parts import check_parts
from qwenctxd.sessions.state import Session

NOT_EXECUTED = "[Tool call not executed: the user sent a new message before it ran]"


def incoming_messages(s: Session, p: wire.TurnParams, events: list[ev.Event]
                      ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The turn's new messages, and the unanswered user message the last of them joins
    (taken out of the history here; None when nothing is merged)."""
    pending = s.history.pending_tool_calls()
    out: list[dict[str, Any]] = []
    if p.kind == "tool_results":
        results = []
        for i, r in enumerate(p.tool_results or []):
            if r.tool_call_id in s.turn.daemon_answered and r.tool_call_id not in pending:
                # the daemon answered this call itself (its skill tool): keep its answer
                events.append(ev.DuplicateToolResult(tool_call_id=r.tool_call_id, index=i))
                continue
            results.append((i, r))
        if not results and (pending or not p.tool_results and not s.answered_tail()):
            raise errors.InvalidParams("tool_results is empty",
                                       data={"field": "tool_results", "message": "empty"})
        seen: set[str] = set()
        for i, r in results:
            if isinstance(r.content, list):
                check_parts(r.content, f"tool_results[{i}].content")
            if r.tool_call_id not in pending or r.tool_call_id in seen:
                raise errors.InvalidParams(
                    f"tool_results[{i}].tool_call_id {r.tool_call_id!r} answers no pending "
                    f"tool call (pending: {', '.join(pending) or 'none'})",
                    data={"field": f"tool_results[{i}].tool_call_id",
                          "message": "no such pending tool call"})
            seen.add(r.tool_call_id)
        missing = [c for c in pending if c not in seen]
        if missing:
            raise errors.InvalidParams(
                f"tool results missing for pending calls: {', '.join(missing)}",
                data={"field": "tool_results", "message": "missing results",
                      "missing": missing})
        for _i, r in results:
            msg: dict[str, Any] = {"role": "tool", "tool_call_id": r.tool_call_id,
                                   "content": r.content}
            if r.name:
                msg["name"] = r.name
            if r.is_error:
                msg["is_error"] = True
            if isinstance(r.content, list):
                s.compaction.tool_images += sum(1 for part in r.content
                                     if part.get("type") == "image_url")
            out.append(msg)
        s.turn.results_received(len(results))
        if p.text:
            out.append({"role": "user", "content": p.text})
        return out, None
    # user or cron turn: a new question abandons calls still pending
    for call_id in pending:
        out.append({"role": "tool", "tool_call_id": call_id, "content": NOT_EXECUTED,
                    "is_error": True})
    if pending:
        events.append(ev.ToolCallsAbandoned(tool_call_ids=pending))
    if not (p.text or p.images):
        raise errors.InvalidParams(f"a {p.kind} turn needs text or images",
                                   data={"field": "text", "message": "missing"})
    if p.images:
        check_parts(p.images, "images")
        content: Any = ([{"type": "text", "text": p.text}] if p.text else []) + list(p.images)
    else:
        content = p.text
    last = s.history.messages[-1] if s.history.messages else None
    merged_into = None
    if not pending and last is not None and last.get("role") == "user":
        # the last user turn went unanswered (a failed model call, the user typed again):
        # this turn joins it, so two user messages never follow each other (C1). Only the
        # new part is recorded (and gets this turn's reminders): never the whole again
        merged_into = s.pop_last()
        events.append(ev.UserTurnMerged())
    out.append({"role": "user", "content": content})
    if p.kind == "user":
        s.turn.begin_user_turn()
    return out, merged_into
