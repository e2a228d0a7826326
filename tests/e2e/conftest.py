"""End-to-end suite: real counterparts (llama.cpp server, the real Qwen Code CLI).

Run by ``make e2e`` (after ``tests/e2e/prepare.sh`` filled the cache), not by ``make test``.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in item.nodeid.replace("\\", "/") or item.nodeid.startswith("e2e/"):
            item.add_marker(pytest.mark.e2e)
