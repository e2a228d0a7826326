"""The configuration layers: read one source, validate it alone, merge them in order.

Sources, lowest to highest precedence: built-in defaults (the ``Settings`` defaults), Qwen
Code's ``settings.json`` files (user, then project), the daemon's ``config.toml``, and the
environment. Each source becomes a ``Layer``: a dict shaped like ``Settings`` on the wire
(camelCase settings sections, snake_case ``daemon``/``model_endpoint``) that has already been
validated on its own, so an error names the file it came from. ``build`` deep-merges layers
(nested dicts merge, scalars and lists replace, except the lists Qwen Code concatenates or
unions) and converts the result to ``Settings``.

Every failure is a ``ConfigError(file, key, problem)`` with the key as a dotted path
(``context.autoCompactThreshold``), ``(syntax)`` for malformed files, ``(file)`` for unreadable
ones. Messages never include configuration values (an API key could be one of them).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import structlog

from qwenctxd.config.schema import (
    DaemonSettings,
    LimitsSettings,
    ModelEndpoint,
    ModelSettings,
    SessionsSettings,
    Settings,
)
from qwenctxd.fsutil import read_regular
from qwenctxd.protocol.errors import ConfigError

__all__ = [
    "ENV_VARS",
    "Layer",
    "build",
    "deep_merge",
    "env_layer",
    "read_config_toml",
    "read_settings_json",
    "strip_json_comments",
]

log = structlog.get_logger("qwenctxd.config")


def _encode_names(cls: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(f.encode_name for f in msgspec.structs.fields(cls))


#: Top-level keys of Qwen Code's settings.json that the daemon reads; the rest are ignored.
SETTINGS_JSON_KEYS = frozenset({"context", "memory", "skills", "model", "fastModel", "hooks"})
#: config.toml: tables allowed at the top level, and the top-level scalars.
TOML_TABLES = ("daemon", "model", "context", "memory", "skills", "sessions", "limits")
TOML_SCALARS = frozenset({"fastModel"})
_DAEMON_KEYS = _encode_names(DaemonSettings)
_SESSIONS_KEYS = _encode_names(SessionsSettings)
_LIMITS_KEYS = _encode_names(LimitsSettings)
_ENDPOINT_KEYS = _encode_names(ModelEndpoint)
_MODEL_SETTINGS_KEYS = _encode_names(ModelSettings)
_SECTION_TYPES: dict[str, Any] = {f.encode_name: f.type for f in msgspec.structs.fields(Settings)}

#: Environment variable -> (section, key) in the Settings wire shape.
ENV_VARS: dict[str, tuple[str, str]] = {
    "OPENAI_BASE_URL": ("model_endpoint", "base_url"),
    "OPENAI_API_KEY": ("model_endpoint", "api_key"),
    "OPENAI_MODEL": ("model_endpoint", "model"),
    "QWENCTXD_FAST_MODEL": ("model_endpoint", "fast_model"),
    "QWENCTXD_MODEL_TIMEOUT_S": ("model_endpoint", "timeout_s"),
    "QWENCTXD_LOG_LEVEL": ("daemon", "log_level"),
}

#: Lists Qwen Code merges across layers instead of replacing (settingsSchema.ts).
_CONCAT_LISTS = frozenset({("context", "includeDirectories")})
_UNION_LISTS = frozenset(
    {("skills", "disabled"), ("skills", "defaultDisabled"), ("skills", "enabled")}
)


@dataclass(frozen=True, slots=True)
class Layer:
    """One validated configuration source."""

    kind: str  # "settings" | "toml" | "env" | "dotenv"
    source: str  # what error messages call it: a file path or "environment"
    path: Path | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    present: bool = False  # the file exists (always True for a non-empty env layer)

    def locate(self, key: str) -> tuple[str, str]:
        """``(file, key)`` for an error at Settings key path ``key`` within this layer."""
        if self.kind == "toml" and (key == "model_endpoint" or key.startswith("model_endpoint.")):
            return self.source, "model" + key[len("model_endpoint") :]
        if self.kind == "dotenv":
            for var, (section, name) in ENV_VARS.items():
                if key == f"{section}.{name}":
                    return self.source, var
            return self.source, key
        if self.kind == "env":
            for var, (section, name) in ENV_VARS.items():
                if key == f"{section}.{name}":
                    return f"environment ({var})", key
            return "environment (OPENAI_*, QWENCTXD_*)", key
        return self.source, key

    def has(self, key: str) -> bool:
        """Whether this layer sets the dotted ``key`` (list indexes ignored)."""
        node: Any = self.data
        for part in re.sub(r"\[\d+\]", "", key).split("."):
            if not isinstance(node, Mapping) or part not in node:
                return False
            node = node[part]
        return True


# -- JSON with comments -----------------------------------------------------------------------
_STRING = r'"(?:\\.|[^"\\\n])*"'
_COMMENTS_RE = re.compile(_STRING + r"|//[^\n]*|/\*[\s\S]*?\*/|/\*")
_TRAILING_COMMA_RE = re.compile(_STRING + r"|,(?=\s*[}\]])")


def _blank(text: str) -> str:
    """Same length and line breaks, no content: keeps error line/column numbers true."""
    return re.sub(r"[^\n]", " ", text)


def strip_json_comments(text: str) -> str:
    """Blank out ``//`` and ``/* */`` comments outside strings and trailing commas.

    Raises ValueError(offset) for an unterminated block comment.
    """

    def comments(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.startswith('"'):
            return tok
        if tok == "/*":
            raise ValueError(m.start())
        return _blank(tok)

    def commas(m: re.Match[str]) -> str:
        return m.group(0) if m.group(0).startswith('"') else " "

    return _TRAILING_COMMA_RE.sub(commas, _COMMENTS_RE.sub(comments, text))


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _read_text(path: Path) -> str | None:
    """The file's text, None if it does not exist; ConfigError if it cannot be read."""
    try:
        raw = read_regular(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(str(path), "(file)", f"cannot read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _line_col(raw[: exc.start].decode("utf-8", "replace"), exc.start)
        raise ConfigError(
            str(path), "(syntax)", f"line {line}, column {col}: not valid UTF-8"
        ) from None


def read_settings_json(path: Path) -> Layer:
    """A Qwen Code settings.json (missing file → empty layer). Blocking."""
    text = _read_text(path)
    if text is None:
        return Layer("settings", str(path), path)
    if text.startswith("\ufeff"):
        text = " " + text[1:]  # a BOM; a space keeps the columns of line 1
    try:
        cleaned = strip_json_comments(text)
    except ValueError as exc:
        line, col = _line_col(text, int(exc.args[0]))
        raise ConfigError(
            str(path), "(syntax)", f"line {line}, column {col}: unterminated /* comment"
        ) from None
    if not cleaned.strip():
        return Layer("settings", str(path), path, {}, True)
    try:
        raw = json.loads(cleaned)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            str(path), "(syntax)", f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "(root)", "expected a JSON object")
    data = {k: v for k, v in raw.items() if k in SETTINGS_JSON_KEYS}
    layer = Layer("settings", str(path), path, data, True)
    validate(layer)
    return layer


# -- config.toml ----------------------------------------------------------------------------
def _unknown_keys(cls: type[msgspec.Struct], table: Mapping[str, Any], prefix: str) -> list[str]:
    """Keys of ``table`` (recursively) that ``cls`` does not define."""
    fields = {f.encode_name: f.type for f in msgspec.structs.fields(cls)}
    out: list[str] = []
    for key, value in table.items():
        if key not in fields:
            out.append(f"{prefix}.{key}")
            continue
        sub = fields[key]
        if isinstance(value, Mapping) and isinstance(sub, type) and issubclass(sub, msgspec.Struct):
            out.extend(_unknown_keys(sub, value, f"{prefix}.{key}"))
    return out


def read_config_toml(path: Path) -> Layer:
    """The daemon's config.toml (missing file → empty layer). Blocking.

    ``[daemon]`` → ``Settings.daemon``; ``[model]`` endpoint keys (base_url, api_key, model,
    fast_model, timeout_s) → ``Settings.model_endpoint`` and Qwen Code model keys (name,
    chatCompression, generationConfig) → ``Settings.model``; ``[context]``, ``[memory]``,
    ``[skills]`` and ``fastModel`` as in settings.json. Unknown tables, and unknown keys in
    ``[daemon]``/``[model]``, are errors: this is our own file, a typo must not pass silently.
    """
    text = _read_text(path)
    if text is None:
        return Layer("toml", str(path), path)
    file = str(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, "(syntax)", str(exc)) from None
    data: dict[str, Any] = {}
    tables = ", ".join(f"[{t}]" for t in TOML_TABLES)
    for key, value in raw.items():
        if key in TOML_SCALARS:
            data[key] = value
            continue
        if key not in TOML_TABLES:
            raise ConfigError(file, key, f"unknown table; expected one of {tables}")
        if not isinstance(value, dict):
            raise ConfigError(file, key, "expected a table")
        if key == "daemon":
            bad = sorted(set(value) - _DAEMON_KEYS)
            if bad:
                raise ConfigError(file, f"daemon.{bad[0]}", "unknown key")
            data["daemon"] = value
        elif key == "sessions":
            bad = sorted(set(value) - _SESSIONS_KEYS)
            if bad:
                raise ConfigError(file, f"sessions.{bad[0]}", "unknown key")
            data["sessions"] = value
        elif key == "limits":
            bad = sorted(set(value) - _LIMITS_KEYS)
            if bad:
                raise ConfigError(file, f"limits.{bad[0]}", "unknown key")
            data["limits"] = value
        elif key == "model":
            bad = sorted(set(value) - _ENDPOINT_KEYS - _MODEL_SETTINGS_KEYS)
            if bad:
                raise ConfigError(file, f"model.{bad[0]}", "unknown key")
            endpoint = {k: v for k, v in value.items() if k in _ENDPOINT_KEYS}
            model = {k: v for k, v in value.items() if k in _MODEL_SETTINGS_KEYS}
            if endpoint:
                data["model_endpoint"] = endpoint
            if model:
                data["model"] = model
        else:
            data[key] = value
    for key in ("context", "memory", "skills"):
        if isinstance(data.get(key), dict):
            unknown = _unknown_keys(_SECTION_TYPES[key], data[key], key)
            if unknown:
                log.warning("config.unknown_keys_ignored", file=file, keys=unknown)
    layer = Layer("toml", file, path, data, True)
    validate(layer)
    endpoint = data.get("model_endpoint", {})
    if endpoint.get("api_key"):
        _warn_if_readable_by_others(path)
    return layer


def _warn_if_readable_by_others(path: Path) -> None:
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    if mode & 0o077:
        log.warning(
            "config.api_key_file_not_private",
            file=str(path),
            mode=f"{mode:o}",
            hint=f"chmod 600 {path}",
        )


# -- environment --------------------------------------------------------------------------------
def dotenv_layer(path: Path) -> Layer:
    """The ``OPENAI_*`` (and ``QWENCTXD_*``) variables of a ``.env`` file, as a layer. Blocking."""
    from qwenctxd.config.dotenv import read_dotenv

    values = read_dotenv(path)
    try:
        layer = env_layer(values)
    except ConfigError as exc:
        var = exc.file.removeprefix("environment (").removesuffix(")")
        raise ConfigError(str(path), var, exc.problem) from None
    return Layer("dotenv", str(path), path, layer.data, path.is_file())


def env_layer(environ: Mapping[str, str]) -> Layer:
    """The environment's keys (empty variables count as unset)."""
    data: dict[str, dict[str, Any]] = {}
    for var, (section, key) in ENV_VARS.items():
        value = environ.get(var, "").strip()
        if not value:
            continue
        parsed: Any = value
        if var == "QWENCTXD_MODEL_TIMEOUT_S":
            try:
                parsed = float(value)
            except ValueError:
                raise ConfigError(
                    f"environment ({var})", f"{section}.{key}", "expected a number of seconds"
                ) from None
        elif var == "QWENCTXD_LOG_LEVEL":
            parsed = {"warn": "warning"}.get(value.lower(), value.lower())
        data.setdefault(section, {})[key] = parsed
    layer = Layer("env", "environment", None, data, bool(data))
    validate(layer)
    return layer


# -- validation and merging -------------------------------------------------------------------
_AT_RE = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)


