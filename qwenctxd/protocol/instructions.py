"""Wire types of ``prompt.system`` and the ``instructions.*`` methods, and the prefix hash."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from qwenctxd.protocol.daemon import Params

InteractionMode = Literal["interactive", "headless", "acp"]

# The environment variables that shape the system prompt; a client passes its own values in
# ``PromptSystemParams.env`` / ``OpenParams.env`` (the daemon ignores any other key there).
PROMPT_ENV_KEYS = (
    "SANDBOX",
    "QWEN_SYSTEM_MD",
    "QWEN_WRITE_SYSTEM_MD",
    "QWEN_SYSTEM_IDENTITY_MD",
    "QWEN_CODE_TOOL_CALL_STYLE",
)


class PromptSystemParams(Params):
    cwd: str
    model: str | None = None
    append: str | None = None
    interaction_mode: InteractionMode = "interactive"
    # The client's own environment for the variables that shape the prompt (SANDBOX,
    # QWEN_SYSTEM_MD, QWEN_WRITE_SYSTEM_MD, QWEN_SYSTEM_IDENTITY_MD, QWEN_CODE_TOOL_CALL_STYLE);
    # values here win over the daemon's environment.
    env: dict[str, str] | None = None
    # the tools and agent a session would declare (protocol C5); without ``tools`` the base
    # prompt's examples use Qwen Code's tool set
    tools: list[dict[str, Any]] | None = None
    agent: dict[str, Any] | None = None


class Section(msgspec.Struct, kw_only=True):
    name: str
    chars: int
    est_tokens: int
    # a base-prompt section left out because the session declared none of its tools (C5)
    omitted: bool = False


class PromptFile(msgspec.Struct, kw_only=True):
    path: str
    type: str


class Problem(msgspec.Struct, kw_only=True):
    path: str
    kind: str
    message: str


class PromptSystemResult(msgspec.Struct, kw_only=True):
    text: str
    sections: list[Section]
    files: list[PromptFile]
    prefix_hash: str
    project_root: str | None = None
    errors: list[Problem] = msgspec.field(default_factory=list)


class CwdParams(Params):
    cwd: str


class FileInfo(msgspec.Struct, kw_only=True):
    path: str
    type: str
    imports: list[str]
    bytes: int
    truncated: bool = False


class RuleInfo(msgspec.Struct, kw_only=True):
    path: str
    conditional: bool
    paths: list[str]
    bytes: int


class InstructionsFilesResult(msgspec.Struct, kw_only=True):
    files: list[FileInfo]
    errors: list[Problem]
    rules: list[RuleInfo] = msgspec.field(default_factory=list)
    project_root: str | None = None


class AddMemoryParams(Params):
    cwd: str
    scope: Literal["project", "global"]
    text: str


class AddMemoryResult(msgspec.Struct, kw_only=True):
    path: str


_canonical = msgspec.json.Encoder(order="sorted")


def prefix_hash(system: str, tools: list[Any]) -> str:
    """sha256 over the canonical JSON (sorted keys, compact) of ``{"system", "tools"}``."""
    return hashlib.sha256(_canonical.encode({"system": system, "tools": tools})).hexdigest()


class MatchRulesParams(Params):
    cwd: str
    paths: list[str]


class MatchedRule(msgspec.Struct, kw_only=True):
    path: str
    paths: list[str]
    matched: list[str]
    reminder: str


class MatchRulesResult(msgspec.Struct, kw_only=True):
    rules: list[MatchedRule]
