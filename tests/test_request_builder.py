"""The request builder and the output checks, over real HTTP against the strict scripted server.

What real servers reject (reference/real-endpoints.md) is rejected by the scripted server too
(``validate_payload``), so these tests fail if a feature ever sends null content, tools without
``tool_choice``, no ``max_tokens`` or one that does not fit the configured window.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenctxd.compaction.recap import project_summary, project_summary_problem, recap
from qwenctxd.compaction.summary import summarize, summary_problem
from qwenctxd.config.schema import ModelDeadlines, ModelEndpoint
from qwenctxd.memory.forget_match import term_candidates
from qwenctxd.model import ModelClient
from qwenctxd.model.request import build_payload, normalize_messages
from qwenctxd.protocol.errors import ModelUnavailable
from qwenctxd.testing.chat_validation import validate_payload
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI

SNAPSHOT = ("<state_snapshot>\n<primary_request_and_intent>Fix the parser.</primary_request_and_"
            "intent>\n<next_step>Add tests.</next_step>\n</state_snapshot>")
TOOL_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "text", "text": "read the parser"}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "read_file", "arguments": "{\"file_path\": \"p.py\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "def parse(): ...\n" * 40},
    {"role": "assistant", "content": "The parser is a stub."},
]


def client_for(stub: ScriptedOpenAI, **kw: Any) -> ModelClient:
    kw.setdefault("timeout_s", 5.0)
    return ModelClient(ModelEndpoint(base_url=stub.base_url, model="stub-model",
                                     fast_model="stub-fast", api_key="k", **kw))


def test_the_strict_payload_check_rejects_what_real_servers_reject() -> None:
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    assert validate_payload(ok) == []
    null = {**ok, "messages": [{"role": "assistant", "content": None, "tool_calls": []}]}
    assert any("null" in p for p in validate_payload(null))
    tools = {**ok, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {}}}}]}
    assert validate_payload(tools) == ["tools sent without tool_choice"]
    bare = {**ok, "tool_choice": "auto", "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert validate_payload(bare) == ["tools[0].function has no parameters object"]
    assert validate_payload({**ok, "max_tokens": None}) == ["max_tokens is missing"]
    assert any("exceeds" in p for p in validate_payload({**ok, "max_tokens": 9_000},
                                                        context_window=8_192))


@pytest.mark.asyncio
async def test_a_tool_history_summary_is_accepted_and_sized_to_a_small_window() -> None:
    with ScriptedOpenAI(strict_chat=True, context_window=8_192,
                        default=Reply(content=SNAPSHOT)) as stub:
        async with client_for(stub, context_window=8_192) as client:
            out = await summarize(client, TOOL_HISTORY, trigger="manual")
        assert out.status == "compressed", out
        assert stub.rejected == []
        [req] = stub.chat_requests
    body = req.body
    assert req.headers["x-qwenctxd-feature"] == "compress"
    assert 64 <= body["max_tokens"] < 8_192  # not the fixed 20 000
    calls = [m for m in body["messages"] if m.get("tool_calls")]
    assert calls and all(m["content"] == "" for m in calls)
    assert all(isinstance(m["content"], str) for m in body["messages"])  # plain strings


@pytest.mark.asyncio
async def test_agent_style_calls_send_tool_choice_and_profile_knobs() -> None:
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    seen: dict[str, dict[str, Any]] = {}
    for profile in ("openai", "vllm", "dashscope", "ollama", "llamacpp"):
        with ScriptedOpenAI(default=Reply(content="ok")) as stub:
            async with client_for(stub, profile=profile) as client:
                await client.complete(TOOL_HISTORY, tools=tools, feature="extract")
            assert stub.rejected == []
            seen[profile] = stub.chat_requests[0].body
    for body in seen.values():
        assert body["tool_choice"] == "auto"
    assert seen["vllm"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert seen["dashscope"]["enable_thinking"] is False
    for plain in ("openai", "ollama", "llamacpp"):
        assert "enable_thinking" not in seen[plain] and "chat_template_kwargs" not in seen[plain]


@pytest.mark.asyncio
async def test_the_structured_output_ladder_learns_each_rejected_rung_once() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    with ScriptedOpenAI(reject_json_schema=True) as stub:
        stub.push_many([Reply(fault="http_400"),  # json_object rejected too
                        Reply(content='Sure:\n```json\n{"a": 1}\n```'),  # plain text, parsed
                        Reply(content='{"a": 2}')])
        async with client_for(stub) as client:
            assert await client.complete_json(TOOL_HISTORY, schema, name="t") == {"a": 1}
            assert client.status()["quirks"] == ["json_object_rejected", "json_schema_rejected"]
            assert await client.complete_json(TOOL_HISTORY, schema, name="t") == {"a": 2}
        bodies = [r.body for r in stub.chat_requests]
    assert [b.get("response_format", {}).get("type") for b in bodies] == [
        "json_schema", "json_object", None, None]
    for body in bodies[1:]:  # the schema is in the prompt, max_tokens set
        assert json.dumps(schema) in body["messages"][0]["content"] and body["max_tokens"] > 0


@pytest.mark.asyncio
async def test_a_llamacpp_profile_never_sends_json_schema() -> None:
    with ScriptedOpenAI(reject_json_schema=True, default=Reply(content='{"a": 1}')) as stub:
        async with client_for(stub, profile="llamacpp") as client:
            assert await client.complete_json(TOOL_HISTORY, {"type": "object"}, name="t")
        assert [r.response_format_type for r in stub.chat_requests] == ["json_object"]


@pytest.mark.parametrize("garbage", [
    '{"name": "read_file", "arguments": {"file_path": "a.py"}} then more words here',
    '<tool_call>{"name": "x", "arguments": {}}</tool_call> with a long enough tail',
    "A plain paragraph that never produces the snapshot element at all.",
    "<state_snapshot></state_snapshot>"[:20],
])
@pytest.mark.asyncio
async def test_garbage_summaries_are_failed_empty_summary(garbage: str) -> None:
    with ScriptedOpenAI(default=Reply(content=garbage)) as stub:
        async with client_for(stub) as client:
            out = await summarize(client, TOOL_HISTORY, trigger="auto")
    assert out.status == "failed_empty_summary" and out.error, out


@pytest.mark.asyncio
async def test_a_garbage_project_summary_is_refused() -> None:
    with ScriptedOpenAI(default=Reply(content='{"name": "write_file", "arguments": {}} x' * 2)) \
            as stub:
        async with client_for(stub) as client:
            with pytest.raises(ModelUnavailable) as info:
                await project_summary(client, TOOL_HISTORY)
    assert info.value.data["reason"] == "unusable_output"
    assert project_summary_problem("# Project Summary\n\n## Goal\nShip the parser fix.") is None


def test_deadlines_cap_and_override() -> None:
    ep = ModelEndpoint(base_url="http://127.0.0.1:1/v1", model="m", timeout_s=6)
    client = ModelClient(ep)
    assert client.deadline("compress") == 6 and client.deadline("forget") == 6
    ep = ModelEndpoint(base_url="http://127.0.0.1:1/v1", model="m", timeout_s=2,
                       deadlines=ModelDeadlines(compress_s=30))
    client = ModelClient(ep)
    assert client.deadline("compress") == 30 and client.deadline("recap") == 2


@pytest.mark.parametrize("fault", ["hang", "http_500", "cut_stream", "garbage"])
@pytest.mark.asyncio
async def test_each_side_query_ends_within_its_deadline(fault: str) -> None:
    reply = {"hang": Reply(content=SNAPSHOT, delay_s=30), "http_500": Reply(fault="http_500"),
             "cut_stream": Reply(content=SNAPSHOT * 4, fault="cut_stream"),
             "garbage": Reply(content="\x00{{{ not at all }}}")}[fault]
    with ScriptedOpenAI(default=reply) as stub:
        async with client_for(stub, timeout_s=1.0) as client:
            started = time.monotonic()
            out = await summarize(client, TOOL_HISTORY, trigger="auto")
            assert out.status != "compressed"
            r = await recap(client, [{"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": "hello"}])
            assert r.status in ("unavailable", "empty", "ok")
            with pytest.raises(ModelUnavailable):
                await project_summary(client, TOOL_HISTORY)
            with pytest.raises(ModelUnavailable):
                await client.complete_json(TOOL_HISTORY, {"type": "object"}, name="x",
                                           feature="recall")
            elapsed = time.monotonic() - started
    assert elapsed < 4 * 1.0 + 2.0, elapsed  # four deadlines of 1 s, plus slack


class _Doc:
    def __init__(self, name: str, body: str, mtime: float) -> None:
        self.name, self.description, self.body, self.mtime = name, name, body, mtime


def test_forget_term_matching_finds_a_topic_inside_a_sentence() -> None:
    docs = [_Doc("Indent with tabs", "use tabs in Go files", 1.0),
            _Doc("Deploy process", "deploys go through canary", 2.0)]
    picked = term_candidates("please forget what I said about tabs", docs, limit=5)
    assert [d.name for d, _ in picked] == ["Indent with tabs"]
    assert term_candidates("xylophone", docs, limit=5) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "tool", "system"]),
    "content": st.one_of(st.none(), st.text(max_size=40),
                         st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                         "text": st.text(max_size=20)}),
                                  max_size=3))}), min_size=1, max_size=12),
       st.integers(min_value=512, max_value=200_000))
def test_built_payloads_always_pass_the_strict_check(msgs: list[dict[str, Any]],
                                                    window: int) -> None:
    try:
        kwargs = build_payload(model="m", messages=msgs, feature="compress", window=window,
                               profile="openai", tools=[{"type": "function",
                                                         "function": {"name": "f"}}])
    except ValueError:  # PromptTooLong: nothing is sent
        return
    body = {k: v for k, v in kwargs.items() if k not in ("extra_headers", "extra_body")}
    assert validate_payload(body, context_window=window) == []
    assert all(m["content"] is not None for m in normalize_messages(msgs))


def test_summary_problem_names() -> None:
    assert summary_problem(SNAPSHOT) is None
    assert summary_problem("short") == "too_short"


def test_config_toml_sets_profile_window_and_deadlines(tmp_path: Any) -> None:
    from qwenctxd.config.layers import build, read_config_toml
    from qwenctxd.protocol.errors import ConfigError

    good = tmp_path / "config.toml"
    good.write_text('[model]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "m"\n'
                    'profile = "vllm"\ncontext_window = 8192\n[model.deadlines]\ncompress_s = 5\n')
    ep = build([read_config_toml(good)]).endpoint()
    client = ModelClient(ep)
    assert (ep.profile, client.context_window, client.deadline("compress")) == ("vllm", 8192, 5)
    bad = tmp_path / "bad.toml"
    bad.write_text("[model.deadlines]\ncompres_s = 5\n")
    with pytest.raises(ConfigError) as info:
        read_config_toml(bad)
    assert "compres_s" in str(info.value)
