"""The proxy's HTTP client to the upstream: one pooled aiohttp session and its failure families.

Every request the proxy forwards, and the few it makes to learn a model's window, go through
the one :func:`open_session`: keep-alive HTTP/1.1 connections pooled per upstream, its
response parser in C, a streamed body read as whatever has arrived
(``content.iter_any()``, so a burst of SSE events is relayed in one write rather than one
write an event). aiohttp replaced httpx here because the relay is the proxy's hot path: under
32 concurrent streamed conversations httpx's pure-Python HTTP/1.1 stack was half the proxy's
CPU (docs/benchmarks.md, issue 28).

Bodies pass unchanged: no automatic decompression (the proxy asks for ``identity``), no
default ``User-Agent`` beyond aiohttp's own. Environment proxies (``HTTP(S)_PROXY``,
``NO_PROXY``) are honoured, as the openai SDK honours them — resolved once for the upstream
when the session opens, not per request (aiohttp's ``trust_env`` looks them and ``~/.netrc``
up in a worker thread for every request: 5 % of the proxy's CPU under load).
"""

from __future__ import annotations

import asyncio
import urllib.request
from urllib.parse import urlsplit

import aiohttp

#: the upstream could not be reached, or its reply broke off (connection refused, reset,
#: a chunked body cut short, a malformed response)
UpstreamError = aiohttp.ClientError
#: the upstream sent nothing for the read deadline, or did not accept the connection in time
#: (aiohttp's timeout errors are subclasses of this)
UpstreamTimeout = asyncio.TimeoutError

MAX_CONNECTIONS = 256
KEEPALIVE_S = 30.0
CONNECT_S = 10.0


def env_proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY`` for https, ``HTTP_PROXY``
    for http, ``ALL_PROXY`` otherwise), or None when there is none or ``NO_PROXY`` covers its
    host."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    found = proxies.get(parts.scheme) or proxies.get("all")
    if not found or (parts.hostname and urllib.request.proxy_bypass(parts.hostname)):
        return None
    return found


def open_session(read_s: float, upstream: str) -> aiohttp.ClientSession:
    """The proxy's session to ``upstream``: at most :data:`MAX_CONNECTIONS` connections, idle
    ones kept :data:`KEEPALIVE_S`; ``read_s`` bounds every wait for the upstream's next bytes
    (the reply's head included), not the whole reply — a long stream that keeps sending lives
    on. Call from inside the running event loop; close it with ``await session.close()``."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_S, sock_read=read_s),
        auto_decompress=False,
        proxy=env_proxy_for(upstream),
    )
