"""The proxy: asyncio (uvloop when installed) listeners, one upstream connection per
client connection, frames forwarded both ways, responses paired with requests.

Forwarding comes first. Requests are forwarded as the bytes arrive, after their
headers have been noted for pairing; responses are forwarded frame by frame and
held only when broker addresses in them must be rewritten. Everything else
(decoding, captures, the live view) happens after forwarding, in
:class:`~kinspect.proxy.pipeline.Pipeline`, which may skip decoding under load
but never drops a frame.

Port-per-broker: each upstream broker address seen in a response gets its own
local listener, and responses are rewritten to point at it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..codec import Codec, DecodeError, FrameSizeError, FrameSplitter, KinspectError
from ..codec.frames import DEFAULT_MAX_FRAME
from ..flows import MUTATED, NO_RESPONSE, REWRITTEN, UNDECODED, UNPAIRED, Flow
from .rewrite import AddressRewriter
from .tracker import FlowTracker

log = logging.getLogger("kinspect.proxy")

_SIZE = struct.Struct(">i").pack


def parse_hostport(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``"host:port"``, ``"[::1]:port"`` or ``":port"`` → ``(host, port)``.

    Raises:
        ValueError: malformed text or a port outside 0..65535.
    """
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError(f"expected HOST:PORT, got {text!r}")
    port_n = int(port)
    if not 0 <= port_n <= 65535:
        raise ValueError(f"port {port_n} out of range")
    return host or default_host, port_n


@dataclass
class ProxyConfig:
    """Settings of a :class:`Proxy`.

    Attributes:
        upstream: bootstrap broker ``(host, port)``.
        listen: ``(host, port)`` of the bootstrap listener (port 0 = any free port).
        advertise_host: host written into rewritten responses (default: the listen
            host, or 127.0.0.1 when listening on a wildcard address).
        rewrite: rewrite broker addresses (port-per-broker); on by default.
        max_frame: largest frame accepted, bytes (Kafka's socket.request.max.bytes).
        connect_timeout: seconds allowed to reach a broker.
    """

    upstream: tuple[str, int]
    listen: tuple[str, int] = ("127.0.0.1", 0)
    advertise_host: str | None = None
    rewrite: bool = True
    max_frame: int = DEFAULT_MAX_FRAME
    connect_timeout: float = 10.0


@dataclass
class Stats:
    """Running totals (read by the live view)."""

    connections_total: int = 0
    connections_open: int = 0
    flows: int = 0
    bytes_from_clients: int = 0
    bytes_from_brokers: int = 0
    undecoded: int = 0
    decode_skipped: int = 0
    rewritten: int = 0
    connection_errors: int = 0
    started: float = field(default_factory=time.time)


class Listener:
    """One local listening socket forwarding to one upstream broker address."""

    def __init__(self, proxy: "Proxy", upstream: tuple[str, int], sock: socket.socket):
        self.proxy = proxy
        self.upstream = upstream
        self.sock = sock
        self.host, self.port = sock.getsockname()[:2]
        self.server: asyncio.base_events.Server | None = None
        self.closed = False

    async def start(self) -> None:
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _ClientSide(self.proxy, self), sock=self.sock)
        if self.closed:  # closed while starting
            self.server.close()

    def close(self) -> None:
        self.closed = True
        if self.server is not None:
            self.server.close()
        else:
            self.sock.close()


