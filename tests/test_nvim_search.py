"""``:QwenCtxSearch`` in a real headless Neovim against a real daemon: the picker lists the hits
of this project (``!``: every project), and <CR> on a hit opens the transcript at its entry."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from test_nvim_plugin import LUA_PRELUDE, _run_nvim, nvim  # noqa: F401 - nvim is a fixture
from test_session_search import settled, write_session

from qwenctxd.testing.spawn import SpawnedDaemon

SCENARIO = r"""
  local qc = require("qwenctx")
  vim.cmd("runtime plugin/qwenctx.lua")
  R.commands = vim.fn.exists(":QwenCtxSearch") == 2 and vim.fn.exists(":QwenctxSearch") == 2
  qc.setup({ socket = os.getenv("QT_SOCKET"), autostart = false })
  vim.cmd("edit " .. vim.fn.fnameescape(os.getenv("QT_PROJECT") .. "/notes.txt"))
  local function picker()
    local ok = vim.wait(8000, function()
      local b = qc.view_buffer("search")
      return b ~= nil and #vim.api.nvim_buf_get_lines(b, 0, -1, false) > 1
    end, 10)
    local b = qc.view_buffer("search")
    return ok and vim.api.nvim_buf_get_lines(b, 0, -1, false) or {}
  end
  vim.cmd("QwenCtxSearch capybara quota")
  R.here = picker()
  R.cursor_line = vim.api.nvim_get_current_line()
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes("<CR>", true, false, true), "x", false)
  local name = "transcript/" .. os.getenv("QT_SID")
  vim.wait(8000, function() return qc.view_buffer(name) ~= nil end, 10)
  local tb = qc.view_buffer(name)
  R.transcript_name = tb and vim.api.nvim_buf_get_name(tb)
  R.at_cursor = tb and vim.api.nvim_get_current_line()
  R.below_cursor = tb and vim.api.nvim_buf_get_lines(tb, vim.api.nvim_win_get_cursor(0)[1],
    vim.api.nvim_win_get_cursor(0)[1] + 1, false)[1]
  vim.api.nvim_buf_delete(qc.view_buffer("search"), { force = true })
  vim.cmd("wincmd o")
  vim.cmd("QwenctxSearch! capybara quota")
  R.all = picker()
"""


def test_qwenctx_search_picker_opens_the_transcript_at_the_hit(
        nvim: str, daemon: SpawnedDaemon, tmp_path: Path) -> None:  # noqa: F811
    here, there = daemon.home / "here", daemon.home / "there"
    (here / ".git").mkdir(parents=True)
    there.mkdir()
    sid = write_session(daemon, here, [("user", "hello"), ("model", "hi"),
                                       ("user", "what is the capybara quota?"),
                                       ("model", "The capybara quota is 12 per pen.")])
    other = write_session(daemon, there, [("user", "capybara quota elsewhere")])
    settled(daemon, 2)
    env = {**daemon.env, "QT_OUT": str(tmp_path / "out"), "QT_PROJECT": str(here),
           "QT_SOCKET": str(daemon.socket), "QT_SID": sid}
    proc = _run_nvim(nvim, LUA_PRELUDE % SCENARIO, tmp_path, env, here)
    try:
        proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
    r = json.loads((tmp_path / "out.final").read_text())
    assert "lua_error" not in r, r["lua_error"]
    assert r["commands"] is True
    assert r["here"][0].startswith("qwenctx search: capybara quota  (2 hits")
    assert all(sid[:8] in line for line in r["here"][1:]) and other[:8] not in "".join(r["here"])
    assert sid[:8] in r["cursor_line"]
    hit_entry = 3 if "12 per pen" in r["cursor_line"] else 2
    assert r["transcript_name"].endswith(f"qwenctx://transcript/{sid}")
    assert r["at_cursor"].startswith(f"[{hit_entry}] ")
    assert "capybara quota" in r["below_cursor"]
    assert any(other[:8] in line for line in r["all"]) and any(sid[:8] in ln for ln in r["all"])
