"""Running the real proxy in-process in front of a real broker, for tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import time
from typing import AsyncIterator

from kinspect.codec import Codec, frame
from kinspect.codec.protocol import Request
from kinspect.flows import Flow
from kinspect.proxy.server import Proxy, ProxyConfig

_CODEC: Codec | None = None


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP process ``pid`` and return once every thread of it has stopped (state
    ``T`` in ``/proc/<pid>/task/*/stat``). kill(2) returns before the threads of a
    busy process have all taken the stop, and on a loaded machine a request sent
    meanwhile could still be answered by a broker the test means to be frozen.

    Raises:
        AssertionError: the threads have not all stopped after ``timeout`` seconds.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    states.append(fh.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
        if states and all(st in ("T", "t") for st in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still running {timeout:.0f} s after SIGSTOP "
                                 f"(thread states {states})")
        time.sleep(0.001)


def codec() -> Codec:
    """One default-spec codec shared by the tests (loading specs takes a moment)."""
    global _CODEC
    if _CODEC is None:
        _CODEC = Codec()
    return _CODEC


class Recorder:
    """Pipeline addon keeping every completed flow."""

    def __init__(self) -> None:
        self.flows: list[Flow] = []
        self.requests: list[Flow] = []

    def on_request(self, flow: Flow) -> None:
        self.requests.append(flow)

    def on_flow(self, flow: Flow) -> None:
        self.flows.append(flow)


@contextlib.asynccontextmanager
async def running_proxy(bootstrap: str, **config) -> AsyncIterator[tuple[Proxy, Recorder]]:
    """Start :class:`Proxy` for ``bootstrap`` ("host:port") with a :class:`Recorder`;
    close it (draining the pipeline) on exit."""
    host, port = bootstrap.rsplit(":", 1)
    proxy = Proxy(ProxyConfig(upstream=(host, int(port)), **config), codec())
    rec = Recorder()
    proxy.pipeline.add(rec)
    await proxy.start()
    try:
        yield proxy, rec
    finally:
        await proxy.close()


def bootstrap_of(proxy: Proxy) -> str:
    return "%s:%d" % proxy.address


def request_bytes(api_key: int, api_version: int, correlation_id: int, client_id: str = "t",
                  **body) -> bytes:
    """A request frame (no size prefix) built with the codec."""
    c = codec()
    cls = c.request_codec(api_key).cls
    req = Request(api_key, api_version, correlation_id, client_id,
                  c.request_header_version(api_key, api_version), None, cls(**body), 0, "")
    return c.encode_request(req)


async def exchange(host: str, port: int, frames: list[bytes], timeout: float = 10.0) -> list[bytes]:
    """Send request frames pipelined on one connection; read one response per frame."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(b"".join(frame(f) for f in frames))
        await writer.drain()
        out = []
        for _ in frames:
            (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout))
            out.append(await asyncio.wait_for(reader.readexactly(size), timeout))
        return out
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def exchange_sync(host: str, port: int, frames: list[bytes], timeout: float = 10.0) -> list[bytes]:
    """:func:`exchange` with a blocking socket (for talking to a broker directly)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(b"".join(frame(f) for f in frames))
        out = []
        for _ in frames:
            size = struct.unpack(">i", _read(s, 4))[0]
            out.append(_read(s, size))
        return out


def _read(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


async def record_session(path, broker, values, topic, group, client: str = "kafka-python",
                         timeout: float = 20) -> list[str]:
    """Run ``client``'s produce/consume round trip through the real proxy in front of
    ``broker``, capturing every frame to ``path``; return what the client consumed."""
    from clients import roundtrip_async

    from kinspect.capture import CaptureWriter

    async with running_proxy(broker.bootstrap) as (proxy, _):
        proxy.pipeline.add(CaptureWriter(path, codec(), upstream=broker.bootstrap))
        return await roundtrip_async(client, bootstrap_of(proxy), values, topic=topic,
                                     group=group, timeout=timeout)
