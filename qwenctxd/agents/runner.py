"""The forked-agent runner: an OpenAI tool-calling loop over a copy of a session's history.

An agent gets its own system prompt, task, tool set and permission scope, and turn and time
budgets. Tool calls of one model reply run concurrently; every result is capped. The history
copy is made to end with an assistant message (a trailing user message dropped, open tool
calls closed) so the forked request is a valid conversation. Every turn goes through the model
client's request builder (``tool_choice: "auto"``, ``max_tokens`` sized to the context, no null
content); the whole run is capped by the feature's deadline (``model.deadlines.<feature>_s``, or
``model.timeout_s``), whatever the agent's own ``max_time_s``. Cancellation (shutdown, a newer
request) propagates: the caller records the outcome as ``cancelled`` — never as completed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from qwenctxd.agents.tools import DECLARATIONS, ToolContext, call_tool
from qwenctxd.model import ModelClient
from qwenctxd.protocol.errors import ModelUnavailable

log = structlog.get_logger("qwenctxd.agents")
FORK_NOTE = "A background task has started; it does not need a reply in this conversation."


@dataclass
class AgentSpec:
    name: str
    system: str
    task: str
    tools: Sequence[str]
    max_turns: int = 5
    max_time_s: float = 120.0
    fast: bool = False
    feature: str = ""  # model.deadlines key; "" → derived from the agent's name

    @property
    def deadline_feature(self) -> str:
        return self.feature or _FEATURE_OF.get(self.name, "other")


_FEATURE_OF = {"memory-extractor": "extract", "memory-dreamer": "dream", "dream": "dream",
               "skill-reviewer": "skill_review"}


@dataclass
class AgentOutcome:
    status: str  # completed | budget_exhausted | failed | timed_out
    turns: int = 0
    final_text: str = ""
    error: str | None = None
    files_written: list[str] = field(default_factory=list)
    tool_calls: int = 0
    elapsed_s: float = 0.0


async def _run_calls(ctx: ToolContext, calls: Sequence[dict[str, Any]]) -> dict[int, str]:
    """Run one reply's tool calls concurrently; results by position."""
    results: dict[int, str] = {}

    async def one(i: int, call: dict[str, Any]) -> None:
        fn = call.get("function") or {}
        results[i] = await call_tool(ctx, fn.get("name", ""), fn.get("arguments") or "{}")

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    return results


def fork_history(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of ``history`` that ends with an assistant message and has no open tool calls."""
    msgs = [dict(m) for m in history if m.get("role") in ("user", "assistant", "tool")]
    for m in msgs:
        m.pop("is_error", None)
        m.pop("reasoning_content", None)
    while msgs and msgs[-1].get("role") == "user":
        msgs.pop()
    if msgs and msgs[-1].get("role") == "assistant" and msgs[-1].get("tool_calls"):
        for call in msgs[-1]["tool_calls"]:
            msgs.append({"role": "tool", "tool_call_id": call.get("id"), "content": FORK_NOTE})
        msgs.append({"role": "assistant", "content": "Understood."})
    elif msgs and msgs[-1].get("role") == "tool":
        msgs.append({"role": "assistant", "content": "Understood."})
    return msgs


async def run_agent(model: ModelClient, spec: AgentSpec, ctx: ToolContext,
                    history: Sequence[dict[str, Any]] = ()) -> AgentOutcome:
    started = time.monotonic()
    outcome = AgentOutcome(status="completed")
    messages: list[dict[str, Any]] = [{"role": "system", "content": spec.system},
                                      *fork_history(history),
                                      {"role": "user", "content": spec.task}]
    tools = [DECLARATIONS[t] for t in spec.tools]
    feature = spec.deadline_feature
    budget = min(spec.max_time_s, model.deadline(feature))
    with anyio.move_on_after(budget) as deadline:
        try:
            for turn in range(1, spec.max_turns + 1):
                outcome.turns = turn
                left = max(0.5, budget - (time.monotonic() - started))
                reply = await model.complete(messages, tools=tools, fast=spec.fast,
                                             timeout_s=left, feature=feature)
                msg: dict[str, Any] = {"role": "assistant", "content": reply.text or ""}
                if reply.tool_calls:
                    msg["tool_calls"] = reply.tool_calls
                messages.append(msg)
                if not reply.tool_calls:
                    outcome.final_text = reply.text
                    break
                results = await _run_calls(ctx, reply.tool_calls)
                outcome.tool_calls += len(reply.tool_calls)
                for i, call in enumerate(reply.tool_calls):
                    messages.append({"role": "tool", "tool_call_id": call.get("id"),
                                     "content": results[i]})
            else:
                outcome.status = "budget_exhausted"
        except ModelUnavailable as exc:
            outcome.status = "failed"
            outcome.error = (exc.data or {}).get("reason", exc.message) if isinstance(
                exc.data, dict) else exc.message
    if deadline.cancelled_caught:
        outcome.status = "timed_out"
        outcome.error = outcome.error or "timeout"
    outcome.files_written = list(dict.fromkeys(ctx.files_written))
    outcome.elapsed_s = round(time.monotonic() - started, 3)
    log.info("agent finished", agent=spec.name, status=outcome.status, turns=outcome.turns,
             tool_calls=outcome.tool_calls, files=len(outcome.files_written))
    return outcome
