"""ModelClient against the scripted OpenAI stub, over the real HTTP path of the openai SDK."""


from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from qwenctxd.config.schema import ModelEndpoint
from qwenctxd.model import Completion, ModelClient, parse_json_reply
from qwenctxd.protocol.errors import MODEL_UNAVAILABLE, ModelUnavailable
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI, refused_base_url

USER = [{"role": "user", "content": "Summarise the diff."}]
SECRET = "sk-test-SECRET-0123456789"
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["title", "score"],
    "additionalProperties": False,
}


def _endpoint(base_url: str, **kw: Any) -> ModelEndpoint:
    kw.setdefault("model", "qwen-main")
    kw.setdefault("api_key", SECRET)
    kw.setdefault("timeout_s", 5.0)
    return ModelEndpoint(base_url=base_url, **kw)


def _reason(info: pytest.ExceptionInfo[ModelUnavailable]) -> str:
    assert info.value.code == MODEL_UNAVAILABLE
    assert SECRET not in info.value.message
    return str(info.value.data["reason"])


@pytest.mark.asyncio
async def test_complete_round_trip(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(
        Reply(content="The diff renames foo.", usage={"prompt_tokens": 12, "completion_tokens": 5})
    )
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        assert not client.imported
        done = await client.complete(
            USER, max_tokens=64, temperature=0.1, extra_body={"enable_thinking": False}
        )
        assert client.imported
        status = client.status()
    assert done == Completion(
        text="The diff renames foo.",
        tool_calls=[],
        finish_reason="stop",
        usage={"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        model="qwen-main",
    )
    (req,) = openai_stub.chat_requests
    assert req.body["model"] == "qwen-main"
    assert req.body["messages"] == USER
    assert req.body["max_tokens"] == 64 and req.body["temperature"] == 0.1
    assert req.body["enable_thinking"] is False  # extra_body is merged into the JSON body
    assert "stream" not in req.body or req.body["stream"] is False
    assert req.headers["authorization"] == f"Bearer {SECRET}"
    assert status["calls"] == 1 and status["failures"] == 0 and status["last_error"] is None
    assert SECRET not in json.dumps(status)


@pytest.mark.asyncio
async def test_fast_model_and_explicit_model(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.default = Reply(content="ok")
    async with ModelClient(_endpoint(openai_stub.base_url, fast_model="qwen-fast")) as client:
        await client.complete(USER, fast=True)
        await client.complete(USER)
        await client.complete(USER, model="other", fast=True)
        client.update(_endpoint(openai_stub.base_url))  # no fast model any more
        await client.complete(USER, fast=True)
    models = [r.body["model"] for r in openai_stub.chat_requests]
    assert models == ["qwen-fast", "qwen-main", "other", "qwen-main"]


@pytest.mark.asyncio
async def test_missing_api_key_sends_placeholder(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="ok"))
    async with ModelClient(_endpoint(openai_stub.base_url, api_key=None)) as client:
        await client.complete(USER)
    assert openai_stub.chat_requests[0].headers["authorization"] == "Bearer none"


@pytest.mark.asyncio
async def test_tool_calls_non_streamed(openai_stub: ScriptedOpenAI) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    openai_stub.push(
        Reply(tool_calls=[{"function": {"name": "read_file", "arguments": {"path": "a.py"}}}])
    )
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        done = await client.complete(USER, tools=tools, tool_choice="auto")
    assert done.text == ""
    assert done.finish_reason == "tool_calls"
    (call,) = done.tool_calls
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "a.py"}
    req = openai_stub.chat_requests[0].body
    assert req["tools"] == tools and req["tool_choice"] == "auto"


@pytest.mark.asyncio
async def test_stream_text_and_tool_call_deltas(openai_stub: ScriptedOpenAI) -> None:
    calls = [
        {"function": {"name": "grep", "arguments": {"pattern": "deprecated", "path": "src"}}},
        {"id": "call_b", "function": {"name": "ls", "arguments": "{}"}},
    ]
    text = "I will search the source tree for deprecated calls."
    openai_stub.push(Reply(content=text, tool_calls=calls, chunk_chars=4))
    deltas: list[str] = []

    async def on_delta(piece: str) -> None:
        deltas.append(piece)

    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        done = await client.stream(USER, on_delta=on_delta)
    assert done.text == text
    assert "".join(deltas) == text and len(deltas) > 5
    assert done.finish_reason == "tool_calls"
    assert [c["function"]["name"] for c in done.tool_calls] == ["grep", "ls"]
    assert json.loads(done.tool_calls[0]["function"]["arguments"]) == {
        "pattern": "deprecated",
        "path": "src",
    }
    assert done.tool_calls[0]["id"].startswith("call_") and done.tool_calls[1]["id"] == "call_b"
    assert done.usage is not None and done.usage["total_tokens"] > 0  # final usage chunk
    body = openai_stub.chat_requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


@pytest.mark.asyncio
async def test_stream_with_sync_callback(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="abcdefgh", chunk_chars=2))
    seen: list[str] = []
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        done = await client.stream(USER, on_delta=seen.append)
    assert seen == ["ab", "cd", "ef", "gh"] and done.text == "abcdefgh"


