-- qwenctx: Neovim client of qwenctxd (the per-user context daemon).
--
--   require('qwenctx').setup({ socket = nil, model = "qwen3-coder-plus", autostart = false })
--   require('qwenctx').assemble({ text = "fix the failing test" }, function(err, prompt) ... end)
--
-- Neovim 0.7+, no dependencies. See docs/clients.md ("Neovim").

local rpc = require("qwenctx.rpc")
local picture = require("qwenctx.picture")

local uv = vim.loop
local v = picture.v

local M = {}

M.SESSION_NOT_FOUND = -32001
M.METHOD_NOT_FOUND = -32601

local defaults = {
  socket = nil, -- nil: $QWENCTXD_SOCKET, else $XDG_RUNTIME_DIR/qwenctxd/qwenctxd.sock, else /tmp/qwenctxd-<uid>/qwenctxd.sock
  model = "qwen3-coder-plus", -- the model sessions are opened for
  window_tokens = nil, -- nil: the daemon's default for the model
  autostart = false, -- start the daemon (cmd) when nobody listens on the socket
  cmd = { "qwenctxd" }, -- how autostart runs the daemon
  timeout_ms = 15000, -- per request
}

local config = vim.deepcopy(defaults)

local state = {
  client = nil,
  sessions = {}, -- project root -> session_id (the sessions assemble() continues)
  opening = {}, -- project root -> callbacks waiting for session.open
  session_opts = {}, -- project root -> session.open options given to assemble()
  views = {}, -- view name -> scratch buffer
  -- session_id -> { epoch, messages }: the history assemble() received, so session.turn sends
  -- `known` and the daemon replies with only the new messages (`messages_from`)
  histories = {},
}

-- Helpers ------------------------------------------------------------------------------------

local function notify(msg, level)
  vim.notify("qwenctx: " .. rpc.one_line(msg), level or vim.log.levels.INFO)
end

local function notify_err(what, err)
  local level = (type(err) == "table" and err.kind == "usage") and vim.log.levels.WARN or vim.log.levels.ERROR
  notify(what .. ": " .. tostring(err), level)
end

local function call_cb(cb, ...)
  if not cb then
    return
  end
  local ok, e = pcall(cb, ...)
  if not ok then
    notify("callback failed: " .. tostring(e), vim.log.levels.ERROR)
  end
end

local function is_dir(p)
  local st = p and uv.fs_stat(p)
  return st ~= nil and st.type == "directory"
end

local function strip_slash(p)
  if #p > 1 then
    p = p:gsub("/+$", "")
  end
  return p
end

local function parent(p)
  local par = p:match("^(.*)/[^/]*$")
  if par == nil or par == "" then
    return "/"
  end
  return par
end

-- Socket and project -------------------------------------------------------------------------

--- The socket in use: setup's `socket`, else the daemon's own rules.
function M.socket_path()
  if config.socket and config.socket ~= "" then
    return vim.fn.expand(config.socket)
  end
  local env = os.getenv("QWENCTXD_SOCKET")
  if env and env ~= "" then
    return env
  end
  local xdg = os.getenv("XDG_RUNTIME_DIR")
  if xdg and xdg ~= "" then
    return strip_slash(xdg) .. "/qwenctxd/qwenctxd.sock"
  end
  return string.format("/tmp/qwenctxd-%d/qwenctxd.sock", uv.getuid())
end

