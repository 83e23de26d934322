"""The reference floor: a plain byte-forwarding TCP proxy on asyncio + uvloop.

No framing, no decoding, no address rewriting: every byte read from one side is
written to the other, with flow control both ways (a side whose peer cannot keep
up stops being read) and TCP_NODELAY on both sockets. This is the cost any
user-space proxy in Python pays; ``bench/proxy.py`` compares kinspect with it.

Because it does not rewrite addresses, the broker behind it must advertise the
forwarder's address (Tansu: ``--advertised-listener-url``).

Usage::

    python bench/forwarder.py --listen 127.0.0.1:19092 --upstream 127.0.0.1:9092

Prints ``listening on HOST:PORT`` on stdout once ready; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket


def _nodelay(tr: asyncio.BaseTransport) -> None:
    sock = tr.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Side(asyncio.Protocol):
    """One half of a forwarded connection; ``peer`` is the other half."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.early.append(data)
        else:
            peer.transport.write(data)

    def eof_received(self) -> bool:
        self._close_peer()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_peer()

    def _close_peer(self) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.transport.is_closing():
            peer.transport.close()

    # our transport's write buffer is full: stop reading the other side
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Client(_Side):
    def __init__(self, upstream: tuple[str, int]):
        super().__init__()
        self.upstream = upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        up = _Side()
        up.peer = self
        try:
            await loop.create_connection(lambda: up, *self.upstream)
        except OSError:
            self.transport.close()
            return
        self.peer = up
        if self.transport.is_closing():
            up.transport.close()
            return
        if self.early:
            up.transport.writelines(self.early)
            self.early = []


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def serve(listen: tuple[str, int], upstream: tuple[str, int],
                stop: asyncio.Event | None = None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream), *listen, backlog=1024,
                                      reuse_address=True)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--upstream", required=True)
    args = ap.parse_args(argv)
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    asyncio.run(serve(_hostport(args.listen), _hostport(args.upstream)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
