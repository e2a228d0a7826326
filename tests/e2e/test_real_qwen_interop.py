"""Interop with the real Qwen Code CLI 0.24: sessions both ways, recap, prompt structure.

The daemon and the CLI share one scratch HOME (so one ``~/.qwen``) and one project; both talk
to the same scripted model. A session the daemon recorded is listed and resumed by ``qwen``
(its next request carries the earlier messages); a session ``qwen`` recorded — with a real
``read_file`` tool call — is resumed, recapped and continued by the daemon, whose messages
stay a valid chat-completions request. The prompt-structure items of
../shared/reference/interop-facts.md are compared against what the CLI sent.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from qwenctxd.testing.chat_validation import validate_chat_body
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI
from qwenctxd.testing.spawn import SpawnedDaemon
from tests.e2e.qwen_cli import QwenCli

pytestmark = pytest.mark.real_qwen

READ_FILE_TOOL = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file",
    "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}},
                   "required": ["file_path"]}}}


def is_main(body: dict[str, Any]) -> bool:
    """The CLI's main request is the one whose tools include ``skill``."""
    return any((t.get("function") or {}).get("name") == "skill" for t in body.get("tools") or [])


def texts(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                   check=True, capture_output=True)


@pytest.fixture
def world(spawn: type[SpawnedDaemon]) -> Any:
    """(daemon, stub, cli, project): one HOME, one project, one scripted model."""
    state: dict[str, Any] = {"main_reply": None, "recaps": []}

    def handler(body: dict[str, Any]) -> Reply:
        if is_main(body):
            reply = state["main_reply"]
            return reply(body) if callable(reply) else Reply(content="main answer")
        if "<recap>" in json.dumps(body.get("messages", [])):
            state["recaps"].append(body)
            return Reply(content="<recap>You asked for the secret word; next, confirm it.</recap>")
        return Reply(content="ok")

    with ScriptedOpenAI(handler=handler) as stub:
        d = spawn(env={"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "k",
                       "OPENAI_MODEL": "scripted-model"}).start()
        proj = d.root / "proj"
        proj.mkdir()
        (proj / "notes.txt").write_text("the secret word is banana\n")
        git(proj, "init", "-q", "-b", "main")
        git(proj, "commit", "-q", "--allow-empty", "-m", "first commit")
        cli = QwenCli(home=d.home, cwd=proj, base_url=stub.base_url)
        yield d, stub, cli, proj, state


