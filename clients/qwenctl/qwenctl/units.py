"""``qwenctl install-service``: write the systemd user units for this installation.

The unit files shipped in ``qwenctl/units/`` (also linked from the repository's ``systemd/``)
are copied to ``$XDG_CONFIG_HOME/systemd/user/`` with ExecStart pointing at the qwenctxd of the
Python environment qwenctl runs from.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from importlib import resources
from pathlib import Path

UNIT_NAMES = ("qwenctxd.service", "qwenctxd.socket")


def unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(
        os.environ.get("HOME") or os.path.expanduser("~"), ".config"
    )
    return Path(base) / "systemd" / "user"


def exec_start() -> str:
    exe = shutil.which("qwenctxd", path=str(Path(sys.executable).parent))
    if exe:
        return f"{exe} serve --log-format json"
    return f"{sys.executable} -m qwenctxd serve --log-format json"


def render(name: str) -> str:
    text = resources.files("qwenctl").joinpath("units", name).read_text()
    if name.endswith(".service"):
        text = re.sub(r"^ExecStart=.*$", f"ExecStart={exec_start()}", text, flags=re.M)
    return text


def install(target: Path | None = None) -> list[Path]:
    target = target or unit_dir()
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name in UNIT_NAMES:
        path = target / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(render(name))
        os.replace(tmp, path)
        written.append(path)
    return written


SYSTEMCTL_LINES = (
    "systemctl --user daemon-reload",
    "systemctl --user enable --now qwenctxd.socket",
    "systemctl --user start qwenctxd.service   # optional: start now instead of on first use",
    "journalctl --user -u qwenctxd -f          # logs",
)
