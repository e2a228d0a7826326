-- JSON-RPC 2.0 client for qwenctxd over its Unix socket, NDJSON framing (one JSON per line).
--
-- Works on Neovim 0.7+: raw libuv pipes through `vim.loop` (no `vim.uv`, no
-- `vim.lsp.rpc.connect`). Everything a caller sees runs in the main loop (`vim.schedule`), so
-- callbacks may use the whole API. Errors are tables {kind, code, message, data} with a
-- one-line `tostring`.

local uv = vim.loop

local M = {}

-- JSON ---------------------------------------------------------------------------------------

-- vim.json (lua-cjson) exists since 0.6; vim.fn.json_* are the fallback. Decoding keeps nulls as
-- vim.NIL and empty objects as empty dicts, so re-encoding a result gives back the same JSON.
local encode = (vim.json and vim.json.encode) or vim.fn.json_encode
local decode = (vim.json and vim.json.decode) or vim.fn.json_decode
M.encode, M.decode = encode, decode

-- Errors -------------------------------------------------------------------------------------

local Error = {}
Error.__index = Error
Error.__tostring = function(e)
  return e.message
end

local function one_line(s)
  s = tostring(s or "")
  s = s:gsub("%s*\n%s*", " "):gsub("^%s+", ""):gsub("%s+$", "")
  return s
end
M.one_line = one_line

--- kind: "rpc" (the daemon answered with an error), "transport" (no connection / connection
--- lost), "timeout", "protocol" (an unreadable reply).
function M.error(kind, message, code, data)
  return setmetatable({ kind = kind, message = one_line(message), code = code, data = data }, Error)
end

function M.is_error(v)
  return getmetatable(v) == Error
end

-- Client -------------------------------------------------------------------------------------

local Client = {}
Client.__index = Client

--- opts:
---   path        string | fun(): string   the socket
---   timeout_ms  number                    per request (default 15000; 0 = none)
---   autostart   nil | string[]           a command starting the daemon when nobody listens
---   on_notification fun(method, params)   server notifications (ignored when nil)
function M.new(opts)
  return setmetatable({
    opts = opts or {},
    pipe = nil,
    state = "closed", -- closed | connecting | connected
    gen = 0, -- bumped on every (re)connect; stale callbacks compare and drop out
    next_id = 0,
    pending = {}, -- id -> req, written (or being written) on the current connection
    queue = {}, -- reqs waiting for a connection
    chunks = {}, -- a partial line
  }, Client)
end

function Client:socket_path()
  local p = self.opts.path
  if type(p) == "function" then
    p = p()
  end
  return p
end

local function safe(cb, ...)
  if not cb then
    return
  end
  local ok, err = pcall(cb, ...)
  if not ok then
    vim.notify("qwenctx: callback failed: " .. one_line(err), vim.log.levels.ERROR)
  end
end

local function stop_timer(req)
  if req.timer then
    if not req.timer:is_closing() then
      req.timer:stop()
      req.timer:close()
    end
    req.timer = nil
  end
end

function Client:_finish(req, err, result)
  if req.done then
    return
  end
  req.done = true
  stop_timer(req)
  if req.id then
    self.pending[req.id] = nil
  end
  safe(req.cb, err, result)
end

function Client:_close_pipe()
  local pipe = self.pipe
  self.pipe = nil
  self.chunks = {}
  if pipe and not pipe:is_closing() then
    pcall(pipe.read_stop, pipe)
    pipe:close()
  end
end

--- Closes the connection; requests in flight fail. The next request connects again.
function Client:close()
  self.gen = self.gen + 1
  self:_close_pipe()
  self.state = "closed"
  local reqs = {}
  for _, r in pairs(self.pending) do
    table.insert(reqs, r)
  end
  for _, r in ipairs(self.queue) do
    table.insert(reqs, r)
  end
  self.pending, self.queue = {}, {}
  for _, r in ipairs(reqs) do
    self:_finish(r, M.error("transport", "connection to qwenctxd closed"))
  end
end

function Client:is_connected()
  return self.state == "connected"
end