class Proxy:
    """A running proxy.

    Args:
        config: :class:`ProxyConfig`.
        codec: the frame codec (default spec search path when omitted).
        pipeline: post-forwarding consumer of flows; a default one (decode only)
            is created when omitted.

    Use ``await proxy.start()`` then ``await proxy.close()``; or ``async with``.
    """

    def __init__(self, config: ProxyConfig, codec: Codec | None = None,
                 pipeline: Any = None):
        from .pipeline import Pipeline

        self.config = config
        self.codec = codec or Codec()
        self.rewriter = AddressRewriter(self.codec.registry)
        self.pipeline = pipeline or Pipeline(self.codec)
        self.pipeline.attach(self)
        self.stats = Stats()
        self.listeners: dict[tuple[str, int], Listener] = {}
        self.connections: set[Connection] = set()
        self._next_conn = 0
        self._next_flow = 0
        self._closing = False
        self._rw_cache: dict[tuple[int, int], bool] = {}
        #: Optional frame mutators (the tagged-field workbench): callables
        #: ``(flow, frame) -> bytes | None`` returning a replacement frame (without
        #: size prefix) or ``None`` to leave the frame alone. With no request
        #: mutator, requests are forwarded as raw chunks (the fast path).
        self.request_mutator: Callable[[Flow, bytes], bytes | None] | None = None
        self.response_mutator: Callable[[Flow, bytes], bytes | None] | None = None

    # -- lifecycle -------------------------------------------------------------
    @property
    def bootstrap(self) -> Listener:
        return self.listeners[self.config.upstream]

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` clients should bootstrap from."""
        b = self.bootstrap
        return self.advertised_host(), b.port

    def advertised_host(self) -> str:
        if self.config.advertise_host:
            return self.config.advertise_host
        h = self.config.listen[0]
        return "127.0.0.1" if h in ("", "0.0.0.0", "::") else h

    async def start(self) -> "Proxy":
        sock = self._bind(self.config.listen[1])
        listener = Listener(self, self.config.upstream, sock)
        self.listeners[self.config.upstream] = listener
        await listener.start()
        self.pipeline.start()
        log.info("listening on %s:%d -> %s:%d", listener.host, listener.port,
                 *self.config.upstream)
        return self

    async def __aenter__(self) -> "Proxy":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, let in-flight responses drain (up to ``timeout`` s),
        close every connection and flush the pipeline."""
        if self._closing:
            return
        self._closing = True
        for lst in self.listeners.values():
            lst.close()
        deadline = time.monotonic() + timeout
        while any(c.pending for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for c in list(self.connections):
            c.close("proxy shutting down")
        for lst in self.listeners.values():
            if lst.server is not None:
                try:
                    await asyncio.wait_for(lst.server.wait_closed(), 1.0)
                except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                    pass
        await self.pipeline.close()

    def _bind(self, port: int) -> socket.socket:
        host = self.config.listen[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        sock.listen(1024)
        sock.setblocking(False)
        return sock

    # -- port-per-broker -------------------------------------------------------
    def listener_for(self, upstream: tuple[str, int]) -> Listener:
        """The listener forwarding to ``upstream``, created on first use.

        The socket is bound and listening before this returns, so a rewritten
        address is connectable at once; serving starts on the event loop.
        """
        lst = self.listeners.get(upstream)
        if lst is not None:
            return lst
        base = self.bootstrap.port
        sock = None
        for cand in range(base + 1, base + 1 + 64):
            if cand > 65535 or any(x.port == cand for x in self.listeners.values()):
                continue
            try:
                sock = self._bind(cand)
                break
            except OSError:
                continue
        if sock is None:
            sock = self._bind(0)
        lst = Listener(self, upstream, sock)
        self.listeners[upstream] = lst
        asyncio.get_running_loop().create_task(lst.start())
        log.info("broker %s:%d mapped to %s:%d", *upstream, self.advertised_host(), lst.port)
        return lst

    def map_address(self, node_id: int | None, host: str, port: int) -> tuple[str, int]:
        return self.advertised_host(), self.listener_for((host, port)).port

    def rewrite_response(self, api_key: int, api_version: int,
                         frame: bytes) -> tuple[bytes | None, Any]:
        """Rewrite the broker addresses in a response frame to this proxy's listeners
        (creating listeners for brokers seen for the first time).

        Returns:
            ``(new frame or None if nothing changed, the decoded response)``.
        Raises:
            DecodeError: the frame does not decode; EncodeError: it cannot be re-encoded.
        """
        resp = self.codec.decode_response(frame, api_key, api_version)
        if not self.rewriter.rewrite(api_key, api_version, resp.body, self.map_address):
            return None, resp
        self.stats.rewritten += 1
        return self.codec.encode_response(resp), resp

    def rewrite_needed(self, api_key: int, api_version: int) -> bool:
        key = (api_key, api_version)
        r = self._rw_cache.get(key)
        if r is None:
            r = self._rw_cache[key] = (self.config.rewrite and
                                       self.rewriter.needs_rewrite(api_key, api_version))
        return r

    # -- per-frame helpers used by connections ---------------------------------
    def new_conn_id(self) -> int:
        self._next_conn += 1
        return self._next_conn

    def new_flow_id(self) -> int:
        self._next_flow += 1
        return self._next_flow


class Connection:
    """One client connection and its upstream connection."""

    __slots__ = ("proxy", "listener", "id", "client", "upstream_addr", "client_tr", "up_tr",
                 "req_split", "resp_split", "tracker", "closed", "_early", "client_paused",
                 "up_paused", "opened", "__weakref__")

    def __init__(self, proxy: Proxy, listener: Listener, client_tr: asyncio.Transport):
        self.proxy = proxy
        self.listener = listener
        self.id = proxy.new_conn_id()
        peer = client_tr.get_extra_info("peername") or ("?", 0)
        self.client = f"{peer[0]}:{peer[1]}"
        self.upstream_addr = "%s:%d" % listener.upstream
        self.client_tr = client_tr
        self.up_tr: asyncio.Transport | None = None
        self.req_split = FrameSplitter(proxy.config.max_frame)
        self.resp_split = FrameSplitter(proxy.config.max_frame)
        self.tracker = FlowTracker(proxy.codec, self.id, self.client, self.upstream_addr,
                                   proxy.new_flow_id)
        self.closed = False
        self._early: list[bytes] = []
        self.client_paused = False
        self.up_paused = False
        self.opened = time.time_ns()

    @property
    def pending(self) -> dict[int, Flow]:
        return self.tracker.pending

    # -- client -> broker --------------------------------------------------------
    def from_client(self, data: bytes) -> None:
        proxy = self.proxy
        proxy.stats.bytes_from_clients += len(data)
        try:
            frames = self.req_split.feed(data)
        except FrameSizeError as e:
            for f in e.frames:
                self._request(f)
            self.close(f"client sent {e.reason}")
            return
        mutator = proxy.request_mutator
        if mutator is None:
            for f in frames:
                self._request(f)
            out = [data]
        else:
            out = []
            for f in frames:
                flow = self._request(f)
                new = mutator(flow, f)
                if new is not None:
                    flow.request_sent = new
                    flow.flags.add(MUTATED)
                    f = new
                out.append(_SIZE(len(f)))
                out.append(f)
            if not out:
                return
        if self.up_tr is None:
            self._early.extend(out)
        else:
            self.up_tr.writelines(out)

    def _request(self, frame: bytes) -> Flow:
        flow = self.tracker.request(frame, time.time_ns())
        pipeline = self.proxy.pipeline
        pipeline.request(flow)
        if NO_RESPONSE in flow.flags:
            pipeline.complete(flow)
        return flow

    # -- broker -> client --------------------------------------------------------
    def from_upstream(self, data: bytes) -> None:
        self.proxy.stats.bytes_from_brokers += len(data)
        try:
            frames = self.resp_split.feed(data)
        except FrameSizeError as e:
            self._send_frames([self._response(f) for f in e.frames])
            self.close(f"broker sent {e.reason}")
            return
        if frames:
            self._send_frames([self._response(f) for f in frames])

    def _send_frames(self, frames: list[bytes]) -> None:
        if not frames or self.client_tr.is_closing():
            return
        parts = []
        for f in frames:
            parts.append(_SIZE(len(f)))
            parts.append(f)
        self.client_tr.writelines(parts)

    def _response(self, frame: bytes) -> bytes:
        proxy = self.proxy
        flow = self.tracker.response(frame, time.time_ns())
        sent = frame
        if UNPAIRED not in flow.flags and flow.api_key >= 0 and \
                proxy.rewrite_needed(flow.api_key, flow.api_version):
            sent = self._rewrite(flow, frame)
        mutator = proxy.response_mutator
        if mutator is not None and UNPAIRED not in flow.flags:
            new = mutator(flow, sent)
            if new is not None:
                flow.response_sent = sent = new
                flow.flags.add(MUTATED)
        proxy.pipeline.complete(flow)
        return sent

    def _rewrite(self, flow: Flow, frame: bytes) -> bytes:
        proxy = self.proxy
        try:
            new, resp = proxy.rewrite_response(flow.api_key, flow.api_version, frame)
        except DecodeError as e:
            flow.flags.add(UNDECODED)
            flow.error = f"response: {e}"
            return frame
        except (KinspectError, OSError) as e:
            log.warning("conn %d: cannot rewrite %s v%d response, forwarded unchanged: %s",
                        self.id, flow.api_name, flow.api_version, e)
            flow.notes.append(f"rewrite failed: {e}")
            return frame
        if new is None:
            flow.response_decoded = resp  # reuse: it equals the bytes on the wire
            return frame
        flow.response_sent = new
        flow.flags.add(REWRITTEN)
        return new

    # -- lifecycle ---------------------------------------------------------------
    def upstream_ready(self, tr: asyncio.Transport) -> None:
        self.up_tr = tr
        if self.closed:
            tr.close()
            return
        if self._early:
            tr.writelines(self._early)
            self._early = []
        self.resume_client()

    def close(self, reason: str | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        if reason:
            log.info("conn %d (%s): closing: %s", self.id, self.client, reason)
        for tr in (self.client_tr, self.up_tr):
            if tr is not None and not tr.is_closing():
                tr.close()
        now = time.time_ns()
        for flow in self.tracker.close():
            self.proxy.pipeline.complete(flow)
        if self in self.proxy.connections:
            self.proxy.connections.discard(self)
            self.proxy.stats.connections_open -= 1
        self.proxy.pipeline.disconnected(self, now)

    def pause_client(self) -> None:
        if not self.client_paused and not self.client_tr.is_closing():
            self.client_paused = True
            self.client_tr.pause_reading()

    def resume_client(self) -> None:
        if self.client_paused and not self.client_tr.is_closing():
            self.client_paused = False
            self.client_tr.resume_reading()

    def pause_upstream(self) -> None:
        if self.up_tr is not None and not self.up_paused and not self.up_tr.is_closing():
            self.up_paused = True
            self.up_tr.pause_reading()

    def resume_upstream(self) -> None:
        if self.up_tr is not None and self.up_paused and not self.up_tr.is_closing():
            self.up_paused = False
            self.up_tr.resume_reading()


class _ClientSide(asyncio.Protocol):
    """Client-facing half of a connection."""

    def __init__(self, proxy: Proxy, listener: Listener):
        self.proxy = proxy
        self.listener = listener
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        proxy = self.proxy
        if proxy._closing:
            transport.close()
            return
        tr: asyncio.Transport = transport  # type: ignore[assignment]
        _nodelay(tr)
        conn = self.conn = Connection(proxy, self.listener, tr)
        tr.pause_reading()  # until the broker connection is up; resumed by upstream_ready
        conn.client_paused = True
        proxy.connections.add(conn)
        proxy.stats.connections_total += 1
        proxy.stats.connections_open += 1
        proxy.pipeline.connected(conn)
        asyncio.get_running_loop().create_task(self._connect_upstream(conn))

    async def _connect_upstream(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.listener.upstream
        try:
            tr, _ = await asyncio.wait_for(
                loop.create_connection(lambda: _UpstreamSide(conn), host, port),
                self.proxy.config.connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            self.proxy.stats.connection_errors += 1
            conn.close(f"cannot reach broker {host}:{port}: {e or type(e).__name__}")
            return
        _nodelay(tr)
        conn.upstream_ready(tr)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None and not conn.closed:
            conn.from_client(data)

    def eof_received(self) -> bool:
        if self.conn is not None:
            self.conn.close(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.close(f"client error: {exc}" if exc else None)

    def pause_writing(self) -> None:  # client is slow: stop reading from the broker
        if self.conn is not None:
            self.conn.pause_upstream()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_upstream()


class _UpstreamSide(asyncio.Protocol):
    """Broker-facing half of a connection."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        if not self.conn.closed:
            self.conn.from_upstream(data)

    def eof_received(self) -> bool:
        self.conn.close("broker closed the connection")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.close(f"broker connection lost: {exc}" if exc else "broker closed the connection")

    def pause_writing(self) -> None:  # broker is slow: stop reading from the client
        self.conn.pause_client()

    def resume_writing(self) -> None:
        self.conn.resume_client()


def _nodelay(tr: asyncio.BaseTransport) -> None:
    sock = tr.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


def install_uvloop() -> bool:
    """Use uvloop's event loop policy when uvloop is installed; return whether it is."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


Callback = Callable[[Flow], None]
