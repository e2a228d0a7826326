"""Instructions and the system prompt: layered QWEN.md/AGENTS.md discovery, @import, rules,
the base prompt sections, and the per-project cache that watchers keep fresh."""
