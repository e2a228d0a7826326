-- qwenctx.search: :QwenCtxSearch — what was said in past sessions (session.search).
--
--   :QwenCtxSearch {query}    this project's sessions (the current buffer's project root)
--   :QwenCtxSearch! {query}   every project's
--
-- The hits go to the picker view `qwenctx://search` (one line per hit: when, role, session
-- title and id, snippet); <CR> on a hit opens `qwenctx://transcript/<id>` with the cursor on
-- the hit's entry. (`:QwenctxSearch` is the same command.)

local picture = require("qwenctx.picture")

local v = picture.v

local M = {}

local last = { hits = {}, first_line = 0 }

local function one_line(s)
  return (tostring(s or ""):gsub("%s+", " "))
end

--- search(query, opts, cb): cb(err, res) with the session.search result. opts: all (every
--- project), cwd (default: the current buffer's project root), roles, since, limit.
function M.search(query, opts, cb)
  local qc = require("qwenctx")
  opts = opts or {}
  local params = { query = query, limit = opts.limit or 50 }
  if not opts.all then
    params.cwd = opts.cwd or qc.project_root()
  end
  params.roles = opts.roles
  params.since = opts.since
  qc.request("session.search", params, cb)
end

--- The picker's lines for a result: a header, then one line per hit.
function M.hit_lines(query, res, scope)
  local hits = v(res.hits) or {}
  local lines = { ("qwenctx search: %s  (%d hit%s, %s)"):format(query, #hits,
    #hits == 1 and "" or "s", scope) }
  local pending = v(v(res.indexed) and res.indexed.pending) or 0
  if pending > 0 then
    lines[#lines + 1] = ("  (still indexing %d session file(s))"):format(pending)
  end
  if #hits == 0 then
    lines[#lines + 1] = "  no past session mentions it"
  end
  return lines, #lines
end

local function hit_line(h)
  local when = (v(h.time) or "?"):sub(1, 16):gsub("T", " ")
  return ("%s  %-9s  %s [%s]  %s"):format(when, h.role, v(h.title) or "(untitled)",
    h.session_id:sub(1, 8), one_line(h.snippet))
end

--- open_hit(hit): the transcript of the hit's session, cursor on the hit's entry.
function M.open_hit(h, cb)
  local qc = require("qwenctx")
  qc.request("session.transcript", { session_id = h.session_id }, function(err, tr)
    if err then
      vim.notify("qwenctx: transcript: " .. tostring(err), vim.log.levels.ERROR)
      return cb and cb(err)
    end
    local lines, at = { ("transcript of %s (%s)"):format(h.session_id, v(h.title) or "untitled") }, 1
    for i, e in ipairs(v(tr.entries) or {}) do
      lines[#lines + 1] = ""
      if i - 1 == h.entry then
        at = #lines + 1
      end
      lines[#lines + 1] = ("[%d] %s  %s"):format(i - 1, e.kind == "compression" and "--" or e.role,
        v(e.time) or "")
      for _, l in ipairs(vim.split(v(e.text) or "", "\n", { plain = true })) do
        lines[#lines + 1] = "    " .. l
      end
    end
    local buf = qc.show("transcript/" .. h.session_id, lines)
    vim.api.nvim_win_set_cursor(0, { at, 0 })
    if cb then
      cb(nil, buf, at)
    end
  end)
end

--- The hit under the cursor in the picker, or nil.
function M.hit_at_cursor()
  local row = vim.api.nvim_win_get_cursor(0)[1]
  return last.hits[row - last.first_line]
end

function M.cmd_search(query, all)
  if not query or not query:find("%S") then
    return vim.notify("qwenctx: usage: :QwenCtxSearch[!] {query}", vim.log.levels.ERROR)
  end
  local qc = require("qwenctx")
  M.search(query, { all = all }, function(err, res)
    if err then
      return vim.notify("qwenctx: search: " .. tostring(err), vim.log.levels.ERROR)
    end
    local hits = v(res.hits) or {}
    local lines, header = M.hit_lines(query, res, all and "all projects" or qc.project_root())
    for _, h in ipairs(hits) do
      lines[#lines + 1] = hit_line(h)
    end
    last = { hits = hits, first_line = header }
    local buf = qc.show("search", lines)
    vim.api.nvim_buf_set_keymap(buf, "n", "<CR>", "", {
      noremap = true, silent = true,
      callback = function()
        local h = M.hit_at_cursor()
        if h then
          M.open_hit(h)
        end
      end,
    })
    if #hits > 0 then
      vim.api.nvim_win_set_cursor(0, { header + 1, 0 })
    end
  end)
end

return M
