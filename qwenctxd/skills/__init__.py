"""Skills: SKILL.md discovery, parsing, precedence, conditional activation and listing."""
