"""The proxy's bearer key (created once, 0600, under the config dir), the ``/p/<base64url>``
project prefix, and the ``export`` lines ``qwenctl proxy env`` prints."""

from __future__ import annotations

import base64
import hmac
import os
import secrets
import shlex
from pathlib import Path

from qwenctxd.fsutil import atomic_write
from qwenctxd.paths import config_dir

DEFAULT_LISTEN = "127.0.0.1:8788"
KEY_PREFIX = "qcx-"


def key_path() -> Path:
    return config_dir() / "proxy.key"


def load_or_create_key(path: Path | None = None) -> str:
    """The key in ``path`` (default ``~/.config/qwenctxd/proxy.key``), created 0600 if missing."""
    path = path or key_path()
    try:
        key = path.read_text(encoding="utf-8").strip()
        if key:
            return key
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    old = os.umask(0o077)
    try:
        atomic_write(path, key + "\n")
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return key


def bearer_ok(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>`` (constant-time compare)."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), key.encode())


def encode_project(path: str | Path) -> str:
    raw = str(Path(path).resolve()).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_project(token: str) -> str | None:
    """The absolute directory a ``/p/<token>`` prefix names, or None when it names none."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        path = raw.decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return path if path.startswith("/") and "\0" not in path else None


def base_url(listen: str, cwd: str | Path | None = None, default_cwd: str | Path | None = None
             ) -> str:
    """The OpenAI base URL for ``cwd``: plain ``/v1`` for the proxy's default directory, else
    with the ``/p/<base64url>`` prefix."""
    host, _, port = listen.rpartition(":")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    root = f"http://{host}:{port}"
    if cwd is None or (default_cwd is not None
                       and Path(cwd).resolve() == Path(default_cwd).resolve()):
        return root + "/v1"
    return f"{root}/p/{encode_project(cwd)}/v1"


def env_lines(url: str, key: str, model: str | None = None) -> list[str]:
    """``export`` lines for an OpenAI-compatible client: base URL, key and (when one is
    configured) the model, so Qwen Code and the openai SDK need nothing else."""
    lines = [f"export OPENAI_BASE_URL={url}", f"export OPENAI_API_KEY={key}"]
    if model:
        lines.append(f"export OPENAI_MODEL={shlex.quote(model)}")
    return lines