--- request(method, params, cb[, ropts]) — cb(err, result). params nil or a table (sent as an
--- object; an empty table goes out as {} rather than []). ropts.retry_sent = false: never
--- resend a request that reached the socket before the connection died (not idempotent).
function Client:request(method, params, cb, ropts)
  ropts = ropts or {}
  local req = {
    method = method,
    params = params,
    cb = cb,
    attempts = 0,
    retry_sent = ropts.retry_sent ~= false,
    timeout_ms = ropts.timeout_ms or self.opts.timeout_ms or 15000,
  }
  if req.timeout_ms > 0 then
    req.timer = uv.new_timer()
    req.timer:start(req.timeout_ms, 0, function()
      vim.schedule(function()
        self:_finish(req, M.error("timeout", string.format(
          "%s: no answer from qwenctxd within %d ms", method, req.timeout_ms)))
      end)
    end)
  end
  self:_submit(req)
  return req
end

function Client:_submit(req)
  if req.done then
    return
  end
  req.attempts = req.attempts + 1
  req.written = false
  if self.state == "connected" then
    self:_send(req)
  else
    table.insert(self.queue, req)
    if self.state == "closed" then
      self:_connect(false)
    end
  end
end

function Client:_send(req)
  self.next_id = self.next_id + 1
  req.id = self.next_id
  local msg = { jsonrpc = "2.0", id = req.id, method = req.method }
  if req.params ~= nil then
    msg.params = (next(req.params) == nil) and vim.empty_dict() or req.params
  end
  local ok, line = pcall(encode, msg)
  if not ok then
    return self:_finish(req, M.error("protocol", req.method .. ": params not encodable: " .. tostring(line)))
  end
  self.pending[req.id] = req
  local gen = self.gen
  local wok, werr = pcall(self.pipe.write, self.pipe, line .. "\n", function(err)
    vim.schedule(function()
      if err then
        self:_lost(gen, "write failed: " .. tostring(err))
      elseif not req.done then
        req.written = true
      end
    end)
  end)
  if not wok then
    -- the pipe is closing; treat like a lost connection
    vim.schedule(function()
      self:_lost(gen, "write failed: " .. tostring(werr))
    end)
  end
end

local UNREACHABLE = { ENOENT = true, ECONNREFUSED = true }

local function errname(err)
  return tostring(err):match("^(E[%u]+)") or tostring(err)
end

function Client:_connect(after_autostart)
  self.gen = self.gen + 1
  local gen = self.gen
  self.state = "connecting"
  local path = self:socket_path()
  local pipe = uv.new_pipe(false)
  self.pipe = pipe
  local ok, cerr = pcall(pipe.connect, pipe, path, function(err)
    vim.schedule(function()
      if gen ~= self.gen then
        return
      end
      if err then
        self:_connect_failed(gen, path, err, after_autostart)
      else
        self:_connected(gen)
      end
    end)
  end)
  if not ok then
    vim.schedule(function()
      if gen == self.gen then
        self:_connect_failed(gen, path, cerr, after_autostart)
      end
    end)
  end
end

function Client:_connected(gen)
  self.state = "connected"
  self.pipe:read_start(function(err, chunk)
    if err or not chunk then
      vim.schedule(function()
        self:_lost(gen, err and ("read failed: " .. tostring(err)) or "closed by qwenctxd")
      end)
      return
    end
    vim.schedule(function()
      self:_on_data(gen, chunk)
    end)
  end)
  local queue = self.queue
  self.queue = {}
  for _, req in ipairs(queue) do
    if not req.done then
      self:_send(req)
    end
  end
end

function Client:_connect_failed(gen, path, err, after_autostart)
  self:_close_pipe()
  self.state = "closed"
  local name = errname(err)
  local cmd = self.opts.autostart
  if cmd and not after_autostart and UNREACHABLE[name] and #self.queue > 0 then
    return self:_autostart(gen, path, cmd)
  end
  local msg
  if UNREACHABLE[name] then
    msg = string.format("qwenctxd is not running at %s (%s); start it with `qwenctxd` "
      .. "or `systemctl --user start qwenctxd`", path, name)
  else
    msg = string.format("cannot connect to qwenctxd at %s: %s", path, tostring(err))
  end
  local queue = self.queue
  self.queue = {}
  for _, req in ipairs(queue) do
    self:_finish(req, M.error("transport", msg, name))
  end
end

