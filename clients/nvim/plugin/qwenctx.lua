-- User commands of the qwenctx plugin (client of qwenctxd). Configure with
-- require('qwenctx').setup({...}); the commands work with the defaults too.
if vim.g.loaded_qwenctx then
  return
end
vim.g.loaded_qwenctx = true

if vim.fn.has("nvim-0.7") ~= 1 then
  vim.notify("qwenctx: needs Neovim 0.7 or newer", vim.log.levels.ERROR)
  return
end

local function cmd(name, fn, opts)
  vim.api.nvim_create_user_command(name, function(a)
    local ok, err = pcall(fn, a)
    if not ok then
      vim.notify("qwenctx: " .. tostring(err):gsub("%s*\n%s*", " "), vim.log.levels.ERROR)
    end
  end, opts)
end

cmd("QwenCtxStatus", function()
  require("qwenctx").cmd_status()
end, { nargs = 0, desc = "qwenctxd: daemon status" })

cmd("QwenCtxContext", function()
  require("qwenctx").cmd_context()
end, { nargs = 0, desc = "qwenctxd: context window picture of this project's session" })

cmd("QwenCtxRecall", function(a)
  require("qwenctx").cmd_recall(a.args)
end, { nargs = "+", desc = "qwenctxd: memories recalled for a query" })

cmd("QwenCtxSessions", function()
  require("qwenctx").cmd_sessions()
end, { nargs = 0, desc = "qwenctxd: sessions of this project" })

cmd("QwenCtxTitle", function(a)
  require("qwenctx").cmd_title(a.args)
end, { nargs = "+", desc = "qwenctxd: title this project's session" })

cmd("QwenCtxPrompt", function()
  require("qwenctx").cmd_prompt()
end, { nargs = 0, desc = "qwenctxd: the system prompt this project's sessions get" })

for _, name in ipairs({ "QwenCtxSearch", "QwenctxSearch" }) do
  cmd(name, function(a)
    require("qwenctx.search").cmd_search(a.args, a.bang)
  end, { nargs = "+", bang = true, desc = "qwenctxd: search past sessions (! every project)" })
end
