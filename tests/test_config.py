"""Layered configuration: precedence, Qwen Code settings.json quirks, errors, live reload."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from qwenctxd.config import ConfigError, ConfigStore, Settings, strip_json_comments
from qwenctxd.testing.wait import until_async
from qwenctxd.watch import WatchHub


class Env:
    """A scratch HOME with ~/.qwen present and ~/.config absent."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        (self.home / ".qwen").mkdir(parents=True)
        self.xdg = self.home / ".config"
        self.project = tmp_path / "proj"
        self.project.mkdir()
        self.environ: dict[str, str] = {}

    @property
    def user_file(self) -> Path:
        return self.home / ".qwen" / "settings.json"

    @property
    def toml_file(self) -> Path:
        return self.xdg / "qwenctxd" / "config.toml"

    def project_file(self, root: Path | None = None) -> Path:
        return (root or self.project) / ".qwen" / "settings.json"

    def store(self) -> ConfigStore:
        return ConfigStore(home=self.home, xdg_config=self.xdg, environ=self.environ)


def write(path: Path, text: str | dict[str, object]) -> None:
    """Write atomically (temp file + rename), as editors do."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp~")
    tmp.write_text(text if isinstance(text, str) else json.dumps(text))
    os.replace(tmp, path)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


# -- layering -------------------------------------------------------------------------------
def test_precedence_across_all_five_layers(env: Env) -> None:
    def effective() -> tuple[str | None, str | None, float]:
        store = env.store()
        store.load_global()
        s = store.for_project(env.project)
        ep = s.endpoint()
        return ep.model, ep.fast_model, s.context.auto_compact_threshold

    assert effective() == (None, None, 0.7)  # built-in defaults
    write(
        env.user_file,
        {"model": {"name": "user"}, "fastModel": "user", "context": {"autoCompactThreshold": 0.5}},
    )
    assert effective() == ("user", "user", 0.5)
    write(
        env.project_file(),
        {
            "model": {"name": "project"},
            "fastModel": "project",
            "context": {"autoCompactThreshold": 0.6},
        },
    )
    assert effective() == ("project", "project", 0.6)
    write(
        env.toml_file,
        '[model]\nmodel = "toml"\nfast_model = "toml"\n[context]\nautoCompactThreshold = 0.8\n',
    )
    assert effective() == ("toml", "toml", 0.8)
    env.environ.update(OPENAI_MODEL="env", QWENCTXD_FAST_MODEL="env")
    assert effective() == ("env", "env", 0.8)


def test_settings_json_comments_and_trailing_commas(env: Env) -> None:
    write(
        env.user_file,
        """// Qwen Code allows comments
        {
          /* block
             comment */
          "context": {
            "fileName": ["QWEN.md", "NOTES.md",],  // trailing comma
            "importFormat": "flat",
          },
          "fastModel": "http://not-a-comment/* either */",
        }
        """,
    )
    s = env.store().load_global()
    assert s.context.file_name == ["QWEN.md", "NOTES.md"]
    assert s.context.import_format == "flat"
    assert s.fast_model == "http://not-a-comment/* either */"
    assert strip_json_comments('{"a": "//x", // c\n"b": 1,}') == '{"a": "//x",     \n"b": 1 }'


def test_unknown_settings_json_keys_ignored(env: Env) -> None:
    write(
        env.user_file,
        {
            "ui": {"theme": "dark"},
            "$schema": "https://example.invalid/schema.json",
            "context": {"fileFiltering": {"respectGitIgnore": True}, "importFormat": "flat"},
            "memory": {"someFutureKey": 3},
        },
    )
    s = env.store().load_global()
    assert s.context.import_format == "flat"


def test_invalid_value_names_file_and_key(env: Env) -> None:
    write(env.user_file, {"context": {"autoCompactThreshold": 2}})
    with pytest.raises(ConfigError) as info:
        env.store().load_global()
    err = info.value
    assert err.file == str(env.user_file)
    assert err.key == "context.autoCompactThreshold"
    assert "1.0" in err.problem
    assert str(env.user_file) in str(err) and "context.autoCompactThreshold" in str(err)


def test_error_is_attributed_to_the_layer_that_set_it(env: Env) -> None:
    write(env.user_file, {"context": {"autoCompactThreshold": 0.5}})
    write(env.toml_file, "[context]\nautoCompactThreshold = 7\n")
    with pytest.raises(ConfigError) as info:
        env.store().load_global()
    assert (info.value.file, info.value.key) == (str(env.toml_file), "context.autoCompactThreshold")


def test_malformed_json_names_the_file_and_position(env: Env) -> None:
    write(env.user_file, '// header /* not closed here\n{\n  "context": {"a" 1}\n}\n')
    with pytest.raises(ConfigError) as info:
        env.store().load_global()
    assert info.value.file == str(env.user_file)
    assert info.value.key == "(syntax)"
    assert "line 3, column 19" in info.value.problem


def test_malformed_toml_names_the_file(env: Env) -> None:
    write(env.toml_file, "[daemon\nlog_level = 'debug'\n")
    with pytest.raises(ConfigError) as info:
        env.store().load_global()
    assert (info.value.file, info.value.key) == (str(env.toml_file), "(syntax)")
    assert "line 1" in info.value.problem


def test_unknown_toml_table_and_key_refused(env: Env) -> None:
    write(env.toml_file, "[server]\nport = 1\n")
    with pytest.raises(ConfigError) as info:
        env.store().load_global()
    assert (info.value.file, info.value.key) == (str(env.toml_file), "server")
    assert "unknown table" in info.value.problem
    write(env.toml_file, "[daemon]\nlog_levle = 'debug'\n")
    with pytest.raises(ConfigError) as info:
        env.store().load_global()
    assert info.value.key == "daemon.log_levle"


def test_toml_daemon_and_model_keys(env: Env) -> None:
    write(
        env.toml_file,
        """
        fastModel = "qwen-flash"
        [daemon]
        log_level = "debug"
        max_connections = 32
        uvloop = false
        [model]
        base_url = "http://127.0.0.1:9/v1"
        model = "qwen3-coder"
        timeout_s = 5
        [model.chatCompression]
        maxRecentFilesToRetain = 2
        """,
    )
    s = env.store().load_global()
    assert (s.daemon.log_level, s.daemon.max_connections, s.daemon.uvloop) == ("debug", 32, False)
    ep = s.endpoint()
    assert (ep.base_url, ep.model, ep.timeout_s, ep.fast_model) == (
        "http://127.0.0.1:9/v1",
        "qwen3-coder",
        5.0,
        "qwen-flash",
    )
    assert ep.configured
    assert s.model.chat_compression.max_recent_files_to_retain == 2
    write(env.toml_file, "[model]\ntimeout_s = -1\n")
    with pytest.raises(ConfigError) as info:
        env.store().load_global()
    assert (info.value.file, info.value.key) == (str(env.toml_file), "model.timeout_s")


def test_environment_overrides(env: Env) -> None:
    write(
        env.toml_file,
        '[model]\nbase_url = "http://toml/v1"\ntimeout_s = 9\n[daemon]\nlog_level = "error"\n',
    )
    env.environ.update(
        OPENAI_BASE_URL="http://env/v1",
        OPENAI_API_KEY="sk-test",
        OPENAI_MODEL="qwen3-coder-plus",
        QWENCTXD_FAST_MODEL="qwen-flash",
        QWENCTXD_LOG_LEVEL="DEBUG",
        QWENCTXD_MODEL_TIMEOUT_S="12.5",
        OPENAI_ORG="ignored",
    )
    s = env.store().load_global()
    ep = s.endpoint()
    assert (ep.base_url, ep.api_key, ep.model, ep.fast_model, ep.timeout_s) == (
        "http://env/v1",
        "sk-test",
        "qwen3-coder-plus",
        "qwen-flash",
        12.5,
    )
    assert s.daemon.log_level == "debug"


@pytest.mark.parametrize(
    ("value", "problem"), [("soon", "number"), ("-3", "> 0")], ids=["not-a-number", "negative"]
)
def test_bad_environment_value_names_the_variable(env: Env, value: str, problem: str) -> None:
    env.environ["QWENCTXD_MODEL_TIMEOUT_S"] = value
    with pytest.raises(ConfigError) as info:
        env.store().load_global()
    assert info.value.file == "environment (QWENCTXD_MODEL_TIMEOUT_S)"
    assert info.value.key == "model_endpoint.timeout_s"
    assert problem in info.value.problem


def test_project_layer_only_for_that_project(env: Env, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    write(env.user_file, {"context": {"importFormat": "flat"}})
    write(env.project_file(), {"context": {"autoCompactThreshold": 0.4}, "ui": {"x": 1}})
    store = env.store()
    glob = store.load_global()
    mine = store.for_project(env.project)
    assert (mine.context.auto_compact_threshold, mine.context.import_format) == (0.4, "flat")
    assert store.for_project(other) is glob
    assert glob.context.auto_compact_threshold == 0.7
    assert store.for_project(env.project) is mine  # cached
    assert store.files == [env.user_file, env.project_file()]


def test_home_directory_as_project_adds_no_layer(env: Env) -> None:
    write(env.user_file, {"context": {"importFormat": "flat"}})
    store = env.store()
    glob = store.load_global()
    assert store.for_project(env.home) is glob
    assert store.files == [env.user_file]


def test_bad_project_file_falls_back_and_is_reported(env: Env) -> None:
    write(env.project_file(), {"context": {"autoCompactThreshold": "high"}})
    store = env.store()
    glob = store.load_global()
    assert store.for_project(env.project) is glob
    msg = store.project_errors[env.project]
    assert str(env.project_file()) in msg and "context.autoCompactThreshold" in msg


def test_qwen_code_list_merges(env: Env) -> None:
    write(
        env.user_file,
        {
            "context": {"includeDirectories": ["~/a"]},
            "skills": {"disabled": ["Lint"], "enabled": ["x"]},
        },
    )
    write(
        env.project_file(),
        {"context": {"includeDirectories": ["../b"]}, "skills": {"disabled": ["lint", "deploy"]}},
    )
    store = env.store()
    store.load_global()
    s = store.for_project(env.project)
    assert s.context.include_directories == ["~/a", "../b"]  # concatenated, as Qwen Code does
    assert s.skills.disabled == ["Lint", "deploy"]  # union, case-insensitive
    assert s.skills.enabled == ["x"]


def test_for_project_is_cheap_when_cached(env: Env) -> None:
    write(env.project_file(), {"fastModel": "p"})
    store = env.store()
    store.load_global()
    store.for_project(env.project)
    t0 = time.perf_counter()
    for _ in range(10_000):
        store.for_project(env.project)
    assert (time.perf_counter() - t0) / 10_000 < 20e-6


# -- live reload ----------------------------------------------------------------------------
@asynccontextmanager
async def live(store: ConfigStore) -> AsyncIterator[WatchHub]:
    store.load_global()
    hub = WatchHub()
    async with anyio.create_task_group() as tg:
        await tg.start(hub.run)
        await tg.start(store.run, hub)
        try:
            yield hub
        finally:
            tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_live_reload_valid_edit(env: Env) -> None:
    write(env.user_file, {"context": {"autoCompactThreshold": 0.5}})
    store = env.store()
    seen: list[Settings] = []
    store.add_listener(seen.append)
    async with live(store):
        generation = store.generation
        write(env.user_file, {"context": {"autoCompactThreshold": 0.65}})
        await until_async(
            lambda: store.global_settings.context.auto_compact_threshold == 0.65, what="reloaded"
        )
        assert store.generation > generation
        assert seen and seen[-1].context.auto_compact_threshold == 0.65
        assert store.last_error is None


@pytest.mark.asyncio
async def test_live_reload_bad_edit_keeps_last_good(env: Env) -> None:
    write(env.user_file, {"context": {"autoCompactThreshold": 0.5}})
    store = env.store()
    async with live(store):
        good, generation = store.global_settings, store.generation
        write(env.user_file, '{"context": {"autoCompactThreshold": 5}}')
        await until_async(lambda: store.last_error is not None, what="error reported")
        assert store.last_error is not None
        assert str(env.user_file) in store.last_error
        assert "context.autoCompactThreshold" in store.last_error
        assert store.global_settings is good and store.generation == generation
        write(env.user_file, '{"context": {"autoCompactThreshold": 0.55}}')
        await until_async(lambda: store.last_error is None, what="error cleared by a good edit")
        assert store.global_settings.context.auto_compact_threshold == 0.55


@pytest.mark.asyncio
async def test_config_toml_created_in_missing_dir_is_picked_up(env: Env) -> None:
    assert not env.xdg.exists()
    store = env.store()
    async with live(store):
        generation = store.generation
        write(env.toml_file, '[daemon]\nlog_level = "debug"\n')
        await until_async(lambda: store.global_settings.daemon.log_level == "debug", what="toml read")
        assert store.generation > generation
        assert env.toml_file in store.files


@pytest.mark.asyncio
async def test_project_file_created_later_is_picked_up(env: Env) -> None:
    store = env.store()
    project_seen: list[Path] = []
    store.add_project_listener(lambda root, _s: project_seen.append(root))
    async with live(store):
        glob = store.for_project(env.project)
        write(env.project_file(), {"fastModel": "project-fast"})
        await until_async(
            lambda: store.for_project(env.project).fast_model == "project-fast", what="project read"
        )
        assert store.global_settings is glob
        assert project_seen == [env.project]
        write(env.project_file(), '{"fastModel": 1}')
        await until_async(lambda: env.project in store.project_errors, what="bad project edit")
        assert store.for_project(env.project).fast_model == "project-fast"  # last good kept


# -- .env files (Qwen Code keeps OPENAI_* there) ------------------------------------------------
def test_qwen_dotenv_supplies_openai_vars_below_the_real_environment(env: Env) -> None:
    write(env.home / ".qwen" / ".env",
          "# my key\nexport OPENAI_API_KEY='sk-from-file'\n"
          'OPENAI_BASE_URL="http://dotenv/v1"  \nOPENAI_MODEL=qwen3-coder # the usual\n')
    s = env.store().load_global()
    ep = s.endpoint()
    assert (ep.base_url, ep.api_key, ep.model) == ("http://dotenv/v1", "sk-from-file",
                                                   "qwen3-coder")
    env.environ.update(OPENAI_MODEL="from-env")  # the real environment wins
    assert env.store().load_global().endpoint().model == "from-env"
    store = env.store()
    store.load_global()
    assert env.home / ".qwen" / ".env" in store.files


def test_project_dotenv_overrides_the_user_one_for_that_project(env: Env) -> None:
    write(env.home / ".qwen" / ".env", "OPENAI_MODEL=user-model\nOPENAI_BASE_URL=http://u/v1\n")
    write(env.project / ".qwen" / ".env", "OPENAI_MODEL=project-model\n")
    store = env.store()
    store.load_global()
    proj = store.for_project(env.project).endpoint()
    assert (proj.model, proj.base_url) == ("project-model", "http://u/v1")
    assert store.global_settings.endpoint().model == "user-model"


def test_toml_beats_dotenv_and_a_bad_dotenv_value_names_the_file(env: Env) -> None:
    write(env.toml_file, '[model]\nmodel = "toml-model"\n')
    write(env.home / ".qwen" / ".env", "OPENAI_MODEL=dotenv-model\nQWENCTXD_MODEL_TIMEOUT_S=soon\n")
    with pytest.raises(ConfigError) as exc:
        env.store().load_global()
    assert str(env.home / ".qwen" / ".env") in str(exc.value)
    write(env.home / ".qwen" / ".env", "OPENAI_MODEL=dotenv-model\nthis line is junk\n")
    assert env.store().load_global().endpoint().model == "toml-model"