@pytest.mark.asyncio
async def test_timeout_on_slow_endpoint(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="late", fault="slow", delay_s=10))
    async with ModelClient(_endpoint(openai_stub.base_url, timeout_s=0.5)) as client:
        await client.warm_up()  # keep the one-off import out of the measurement
        started = time.monotonic()
        with pytest.raises(ModelUnavailable) as info:
            await client.complete(USER)
        elapsed = time.monotonic() - started
        assert client.status()["last_error"] == "timeout"
    assert _reason(info) == "timeout"
    assert 0.4 <= elapsed < 1.5


@pytest.mark.asyncio
async def test_hard_deadline_cuts_a_dripping_stream(openai_stub: ScriptedOpenAI) -> None:
    # Each chunk arrives well within the SDK's per-read timeout; only the total deadline fires.
    openai_stub.push(Reply(content="x" * 100, chunk_chars=1, chunk_delay_s=0.1))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        await client.warm_up()
        started = time.monotonic()
        with pytest.raises(ModelUnavailable) as info:
            await client.stream(USER, timeout_s=0.6)
        elapsed = time.monotonic() - started
    assert _reason(info) == "timeout"
    assert elapsed < 1.6


@pytest.mark.asyncio
async def test_connection_refused() -> None:
    async with ModelClient(_endpoint(refused_base_url())) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.complete(USER)
    assert _reason(info) == "connection"


@pytest.mark.asyncio
async def test_dropped_connection(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="x", fault="drop"))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.complete(USER)
    assert _reason(info) == "connection"
    assert len(openai_stub.chat_requests) == 1  # one attempt: SDK retries are off


@pytest.mark.asyncio
async def test_http_500_single_attempt_and_secret_free(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="x", fault="http_500"))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with capture_logs() as logs, pytest.raises(ModelUnavailable) as info:
            await client.complete([{"role": "user", "content": "PRIVATE-PROMPT-TEXT"}])
        status = client.status()
    assert _reason(info) == "http_500"
    assert info.value.data["status"] == 500
    assert "500" in info.value.message
    assert len(openai_stub.chat_requests) == 1  # one attempt: SDK retries are off
    assert status["calls"] == 1 and status["failures"] == 1 and status["last_error"] == "http_500"
    failures = [e for e in logs if e["event"] == "model_call_failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "warning" and failures[0]["reason"] == "http_500"
    assert failures[0]["model"] == "qwen-main" and failures[0]["op"] == "complete"
    assert SECRET not in repr(logs)  # the key is never logged ...
    assert "PRIVATE-PROMPT-TEXT" not in repr(logs)  # ... nor message contents


@pytest.mark.asyncio
async def test_http_400(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="x", fault="http_400"))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.complete(USER)
    assert _reason(info) == "http_400"


@pytest.mark.asyncio
async def test_cut_stream(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="a long streamed answer " * 5, fault="cut_stream"))
    seen: list[str] = []
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.stream(USER, on_delta=seen.append)
    assert _reason(info) == "stream_cut"
    assert seen  # some text did arrive before the cut


@pytest.mark.asyncio
async def test_cut_non_streamed_body(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="x" * 50, fault="cut_stream"))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.complete(USER)
    assert _reason(info) == "connection"