def _split_error(exc: msgspec.ValidationError) -> tuple[str, str]:
    """``(key path, problem)`` from a msgspec message like ``Expected … - at `$.a.b```."""
    m = _AT_RE.match(str(exc))
    if m is None:  # pragma: no cover - the pattern matches every string
        return "(root)", str(exc)
    return (m.group("path") or "").lstrip(".") or "(root)", m.group("problem")


def validate(layer: Layer) -> None:
    """Convert ``layer`` alone against Settings; ConfigError naming its file and key."""
    try:
        msgspec.convert(layer.data, Settings)
    except msgspec.ValidationError as exc:
        key, problem = _split_error(exc)
        file, shown = layer.locate(key)
        raise ConfigError(file, shown, problem) from None


def _union_ci(a: Iterable[Any], b: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    seen: set[Any] = set()
    for item in (*a, *b):
        norm = item.lower() if isinstance(item, str) else item
        if norm not in seen:
            seen.add(norm)
            out.append(item)
    return out


def deep_merge(
    base: Mapping[str, Any], over: Mapping[str, Any], path: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``over`` on top of ``base``: dicts merge, the rest replaces (Qwen Code's concat/union
    lists excepted). Neither input is modified."""
    out = dict(base)
    for key, value in over.items():
        here = (*path, key)
        prev = out.get(key)
        if isinstance(prev, Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(prev, value, here)
        elif isinstance(prev, list) and isinstance(value, list) and here in _CONCAT_LISTS:
            out[key] = [*prev, *value]
        elif isinstance(prev, list) and isinstance(value, list) and here in _UNION_LISTS:
            out[key] = _union_ci(prev, value)
        else:
            out[key] = value
    return out


def build(layers: Sequence[Layer]) -> Settings:
    """Merge ``layers`` (lowest first) over the defaults and convert to Settings."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer.data:
            merged = deep_merge(merged, layer.data)
    try:
        return msgspec.convert(merged, Settings)
    except msgspec.ValidationError as exc:  # only when layers clash; blame the top setter
        key, problem = _split_error(exc)
        for layer in reversed(layers):
            if layer.has(key):
                file, shown = layer.locate(key)
                raise ConfigError(file, shown, problem) from None
        raise ConfigError("merged configuration", key, problem) from None
