"""Baseline for the ping benchmark: a bare asyncio NDJSON echo server on a Unix socket.

Usage: python -m bench.echo_server SOCKET_PATH — prints "ready" once listening.
"""

from __future__ import annotations

import asyncio
import os
import sys


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(path: str) -> None:
    server = await asyncio.start_unix_server(handle, path)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if os.path.exists(sys.argv[1]):
        os.unlink(sys.argv[1])
    asyncio.run(main(sys.argv[1]))
