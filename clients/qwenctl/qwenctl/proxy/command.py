"""``qwenctl proxy`` (serve), ``qwenctl proxy key`` and ``qwenctl proxy env``."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from qwenctl.daemon_link import EXIT_OK, EXIT_USAGE
from qwenctl.proxy import keys
from qwenctxd.protocol import methods

if TYPE_CHECKING:
    from qwenctl.context import Ctx

UPSTREAM_KEY_ENV = "QWENCTXD_PROXY_UPSTREAM_KEY"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("proxy", parents=[common],
                       help="OpenAI-compatible proxy that runs requests through the daemon")
    p.add_argument("action", nargs="?", choices=("key", "env"),
                   help="key: print the bearer key; env: print export lines for this directory"
                        " (default: serve)")
    p.add_argument("--listen", default=keys.DEFAULT_LISTEN,
                   help=f"HOST:PORT to listen on (default {keys.DEFAULT_LISTEN}; port 0 picks one)")
    p.add_argument("--upstream", help="upstream OpenAI base URL (default: the configured "
                   "model endpoint)")
    p.add_argument("--cwd", help="the project of plain /v1 requests (default: the current "
                   "directory); with `env`: the directory to print the lines for")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="cap every forwarded max_tokens (default: only the upstream's window "
                        "caps it)")
    p.add_argument("--default-cwd", help="with `env`: the --cwd the proxy was started with "
                   "(that directory gets the plain /v1 URL; default: the current directory)")


def cmd_proxy(ctx: Ctx) -> int:
    a = ctx.args
    if a.action == "key":
        sys.stdout.write(keys.load_or_create_key() + "\n")
        return EXIT_OK
    if a.action == "env":
        cwd = Path(a.cwd or os.getcwd()).resolve()
        # the plain /v1 URL for the directory the proxy is taken to serve by default: where
        # this runs, unless --default-cwd says where it was started
        url = keys.base_url(a.listen, cwd, a.default_cwd or os.getcwd())
        sys.stdout.write("\n".join(keys.env_lines(url, keys.load_or_create_key(),
                                                   _configured_model())) + "\n")
        return EXIT_OK
    return serve(ctx)


def _configured_model() -> str | None:
    """The model the user configured (config.toml ``[model] model``, OPENAI_MODEL, Qwen
    Code's ``model.name``), for ``proxy env`` (whose stdout is for ``eval``: the config
    reader's log lines go to stderr, warnings only)."""
    import logging

    import structlog

    from qwenctxd.config import ConfigStore

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    return ConfigStore().load_global().endpoint().model


def _upstream(ctx: Ctx, key: str) -> tuple[str | None, str | None, float, int | None]:
    """The upstream URL, its key, its read deadline (``model.timeout_s``) and the configured
    window (``[model] context_window``, used when the upstream does not tell its own)."""
    from qwenctxd.config import ConfigStore

    ep = ConfigStore().load_global().endpoint()
    url = ctx.args.upstream or ep.base_url
    if not url:
        url = ctx.request(methods.DAEMON_STATUS).model.get("base_url")
    up_key = os.environ.get(UPSTREAM_KEY_ENV) or ep.api_key
    if up_key == key:  # OPENAI_API_KEY came from `eval "$(qwenctl proxy env)"`
        up_key = None
    return url, up_key, ep.timeout_s, ep.context_window


def serve(ctx: Ctx) -> int:
    import structlog
    import uvicorn

    from qwenctl.proxy.app import ProxyConfig, build_app

    a = ctx.args
    host, _, port_s = a.listen.rpartition(":")
    if not host or not port_s.isdigit():
        sys.stderr.write(f"qwenctl proxy: --listen wants HOST:PORT, not {a.listen!r}\n")
        return EXIT_USAGE
    cwd = str(Path(a.cwd or os.getcwd()).resolve())
    if not os.path.isdir(cwd):
        sys.stderr.write(f"qwenctl proxy: --cwd {cwd} is not a directory\n")
        return EXIT_USAGE
    key = keys.load_or_create_key()
    ctx.request(methods.DAEMON_PING)  # autostarts the daemon unless --no-autostart
    url, up_key, read_s, window = _upstream(ctx, key)
    ctx.close()
    if not url:
        sys.stderr.write("qwenctl proxy: no upstream: pass --upstream URL or configure the "
                         "model endpoint (OPENAI_BASE_URL, config.toml [model])\n")
        return EXIT_USAGE
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), int(port_s)))
    except OSError as exc:
        sys.stderr.write(f"qwenctl proxy: cannot listen on {a.listen}: {exc.strerror}\n")
        return EXIT_USAGE
    bound = f"{host}:{sock.getsockname()[1]}"
    up = urlsplit(url)
    if up.hostname in (host, "localhost", "127.0.0.1") and up.port == sock.getsockname()[1]:
        sys.stderr.write(f"qwenctl proxy: the upstream {url} is this proxy itself; pass "
                         "--upstream with the real model endpoint\n")
        return EXIT_USAGE
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    cfg = ProxyConfig(key=key, upstream=url, upstream_key=up_key, default_cwd=cwd,
                      socket=a.socket, upstream_read_s=read_s, context_window=window,
                      autostart=not a.no_autostart, max_tokens=a.max_tokens)
    sys.stderr.write(f"qwenctl proxy: listening on {keys.base_url(bound)} (project {cwd}, "
                     f"upstream {url})\n")
    sys.stderr.flush()
    # httptools by name (a dependency): the default would fall back to the pure-Python h11,
    # a quarter of the proxy's CPU under load (docs/design.md); the proxy reads no
    # X-Forwarded-* headers (it listens for local agents, not behind another proxy)
    config = uvicorn.Config(build_app(cfg), log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=5, http="httptools",
                            proxy_headers=False)
    uvicorn.Server(config).run(sockets=[sock])
    return EXIT_OK
