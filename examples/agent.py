"""A reference coding agent on qwenctxd: the daemon owns the context, the agent owns the tools.

Usage: ``python examples/agent.py [--cwd DIR] [--model NAME] "what to do" ["next request" …]``
with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` set (any OpenAI-compatible endpoint). The loop:

1. ``session.open`` with our tools and our name (the system prompt follows both);
2. ``session.turn`` with the user's words → an AssembledPrompt: ``system + tools + messages``
   POSTed as they are (streamed with the ``openai`` SDK);
3. ``session.record_model`` with the reply; the daemon answers its own ``skill`` calls
   (``answered``), we run the rest and send them back with ``session.turn {kind:
   "tool_results"}`` (``tool_results: []`` when the daemon answered everything);
4. a failed model call is retried once; if it fails again the turn is taken back with
   ``session.rewind`` so the history stays answerable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai

from qwenctxd.client import Client

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file and return its content.",
        "parameters": {"type": "object", "required": ["file_path"], "properties": {
            "file_path": {"type": "string", "description": "Path of the file."}}}}},
    {"type": "function", "function": {
        "name": "edit_file",
        "description": "Replace old_string with new_string in a file (an empty old_string "
                       "creates or overwrites the file with new_string).",
        "parameters": {"type": "object", "required": ["file_path", "old_string", "new_string"],
                       "properties": {"file_path": {"type": "string"},
                                      "old_string": {"type": "string"},
                                      "new_string": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the project; returns output.",
        "parameters": {"type": "object", "required": ["command"], "properties": {
            "command": {"type": "string"}}}}},
]


def run_tool(cwd: Path, name: str, args: dict[str, Any]) -> tuple[str, list[str]]:
    """Run one of our tools: (result text, paths it touched)."""
    try:
        if name == "read_file":
            path = cwd / args["file_path"]
            return path.read_text(encoding="utf-8", errors="replace"), [str(path)]
        if name == "edit_file":
            path = cwd / args["file_path"]
            old, new = args["old_string"], args["new_string"]
            if not old:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(new, encoding="utf-8")
            else:
                text = path.read_text(encoding="utf-8")
                if old not in text:
                    return f"Error: old_string not found in {args['file_path']}", [str(path)]
                path.write_text(text.replace(old, new, 1), encoding="utf-8")
            return f"Edited {args['file_path']}", [str(path)]
        if name == "run_shell":
            done = subprocess.run(args["command"], shell=True, cwd=cwd, capture_output=True,  # noqa: S602
                                  text=True, timeout=120)
            return f"exit {done.returncode}\n{done.stdout}{done.stderr}"[-20_000:], []
    except (OSError, KeyError, subprocess.TimeoutExpired) as exc:
        return f"Error: {type(exc).__name__}: {exc}", []
    return f"Error: unknown tool {name}", []


DEFAULT_MAX_TOKENS = 4096


def answer_budget(prompt: dict[str, Any], asked: int | None) -> int:
    """``max_tokens`` for this call: what was asked (``--max-tokens``), else 4096, never more
    than the window leaves after the prompt (a small local model otherwise rambles on)."""
    usage = prompt["usage"]
    room = max(64, usage["window_tokens"] - usage["prompt_tokens"])
    return min(asked or DEFAULT_MAX_TOKENS, room)


def call_model(llm: openai.OpenAI, model: str, prompt: dict[str, Any],
               max_tokens: int | None = None) -> dict[str, Any]:
    """POST the assembled prompt unchanged, streamed; returns the assistant message."""
    tools = prompt["tools"]
    stream = llm.chat.completions.create(
        model=model, stream=True, tools=tools or openai.NOT_GIVEN,
        tool_choice="auto" if tools else openai.NOT_GIVEN,
        max_tokens=answer_budget(prompt, max_tokens),
        messages=[{"role": "system", "content": prompt["system"]}, *prompt["messages"]])
    text, calls = [], {}
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        if delta.content:
            text.append(delta.content)
            print(delta.content, end="", flush=True)
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "type": "function",
                                               "function": {"name": "", "arguments": ""}})
            slot["id"] = tc.id or slot["id"]
            if tc.function and tc.function.name:
                slot["function"]["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                slot["function"]["arguments"] += tc.function.arguments
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def show_events(prompt: dict[str, Any]) -> None:
    for ev in prompt["events"]:
        if ev["type"] in ("compressed", "micro_compacted", "user_turn_merged"):
            print(f"\n[qwenctxd: {ev['type']} {ev.get('tokens_before', '')}"
                  f"→{ev.get('tokens_after', '')}]", file=sys.stderr)


def run_turn(daemon: Client, llm: openai.OpenAI, model: str, sid: str, cwd: Path,
             text: str, max_tokens: int | None = None) -> bool:
    """One user request to completion; False when the model stayed unreachable."""
    prompt = daemon.call("session.turn", {"session_id": sid, "kind": "user", "text": text})
    while True:
        show_events(prompt)
        for attempt in (1, 2):
            try:
                msg = call_model(llm, model, prompt, max_tokens)
                break
            except openai.OpenAIError as exc:
                print(f"\n[model call failed ({attempt}/2): {exc}]", file=sys.stderr)
                time.sleep(0.5)
        else:  # give the turn back: the history stays as it was before the request
            daemon.call("session.rewind", {"session_id": sid, "turns": 1})
            return False
        rec = daemon.call("session.record_model", {"session_id": sid, "message": msg})
        if rec["turn_complete"]:
            print()
            return True
        answered = {a["tool_call_id"] for a in rec["answered"]}  # the daemon's skill calls
        results, touched = [], []
        for call in msg["tool_calls"]:
            if call["id"] in answered:
                print(f"\n[skill loaded by the daemon: {call['function']['arguments']}]")
                continue
            try:
                args = json.loads(call["function"]["arguments"] or "{}")
            except ValueError:
                args = {}
            print(f"\n[{call['function']['name']} {args}]")
            out, paths = run_tool(cwd, call["function"]["name"], args)
            results.append({"tool_call_id": call["id"], "name": call["function"]["name"],
                            "content": out})
            touched += paths
        prompt = daemon.call("session.turn", {"session_id": sid, "kind": "tool_results",
                                              "tool_results": results, "touched_paths": touched})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cwd", default=os.getcwd())
    ap.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "qwen3-coder-plus"))
    ap.add_argument("--window", type=int, default=None, help="context window in tokens")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help=f"answer budget per model call (default {DEFAULT_MAX_TOKENS}, never "
                         "more than the window leaves)")
    ap.add_argument("requests", nargs="+")
    a = ap.parse_args(argv)
    cwd = Path(a.cwd).resolve()
    llm = openai.OpenAI(max_retries=0)
    with Client(timeout=300) as daemon:
        opened = daemon.call("session.open", {
            "cwd": str(cwd), "model": a.model, "tools": TOOLS, "window_tokens": a.window,
            "agent": {"name": "qwenctxd reference agent", "version": "1"}})
        sid = opened["session_id"]
        ok = all(run_turn(daemon, llm, a.model, sid, cwd, text, a.max_tokens)
                 for text in a.requests)
        daemon.call("session.close", {"session_id": sid})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