def test_qwen_lists_and_resumes_a_session_the_daemon_recorded(world: Any) -> None:
    d, stub, cli, proj, state = world
    notes = str(proj / "notes.txt")
    with d.client() as c:
        sid = c.call("session.open", {"cwd": str(proj), "model": "scripted-model",
                                      "tools": [READ_FILE_TOOL]})["session_id"]
        c.call("session.turn", {"session_id": sid, "kind": "user", "text": "what is the secret?"})
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "call_d1", "type": "function",
                 "function": {"name": "read_file", "arguments": json.dumps({"file_path": notes})}}]},
            "usage": {"prompt_tokens": 100, "completion_tokens": 10}})
        c.call("session.turn", {"session_id": sid, "kind": "tool_results", "tool_results": [
            {"tool_call_id": "call_d1", "name": "read_file", "content": "the secret word is banana"}]})
        c.call("session.record_model", {"session_id": sid, "message": {
            "role": "assistant", "content": "The secret word is banana."}})
        c.call("session.close", {"session_id": sid})

    listed = cli.run("sessions", "list", "--json")
    rows = [json.loads(line) for line in listed.stdout.splitlines() if line.strip().startswith("{")]
    [row] = [r for r in rows if r["sessionId"] == sid]
    assert row["prompt"] == "what is the secret?", row  # shown by its first words, not reminders
    assert row["cwd"] == str(proj)

    before = len(stub.chat_requests)
    proc = cli.run("--resume", sid, prompt="and spell it backwards")
    assert "Failed" not in proc.stderr, proc.stderr
    mains = [r.body for r in stub.chat_requests[before:] if is_main(r.body)]
    assert mains, "the resumed CLI sent no main request"
    msgs = mains[0]["messages"]
    joined = "\n".join(texts(m) for m in msgs)
    assert "what is the secret?" in joined
    assert "The secret word is banana." in joined
    calls = [tc for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls") or []]
    assert [(tc["id"], tc["function"]["name"], json.loads(tc["function"]["arguments"]))
            for tc in calls] == [("call_d1", "read_file", {"file_path": notes})]
    tool_msgs = [m for m in msgs if m["role"] == "tool"]
    assert [(m["tool_call_id"], texts(m)) for m in tool_msgs] == [
        ("call_d1", "the secret word is banana")]
    assert "and spell it backwards" in texts(msgs[-1])


def test_daemon_resumes_recaps_and_continues_a_session_qwen_recorded(world: Any) -> None:
    d, stub, cli, proj, state = world
    notes = str(proj / "notes.txt")

    def main_reply(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="The file says banana.")
        return Reply(tool_calls=[{"id": "call_q1", "function": {
            "name": "read_file", "arguments": {"file_path": notes}}}])

    state["main_reply"] = main_reply
    cli.run("--approval-mode", "yolo", prompt="read notes.txt please")
    files = list(cli.chats_dir().glob("*.jsonl"))
    assert len(files) == 1
    sid = files[0].stem

    with d.client() as c:
        listed = c.call("session.list", {"cwd": str(proj)})
        opened = c.call("session.open", {"cwd": str(proj), "model": "scripted-model",
                                         "session_id": sid, "resume": True,
                                         "tools": [READ_FILE_TOOL]})
        assert opened["resumed"] is True and opened["torn_lines"] == []
        recap = c.call("session.recap", {"session_id": sid})
        prompt = c.call("session.turn", {"session_id": sid, "kind": "user",
                                         "text": "thanks, anything else?"})
    assert sid in [s["session_id"] for s in listed["sessions"]]
    msgs = prompt["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "user"]
    assert texts(msgs[0]) == "read notes.txt please"
    call = msgs[1]["tool_calls"][0]
    assert call["id"] == "call_q1" and call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"file_path": notes}
    assert msgs[2]["tool_call_id"] == "call_q1"
    assert "banana" in texts(msgs[2])
    assert msgs[3]["content"] == "The file says banana."
    body = {"model": "scripted-model", "messages": [
        {"role": "system", "content": prompt["system"]}, *msgs], "tools": prompt["tools"]}
    assert validate_chat_body(body) == []
    assert recap["status"] == "ok" and "secret word" in recap["text"]
    assert len(state["recaps"]) == 1
    recap_input = json.dumps(state["recaps"][0]["messages"])
    assert "read notes.txt please" in recap_input and "The file says banana." in recap_input


def fenced_git(system: str) -> list[str]:
    block = system.split("```text\n", 1)[1].split("\n```", 1)[0]
    return block.splitlines()


def test_prompt_structure_matches_what_the_cli_sends(world: Any) -> None:
    d, stub, cli, proj, state = world
    (proj / "QWEN.md").write_text("Project rule: be brief.\n")
    (proj / ".qwen" / "rules").mkdir(parents=True)
    (proj / ".qwen" / "rules" / "00-base.md").write_text("Always use tabs.\n")
    skill = proj / ".qwen" / "skills" / "demo"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(
        "---\nname: demo\ndescription: Shows the user's \"demo\" flow\n---\nDo the demo.\n")
    cli.run(prompt="hello")  # also writes ~/.qwen/output-language.md, as the CLI does
    cli_main = next(r.body for r in stub.chat_requests if is_main(r.body))
    cli_system = cli_main["messages"][0]["content"]
    cli_first = texts(cli_main["messages"][1])
    assert (d.home / ".qwen" / "output-language.md").is_file()

    with d.client() as c:
        sid = c.call("session.open", {"cwd": str(proj), "model": "scripted-model"})["session_id"]
        turn = c.call("session.turn", {"session_id": sid, "kind": "user", "text": "hello"})
    ours, ours_first = turn["system"], texts(turn["messages"][0])

    rule = ("--- Rule from: .qwen/rules/00-base.md ---\nAlways use tabs.\n"
            "--- End of Rule from: .qwen/rules/00-base.md ---")
    assert rule in cli_system and rule in ours
    lang_start = "--- Context from: ../home/.qwen/output-language.md ---"
    lang_end = "--- End of Context from: ../home/.qwen/output-language.md ---"
    for system in (cli_system, ours):
        assert system.index("--- End of Context from: QWEN.md ---") < system.index(lang_start)
        assert system.index(lang_end) < system.index(rule) < system.index("```text\ngit: ")
        assert system.index("```text\ngit: ") < system.index("\n\n---\n\n# auto memory")
    cli_lang = cli_system[cli_system.index(lang_start):cli_system.index(lang_end)]
    assert cli_lang in ours  # the same file, the same markers
    # the git snapshot: same fenced lines (branch, status, commits), untrusted-data preface
    assert fenced_git(ours) == fenced_git(cli_system)
    assert "git: Status:" in fenced_git(ours) and "git: ?? QWEN.md" in fenced_git(ours)
    assert "untrusted repository data" in ours and "untrusted repository data" in cli_system
    # the environment reminder: date in words, OS, cwd and the same folder tree
    tree_of = lambda text: text.split(f"{proj}/\n", 1)[1].split("\n</system-reminder>", 1)[0]  # noqa: E731
    cli_env = next(p for p in cli_first.split("\n</system-reminder>\n")
                   if "folder structure" in p.lower())
    ours_env = next(p for p in ours_first.split("\n</system-reminder>\n") if "Folder" in p)
    assert tree_of(cli_env + "\n</system-reminder>") == tree_of(ours_env + "\n</system-reminder>")
    today = cli_env.split("Today's date is ", 1)[1].split(".\n", 1)[0]
    assert today in ours_env and str(proj) in ours_env and "linux" in ours_env
    # the skill listing entry of a project skill, byte for byte
    entry = ("<skill>\n<name>\ndemo\n</name>\n<description>\n"
             "Shows the user&apos;s &quot;demo&quot; flow (project)\n</description>\n"
             "<location>\nproject\n</location>\n</skill>")
    assert entry in cli_first and entry in ours_first


SUMMARY = ("<analysis>notes</analysis>\n<state_snapshot>\n<primary_request_and_intent>"
           "SUMMARY-MARK: find the secret word in notes.txt</primary_request_and_intent>\n"
           "<next_step>report the word</next_step>\n</state_snapshot>")


def test_qwen_resumes_from_the_daemons_compression_checkpoint(world: Any) -> None:
    d, stub, cli, proj, state = world
    with ScriptedOpenAI(default=Reply(content=SUMMARY)) as summarizer:
        d.stop()
        d.start(env={"OPENAI_BASE_URL": summarizer.base_url})
        with d.client() as c:
            sid = c.call("session.open", {"cwd": str(proj), "model": "scripted-model"})[
                "session_id"]
            c.call("session.turn", {"session_id": sid, "kind": "user",
                                    "text": "EARLY-MARK " + "long question " * 200})
            c.call("session.record_model", {"session_id": sid, "message": {
                "role": "assistant", "content": "long answer " * 200}})
            r = c.call("session.compress", {"session_id": sid})
            assert r["status"] == "compressed", r
            c.call("session.close", {"session_id": sid})
    before = len(stub.chat_requests)
    cli.run("--resume", sid, prompt="what now?")
    main = next(r.body for r in stub.chat_requests[before:] if is_main(r.body))
    sent = json.dumps(main["messages"])
    assert "SUMMARY-MARK" in sent and "EARLY-MARK" not in sent
    assert "what now?" in texts(main["messages"][-1])