@pytest.mark.asyncio
@pytest.mark.parametrize("streamed", [False, True])
async def test_invalid_json_body(openai_stub: ScriptedOpenAI, streamed: bool) -> None:
    openai_stub.push(Reply(content="x", fault="invalid_json"))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with pytest.raises(ModelUnavailable) as info:
            if streamed:
                await client.stream(USER)
            else:
                await client.complete(USER)
    assert _reason(info) == "invalid_json"


@pytest.mark.asyncio
async def test_empty_reply(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push_many([Reply(content=""), Reply(content=None, finish_reason="length")])
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with pytest.raises(ModelUnavailable) as first:
            await client.complete(USER)
        with pytest.raises(ModelUnavailable) as second:
            await client.stream(USER)
    assert _reason(first) == "empty" and _reason(second) == "empty"


@pytest.mark.asyncio
async def test_not_configured() -> None:
    for endpoint in (ModelEndpoint(), ModelEndpoint(base_url="http://127.0.0.1:9/v1")):
        client = ModelClient(endpoint)
        assert not client.configured
        with pytest.raises(ModelUnavailable) as info:
            await client.complete(USER)
        with pytest.raises(ModelUnavailable):
            await client.complete_json(USER, SCHEMA, name="x")
        assert _reason(info) == "not_configured"
        assert not client.imported  # failing early never pays for the openai import
        assert client.status()["failures"] == 2
        await client.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "url", ["localhost:8080/v1", "ftp://127.0.0.1/v1", "http://[::1", "http://127.0.0.1:99999/v1"]
)
async def test_malformed_base_url_is_not_configured(url: str) -> None:
    async with ModelClient(_endpoint(url)) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.complete(USER)
    assert _reason(info) == "not_configured"
    assert "base_url" in info.value.message


@pytest.mark.asyncio
async def test_complete_json_with_json_schema(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content='```json\n{"title": "Rename foo", "score": 3}\n```'))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        got = await client.complete_json(
            [{"role": "system", "content": "Rate it."}, *USER], SCHEMA, name="rating"
        )
    assert got == {"title": "Rename foo", "score": 3}
    (req,) = openai_stub.chat_requests
    assert req.body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "rating", "schema": SCHEMA, "strict": True},
    }
    assert req.body["messages"][0] == {"role": "system", "content": "Rate it."}  # untouched