--- The project a buffer belongs to: the nearest ancestor (of its file's directory) holding
--- .git, else that directory; buffers without a file start from getcwd().
function M.project_root(bufnr)
  bufnr = bufnr or 0
  local start
  local name = vim.api.nvim_buf_get_name(bufnr)
  if name ~= "" and not name:match("^%a[%w+.-]*://") then
    local full = vim.fn.fnamemodify(name, ":p")
    if is_dir(full) then
      start = full
    else
      start = vim.fn.fnamemodify(full, ":h")
    end
  end
  if not is_dir(start) then
    start = vim.fn.getcwd()
  end
  start = strip_slash(uv.fs_realpath(start) or start)
  local cur = start
  while true do
    if uv.fs_stat(cur .. "/.git") then
      return cur
    end
    local up = parent(cur)
    if up == cur then
      break
    end
    cur = up
  end
  return start
end

-- Connection ---------------------------------------------------------------------------------

local function client()
  if not state.client then
    state.client = rpc.new({
      path = M.socket_path,
      timeout_ms = config.timeout_ms,
      autostart = config.autostart and config.cmd or nil,
    })
  end
  return state.client
end

--- Low-level call: cb(err, result) — err is nil or {kind, code, message, data} (tostring gives
--- the message). Does not notify; the commands and assemble() do.
function M.request(method, params, cb, ropts)
  return client():request(method, params, function(err, res)
    call_cb(cb, err, res)
  end, ropts)
end

function M.setup(opts)
  opts = opts or {}
  vim.validate({
    socket = { opts.socket, "string", true },
    model = { opts.model, "string", true },
    window_tokens = { opts.window_tokens, "number", true },
    autostart = { opts.autostart, "boolean", true },
    cmd = { opts.cmd, "table", true },
    timeout_ms = { opts.timeout_ms, "number", true },
  })
  config = vim.tbl_extend("force", vim.deepcopy(defaults), opts)
  if state.client then
    state.client:close()
    state.client = nil
  end
  state.sessions, state.opening = {}, {}
  return M
end

function M.config()
  return vim.deepcopy(config)
end

-- Sessions -----------------------------------------------------------------------------------

local function normalize_dir(cwd)
  local full = strip_slash(vim.fn.fnamemodify(vim.fn.expand(cwd), ":p"))
  return strip_slash(uv.fs_realpath(full) or full)
end

-- session.open; with resume_sid, re-open that session from its record (after a daemon restart);
-- if it has no record, a new session is opened instead (with a warning).
local function open_session(root, model, resume_sid, cb)
  local params = { cwd = root, model = model, window_tokens = config.window_tokens }
  -- the session options assemble() was given (tools, agent, keep_reasoning, window_tokens,
  -- auto_compact_threshold); on a resume the daemon restores the recorded ones unless set
  for k, val in pairs(state.session_opts[root] or {}) do
    params[k] = val
  end
  if resume_sid then
    params.session_id = resume_sid
    params.resume = true
  end
  M.request("session.open", params, function(err, res)
    if err and resume_sid and err.code == M.SESSION_NOT_FOUND then
      notify(string.format("session %s could not be resumed (%s); starting a new one",
        picture.short_id(resume_sid), tostring(err)), vim.log.levels.WARN)
      return open_session(root, model, nil, cb)
    end
    if err then
      return cb(err)
    end
    state.sessions[root] = res.session_id
    cb(nil, res.session_id, res)
  end)
end

local function ensure_session(root, model, cb)
  local sid = state.sessions[root]
  if sid then
    return cb(nil, sid)
  end
  if state.opening[root] then
    table.insert(state.opening[root], cb)
    return
  end
  local waiting = { cb }
  state.opening[root] = waiting
  open_session(root, model, nil, function(err, new_sid)
    if state.opening[root] == waiting then
      state.opening[root] = nil
    end
    for _, w in ipairs(waiting) do
      w(err, new_sid)
    end
  end)
end

-- Call `method` with params(session_id) for the project's session; a session the daemon no
-- longer knows (it restarted) is resumed and the call retried once.
local function session_call(root, model, method, params, cb, ropts)
  ensure_session(root, model, function(err, sid)
    if err then
      return cb(err)
    end
    M.request(method, params(sid), function(err2, res)
      if err2 and err2.code == M.SESSION_NOT_FOUND and state.sessions[root] == sid then
        return open_session(root, model, sid, function(err3, sid2)
          if err3 then
            return cb(err3)
          end
          M.request(method, params(sid2), cb, ropts)
        end)
      end
      cb(err2, res)
    end, ropts)
  end)
end

--- The session assemble() uses for a project (nil before the first assemble()).
function M.session_id(root)
  return state.sessions[root or M.project_root()]
end

--- assemble(opts, cb): a user turn in the project's session; cb(err, prompt) gets the
--- AssembledPrompt {system, messages, tools, reminders, usage, events, prefix_hash, session_id}.
--- opts: text (required), cwd (default: the current buffer's project root), model (default:
--- setup's), touched_paths (optional list of paths for conditional rules and skills), and the
--- session options used when the project's session is opened: tools (OpenAI tool
--- declarations), agent ({name, version}), keep_reasoning ("none"|"current_turn"|"all"),
--- window_tokens, auto_compact_threshold.
local SESSION_OPTS = { "tools", "agent", "keep_reasoning", "window_tokens", "auto_compact_threshold" }

function M.assemble(opts, cb)
  opts = opts or {}
  if type(opts.text) ~= "string" or opts.text == "" then
    local err = rpc.error("usage", "opts.text must be a non-empty string")
    notify_err("assemble", err)
    return call_cb(cb, err)
  end
  local root = opts.cwd and normalize_dir(opts.cwd) or M.project_root()
  local model = opts.model or config.model
  local sopts = {}
  for _, k in ipairs(SESSION_OPTS) do
    sopts[k] = opts[k]
  end
  if next(sopts) ~= nil then
    state.session_opts[root] = sopts
  end
  local sent_sid
  session_call(root, model, "session.turn", function(sid)
    sent_sid = sid
    local h = state.histories[sid]
    local known = h and { epoch = h.epoch, count = #h.messages } or nil
    return { session_id = sid, kind = "user", text = opts.text, touched_paths = opts.touched_paths,
      known = known }
  end, function(err, prompt)
    if err then
      notify_err("assemble", err)
      return call_cb(cb, err)
    end
    call_cb(cb, nil, M.apply_turn(sent_sid, prompt))
  end, { retry_sent = false })
end

--- apply_turn(session_id, prompt): splice a session.turn reply (sent with `known`) into the
--- session's kept history; returns the prompt with the full history as `messages`.
function M.apply_turn(sid, prompt)
  local h = state.histories[sid]
  local from = prompt.messages_from or 0
  local full
  if h and type(from) == "number" and from > 0 and from <= #h.messages then
    full = {}
    for i = 1, from do
      full[i] = h.messages[i]
    end
    for _, m in ipairs(prompt.messages) do
      table.insert(full, m)
    end
  else
    full = prompt.messages
  end
  if type(prompt.epoch) == "string" and prompt.epoch ~= "" then
    state.histories[sid] = { epoch = prompt.epoch, messages = full }
  else
    state.histories[sid] = nil
  end
  local copy = {}
  for i, m in ipairs(full) do
    copy[i] = m
  end
  prompt.messages = copy
  prompt.messages_from = 0
  return prompt
end

function M.status(cb)
  M.request("daemon.status", nil, cb)
end

function M.recall(query, opts, cb)
  opts = opts or {}
  local root = opts.cwd and normalize_dir(opts.cwd) or M.project_root()
  M.request("memory.recall", { cwd = root, query = query }, cb)
end

--- search(query, opts, cb): session.search over past sessions (see qwenctx.search).
function M.search(query, opts, cb)
  return require("qwenctx.search").search(query, opts, cb)
end

function M.sessions(opts, cb)
  opts = opts or {}
  local root = opts.cwd and normalize_dir(opts.cwd) or M.project_root()
  M.request("session.list", { cwd = root }, function(err, res)
    cb(err, res, root)
  end)
end

--- prompt(opts, cb): cb(err, res, root) — prompt.system for a project (opts.cwd, default the
--- current buffer's project root; opts.model, default setup's).
function M.prompt(opts, cb)
  opts = opts or {}
  local root = opts.cwd and normalize_dir(opts.cwd) or M.project_root()
  M.request("prompt.system", { cwd = root, model = opts.model or config.model }, function(err, res)
    cb(err, res, root)
  end)
end

--- set_title(opts, cb): names the session assemble() continues for a project; cb(err, res)
--- gets the session.set_title result {session_id, title}. opts: title (required), cwd (default:
--- the current buffer's project root).
function M.set_title(opts, cb)
  opts = opts or {}
  if type(opts.title) ~= "string" or not opts.title:find("%S") then
    return call_cb(cb, rpc.error("usage", "opts.title must be a non-blank string"))
  end
  local root = opts.cwd and normalize_dir(opts.cwd) or M.project_root()
  local sid = state.sessions[root]
  if not sid then
    return call_cb(cb, rpc.error("usage", "no session for " .. root .. " yet (assemble() opens one)"))
  end
  M.request("session.set_title", { session_id = sid, title = opts.title }, cb)
end

--- context(opts, cb): cb(err, ctx, info) — the session.context answer for the project's
--- session: the one assemble() continues, else the newest in session.list (preferring open
--- ones). A session the daemon does not hold (it restarted, or was closed) is resumed for the
--- call — and closed again unless it is the one assemble() continues. info = {session_id, cwd}.
function M.context(opts, cb)
  opts = opts or {}
  local root = opts.cwd and normalize_dir(opts.cwd) or M.project_root()
  local model = opts.model or config.model

  local function fetch(sid, resumed)
    M.request("session.context", { session_id = sid }, function(err, ctx)
      if err and err.code == M.METHOD_NOT_FOUND then
        return cb(rpc.error("rpc", "this qwenctxd has no session.context; restart it "
          .. "(qwenctl stop) to run the installed version", err.code))
      end
      if err and err.code == M.SESSION_NOT_FOUND and not resumed then
        local ours = state.sessions[root] == sid
        return M.request("session.open", { cwd = root, model = model, session_id = sid, resume = true },
          function(err2)
            if err2 then
              return cb(err2)
            end
            fetch(sid, ours and "ours" or "borrowed")
          end)
      end
      if resumed == "borrowed" then
        M.request("session.close", { session_id = sid }, function() end)
      end
      cb(err, ctx, { session_id = sid, cwd = root })
    end)
  end

  local sid = state.sessions[root]
  if sid then
    return fetch(sid, false)
  end
  M.request("session.list", { cwd = root }, function(err, res)
    if err then
      return cb(err)
    end
    local pick
    for _, s in ipairs(v(res.sessions) or {}) do
      if v(s.open) and not pick then
        pick = s
      end
    end
    pick = pick or (v(res.sessions) or {})[1]
    if not pick then
      return cb(rpc.error("usage", "no session for " .. root
        .. " yet (require('qwenctx').assemble() opens one)"))
    end
    fetch(pick.session_id, false)
  end)
end

-- Scratch views ------------------------------------------------------------------------------

--- Shows lines in the scratch buffer `qwenctx://<name>` (reused), in a split unless a window
--- of this tab already shows it. Returns the buffer.
function M.show(name, lines)
  local buf = state.views[name]
  if not (buf and vim.api.nvim_buf_is_valid(buf)) then
    buf = vim.api.nvim_create_buf(false, true)
    state.views[name] = buf
    pcall(vim.api.nvim_buf_set_name, buf, "qwenctx://" .. name)
    vim.api.nvim_buf_set_option(buf, "bufhidden", "hide")
    vim.api.nvim_buf_set_option(buf, "filetype", "qwenctx")
    vim.api.nvim_buf_set_keymap(buf, "n", "q", "<cmd>close<CR>", { noremap = true, silent = true })
  end
  vim.api.nvim_buf_set_option(buf, "modifiable", true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  vim.api.nvim_buf_set_option(buf, "modified", false)
  local win
  for _, w in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
    if vim.api.nvim_win_get_buf(w) == buf then
      win = w
    end
  end
  if win then
    vim.api.nvim_set_current_win(win)
  else
    vim.cmd("botright split")
    vim.api.nvim_win_set_buf(0, buf)
    vim.api.nvim_win_set_height(0, math.max(3, math.min(#lines + 1, math.floor(vim.o.lines / 2))))
  end
  return buf
end

function M.view_buffer(name)
  local buf = state.views[name]
  if buf and vim.api.nvim_buf_is_valid(buf) then
    return buf
  end
end

-- Commands -----------------------------------------------------------------------------------

function M.cmd_status()
  M.status(function(err, st)
    if err then
      return notify_err("status", err)
    end
    M.show("status", picture.status_lines(st))
    notify(picture.status_summary(st))
  end)
end

function M.cmd_context()
  M.context({}, function(err, ctx, info)
    if err then
      return notify_err("context", err)
    end
    local width = math.max(20, math.min(vim.o.columns - 4, 120))
    M.show("context", picture.context_lines(ctx, info, width))
  end)
end

function M.cmd_recall(query)
  if not query or not query:find("%S") then
    return notify("usage: :QwenCtxRecall {query}", vim.log.levels.ERROR)
  end
  M.recall(query, {}, function(err, res)
    if err then
      return notify_err("recall", err)
    end
    M.show("recall", picture.recall_lines(query, res))
  end)
end

function M.cmd_prompt()
  M.prompt({}, function(err, res, root)
    if err then
      return notify_err("prompt", err)
    end
    M.show("prompt", picture.prompt_lines(root, res))
  end)
end

function M.cmd_title(text)
  if not text or not text:find("%S") then
    return notify("usage: :QwenCtxTitle {title}", vim.log.levels.ERROR)
  end
  M.set_title({ title = text }, function(err, res)
    if err then
      return notify_err("title", err)
    end
    notify("session " .. res.session_id:sub(1, 8) .. " is now titled: " .. res.title)
  end)
end

function M.cmd_sessions()
  M.sessions({}, function(err, res, root)
    if err then
      return notify_err("sessions", err)
    end
    M.show("sessions", picture.sessions_lines(root, res, state.sessions[root]))
  end)
end

return M