-- Start the daemon detached, then try to connect every 100 ms for up to 10 s.
function Client:_autostart(gen, path, cmd)
  self.state = "connecting"
  local env = {}
  for k, v in pairs(vim.fn.environ()) do
    if k ~= "QWENCTXD_SOCKET" then
      table.insert(env, k .. "=" .. v)
    end
  end
  table.insert(env, "QWENCTXD_SOCKET=" .. path)
  local args = {}
  for i = 2, #cmd do
    args[#args + 1] = cmd[i]
  end
  local handle, perr = uv.spawn(cmd[1], { args = args, env = env, detached = true }, function()
  end)
  if not handle then
    self.state = "closed"
    local queue = self.queue
    self.queue = {}
    for _, req in ipairs(queue) do
      self:_finish(req, M.error("transport", string.format(
        "qwenctxd is not running at %s and `%s` could not be started: %s", path, cmd[1], tostring(perr))))
    end
    return
  end
  handle:unref()
  local deadline = uv.now() + 10000
  local timer = uv.new_timer()
  local function try()
    if gen ~= self.gen then
      timer:close()
      return
    end
    local probe = uv.new_pipe(false)
    probe:connect(path, function(err)
      probe:close()
      vim.schedule(function()
        if gen ~= self.gen then
          return timer:close()
        end
        if not err then
          timer:close()
          return self:_connect(true)
        end
        if uv.now() > deadline then
          timer:close()
          return self:_connect_failed(gen, path, "did not answer within 10 s after `" .. cmd[1] .. "` started", true)
        end
        timer:start(100, 0, function()
          vim.schedule(try)
        end)
      end)
    end)
  end
  try()
end

-- The connection died (daemon restarted or stopped). Requests not yet answered are sent again
-- once on a fresh connection (unless they were written and are not safe to repeat).
function Client:_lost(gen, reason)
  if gen ~= self.gen then
    return
  end
  self.gen = self.gen + 1
  self:_close_pipe()
  self.state = "closed"
  local ids = {}
  for id in pairs(self.pending) do
    table.insert(ids, id)
  end
  table.sort(ids)
  local retry = {}
  for _, id in ipairs(ids) do
    local req = self.pending[id]
    self.pending[id] = nil
    req.id = nil
    if req.attempts < 2 and (req.retry_sent or not req.written) then
      table.insert(retry, req)
    else
      self:_finish(req, M.error("transport", string.format(
        "%s: connection to qwenctxd lost (%s)", req.method, reason)))
    end
  end
  for _, req in ipairs(retry) do
    self:_submit(req)
  end
end

function Client:_on_data(gen, chunk)
  if gen ~= self.gen then
    return
  end
  if not chunk:find("\n", 1, true) then
    table.insert(self.chunks, chunk)
    return
  end
  table.insert(self.chunks, chunk)
  local data = table.concat(self.chunks)
  self.chunks = {}
  local start = 1
  while true do
    local nl = data:find("\n", start, true)
    if not nl then
      break
    end
    local line = data:sub(start, nl - 1)
    start = nl + 1
    if line:find("%S") then
      self:_on_line(line)
      if gen ~= self.gen then
        return -- a callback closed or reset the connection
      end
    end
  end
  if start <= #data then
    self.chunks = { data:sub(start) }
  end
end

function Client:_on_line(line)
  local ok, msg = pcall(decode, line)
  if not ok or type(msg) ~= "table" then
    vim.notify("qwenctx: unreadable reply from qwenctxd: " .. one_line(line):sub(1, 120), vim.log.levels.ERROR)
    return
  end
  if msg.method ~= nil and msg.id == nil then
    if self.opts.on_notification then
      safe(self.opts.on_notification, msg.method, msg.params)
    end
    return
  end
  local req = type(msg.id) == "number" and self.pending[msg.id] or nil
  if not req then
    if msg.error ~= nil and msg.error ~= vim.NIL then
      vim.notify("qwenctx: qwenctxd: " .. one_line(msg.error.message), vim.log.levels.ERROR)
    end
    return
  end
  if msg.error ~= nil and msg.error ~= vim.NIL then
    local e = msg.error
    local data = e.data
    if data == vim.NIL then
      data = nil
    end
    self:_finish(req, M.error("rpc", e.message or "error", e.code, data))
  else
    self:_finish(req, nil, msg.result)
  end
end

return M
