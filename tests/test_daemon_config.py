"""Configuration as the daemon sees it: refusal at start, live reload, bad edits ignored."""

from __future__ import annotations

import json

from qwenctxd.testing.spawn import SpawnedDaemon
from qwenctxd.testing.wait import until


def test_invalid_value_refuses_start_naming_file_and_key(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    settings = d.home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text('{\n  // Qwen Code allows comments\n  "context": {"autoCompactThreshold": 3}\n}\n')
    d.start(wait=False)
    assert d.wait_exit() == 2
    events = [json.loads(x) for x in d.log_text().splitlines() if x.startswith("{")]
    refusal = next(e for e in events if e.get("event", "").startswith("invalid configuration"))
    assert refusal["file"] == str(settings)
    assert refusal["key"] == "context.autoCompactThreshold"
    assert not d.socket.exists()


def test_invalid_toml_refuses_start(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()
    toml = d.home / ".config" / "qwenctxd" / "config.toml"
    toml.parent.mkdir(parents=True)
    toml.write_text('[daemon]\nlog_level = "loud"\n')
    d.start(wait=False)
    assert d.wait_exit() == 2
    assert str(toml) in d.log_text() and "daemon.log_level" in d.log_text()


def test_env_endpoint_reaches_status(spawn) -> None:  # type: ignore[no-untyped-def]
    d = spawn(env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_MODEL": "m1",
                   "OPENAI_API_KEY": "sk-do-not-leak-1234567890"}).start()
    st = d.call("daemon.status")
    assert st["model"]["configured"] is True and st["model"]["model"] == "m1"
    assert "sk-do-not-leak" not in json.dumps(st)
    assert "sk-do-not-leak" not in d.log_text()


def test_edits_reload_live_and_bad_edits_keep_the_last_good_config(daemon: SpawnedDaemon) -> None:
    toml = daemon.home / ".config" / "qwenctxd" / "config.toml"
    toml.parent.mkdir(parents=True)
    gen0 = daemon.call("daemon.status")["config"]["generation"]
    toml.write_text('[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "first"\n')
    st = until(lambda: (s := daemon.call("daemon.status"))["config"]["generation"] > gen0 and s,
               what="the config edit to load")
    assert st["model"]["model"] == "first"
    assert str(toml) in st["config"]["files"]
    good_gen = st["config"]["generation"]
    # a bad edit: logged, reported, ignored
    toml.write_text('[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "second"\ntimeout_s = -1\n')
    st = until(lambda: (s := daemon.call("daemon.status"))["config"]["last_error"] and s,
               what="the bad edit to be reported")
    assert "model.timeout_s" in st["config"]["last_error"] or "timeout_s" in st["config"]["last_error"]
    assert st["config"]["generation"] == good_gen
    assert st["model"]["model"] == "first"
    assert daemon.call("daemon.ping") == "pong"
    # fixing it clears the error and applies the new value
    toml.write_text('[model]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "third"\n')
    st = until(lambda: (s := daemon.call("daemon.status"))["model"]["model"] == "third" and s,
               what="the fixed config to apply")
    assert st["config"]["last_error"] is None
