"""Background agents: forked-agent runner, tools, permission scope, extraction, audit log."""