@pytest.mark.asyncio
async def test_complete_json_falls_back_to_json_object_once(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push_many(
        [
            Reply(content='{"title": "a", "score": 1}', fault="reject_json_schema"),
            Reply(content='{"title": "b", "score": 2}'),
        ]
    )
    messages = [{"role": "system", "content": "Rate it."}, *USER]
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        first = await client.complete_json(messages, SCHEMA, name="rating")
        second = await client.complete_json(messages, SCHEMA, name="rating")
        status = client.status()
    assert first == {"title": "a", "score": 1} and second == {"title": "b", "score": 2}
    reqs = openai_stub.chat_requests
    assert [r.response_format_type for r in reqs] == ["json_schema", "json_object", "json_object"]
    system = reqs[1].body["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("Rate it.")
    assert json.dumps(SCHEMA) in system["content"]
    assert reqs[0].body["messages"] == messages  # the first attempt had no schema text
    assert messages[0]["content"] == "Rate it."  # caller's messages not mutated
    assert status["calls"] == 2 and status["failures"] == 0
    assert status["json_schema_fallback"] is True


@pytest.mark.asyncio
async def test_complete_json_fallback_adds_system_message_when_missing() -> None:
    with ScriptedOpenAI(
        reject_json_schema=True, default=Reply(content='{"title": "t", "score": 0}')
    ) as stub:
        async with ModelClient(_endpoint(stub.base_url)) as client:
            assert await client.complete_json(USER, SCHEMA, name="r") == {"title": "t", "score": 0}
        fallback = stub.chat_requests[1].body["messages"]
    assert fallback[0]["role"] == "system" and "JSON Schema" in fallback[0]["content"]
    assert fallback[1:] == USER


@pytest.mark.asyncio
async def test_complete_json_does_not_learn_fallback_when_json_object_fails_too(
    openai_stub: ScriptedOpenAI,
) -> None:
    openai_stub.push_many(
        [
            Reply(content="x", fault="http_500"),
            Reply(content="x", fault="http_500"),
            Reply(content='{"title": "ok", "score": 1}'),
        ]
    )
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.complete_json(USER, SCHEMA, name="r")
        assert _reason(info) == "http_500"
        assert client.status()["json_schema_fallback"] is False
        assert await client.complete_json(USER, SCHEMA, name="r") == {"title": "ok", "score": 1}
    types = [r.response_format_type for r in openai_stub.chat_requests]
    assert types == ["json_schema", "json_object", "json_schema"]


@pytest.mark.asyncio
async def test_complete_json_attempts_share_one_deadline() -> None:
    reply = Reply(content='{"title": "t", "score": 0}', delay_s=5)
    with ScriptedOpenAI(default=reply) as stub:
        # The json_schema attempt is rejected after 0.8 s; the fallback gets only what is left
        # of the 1.2 s, so the call ends near 1.2 s — a deadline per attempt would end at 2.0 s.
        stub.push(Reply(content="x", fault="http_500", delay_s=0.8))
        async with ModelClient(_endpoint(stub.base_url)) as client:
            await client.warm_up()
            started = time.monotonic()
            with pytest.raises(ModelUnavailable) as info:
                await client.complete_json(USER, SCHEMA, name="r", timeout_s=1.2)
            elapsed = time.monotonic() - started
    assert _reason(info) == "timeout"
    assert 1.1 <= elapsed < 1.85
    assert [r.response_format_type for r in stub.chat_requests] == ["json_schema", "json_object"]


@pytest.mark.asyncio
async def test_complete_json_unparsable_reply(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push_many([Reply(content="Sure! Here you go: title=x"), Reply(content="[1, 2]")])
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        for _ in range(2):
            with pytest.raises(ModelUnavailable) as info:
                await client.complete_json(USER, SCHEMA, name="r")
            assert _reason(info) == "invalid_json"
    assert len(openai_stub.chat_requests) == 2  # a bad reply is not retried


@pytest.mark.asyncio
async def test_complete_json_other_errors_do_not_fall_back(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="x", fault="drop"))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        with pytest.raises(ModelUnavailable) as info:
            await client.complete_json(USER, SCHEMA, name="r")
        assert client.status()["json_schema_fallback"] is False
    assert _reason(info) == "connection"
    assert len(openai_stub.chat_requests) == 1


def test_parse_json_reply_variants() -> None:
    assert parse_json_reply('{"a": 1}') == {"a": 1}
    assert parse_json_reply('  ```json\n{"a": 1}\n```  ') == {"a": 1}
    assert parse_json_reply('<think>hmm {"no": 1}</think>\n{"a": 2}') == {"a": 2}
    assert parse_json_reply('Here:\n```\n{"a": 3}\n```\nDone.') == {"a": 3}
    for bad in ("", "nope", "[1]", '{"a": '):
        with pytest.raises(ModelUnavailable):
            parse_json_reply(bad)


@pytest.mark.asyncio
async def test_update_switches_endpoint_and_closes_old_client(openai_stub: ScriptedOpenAI) -> None:
    openai_stub.push(Reply(content="from first"))
    with ScriptedOpenAI(default=Reply(content="from second")) as second:
        async with ModelClient(_endpoint(openai_stub.base_url)) as client:
            assert (await client.complete(USER)).text == "from first"
            old = client._slot
            assert old is not None
            client.update(_endpoint(second.base_url, api_key="other-key", model="m2"))
            assert (await client.complete(USER)).text == "from second"
            assert old.client.is_closed()
        assert second.chat_requests[0].body["model"] == "m2"
        assert second.chat_requests[0].headers["authorization"] == "Bearer other-key"
    assert len(openai_stub.chat_requests) == 1


@pytest.mark.asyncio
async def test_update_lets_in_flight_call_finish_on_old_endpoint(
    openai_stub: ScriptedOpenAI,
) -> None:
    # the old answer outlasts the new call by far, however loaded the machine: the new call
    # makes its HTTP client first (in a worker thread), then asks the second server
    openai_stub.push(Reply(content="slow old answer", delay_s=2.0))
    with ScriptedOpenAI(default=Reply(content="new answer")) as second:
        async with ModelClient(_endpoint(openai_stub.base_url)) as client:
            await client.warm_up()
            results: list[str] = []

            async def old_call() -> None:
                results.append((await client.complete(USER)).text)

            async with anyio.create_task_group() as tg:
                tg.start_soon(old_call)
                await anyio.to_thread.run_sync(openai_stub.wait_for_requests, 1)
                old = client._slot
                assert old is not None and old.inflight == 1
                client.update(_endpoint(second.base_url))
                results.append((await client.complete(USER)).text)
                assert not old.client.is_closed()  # still serving the in-flight call
            assert old.client.is_closed()  # closed once its last call finished
    assert sorted(results) == ["new answer", "slow old answer"]


@pytest.mark.asyncio
async def test_warm_up_makes_the_http_client_before_the_first_call(
        openai_stub: ScriptedOpenAI) -> None:
    """The SDK client (its SSL context, its lazily imported resources: ~40 ms) is made at
    warm-up in a worker thread, not on the event loop by the first call."""
    openai_stub.push(Reply(content="ok"))
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:
        await client.warm_up()
        assert client.imported and client._slot is not None
        made = client._slot.client
        assert (await client.complete(USER)).text == "ok"
        assert client._slot.client is made
    async with ModelClient(ModelEndpoint()) as unconfigured:
        await unconfigured.warm_up()  # imports the SDK; no endpoint, no client
        assert unconfigured.imported and unconfigured._slot is None
    async with ModelClient(_endpoint("localhost:8080/v1")) as malformed:
        await malformed.warm_up()  # no scheme: the first call says so, the warm-up does not fail
        assert malformed._slot is None


@pytest.mark.asyncio
async def test_concurrent_calls_share_one_client(openai_stub: ScriptedOpenAI) -> None:
    def handler(body: dict[str, Any]) -> Reply:
        return Reply(content=f"re: {body['messages'][-1]['content']}", delay_s=0.05)

    openai_stub.handler = handler
    results: dict[int, str] = {}
    async with ModelClient(_endpoint(openai_stub.base_url)) as client:

        async def one(i: int) -> None:
            done = await client.complete([{"role": "user", "content": f"q{i}"}])
            results[i] = done.text

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        assert client.status()["calls"] == 12
        assert client._retired == []  # the first calls waited for one client, made once
    assert results == {i: f"re: q{i}" for i in range(12)}


@pytest.mark.asyncio
async def test_strict_stub_accepts_valid_tool_round_trip(
    strict_openai_stub: ScriptedOpenAI,
) -> None:
    strict_openai_stub.push(Reply(content="The file has 3 lines."))
    messages = [
        {"role": "system", "content": "You may call tools."},
        {"role": "user", "content": "How long is a.py?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "wc", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    async with ModelClient(_endpoint(strict_openai_stub.base_url)) as client:
        done = await client.complete(messages)
    assert done.text == "The file has 3 lines."


@pytest.mark.asyncio
async def test_strict_stub_rejects_malformed_conversation(
    strict_openai_stub: ScriptedOpenAI,
) -> None:
    strict_openai_stub.default = Reply(content="never")
    bad = [
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        [
            {"role": "user", "content": "a"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "user", "content": "unanswered call above"},
        ],
    ]
    async with ModelClient(_endpoint(strict_openai_stub.base_url)) as client:
        for messages in bad:
            with pytest.raises(ModelUnavailable) as info:
                await client.complete(messages)
            assert _reason(info) == "http_400"


def test_importing_the_client_does_not_import_openai() -> None:
    code = (
        "import sys\n"
        "import qwenctxd.model, qwenctxd.model.client\n"
        "from qwenctxd.model import ModelClient\n"
        "from qwenctxd.config.schema import ModelEndpoint\n"
        "c = ModelClient(ModelEndpoint(base_url='http://127.0.0.1:1/v1', model='m'))\n"
        "assert not c.imported\n"
        "bad = [m for m in ('openai', 'httpx2', 'httpx') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
