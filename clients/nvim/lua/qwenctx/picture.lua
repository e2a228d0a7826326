-- Text renderings of daemon answers (pure functions: tables in, lines out).

local M = {}

-- JSON null arrives as vim.NIL (truthy); treat it as absent.
local function v(x)
  if x == vim.NIL then
    return nil
  end
  return x
end
M.v = v

--- 1234567 -> "1,234,567"
function M.int(n)
  n = v(n)
  if type(n) ~= "number" then
    return "?"
  end
  local s = tostring(math.floor(n + 0.5))
  local neg = s:sub(1, 1) == "-"
  if neg then
    s = s:sub(2)
  end
  s = s:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", "")
  return (neg and "-" or "") .. s
end

function M.pct(x)
  x = v(x)
  if type(x) ~= "number" then
    return "?"
  end
  return string.format("%.1f%%", x)
end

function M.bytes(n)
  n = v(n)
  if type(n) ~= "number" then
    return "?"
  end
  local units = { "B", "KiB", "MiB", "GiB" }
  local i = 1
  while n >= 1024 and i < #units do
    n = n / 1024
    i = i + 1
  end
  return i == 1 and string.format("%d B", n) or string.format("%.1f %s", n, units[i])
end

function M.duration(s)
  s = math.floor(tonumber(v(s)) or 0)
  if s < 60 then
    return s .. "s"
  elseif s < 3600 then
    return string.format("%dm %ds", s / 60, s % 60)
  elseif s < 86400 then
    return string.format("%dh %dm", s / 3600, (s % 3600) / 60)
  end
  return string.format("%dd %dh", s / 86400, (s % 86400) / 3600)
end

--- rows: list of lists of strings; returns aligned lines (two spaces between columns).
--- right: set of column indexes to right-align ({[3] = true}); indent: spaces before rows.
function M.table(rows, headers, right, indent)
  right = right or {}
  local all = {}
  if headers then
    table.insert(all, headers)
  end
  for _, r in ipairs(rows) do
    table.insert(all, r)
  end
  local widths = {}
  for _, r in ipairs(all) do
    for i, c in ipairs(r) do
      widths[i] = math.max(widths[i] or 0, vim.fn.strdisplaywidth(c))
    end
  end
  local out = {}
  local lead = string.rep(" ", indent or 0)
  for _, r in ipairs(all) do
    local cells = {}
    for i, c in ipairs(r) do
      local pad = string.rep(" ", widths[i] - vim.fn.strdisplaywidth(c))
      cells[i] = right[i] and (pad .. c) or (c .. pad)
    end
    local line = (lead .. table.concat(cells, "  ")):gsub("%s+$", "")
    table.insert(out, line)
  end
  return out
end

local function short_id(id)
  id = v(id)
  if type(id) ~= "string" then
    return "?"
  end
  return id:sub(1, 8)
end
M.short_id = short_id

-- Context picture (the same letters, labels and cell rules as `qwenctl context` piped) --------

-- part name -> { label, letter }
M.PARTS = {
  system_base = { "system base", "S" },
  instructions = { "instructions", "I" },
  memory = { "memory", "M" },
  system_other = { "system other", "O" },
  tools = { "tools", "T" },
  skills = { "skills", "K" },
  reminders = { "reminders", "N" },
  history_user = { "user messages", "U" },
  history_assistant = { "assistant messages", "A" },
  history_tool_results = { "tool results", "R" },
}
M.FREE = { "free", "." }
M.MARKS = { { "warn", "W" }, { "auto", "A" }, { "hard", "H" } }

function M.part_style(name)
  local s = M.PARTS[name]
  if s then
    return s[1], s[2]
  end
  return (tostring(name):gsub("_", " ")), "?"
end

