"""Secrets through the thin clients: MCP ``save_memory`` / ``recall_memory`` driven by the real
``mcp`` SDK stdio client, and the proxy's upstream request, which never carries a key from a
memory file a person wrote by hand."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, stdio_client
from proxy_harness import CLIENT_SYSTEM, client, forwarded, setup, upstream
from test_mcp_server import errlog_for, ok, server_params

from qwenctxd.testing.openai_stub import Reply
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until

__all__ = ["setup", "upstream"]  # fixtures

KEY = "gh" + "p_" + "Zq8RkT2mWx4Nb7Yc1Ld9Pf3Hs6Jv0Ag5Eu8K"
SLACK_HOOK = "https://hooks.slack" + ".com/services/T0AAAA1111/B0BBBB2222/" + "Xy7" * 8


@pytest.mark.asyncio
async def test_mcp_save_memory_redacts_and_says_so(daemon: SpawnedDaemon) -> None:
    repo = daemon.home / "repo"
    (repo / ".git").mkdir(parents=True)
    with errlog_for(daemon) as errlog:
        async with stdio_client(server_params(daemon, "--cwd", str(repo)), errlog=errlog) as (
                r, w), ClientSession(r, w) as s:
            await s.initialize()
            text = await ok(s, "save_memory", {
                "type": "reference", "name": "Alerts webhook",
                "description": "where CI posts alerts",
                "body": f"CI posts to {SLACK_HOOK} using {KEY}."})
            path = Path(text.splitlines()[0])
            assert "Redacted before saving" in text and "slack-webhook-url ×1" in text
            assert "github-pat ×1" in text and KEY not in text
            saved = await anyio.Path(path).read_text()
            assert KEY not in saved and "B0BBBB2222" not in saved
            assert "[redacted: github-pat]" in saved
            recalled = await ok(s, "recall_memory", {"query": "alerts webhook"})
            assert "[redacted: github-pat]" in recalled and KEY not in recalled
            entry = daemon.call("memory.log", {"limit": 1})["entries"][-1]
            assert entry["path"] == str(path) and entry["redacted"]
            # a hand-written key in a memory file: not in its resource, nor the listing
            hand = path.parent / "hand.md"
            await anyio.Path(hand).write_text(
                f"---\nname: Hand {KEY}\ndescription: by hand {KEY}\ntype: reference\n---\n"
                f"The key is {KEY}.\n")
            until(lambda: any(d["path"] == str(hand) for d in daemon.call(
                "memory.list", {"cwd": str(repo)})["docs"]), what="the hand-written memory")
            listed = await s.list_resources()
            assert KEY not in listed.model_dump_json()
            uri = next(str(r.uri) for r in listed.resources if str(r.uri).endswith("hand.md"))
            read = await s.read_resource(uri)  # type: ignore[arg-type]
            assert KEY not in read.model_dump_json()
            assert "[redacted: github-pat]" in read.model_dump_json()


def test_proxy_upstream_request_carries_no_hand_written_key(setup) -> None:  # type: ignore[no-untyped-def]
    proxy, stub, script, proj = setup
    d = proxy.daemon
    st = d.call("memory.status", {"cwd": str(proj)})
    root = Path(st["roots"]["project"])
    (root / "reference" / "registry.md").write_text(
        "---\nname: Registry login\ndescription: registry token for the build\n"
        f"type: reference\n---\nThe registry token is {KEY}.\n")
    (root / "MEMORY.md").write_text(f"- [Registry login](reference/registry.md) — {KEY}\n")
    until(lambda: d.call("memory.list", {"cwd": str(proj)})["docs"], what="the memory indexed")
    script.replies += [Reply(content="First."), Reply(content="Second.")]
    c = client(proxy)
    msgs = [{"role": "system", "content": CLIENT_SYSTEM},
            {"role": "user", "content": "what is the registry token for the build?"}]
    c.chat.completions.create(model="stub-model", messages=msgs)  # type: ignore[arg-type]
    msgs += [{"role": "assistant", "content": "First."},
             {"role": "user", "content": "and the registry login again?"}]
    c.chat.completions.create(model="stub-model", messages=msgs)  # type: ignore[arg-type]
    bodies = forwarded(stub)
    assert len(bodies) == 2
    assert "[redacted: github-pat]" in bodies[0]["messages"][0]["content"]  # the memory index
    for r in stub.chat_requests:  # nothing the daemon or the proxy sent upstream holds it
        assert KEY not in json.dumps(r.body), json.dumps(r.body)[:3000]
