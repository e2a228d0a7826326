"""The proxy's upstream session honours environment proxies as the openai SDK does, resolved
once for the upstream (qwenctl/proxy/upstream_http.py)."""

from __future__ import annotations

import pytest
from qwenctl.proxy.upstream_http import env_proxy_for


@pytest.fixture
def no_env_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_no_proxy_in_the_environment_means_a_direct_connection(no_env_proxies) -> None:  # type: ignore[no-untyped-def]
    assert env_proxy_for("http://127.0.0.1:8080/v1") is None
    assert env_proxy_for("https://api.example.com/v1") is None


def test_the_scheme_s_proxy_is_used_unless_no_proxy_covers_the_host(no_env_proxies) -> None:  # type: ignore[no-untyped-def]
    env = no_env_proxies
    env.setenv("HTTPS_PROXY", "http://corp-proxy:3128")
    env.setenv("NO_PROXY", "localhost,127.0.0.1,.internal")
    assert env_proxy_for("https://api.example.com/v1") == "http://corp-proxy:3128"
    assert env_proxy_for("http://api.example.com/v1") is None  # no HTTP_PROXY
    assert env_proxy_for("https://127.0.0.1:8443/v1") is None
    assert env_proxy_for("https://llm.internal/v1") is None
    env.setenv("ALL_PROXY", "http://fallback:8080")
    assert env_proxy_for("http://api.example.com/v1") == "http://fallback:8080"