--- Cells of a `width`-cell bar for each part (>= 1 when its tokens > 0) and the free
--- remainder; the used cells follow sum(tokens) / window, a full window fills the bar.
function M.cells(tokens, window, width)
  local used_tok, nonzero, cells = 0, {}, {}
  for i, t in ipairs(tokens) do
    cells[i] = 0
    used_tok = used_tok + math.max(0, t)
    if t > 0 then
      table.insert(nonzero, i)
    end
  end
  if #nonzero == 0 then
    return cells, width
  end
  local share = window > 0 and used_tok / window or 1.0
  local used = math.min(width, math.max(#nonzero, math.floor(share * width + 0.5)))
  if used < #nonzero then -- narrower than the parts: the largest parts win
    table.sort(nonzero, function(a, b)
      return tokens[a] > tokens[b]
    end)
    for k = 1, used do
      cells[nonzero[k]] = 1
    end
    return cells, width - used
  end
  local exact, sum = {}, 0
  for _, i in ipairs(nonzero) do
    exact[i] = tokens[i] * used / used_tok
    cells[i] = math.max(1, math.floor(exact[i]))
    sum = sum + cells[i]
  end
  local diff = used - sum
  if diff > 0 then -- the rest by largest remainder
    local order = vim.deepcopy(nonzero)
    table.sort(order, function(a, b)
      return exact[a] - cells[a] > exact[b] - cells[b]
    end)
    for k = 1, diff do
      cells[order[k]] = cells[order[k]] + 1
    end
  end
  while diff < 0 do -- the one-cell minimum overshot: take from the most over-served
    local best
    for _, i in ipairs(nonzero) do
      if cells[i] > 1 and (not best or cells[i] - exact[i] > cells[best] - exact[best]) then
        best = i
      end
    end
    if not best then
      break
    end
    cells[best] = cells[best] - 1
    diff = diff + 1
  end
  return cells, width - used
end

--- The line under the bar: ^W ^A ^H under the cells where the thresholds fall.
function M.marks(th, window, width)
  if window <= 0 then
    return ""
  end
  local marks = {}
  for _, m in ipairs(M.MARKS) do
    local t = tonumber(v(th[m[1]]))
    if t then
      table.insert(marks, { math.min(width - 1, math.max(0, math.floor(t * width / window))), "^" .. m[2] })
    end
  end
  table.sort(marks, function(a, b)
    return a[1] < b[1]
  end)
  local starts, cursor = {}, 0
  for i, m in ipairs(marks) do
    starts[i] = math.max(m[1], cursor)
    cursor = starts[i] + #m[2]
  end
  local limit = width
  for i = #marks, 1, -1 do
    starts[i] = math.max(0, math.min(starts[i], limit - #marks[i][2]))
    limit = starts[i]
  end
  local line = {}
  for i = 1, width do
    line[i] = " "
  end
  for i, m in ipairs(marks) do
    for j = 1, #m[2] do
      if starts[i] + j <= width then
        line[starts[i] + j] = m[2]:sub(j, j)
      end
    end
  end
  return (table.concat(line):gsub("%s+$", ""))
end

--- ctx: a session.context answer; info: {cwd, note}; width: the bar's. Returns lines.
function M.context_lines(ctx, info, width)
  info = info or {}
  width = math.max(20, width or 80)
  local window = tonumber(v(ctx.window_tokens)) or 0
  local parts = v(ctx.parts) or {}
  local tokens = {}
  for i, p in ipairs(parts) do
    tokens[i] = tonumber(v(p.tokens)) or 0
  end
  local cells, free_cells = M.cells(tokens, window, width)
  local th = v(ctx.thresholds) or {}
  local used = tonumber(v(ctx.prompt_tokens)) or 0
  local lines = {
    string.format("context of session %s: %s / %s tokens%s, level %s%s",
      tostring(v(ctx.session_id) or info.session_id or "?"), M.int(used), M.int(window),
      window > 0 and string.format(" (%.1f%%)", 100 * used / window) or "",
      tostring(v(ctx.level) or "?"), v(ctx.anchored) and ", API-anchored" or ", estimated"),
  }
  if info.cwd then
    table.insert(lines, "project " .. info.cwd)
  end
  if info.note then
    table.insert(lines, info.note)
  end
  local bar, legend = {}, {}
  for i, p in ipairs(parts) do
    local label, letter = M.part_style(v(p.name))
    table.insert(bar, string.rep(letter, cells[i]))
    table.insert(legend, letter .. "=" .. label)
  end
  table.insert(bar, string.rep(M.FREE[2], free_cells))
  table.insert(legend, M.FREE[2] .. "=" .. M.FREE[1])
  table.insert(lines, "")
  table.insert(lines, table.concat(bar))
  table.insert(lines, M.marks(th, window, width))
  table.insert(lines, "legend: " .. table.concat(legend, "  "))
  local ths = {}
  for _, m in ipairs(M.MARKS) do
    local t = tonumber(v(th[m[1]]))
    if t then
      table.insert(ths, string.format("^%s %s %s%s", m[2], m[1], M.int(t),
        window > 0 and string.format(" (%.0f%%)", 100 * t / window) or ""))
    end
  end
  table.insert(lines, "thresholds: " .. table.concat(ths, "  "))
  table.insert(lines, "")
  local rows = {}
  for i, p in ipairs(parts) do
    local label, letter = M.part_style(v(p.name))
    table.insert(rows, { letter, label, M.int(tokens[i]), M.pct(v(p.pct) or 0) })
  end
  table.insert(rows, { M.FREE[2], "free", M.int(v(ctx.free_tokens) or 0), M.pct(v(ctx.free_pct) or 0) })
  table.insert(rows, { "", "total in prompt", M.int(used),
    window > 0 and M.pct(100 * used / window) or "-" })
  table.insert(lines, "parts")
  for _, l in ipairs(M.table(rows, { "", "part", "tokens", "% of window" }, { [3] = true, [4] = true }, 2)) do
    table.insert(lines, l)
  end
  return lines
end

-- Status -------------------------------------------------------------------------------------

function M.status_lines(st)
  local bg = v(st.background) or {}
  local model = v(st.model) or {}
  local in_flight = v(bg.in_flight) or {}
  local rows = {
    { "state", tostring(v(st.state) or "?") },
    { "pid", tostring(v(st.pid) or "?") },
    { "version", string.format("%s (protocol %s)", tostring(v(st.version) or "?"), tostring(v(st.protocol) or "?")) },
    { "uptime", M.duration(st.uptime_s) },
    { "socket", tostring(v(st.socket) or "?") .. (v(st.activated) and "  [socket-activated]" or "") },
    { "memory (RSS)", M.bytes(st.rss_bytes) },
    { "connections", string.format("%s open, %s requests served", M.int(v(st.connections) or 0), M.int(v(st.requests) or 0)) },
    { "sessions", tostring(#(v(st.sessions) or {})) },
    { "projects", tostring(#(v(st.projects) or {})) },
    { "background", string.format("%d running, %s queued, %s done, %s failed", #in_flight,
      M.int(v(bg.queued) or 0), M.int(v(bg.completed) or 0), M.int(v(bg.failed) or 0)) },
    { "model", v(model.configured) and string.format("%s (%s calls, %s failures)",
      tostring(v(model.model) or "?"), M.int(v(model.calls) or 0), M.int(v(model.failures) or 0))
      or "not configured" },
  }
  local lines = { "qwenctxd status", "" }
  for _, l in ipairs(M.table(rows)) do
    table.insert(lines, l)
  end
  local sessions = v(st.sessions) or {}
  if #sessions > 0 then
    table.insert(lines, "")
    table.insert(lines, "open sessions")
    local srows = {}
    for _, s in ipairs(sessions) do
      table.insert(srows, {
        short_id(s.session_id),
        M.int(v(s.messages) or 0),
        M.int(v(s.prompt_tokens)) .. "/" .. M.int(v(s.window_tokens)),
        tostring(v(s.level) or "?"),
        tostring(v(s.cwd) or "?"),
      })
    end
    for _, l in ipairs(M.table(srows, { "session", "msgs", "tokens", "level", "cwd" }, { [2] = true, [3] = true })) do
      table.insert(lines, l)
    end
  end
  return lines
end

--- A one-line summary for vim.notify.
function M.status_summary(st)
  return string.format("qwenctxd %s: pid %s, up %s, %d sessions, %s",
    tostring(v(st.state) or "?"), tostring(v(st.pid) or "?"), M.duration(st.uptime_s),
    #(v(st.sessions) or {}), M.bytes(st.rss_bytes))
end

-- Recall / sessions --------------------------------------------------------------------------

function M.recall_lines(query, res)
  local docs = v(res.docs) or {}
  local lines = {
    "qwenctx recall: " .. query,
    string.format("strategy %s%s, %d memories", tostring(v(res.strategy) or "?"),
      v(res.fell_back) and (" (fell back: " .. tostring(v(res.fell_back)) .. ")") or "", #docs),
    "",
  }
  if #docs == 0 then
    table.insert(lines, "no memories matched")
    return lines
  end
  local rows = {}
  for _, d in ipairs(docs) do
    local score = v(d.score)
    table.insert(rows, {
      type(score) == "number" and string.format("%.2f", score) or "-",
      tostring(v(d.scope) or "?"), tostring(v(d.type) or "?"),
      tostring(v(d.name) or "?"), tostring(v(d.path) or "?"),
    })
  end
  for _, l in ipairs(M.table(rows, { "score", "scope", "type", "name", "path" }, { [1] = true })) do
    table.insert(lines, l)
  end
  local prompt = v(res.prompt)
  if type(prompt) == "string" and prompt ~= "" then
    table.insert(lines, "")
    for _, l in ipairs(vim.split(prompt, "\n", { plain = true })) do
      table.insert(lines, l)
    end
  end
  return lines
end

function M.sessions_lines(root, res, current)
  local sessions = v(res.sessions) or {}
  local lines = { "qwenctx sessions: " .. root, "" }
  if #sessions == 0 then
    table.insert(lines, "no sessions for this project")
    return lines
  end
  local rows = {}
  for _, s in ipairs(sessions) do
    table.insert(rows, {
      (s.session_id == current) and "*" or " ",
      tostring(v(s.session_id) or "?"),
      v(s.open) and "open" or "",
      M.int(v(s.messages) or 0),
      tostring(v(s.updated_at) or ""),
      tostring(v(s.title) or ""),
    })
  end
  for _, l in ipairs(M.table(rows, { " ", "session", "", "msgs", "updated", "title" }, { [4] = true })) do
    table.insert(lines, l)
  end
  if current then
    table.insert(lines, "")
    table.insert(lines, "* the session require('qwenctx').assemble() continues")
  end
  return lines
end

--- prompt.system for a project: a summary (sections, files, problems, prefix hash), a rule,
--- then the prompt text itself, line by line.
function M.prompt_lines(root, res)
  local lines = { "qwenctx prompt: " .. root, "" }
  local rows, total_chars, total_tokens = {}, 0, 0
  for _, s in ipairs(v(res.sections) or {}) do
    table.insert(rows, { tostring(s.name), M.int(s.chars), M.int(s.est_tokens) })
    total_chars = total_chars + (v(s.chars) or 0)
    total_tokens = total_tokens + (v(s.est_tokens) or 0)
  end
  table.insert(rows, { "total", M.int(total_chars), M.int(total_tokens) })
  for _, l in ipairs(M.table(rows, { "section", "chars", "est_tokens" }, { [2] = true, [3] = true })) do
    table.insert(lines, l)
  end
  local files = v(res.files) or {}
  table.insert(lines, "")
  table.insert(lines, #files == 0 and "files: none" or "files")
  for _, f in ipairs(files) do
    table.insert(lines, "  " .. tostring(v(f.type) or "?") .. "  " .. tostring(v(f.path) or "?"))
  end
  local problems = v(res.errors) or {}
  table.insert(lines, #problems == 0 and "problems: none" or "problems")
  for _, e in ipairs(problems) do
    table.insert(lines, "  " .. tostring(v(e.kind) or "?") .. "  " .. tostring(v(e.path) or "")
      .. ": " .. tostring(v(e.message) or ""))
  end
  table.insert(lines, "prefix hash: " .. tostring(v(res.prefix_hash) or "?"))
  table.insert(lines, string.rep("-", 72))
  for _, l in ipairs(vim.split(tostring(v(res.text) or ""), "\n", { plain = true })) do
    table.insert(lines, l)
  end
  return lines
end

return M
