"""A TCP relay that makes a loopback-only server reachable from containers on a bridge network.

The local control plane's kube-apiserver listens on 127.0.0.1 only; a container on compose's
bridge network reaches this machine at its gateway (``host.containers.internal``), not at the
loopback. The relay listens on every address at a free port and copies bytes both ways to the
loopback server: TLS passes through untouched, so the client still verifies the API server's own
certificate (the kubeconfig names the certificate's ``localhost`` with ``tls-server-name``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def relay(target_port: int, target_host: str = "127.0.0.1") -> AsyncIterator[int]:
    """Relay ``0.0.0.0:<port>`` to ``target_host:target_port`` while the block runs; yields
    the port."""
    tasks: set[asyncio.Task[None]] = set()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                target_host, target_port
            )
        except OSError:
            writer.close()
            return
        both = asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        await both

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(connected(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(track, "0.0.0.0", 0)
    port = int(server.sockets[0].getsockname()[1])
    try:
        yield port
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
