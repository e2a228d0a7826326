"""The Neovim plugin (clients/nvim) driven headless against a real daemon.

Needs `nvim` (Debian's neovim, 0.7+; .ci/run installs it). Without it the tests fail, naming
the package: an untested client is never a green run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwenctxd.client import Client
from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import WaitTimeout, until

PLUGIN = Path(__file__).resolve().parents[1] / "clients" / "nvim"
MARKER = "The nvim marker sentence is CERULEAN-PANGOLIN-7."


@pytest.fixture
def nvim() -> str:
    exe = shutil.which("nvim")
    if exe is None:
        pytest.fail("nvim not installed: `apt-get install neovim` (.ci/run does) — the Neovim "
                    "plugin clients/nvim is untested")
    return exe


def _project(root: Path) -> Path:
    proj = root / "proj"
    (proj / ".git").mkdir(parents=True)
    (proj / "src").mkdir()
    (proj / "QWEN.md").write_text(f"# Project rules\n\n{MARKER}\n")
    (proj / "src" / "main.py").write_text("print('hi')\n")
    return proj


def _run_nvim(nvim: str, script: str, tmp: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    path = tmp / "test.lua"
    path.write_text(script)
    return subprocess.Popen(
        [nvim, "--headless", "-u", "NONE", "-i", "NONE", "-n",
         "--cmd", f"set rtp+={PLUGIN}", "-c", f"luafile {path}"],
        env=env, cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_file(path: Path, proc: subprocess.Popen[str], timeout: float) -> dict:
    def written() -> dict | None:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"nvim exited {proc.returncode} before writing {path.name}:\n{out}\n{err}")
        return None

    try:
        return until(written, timeout=timeout, what=f"nvim to write {path.name}")
    except WaitTimeout:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"nvim wrote no {path.name} within {timeout}s:\n{out}\n{err}")


# The Lua side: a helper library, then the scenario. Results go to $QT_OUT.<phase> as JSON
# (written to a temp name and renamed, so Python never reads half a file); every vim.notify is
# collected; any Lua error ends up in the output instead of hanging headless nvim.
LUA_PRELUDE = r"""
local OUT = os.getenv("QT_OUT")
local notes = {}
vim.notify = function(msg, level)
  table.insert(notes, { msg = tostring(msg), level = level or vim.log.levels.INFO })
end
local function emit(phase, t)
  t.notes = notes
  local tmp = OUT .. "." .. phase .. ".tmp"
  vim.fn.writefile({ vim.json.encode(t) }, tmp)
  vim.loop.fs_rename(tmp, OUT .. "." .. phase)
end
local function await(start, ms)
  local done, a, b = false, nil, nil
  start(function(x, y) done, a, b = true, x, y end)
  local ok = vim.wait(ms or 8000, function() return done end, 10)
  return ok, a, b
end
local function view_lines(name)
  local qc = require("qwenctx")
  local ok = vim.wait(5000, function()
    local b = qc.view_buffer(name)
    return b ~= nil and #vim.api.nvim_buf_get_lines(b, 0, -1, false) > 1
  end, 10)
  if not ok then return {} end
  local b = qc.view_buffer(name)
  return { name = vim.api.nvim_buf_get_name(b), lines = vim.api.nvim_buf_get_lines(b, 0, -1, false) }
end
local function errors_since(n)
  local out = {}
  for i = n + 1, #notes do
    if notes[i].level >= vim.log.levels.ERROR then table.insert(out, notes[i].msg) end
  end
  return out
