"""The settings schema: every key the daemon reads, its type, bounds and default.

Qwen Code keys (``~/.qwen/settings.json``, ``<project>/.qwen/settings.json``) keep their upstream
names and meanings (reference/qwen-code-facts.md §9); unknown keys in those files are ignored so
an existing Qwen Code settings file loads unchanged. Daemon-only keys live under ``daemon`` and
``model_endpoint`` and normally come from ``$XDG_CONFIG_HOME/qwenctxd/config.toml``.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

Fraction = Annotated[float, Meta(ge=0.01, le=1.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]


class _Section(msgspec.Struct, kw_only=True, rename="camel"):
    """Settings sections use camelCase keys on disk, as Qwen Code does."""


class ClearContextOnIdle(_Section):
    tool_results_threshold_minutes: NonNegInt = 60
    tool_results_num_to_keep: NonNegInt = 5
    tool_results_total_chars_threshold: PositiveInt = 200_000


class ContextSettings(_Section):
    file_name: str | list[str] = msgspec.field(default_factory=lambda: ["QWEN.md", "AGENTS.md"])
    import_format: Literal["tree", "flat"] = "tree"
    include_directories: list[str] = msgspec.field(default_factory=list)
    load_from_include_directories: bool = False
    auto_compact_threshold: Fraction = 0.7
    max_file_bytes: PositiveInt = 64 * 1024
    clear_context_on_idle: ClearContextOnIdle = msgspec.field(default_factory=ClearContextOnIdle)


class EmbeddingsSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[memory] embeddings``: an OpenAI-compatible ``/v1/embeddings`` endpoint (``base_url``
    and ``model``; the key read from the environment variable ``api_key_env``) or ``path``, a
    local sentence-transformers model directory. Added beside the packaged embedders."""

    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    path: str | None = None
    timeout_s: PositiveFloat = 10.0
    batch: Annotated[int, Meta(ge=1, le=2048)] = 16  # inputs per request (halved on refusal)
    query_prefix: str = ""  # e.g. "query: " for E5-style models
    passage_prefix: str = ""

    def __post_init__(self) -> None:
        if self.path is None and not (self.base_url and self.model):
            raise ValueError("embeddings needs base_url and model, or path")
        if self.path is not None and self.base_url is not None:
            raise ValueError("embeddings takes base_url and model, or path, not both")
        if self.base_url is not None:
            parts = urlsplit(self.base_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("embeddings.base_url must be an http:// or https:// URL")


class RecallSettings(_Section):
    # the semantic tier (packaged embedders, plus [memory] embeddings when set)
    semantic: bool = True


class MemorySettings(_Section):
    enable_managed_auto_memory: bool = True
    enable_managed_auto_dream: bool = True
    enable_auto_skill: bool = False
    auto_skill_confirm: bool = True
    # tool calls since the session's last skill review before the next one (§5.9)
    auto_skill_tool_calls: PositiveInt = 20
    agent_timeout_minutes: Annotated[float, Meta(ge=0)] | None = None
    enable_team_memory: bool = False
    # how long a user turn may wait for its whole memory recall (the semantic tier's worker,
    # the model selector); 0: only for the lexical answer, under a millisecond (sessions/turns.py)
    prefetch_grace_ms: Annotated[int, Meta(ge=0, le=2000)] = 0
    # whether a user turn's recall asks the model selector: "auto" = yes, unless the side-query
    # endpoint is the local server the session's own agent uses (one slot; sessions/turns.py)
    recall_selector: Literal["auto", "on", "off"] = "auto"
    recall: RecallSettings = msgspec.field(default_factory=RecallSettings)
    embeddings: EmbeddingsSettings | None = None
    # extraction after a turn waits until the project's turns pause this long (at most 30 s;
    # 0: at once, as Qwen Code does) — it stays off the CPU while an agent's requests come.
    # Unset: 1000, or 20 000 (at most 5 min) when the session's agent uses the daemon's own
    # local model server (agents/extraction.py)
    extraction_quiet_ms: Annotated[int, Meta(ge=0, le=60_000)] | None = None


class SkillsSettings(_Section):
    disabled: list[str] = msgspec.field(default_factory=list)
    default_disabled: list[str] = msgspec.field(default_factory=list)
    enabled: list[str] = msgspec.field(default_factory=list)
    directories: list[str] = msgspec.field(default_factory=list)
    disabled_levels: list[str] = msgspec.field(default_factory=list)


class ChatCompression(_Section):
    image_token_estimate: PositiveInt = 1_600
    max_recent_files_to_retain: NonNegInt = 5
    max_recent_images_to_retain: NonNegInt = 3
    enable_screenshot_trigger: bool = True
    screenshot_trigger_threshold: PositiveInt = 50


class GenerationConfig(_Section):
    context_window_size: PositiveInt | None = None


class ModelSettings(_Section):
    name: str | None = None
    chat_compression: ChatCompression = msgspec.field(default_factory=ChatCompression)
    generation_config: GenerationConfig = msgspec.field(default_factory=GenerationConfig)


class ModelDeadlines(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``[model.deadlines]``: one feature's whole budget in seconds; unset → the feature's own
    budget capped by ``model.timeout_s`` (qwenctxd.model.request.FEATURES)."""

    compress_s: PositiveFloat | None = None
    project_summary_s: PositiveFloat | None = None
    recap_s: PositiveFloat | None = None
    recall_s: PositiveFloat | None = None
    forget_s: PositiveFloat | None = None
    extract_s: PositiveFloat | None = None
    dream_s: PositiveFloat | None = None
    skill_review_s: PositiveFloat | None = None
    speculation_s: PositiveFloat | None = None

    def as_dict(self) -> dict[str, float | None]:
        return {f: getattr(self, f) for f in self.__struct_fields__}


EndpointProfile = Literal["openai", "vllm", "ollama", "llamacpp", "dashscope"]


class ModelEndpoint(msgspec.Struct, kw_only=True):
    """Where side queries go (OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL in the env).

    ``profile`` decides the provider-specific knobs (thinking off as ``chat_template_kwargs`` for
    vLLM, ``enable_thinking`` for DashScope, none otherwise); ``context_window`` sizes
    ``max_tokens`` (falls back to ``model.generationConfig.contextWindowSize``).
    """

    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None
    fast_model: str | None = None
    timeout_s: PositiveFloat = 60.0
    profile: EndpointProfile = "openai"
    context_window: Annotated[int, Meta(ge=256)] | None = None
    deadlines: ModelDeadlines = msgspec.field(default_factory=ModelDeadlines)

    @property
    def configured(self) -> bool:
        return bool(self.base_url and self.model)


class DaemonSettings(msgspec.Struct, kw_only=True):
    """Daemon-only keys (config.toml ``[daemon]``)."""

    socket: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    drain_timeout_s: PositiveFloat = 20.0
    max_connections: PositiveInt = 1024
    first_frame_timeout_s: PositiveFloat = 10.0  # a new connection must send a frame by then
    max_frame_bytes: Annotated[int, Meta(ge=1024, le=16 * 1024 * 1024)] = 16 * 1024 * 1024
    uvloop: bool = True


class SessionsSettings(msgspec.Struct, kw_only=True):
    """Daemon-only keys (config.toml ``[sessions]``)."""

    # an open session with no activity for this long is closed (resumable); 0 = never
    idle_close_minutes: Annotated[float, Meta(ge=0)] = 120.0


class LimitsSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Daemon-only keys (config.toml ``[limits]``): bounds on one connection."""

    # one message (frame) larger than this gets -32602 (field "message") and is discarded
    max_message_bytes: Annotated[int, Meta(ge=1024, le=16 * 1024 * 1024)] = 4 * 1024 * 1024
    # a connection with nothing in flight and no subscription is closed after this long
    idle_connection_s: PositiveFloat = 600.0


class Settings(msgspec.Struct, kw_only=True, rename={"fast_model": "fastModel"}):
    """The merged view the daemon reads. Unknown top-level keys are ignored."""

    context: ContextSettings = msgspec.field(default_factory=ContextSettings)
    memory: MemorySettings = msgspec.field(default_factory=MemorySettings)
    skills: SkillsSettings = msgspec.field(default_factory=SkillsSettings)
    model: ModelSettings = msgspec.field(default_factory=ModelSettings)
    fast_model: str = ""
    # Qwen Code / Claude Code style hooks: {"PreCompact": [{"matcher"?, "hooks": [...]}], ...}
    hooks: dict[str, list[dict[str, object]]] = msgspec.field(default_factory=dict)
    daemon: DaemonSettings = msgspec.field(default_factory=DaemonSettings)
    sessions: SessionsSettings = msgspec.field(default_factory=SessionsSettings)
    limits: LimitsSettings = msgspec.field(default_factory=LimitsSettings)
    model_endpoint: ModelEndpoint = msgspec.field(default_factory=ModelEndpoint)

    def endpoint(self) -> ModelEndpoint:
        """The endpoint with settings.json's ``fastModel`` and ``model.name`` filled in where
        config.toml and the environment (OPENAI_MODEL, QWENCTXD_FAST_MODEL) set nothing, as
        Qwen Code lets OPENAI_MODEL override ``model.name``."""
        ep = self.model_endpoint
        changes: dict[str, object] = {}
        if ep.fast_model is None and self.fast_model:
            changes["fast_model"] = self.fast_model
        if ep.model is None and self.model.name:
            changes["model"] = self.model.name
        window = self.model.generation_config.context_window_size
        if ep.context_window is None and window is not None and window >= 256:
            changes["context_window"] = window
        return msgspec.structs.replace(ep, **changes) if changes else ep
