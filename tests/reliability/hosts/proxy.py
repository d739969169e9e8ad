"""A TCP proxy that delays and drops, where the kernel has no ``netem``.

It listens on one address and forwards every connection to one target,
adding ``delay`` seconds to every chunk in each direction (a round trip
longer by twice that, bandwidth unchanged), and drops one connection in
every ``drop_every`` mid-stream: once the connection has carried a few
exchanges, both of its sockets are reset (RST), as a broken network path or
a restarting load balancer would. A doomed connection that closes before its
moment passes the doom on to the next one, so the share dropped holds.

It runs an asyncio loop in a daemon thread, holds at most
``max_connections`` connections (more are refused) and shuts itself down
after ``lifetime`` seconds if nobody stops it first.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass
class Drop:
    """A connection the proxy reset: when (monotonic) and whose it was."""

    at: float
    client: str


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0
    replies: int = 0  # chunks the target sent: about one per round trip
    drops: list[Drop] = field(default_factory=list)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN: the peer sees a broken connection."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Forward ``listen`` (host, port 0: a free one) to ``target``, delaying and dropping."""

    def __init__(
        self,
        listen_host: str,
        target: tuple[str, int],
        *,
        delay: float = 0.0,
        drop_every: int = 0,
        seed: int | None = None,
        max_connections: int = 200,
        lifetime: float = 3600.0,
    ) -> None:
        self.listen_host = listen_host
        self.target = target
        self.delay = delay
        self.drop_every = drop_every
        self.max_connections = max_connections
        self.lifetime = lifetime
        self.stats = ProxyStats()
        self.port = 0
        self._rng = random.Random(seed)
        self._doomed: set[int] = set()
        self._owed = 0  # dooms passed on by connections that closed too soon
        self._open = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._started = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None

    # --- the thread ---------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the fault proxy did not start")
        if self._error is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._thread.is_alive() and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _serve(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        try:
            server = await asyncio.start_server(self._handle, self.listen_host, 0)
        except OSError as exc:
            self._error = exc
            self._started.set()
            return
        self.port = int(server.sockets[0].getsockname()[1])
        self._started.set()
        async with server:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.lifetime)
            server.close()
            others = asyncio.all_tasks() - {asyncio.current_task()}
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

    # --- one connection -----------------------------------------------------
    def _doom(self, number: int) -> bool:
        """One connection in each block of ``drop_every`` (a random one), plus owed ones."""
        if not self.drop_every:
            return False
        if (number - 1) % self.drop_every == 0:
            self._doomed.add(number + self._rng.randrange(self.drop_every))
        if number in self._doomed:
            self._doomed.discard(number)
            return True
        if self._owed:
            self._owed -= 1
            return True
        return False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Cancelled at shutdown: end quietly (asyncio's stream callback would
        # report a cancelled handler as an error).
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay(reader, writer)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = str(writer.get_extra_info("peername")[0])
        if self._open >= self.max_connections:
            self.stats.refused += 1
            _reset(writer)
            return
        self.stats.connections += 1
        doomed = self._doom(self.stats.connections)
        self._open += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._open -= 1
            _reset(writer)
            return
        # the number of server replies after which a doomed connection is reset
        fuse = self._rng.randint(3, 10) if doomed else 0
        replies = asyncio.Event()
        counter = [0]
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer, None)),
            asyncio.ensure_future(self._pump(up_reader, writer, (counter, fuse, replies))),
        ]
        try:
            if doomed:
                fused = asyncio.ensure_future(replies.wait())
                done, _ = await asyncio.wait([*pumps, fused], return_when=asyncio.FIRST_COMPLETED)
                if fused in done:
                    self.stats.drops.append(Drop(time.monotonic(), client))
                else:
                    fused.cancel()
                    self._owed += 1  # it ended before its moment: the next one is doomed
            else:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for end in (writer, up_writer):
                if doomed:
                    _reset(end)
                else:
                    end.close()
            self._open -= 1

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        fuse: tuple[list[int], int, asyncio.Event] | None,
    ) -> None:
        """Copy ``source`` to ``sink``, each chunk ``delay`` seconds late, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    if sink.can_write_eof():
                        sink.write_eof()
                    return
                await asyncio.sleep(max(0.0, due - self._loop.time()))
                sink.write(data)
                await sink.drain()
                if fuse is not None:
                    self.stats.replies += 1
                    counter, limit, blown = fuse
                    counter[0] += 1
                    if limit and counter[0] >= limit:
                        blown.set()

        writer_task = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await source.read(CHUNK)
                queue.put_nowait((self._loop.time() + self.delay, data))
                if not data:
                    break
            await writer_task
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer_task.cancel()