end
local function main(R) %s end
local R = {}
local ok, err = xpcall(main, debug.traceback, R)
if not ok then R.lua_error = tostring(err) end
emit("final", R)
vim.cmd("qa!")
"""

SCENARIO = r"""
  local qc = require("qwenctx")
  -- trace the client's reconnects (an internal hook, only to prove which path was taken)
  local C = getmetatable(require("qwenctx.rpc").new({})).__index
  local lost, submit = C._lost, C._submit
  R.trace = {}
  C._lost = function(self, gen, reason)
    if gen == self.gen then table.insert(R.trace, "lost: " .. reason) end
    return lost(self, gen, reason)
  end
  C._submit = function(self, req)
    if req.attempts > 0 then table.insert(R.trace, "retry " .. req.method) end
    return submit(self, req)
  end
  vim.cmd("runtime plugin/qwenctx.lua")
  R.commands = vim.fn.exists(":QwenCtxStatus") == 2 and vim.fn.exists(":QwenCtxContext") == 2
    and vim.fn.exists(":QwenCtxRecall") == 2 and vim.fn.exists(":QwenCtxSessions") == 2
    and vim.fn.exists(":QwenCtxTitle") == 2 and vim.fn.exists(":QwenCtxPrompt") == 2
  R.default_socket = qc.socket_path()

  -- nobody listening: one clean error line, to the callback and to vim.notify
  qc.setup({ socket = os.getenv("QT_PROJECT") .. "/nobody.sock" })
  local n0 = #notes
  local fin, e = await(function(cb) qc.assemble({ text = "x" }, cb) end)
  R.unreachable = { finished = fin, err = e and tostring(e) or nil, kind = e and e.kind, notes = errors_since(n0) }

  qc.setup({ socket = os.getenv("QT_SOCKET"), model = "qwen3-coder-plus" })
  vim.cmd("edit " .. vim.fn.fnameescape(os.getenv("QT_PROJECT") .. "/src/main.py"))
  R.root = qc.project_root()

  local function assemble(text)
    local finished, err, p = await(function(cb) qc.assemble({ text = text }, cb) end)
    local r = { finished = finished, err = err and tostring(err) or nil }
    if p then
      local last = p.messages[#p.messages]
      r.marker = p.system:find(os.getenv("QT_MARKER"), 1, true) ~= nil
      r.messages = #p.messages
      r.session_id = p.session_id
      r.level = p.usage.level
      r.last_text = last.content[#last.content].text
      local texts = {}
      for _, part in ipairs(last.content) do texts[#texts + 1] = part.text or "" end
      r.joined = table.concat(texts, "\n")
      r.reencoded = vim.json.decode(vim.json.encode(p)).session_id == p.session_id
    end
    return r
  end

  -- two at once: they share one session.open
  local a, b
  qc.assemble({ text = "first", agent = { name = "NvimAgent" }, keep_reasoning = "none",
    tools = { { type = "function", ["function"] = { name = "read_buffer", description = "read",
      parameters = { type = "object", properties = { path = { type = "string" } } } } } } },
    function(err, p) a = { err = err, p = p } end)
  qc.assemble({ text = "hello" }, function(err, p) b = { err = err, p = p } end)
  vim.wait(8000, function() return a ~= nil and b ~= nil end, 10)
  R.first = {
    same_session = a and b and a.p and b.p and a.p.session_id == b.p.session_id,
    marker = b and b.p and b.p.system:find(os.getenv("QT_MARKER"), 1, true) ~= nil,
    messages = b and b.p and #b.p.messages,
    identity = b and b.p and b.p.system:sub(1, 16),
    tools = b and b.p and #b.p.tools,
    session_id = b and b.p and b.p.session_id,
    err = (a and a.err and tostring(a.err)) or (b and b.err and tostring(b.err)) or nil,
  }
  emit("1", { session_id = R.first.session_id })

  -- Python restarts the daemon, then creates the go file. Block the event loop meanwhile
  -- (uv.sleep, not vim.wait), so the plugin has not seen the old connection close: the next
  -- request is written on the dead connection and must reconnect, resume and retry.
  local deadline = vim.loop.now() + 20000
  while not vim.loop.fs_stat(os.getenv("QT_GO")) and vim.loop.now() < deadline do
    vim.loop.sleep(20)  -- sleep-ok: blocking the event loop is the point (see above)
    vim.loop.update_time()
  end
  R.go = vim.loop.fs_stat(os.getenv("QT_GO")) ~= nil
  R.second = assemble("hello again")

  local n1 = #notes
  vim.cmd("QwenCtxStatus")
  R.status = view_lines("status")
  vim.cmd("QwenCtxContext")
  R.context = view_lines("context")
  vim.cmd("QwenCtxSessions")
  R.sessions = view_lines("sessions")
  local n2 = #notes
  vim.cmd("QwenCtxTitle Pangolin   hunt")
  vim.wait(3000, function() return #notes > n2 end, 10)
  R.title_note = notes[#notes] and notes[#notes].msg
  vim.cmd("QwenCtxSessions")
  vim.wait(3000, function()
    local b = qc.view_buffer("sessions")
    return table.concat(vim.api.nvim_buf_get_lines(b, 0, -1, false), "\n"):find("Pangolin") ~= nil
  end, 10)
  R.titled = view_lines("sessions")
  vim.cmd("QwenCtxRecall pangolin marker")
  R.recall = view_lines("recall")
  vim.cmd("QwenCtxPrompt")
  R.prompt = view_lines("prompt")
  -- every command above was awaited (its view filled or its note came); one more round trip
  -- lets anything the plugin still had scheduled (vim.schedule'd notifications) run first
  R.sentinel = await(function(cb) qc.status(cb) end, 8000)
  R.command_errors = errors_since(n1)
"""

AUTOSTART = r"""
  local qc = require("qwenctx")
  qc.setup({ socket = os.getenv("QT_SOCKET"), autostart = true, cmd = vim.json.decode(os.getenv("QT_CMD")) })
  local fin, err, st = await(function(cb) qc.status(cb) end, 15000)
  R.finished, R.err, R.pid = fin, err and tostring(err) or nil, st and st.pid
"""


def test_assemble_commands_and_reconnect_after_restart(
    nvim: str, spawn: type[SpawnedDaemon], tmp_path: Path
) -> None:
    d = spawn().start()
    proj = _project(d.root)
    out, go = tmp_path / "out", tmp_path / "go"
    env = {**d.env, "QT_OUT": str(out), "QT_GO": str(go), "QT_PROJECT": str(proj),
           "QT_SOCKET": str(d.socket), "QT_MARKER": MARKER}
    proc = _run_nvim(nvim, LUA_PRELUDE % SCENARIO, tmp_path, env, proj)
    try:
        phase1 = _wait_file(tmp_path / "out.1", proc, 15)
        assert phase1["session_id"], phase1
        d.stop()
        d.start()
        go.touch()
        stdout, stderr = proc.communicate(timeout=25)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    r = json.loads((tmp_path / "out.final").read_text())
    assert "lua_error" not in r, r["lua_error"]
    assert r["commands"] is True
    assert r["default_socket"] == str(d.socket)  # $XDG_RUNTIME_DIR/qwenctxd/qwenctxd.sock

    un = r["unreachable"]
    assert un["finished"] and un["kind"] == "transport"
    assert "not running" in un["err"] and "nobody.sock" in un["err"]
    assert len(un["notes"]) == 1 and "\n" not in un["notes"][0]
    assert un["notes"][0].startswith("qwenctx: assemble: ")

    assert r["root"] == str(proj)
    first = r["first"]
    assert first.get("err") is None, first
    # the second turn joined the first, unanswered one (user_turn_merged): one user message
    assert first["same_session"] and first["marker"] and first["messages"] == 1
    assert first["identity"] == "You are NvimAgen" and first["tools"] == 2  # theirs + skill
    assert first["session_id"] == phase1["session_id"]

    # after the restart: reconnected, session resumed (same id), the history carried on
    second = r["go"] and r["second"]
    assert second["finished"] and second.get("err") is None, r
    assert second["session_id"] == first["session_id"]
    # the turn went out on the dead connection, was sent again on a new one, met
    # SessionNotFound, and the session was resumed (same id) for a second try
    trace = r["trace"]
    assert trace[0].startswith("lost: ") and "retry session.turn" in trace, trace
    assert second["marker"] and second["last_text"] == "hello again"
    # no model reply was recorded in between, so the turn merged into the unanswered one
    # (user_turn_merged): still one user message, now carrying all three texts
    assert second["messages"] == first["messages"] == 1
    assert all(t in second["joined"] for t in ("first", "hello", "hello again")), second
    assert second["reencoded"]

    assert r["sentinel"] is True, "the status request after the commands never answered"
    assert r["command_errors"] == [], r["command_errors"]
    status = r["status"]["lines"]
    assert status[0] == "qwenctxd status"
    assert any(line.split()[:2] == ["pid", str(d.proc.pid)] for line in status)
    assert r["status"]["name"] == "qwenctx://status"
    ctx = r["context"]["lines"]
    assert ctx[0].startswith(f"context of session {first['session_id']}: "), ctx
    bar = next(line for line in ctx if re.fullmatch(r"[SIMOTKNUAR.]{20,}", line))
    assert bar.startswith("S") and bar.endswith(".") and "I" in bar  # QWEN.md: instructions
    assert any(line.startswith("legend: S=system base") for line in ctx)
    assert any(line.split()[:2] == ["I", "instructions"] for line in ctx)
    sessions = r["sessions"]["lines"]
    assert any(line.startswith("*") and first["session_id"] in line for line in sessions)
    mine = next(line for line in sessions if line.startswith("*"))
    assert mine.rstrip().endswith(("first", "hello")), sessions  # the automatic title
    assert r["title_note"] == (f"qwenctx: session {first['session_id'][:8]} is now titled: "
                               "Pangolin hunt"), r["title_note"]
    mine = next(line for line in r["titled"]["lines"] if line.startswith("*"))
    assert mine.rstrip().endswith("Pangolin hunt"), r["titled"]
    assert r["recall"]["lines"][0] == "qwenctx recall: pangolin marker"
    assert any("strategy" in line for line in r["recall"]["lines"])
    prompt_view = r["prompt"]["lines"]
    assert prompt_view[0] == f"qwenctx prompt: {proj}" and r["prompt"]["name"] == "qwenctx://prompt"
    assert any(ln.split()[:1] == ["instructions"] for ln in prompt_view)
    assert any(MARKER in ln for ln in prompt_view)  # the prompt text itself follows the summary
    expected_hash = d.call("prompt.system", {"cwd": str(proj), "model": "qwen3-coder-plus"})[
        "prefix_hash"]
    assert f"prefix hash: {expected_hash}" in prompt_view
    assert "stack traceback" not in stderr and "E5108" not in stderr, stderr
    assert proc.returncode == 0, (stdout, stderr)


def test_autostart_starts_the_daemon(nvim: str, spawn: type[SpawnedDaemon], tmp_path: Path) -> None:
    d = spawn()  # not started: the plugin starts it
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "qwenctxd", "--log-format", "json"]
    env = {**d.env, "QT_OUT": str(out), "QT_SOCKET": str(d.socket), "QT_CMD": json.dumps(cmd)}
    proc = _run_nvim(nvim, LUA_PRELUDE % AUTOSTART, tmp_path, env, d.root)
    try:
        proc.communicate(timeout=25)
        r = json.loads((tmp_path / "out.final").read_text())
        assert "lua_error" not in r, r["lua_error"]
        assert r["finished"] and r.get("err") is None and isinstance(r["pid"], int), r
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if d.socket.exists():
            with Client(d.socket, timeout=5) as c:
                c.call("daemon.shutdown", {"drain": False})
            until(lambda: not d.socket.exists(), what="the daemon to remove its socket")


INCREMENTAL = r"""
  local qc = require("qwenctx")
  qc.setup({ socket = os.getenv("QT_SOCKET"), model = "m", autostart = false })
  local raw = {}
  local request = qc.request
  qc.request = function(method, params, cb, ropts)  -- observe what goes over the socket
    return request(method, params, function(err, res)
      if method == "session.turn" and res then
        table.insert(raw, { from = res.messages_from, n = #res.messages,
                            known = params.known and params.known.count or vim.NIL })
      end
      cb(err, res)
    end, ropts)
  end
  local root = os.getenv("QT_PROJECT")
  local prompts = {}
  for i = 1, 4 do
    local ok, err, p = await(function(done) qc.assemble({ text = "question " .. i, cwd = root }, done) end)
    if not ok or err then R.err = vim.inspect(err); return end
    local c = p.messages[#p.messages].content
    table.insert(prompts, { n = #p.messages, last = type(c) == "table" and c[#c].text or c,
                            first = p.messages[1].content, from = p.messages_from })
    local ok2, err2 = await(function(done)
      qc.request("session.record_model", { session_id = p.session_id,
        message = { role = "assistant", content = "answer " .. i } }, done)
    end)
    if not ok2 or err2 then R.err = vim.inspect(err2); return end
  end
  R.prompts, R.raw = prompts, raw
"""


def test_assemble_sends_known_and_keeps_the_full_history(
    nvim: str, spawn: type[SpawnedDaemon], tmp_path: Path
) -> None:
    d = spawn().start()
    proj = _project(d.root)
    env = {**d.env, "QT_OUT": str(tmp_path / "out"), "QT_PROJECT": str(proj),
           "QT_SOCKET": str(d.socket)}
    proc = _run_nvim(nvim, LUA_PRELUDE % INCREMENTAL, tmp_path, env, proj)
    stdout, stderr = proc.communicate(timeout=60)
    r = json.loads((tmp_path / "out.final").read_text())
    assert "lua_error" not in r and "err" not in r, (r, stderr)
    # the caller always sees the whole history: question, answer, question, …
    assert [p["n"] for p in r["prompts"]] == [1, 3, 5, 7]
    assert all(p["from"] == 0 and p["last"].endswith(f"question {i}")
               for i, p in enumerate(r["prompts"], 1))
    assert all(p["first"] == r["prompts"][0]["first"] for p in r["prompts"])
    # on the socket: the first reply whole, then only the recorded answer and the new question
    assert r["raw"][0]["from"] == 0 and r["raw"][0]["known"] is None
    assert [(x["known"], x["from"], x["n"]) for x in r["raw"][1:]] == [(1, 1, 2), (3, 3, 2),
                                                                       (5, 5, 2)]
