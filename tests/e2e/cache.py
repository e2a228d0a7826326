"""Where the end-to-end counterparts live: the cache that ``tests/e2e/prepare.sh`` fills.

A missing counterpart is a loud failure, never a skip: ``make e2e`` runs the prepare script
first, so a test that finds the cache empty says which piece is missing and how to get it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PREPARE = Path(__file__).with_name("prepare.sh")


def cache_dir() -> Path:
    """The e2e cache dir (``$QWENCTXD_E2E_CACHE``, default ``~/.cache/qwenctxd-e2e``)."""
    env = os.environ.get("QWENCTXD_E2E_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "qwenctxd-e2e"


def require(path: Path, what: str) -> Path:
    """``path`` when it exists; otherwise fail the test naming ``what`` and the fix."""
    if not path.exists():
        pytest.fail(
            f"{what} is missing ({path}); run `bash {PREPARE}` (make e2e does) "
            "with the package registries reachable",
            pytrace=False,
        )
    return path
