"""Pytest fixtures for tests that talk to a model endpoint over real HTTP.

Import the fixtures into a test module (``from qwenctxd.testing.pytest_fixtures import
openai_stub``) or list this module in ``pytest_plugins`` from ``tests/conftest.py``. Each fixture
yields a started :class:`~qwenctxd.testing.openai_stub.ScriptedOpenAI` and stops it after the
test, cutting any connection a client left open.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from qwenctxd.testing.openai_stub import ScriptedOpenAI

__all__ = ["openai_stub", "strict_openai_stub"]


@pytest.fixture
def openai_stub() -> Iterator[ScriptedOpenAI]:
    """A started scripted OpenAI-compatible server on loopback (lenient chat validation)."""
    with ScriptedOpenAI() as stub:
        yield stub


@pytest.fixture
def strict_openai_stub() -> Iterator[ScriptedOpenAI]:
    """Like ``openai_stub`` but malformed chat conversations get HTTP 400."""
    with ScriptedOpenAI(strict_chat=True) as stub:
        yield stub
