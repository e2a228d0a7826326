"""qwenctl doctor and model.probe against spawned daemons and the scripted model: a working
endpoint that refuses json_schema (as llama.cpp does), no model configured, a broken endpoint,
settings from config.toml, no daemon at all."""

from __future__ import annotations

import json
import subprocess
from functools import partial
from typing import Any

from qwenctxd.testing import qwenctl_runs
from qwenctxd.testing.openai_stub import Reply, ScriptedOpenAI, refused_base_url
from qwenctxd.testing.spawn import SpawnedDaemon

#: qwenctl against ``d`` (a fork of the pre-imported fork server; see qwenctl_runs)
qwenctl = partial(qwenctl_runs.qwenctl, stdin=subprocess.DEVNULL, timeout=60)


def checks(out: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads(out)["checks"]}


def test_working_endpoint_and_its_shapes(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(default=Reply(content='{"ok": true}'), reject_json_schema=True) as stub:
        d: SpawnedDaemon = spawn(env={"OPENAI_BASE_URL": stub.base_url,
                                      "OPENAI_MODEL": "stub-model",
                                      "OPENAI_API_KEY": "sk-secret-123"}).start()
        res = d.call("model.probe", {"timeout_s": 5})
        assert res["configured"] and res["reachable"] and res["api_key_set"]
        assert res["models"] == ["stub-model", "stub-fast"]
        assert {s["shape"]: (s["status"], s["reason"]) for s in res["shapes"]} == {
            "models": ("ok", None), "chat": ("ok", None), "stream": ("ok", None),
            "json_schema": ("failed", "http_500"), "json_object": ("ok", None),
            "tools": ("ok", None)}
        assert res["sources"] == {"base_url": "environment (OPENAI_BASE_URL)",
                                  "model": "environment (OPENAI_MODEL)", "fast_model": None,
                                  "api_key": "environment (OPENAI_API_KEY)"}
        assert "sk-secret-123" not in json.dumps(res)
        # the probe used its own client: the daemon's counters did not move
        assert d.call("daemon.status")["model"]["calls"] == 0
        sent = [r.body for r in stub.requests if r.path.endswith("/chat/completions")]
        assert any(b.get("stream") for b in sent) and any(b.get("tools") for b in sent)
        r = qwenctl(d, "doctor")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "json_schema: failed (http_500)" in r.stdout and "json_object: ok" in r.stdout
        assert "base_url: " + stub.base_url in r.stdout
        assert "from environment (OPENAI_BASE_URL)" in r.stdout
        assert "api_key: set  from environment (OPENAI_API_KEY)" in r.stdout
        assert r.stdout.rstrip().endswith("0 problem(s)")
        assert "sk-secret-123" not in r.stdout
        j = checks(qwenctl(d, "doctor", "--json").stdout)
        assert [j[n]["status"] for n in ("socket", "service", "config", "model")] == ["ok"] * 4
        assert j["inotify"]["details"]["max_user_watches"] > 0
        assert j["inotify"]["details"]["daemon_watches"] >= 0


def test_not_configured_and_broken_endpoint_look_different(spawn) -> None:  # type: ignore[no-untyped-def]
    bare: SpawnedDaemon = spawn().start()
    r = qwenctl(bare, "doctor")
    assert r.returncode == 1
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("PROBLEM") and "model" in ln)
    assert "not configured" in line and "OPENAI_BASE_URL" in line
    res = bare.call("model.probe", {})
    assert not res["configured"] and {s["status"] for s in res["shapes"]} == {"skipped"}
    broken: SpawnedDaemon = spawn(env={"OPENAI_BASE_URL": refused_base_url(),
                                       "OPENAI_MODEL": "m"}).start()
    r = qwenctl(broken, "doctor", "--probe-timeout", "3")
    assert r.returncode == 1
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("PROBLEM") and "model" in ln)
    assert "endpoint broken" in line and "connection" in line
    res = broken.call("model.probe", {"timeout_s": 3})
    assert res["configured"] and not res["reachable"]
    assert [s["status"] for s in res["shapes"]][2:] == ["skipped"] * 4


def test_settings_from_config_toml_and_settings_json(spawn) -> None:  # type: ignore[no-untyped-def]
    with ScriptedOpenAI(default=Reply(content='{"ok": true}')) as stub:
        d: SpawnedDaemon = spawn()
        cfg = d.home / ".config" / "qwenctxd" / "config.toml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text(f'[model]\nbase_url = "{stub.base_url}"\napi_key = "k"\n')
        cfg.chmod(0o600)
        settings = d.home / ".qwen" / "settings.json"
        settings.parent.mkdir(parents=True)
        settings.write_text('{"model": {"name": "stub-model"}, "fastModel": "stub-fast"}')
        d.start()
        res = d.call("model.probe", {"timeout_s": 5})
        assert res["sources"] == {"base_url": f"{cfg} ([model] base_url)",
                                  "api_key": f"{cfg} ([model] api_key)",
                                  "model": f"{settings} (model.name)",
                                  "fast_model": f"{settings} (fastModel)"}
        assert res["model"] == "stub-model" and res["reachable"]
        assert str(cfg) in res["config_files"]


def test_no_daemon(spawn) -> None:  # type: ignore[no-untyped-def]
    d: SpawnedDaemon = spawn()  # never started
    r = qwenctl(d, "doctor", "--json")
    assert r.returncode == 3
    j = checks(r.stdout)
    assert j["socket"]["status"] == "problem" and "no daemon answers" in j["socket"]["summary"]
    assert "inotify" in j and "model" not in j
    assert not d.socket.exists()  # doctor never starts the daemon it examines


def test_a_slow_endpoint_is_slow_not_refused_and_a_one_slot_server_is_named(spawn) -> None:  # type: ignore[no-untyped-def]
    # every answer takes 3 s; the probe deadline comes from model.timeout_s (1 s here)
    with ScriptedOpenAI(default=Reply(content='{"ok": true}', delay_s=3), props=True) as stub:
        d: SpawnedDaemon = spawn(env={"OPENAI_BASE_URL": stub.base_url,
                                      "OPENAI_MODEL": "stub-model", "OPENAI_API_KEY": "k",
                                      "QWENCTXD_MODEL_TIMEOUT_S": "1"}).start()
        j = checks(qwenctl(d, "doctor", "--json").stdout)
        model = j["model"]
        assert model["status"] == "warn", model
        assert "slow" in model["summary"] and "refused" not in model["summary"]
        assert "within 1 s" in model["summary"]
        assert model["details"]["slots"] == 1
