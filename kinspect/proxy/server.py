"""The proxy: asyncio (uvloop when installed) listeners, one upstream connection per
client connection, frames forwarded both ways, responses paired with requests.

Forwarding comes first. Bytes are forwarded as they arrive (cut-through,
:class:`CutThrough`: only size prefixes are checked first) and whole frames are
noted for pairing afterwards, except frames that may need changing (broker
addresses to rewrite, a request or response mutator), which are held until
whole. Everything else (decoding, captures, the live view) happens
after forwarding, in :class:`~kinspect.proxy.pipeline.Pipeline`, which may skip
decoding under load but never drops a frame.

Reads: the event loop hands each side's reads over as ``bytes``
(``data_received``); a read that is exactly one whole frame, with nothing under way
and nothing to hold it for, is forwarded there and then (what a request's latency
through the proxy is made of): in C, by the side's protocol itself (its base class
:class:`kinspect.proxy._frames.Hop`, see :meth:`Connection._refresh_fast`), or
without the extension in a few Python calls; and pairing it waits
(:meth:`Connection.settle`): until the pipeline's next batch, or until a frame takes
the long path or a connection opens or closes, whichever comes first (frames of all
connections are then paired in arrival order). A large frame gets a
buffer of its own once a sixteenth of it has arrived, and the side's transport then
reads the rest straight into it (``BufferedProtocol``, :class:`CutThrough`) until
the frame is whole.

Flow control both ways: a side whose peer cannot keep up stops being read, so a
slow client holds back the broker (and the reverse) instead of filling memory.
Connections end without resets: on shutdown or when the other side goes away, the
proxy flushes what it holds, sends FIN and drops what the client still sends
until it closes (at most :data:`LINGER` seconds). A client's FIN with answers still
due is passed on to the broker, and the answers still reach the client
(:meth:`Connection.client_eof`).

Port-per-broker: each upstream broker address seen in a response gets its own
local listener, and responses are rewritten to point at it.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import operator
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..codec import Codec, DecodeError, FrameSizeError, KinspectError
from ..codec.frames import DEFAULT_MAX_FRAME
from ..codec.protocol import scan_clear as _scan_clear
from ..flows import MUTATED, NO_RESPONSE, REWRITTEN, UNDECODED, UNPAIRED, Flow
from .rewrite import AddressRewriter, Unspliceable
from .tracker import PRODUCE, SASL_HANDSHAKE, FlowTracker

try:
    from ._frames import FrameBuffer as _FrameBuffer
except ImportError:  # built without a C compiler: frames are read into bytearrays
    _FrameBuffer = None
try:  # the short path of reads in C (both sides' protocols derive from Hop)
    from ._frames import ABI as _FRAMES_ABI, Counters as _CCounters, Hop as _Hop
except ImportError:  # (or an older build of _frames, ABI < 3: the short path in Python)
    _FRAMES_ABI, _CCounters, _Hop = 0, None, None
if _FRAMES_ABI < 3 or os.environ.get("KINSPECT_NATIVE", "").strip() == "0":
    _CCounters = _Hop = None

log = logging.getLogger("kinspect.proxy")
_UNSET = object()

_SIZE = struct.Struct(">i").pack
_I = struct.Struct(">i").unpack_from
_II = struct.Struct(">ii").unpack_from
_HHI = struct.Struct(">hhi").unpack_from
#: most (api key, api version) pairs remembered by a proxy's per-pair caches
_CACHE_MAX = 4096
#: bytes of short-path frames waiting to be paired past which an answer read kicks
#: the pipeline (requests kick it anyway: Pipeline.kick)
BATCH_KICK = 1 << 20
RAW, END = 0, 1
#: most bytes read at once into a frame's own buffer (about what the event loops
#: read at once: 256,000 bytes for uvloop, 256 KiB for asyncio), and the size of the
#: buffer reads are dropped into (Proxy.scratch)
SCRATCH = 256 * 1024
#: frames this long or longer get a buffer of their own (CutThrough) ...
DIRECT_MIN = 64 * 1024
#: ... once a sixteenth of them has arrived ...
DIRECT_SHARE = 16
#: ... and while the proxy's own buffers lack no more than this many bytes in all
UNFILLED_MAX = 64 << 20
#: seconds a client gets to close its end after the proxy has sent FIN
LINGER = 2.0
#: connections the kernel completes ahead of the proxy accepting them, per listener
#: (``listen()`` backlog; the kernel caps it at ``net.core.somaxconn``): a burst of
#: clients connecting at once, e.g. all of them coming back after a broker restart,
#: beyond it waits for SYN retransmissions (a second and more)
BACKLOG = 1024
#: reasons for not reading a side (bits of Connection.client_hold / up_hold)
HOLD_FLOW = 1         # the other side cannot take more (transport flow control)
HOLD_PIPELINE = 2     # the pipeline is too far behind (Proxy.overload)
HOLD_CONNECTING = 4   # the broker connection is not up yet
HOLD_INFLIGHT = 8     # MAX_INFLIGHT requests wait for their answers
#: requests of one connection waiting for their answers beyond which the proxy stops
#: reading the client, until half of them are answered: each is a tracked flow (some
#: 800 bytes however small the frame), and a broker that does not read or answer
#: must not make the proxy hold them without limit. Kafka brokers read one request
#: of a connection at a time (the rest wait in the socket), so this is far beyond
#: what a client gains by sending ahead.
MAX_INFLIGHT = 1024
#: requests waiting for their answers over all connections beyond which the proxy is
#: crowded (:meth:`Proxy.check_crowding`): each connection may then have only
#: :data:`CROWDED_INFLIGHT` waiting, until the total is under half of this. Clients
#: that send ahead and never read their answers (or a broker that does not answer),
#: on many connections, would else hold MAX_INFLIGHT flows each: 300 connections of
#: 14-byte requests made some 300 MB of flows of the 8 MB read.
MAX_INFLIGHT_TOTAL = 32768
CROWDED_INFLIGHT = 16
#: seconds between two looks at the total (at the start of pipeline batches)
CROWDING_CHECK_S = 0.01
HOLD_SLICE = 16       # the rest of a read waits for the next loop iteration
#: frames of one read handled in one event-loop callback: a read of tiny frames (a
#: 256 KiB read holds some 18,000 frames of 14 bytes) is handled this many at a
#: time, reading that side paused in between, so that it holds the loop for
#: milliseconds, not a tenth of a second (other connections wait meanwhile)
SLICE_FRAMES = 1024


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
    try:
        port_n = int(port)
    except ValueError:
        raise ValueError(f"expected HOST:PORT with a port number, got {text!r}") from None
    if not 0 <= port_n <= 65535:
        raise ValueError(f"port {port_n} out of range")
    return host or default_host, port_n


def format_hostport(host: Any, port: int) -> str:
    """``host:port``, ``[host]:port`` for an IPv6 host: what :func:`parse_hostport`
    reads back."""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


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
        max_listeners: most listeners, the bootstrap one included (one per broker
            address the responses name, port-per-broker): a response naming more
            brokers than are left is forwarded unchanged and logged
            (:class:`ListenerLimitError`), so a broker cannot make the proxy bind
            sockets until it has no file descriptor left for its clients.
    """

    upstream: tuple[str, int]
    listen: tuple[str, int] = ("127.0.0.1", 0)
    advertise_host: str | None = None
    rewrite: bool = True
    max_frame: int = DEFAULT_MAX_FRAME
    connect_timeout: float = 10.0
    max_listeners: int = 256


class ListenerLimitError(KinspectError):
    """A response names more broker addresses than :attr:`ProxyConfig.max_listeners`
    leaves listeners for."""


class _PyCounters:
    """The counts every read moves (:class:`kinspect.proxy._frames.Counters` when the
    C extension is built): bytes read from each side, and the frames and bytes of the
    short path not paired yet."""

    __slots__ = ("bytes_from_clients", "bytes_from_brokers", "unsettled_frames",
                 "unsettled_bytes")

    def __init__(self) -> None:
        self.bytes_from_clients = self.bytes_from_brokers = 0
        self.unsettled_frames = self.unsettled_bytes = 0


def _new_counters() -> Any:
    return _CCounters() if _CCounters is not None else _PyCounters()


def _counter(name: str, doc: str) -> property:
    """A property reading and writing ``self.counters.<name>``."""
    return property(operator.attrgetter("counters." + name),
                    lambda self, n: setattr(self.counters, name, n), doc=doc)


@dataclass
class Stats:
    """Running totals (read by the live view). ``bytes_from_clients`` and
    ``bytes_from_brokers`` live in :attr:`counters`, which the hops move."""

    connections_total: int = 0
    connections_open: int = 0
    flows: int = 0
    undecoded: int = 0
    decode_skipped: int = 0
    rewritten: int = 0
    connection_errors: int = 0
    #: times the pipeline fell so far behind that reading was paused
    overloads: int = 0
    #: times requests waiting for answers over all connections passed
    #: MAX_INFLIGHT_TOTAL, so that each connection could have only CROWDED_INFLIGHT
    crowdings: int = 0
    #: reads of more than SLICE_FRAMES frames, handled a slice at a time
    sliced_reads: int = 0
    started: float = field(default_factory=time.time)
    counters: Any = field(default_factory=_new_counters, repr=False, compare=False)

    bytes_from_clients = _counter("bytes_from_clients", "Bytes read from clients.")
    bytes_from_brokers = _counter("bytes_from_brokers", "Bytes read from brokers.")




class Unfilled:
    """How many more bytes of frame buffers may be allocated before they are read
    into (:class:`CutThrough`; one budget per proxy): what caps what a proxy
    allocates beyond what it has read."""

    __slots__ = ("room",)

    def __init__(self, room: int = UNFILLED_MAX) -> None:
        self.room = room


class CutThrough:
    """Sans-io framing for forwarding: which bytes may leave as they arrive, and
    the whole frames, for the pipeline.

    Feed each chunk read from one side; :meth:`feed` returns events in stream
    order: ``(RAW, data, False)``, bytes to forward now, and ``(END, frame, held)``,
    a frame (without its size prefix) is complete. Frames pass through as their
    bytes arrive (cut-through) unless ``must_hold(corr)`` says, at the frame's
    start, to hold it: then none of its bytes are emitted as RAW, and the caller
    sends the whole frame (possibly changed) when it ends. ``corr`` is the int32
    after the size prefix (a response's correlation id), ``None`` for frames
    shorter than 4 bytes. The first bytes of a frame are kept back until its size
    and those 4 bytes are known (at most 7 bytes).

    Reading. :meth:`take` (or :meth:`feed`) takes bytes already read (the event
    loop's ``data_received``; the proxy's protocols forward a read of exactly one
    whole frame themselves when nothing is under way, as ``feed``'s first branch
    does, and add it to :attr:`consumed`). Once a sixteenth of a frame of at least
    ``direct_min`` bytes has arrived, :meth:`take` gives the frame a buffer of its
    own size (:attr:`own`: a :class:`~kinspect.proxy._frames.FrameBuffer` when the
    C extension is built, the bytes object itself) and copies in what came of it so
    far. Until the frame is whole, the rest of its body is read straight into that
    buffer (:meth:`read_buffer` and :meth:`read_done`, for asyncio's
    ``BufferedProtocol``): those bytes are never copied in user space, and their
    RAW events are read-only views of the buffer (which is never written again, so
    they may be kept, e.g. queued by the transport). Reads then stop at the frame's
    end, and take at most 256 KiB at once (what the event loop reads at once), so
    that flow control reacts as often.

    Copies: a frame inside one chunk is copied once; a frame spread over chunks
    is joined once at its end (chunks are kept as views until then), or, read into
    its own buffer, not at all (only the pieces that came before it got its buffer
    are copied in; without the C extension the buffer is a ``bytearray``, copied
    into ``bytes`` at the end).

    Memory: a frame's own buffer is at most ``direct_share`` times the bytes of the
    frame read so far, and the parts not read into yet of all own buffers sharing
    one :class:`Unfilled` budget come to at most its ``room`` (64 MiB; a frame that
    does not fit is collected in pieces). Otherwise a frame costs what has arrived
    of it. :meth:`clear` lets go of an incomplete frame (the proxy calls it when a
    connection closes; a draining connection keeps its request frame's share until
    then).

    Slices: with ``limit``, :meth:`feed` stops at the first frame that starts once
    it has ``limit`` events, and leaves the bytes from there in :attr:`rest` (to be
    fed next, before anything read later), so that a chunk of thousands of tiny
    frames is handled a slice at a time.

    Raises:
        FrameSizeError: a size prefix outside ``0..max_frame`` (the stream cannot
            be followed past it). ``events`` on the exception holds the events for
            the bytes before that prefix; none of the prefix's bytes are in them.
    """

    __slots__ = ("max_frame", "left", "hold", "head", "parts", "_consumed", "hop", "body",
                 "direct_min", "direct_share", "unfilled", "own", "own_view",
                 "own_data", "fill", "rest")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, direct_min: int = DIRECT_MIN,
                 direct_share: int = DIRECT_SHARE, unfilled: Unfilled | None = None) -> None:
        self.max_frame = max_frame
        self.left = 0       # body bytes of the current frame still to come
        self.hold = False   # the current frame is held
        self.head = b""     # the first bytes (< 8) of a frame, kept back until decided
        self.parts: list = []  # body pieces of the current frame so far
        self.body = 0       # body size of the current frame
        self._consumed = 0
        #: the side's :class:`Hop <kinspect.proxy._frames.Hop>`, whose short path in C
        #: forwards whole frames without this object (see :attr:`consumed`)
        self.hop: Any = None
        #: frames this long or longer may be read into a buffer of their own ...
        self.direct_min = max(2, direct_min)
        #: ... once this fraction (1/direct_share) of the frame has arrived
        self.direct_share = direct_share
        #: the budget of own-buffer bytes not read into yet (shared by the proxy's
        #: connections; a CutThrough made without one gets one of its own)
        self.unfilled = unfilled if unfilled is not None else Unfilled()
        self.own: Any = None        # the current frame's own buffer (FrameBuffer, bytearray)
        self.own_view: memoryview | None = None   # writable: where reads go
        self.own_data: memoryview | None = None   # read-only: what is forwarded
        self.fill = 0               # bytes of the frame in ``own`` so far
        #: bytes of a chunk left unfed when :meth:`feed` stopped at its ``limit``
        #: (they start a frame); feed them next
        self.rest: bytes | None = None

    @property
    def consumed(self) -> int:
        """Bytes fed so far, with those the side's C short path forwarded (``_consumed``
        counts the rest: what is fed is added there)."""
        hop = self.hop
        return self._consumed if hop is None else self._consumed + hop.consumed

    @property
    def buffered(self) -> int:
        """Bytes held for the incomplete frame (kept-back header bytes included)."""
        if self.own is not None:
            return self.fill
        return len(self.head) + sum(len(p) for p in self.parts)

    def read_buffer(self) -> memoryview:
        """Where the next read from the socket goes while the frame under way has a
        buffer of its own (``BufferedProtocol.get_buffer``): the rest of that buffer,
        at most :data:`SCRATCH` bytes. Report what was read with :meth:`read_done`
        before asking again.

        Raises:
            RuntimeError: no frame has a buffer of its own (:attr:`own` is None).
        """
        if self.own_view is None:
            raise RuntimeError("CutThrough.read_buffer() without a frame buffer (see take())")
        return self.own_view[self.fill:self.fill + SCRATCH]

    def read_done(self, n: int) -> list:
        """``n`` bytes were read into :meth:`read_buffer`'s buffer: the events, as
        :meth:`feed` returns them, RAW data as read-only views of the frame's buffer.
        When the frame is whole, :attr:`own` is None again: later bytes go to
        :meth:`take`. (Whether the frame is held was decided in ``take``.)

        Raises:
            RuntimeError: no frame has a buffer of its own.
        """
        if self.own_view is None:
            raise RuntimeError("CutThrough.read_done() without a frame buffer (see take())")
        a = self.fill
        b = self.fill = a + n
        self.left -= n
        self._consumed += n
        self.unfilled.room += n
        ev = [] if self.hold else [(RAW, self.own_data[a:b], False)]
        if not self.left:
            own = self.own
            frame = bytes(own) if type(own) is bytearray else own.frame
            self.own = self.own_view = self.own_data = None
            self.fill = 0
            ev.append((END, frame, self.hold))
            self.hold = False
        return ev

    def take(self, data: bytes, must_hold, limit: int = 0) -> list:
        """:meth:`feed` ``data`` (bytes the event loop read: ``data_received``); then,
        when the frame under way qualifies, give it a buffer of its own (copying in
        what came of it so far), so that the next reads can go straight there
        (:meth:`read_buffer`, :meth:`read_done`; check :attr:`own`)."""
        ev = self.feed(data, must_hold, limit)
        if self.left and self.parts:
            self._own_buffer()
        return ev

    def _own_buffer(self) -> None:
        """Give the current frame a buffer of its own when it is large enough, enough
        of it has arrived and the budget has room for the rest; the pieces so far are
        copied into it."""
        size = self.body
        if size < self.direct_min or (size - self.left) * self.direct_share < size:
            return
        view = self._take_buffer(size, self.left)
        if view is None:
            return  # go on collecting pieces, joined at the end
        pos = 0
        parts = self.parts
        for p in parts:
            k = len(p)
            view[pos:pos + k] = p
            pos += k
        parts.clear()
        self.fill = pos

    def _take_buffer(self, size: int, left: int) -> memoryview | None:
        """A buffer of its own for the current frame (``size`` bytes, ``left`` of them
        still to come), charged to the budget; ``None`` when the budget has no room
        for ``left`` or the memory cannot be had. Returns the writable view."""
        unfilled = self.unfilled
        if left > unfilled.room:
            return None
        try:
            own = _FrameBuffer(size) if _FrameBuffer is not None else bytearray(size)
        except MemoryError:
            return None
        unfilled.room -= left
        view = memoryview(own)
        self.own, self.own_view, self.own_data = own, view, view.toreadonly()
        return view

    def unsent(self) -> list:
        """The bytes fed and not emitted yet (a list of bytes-like pieces): the
        first bytes of a frame kept back until its size was known, or what came of a
        held frame, its size prefix first. A connection ending mid-frame passes them
        on, so the other side gets what this side sent, as without the proxy."""
        if self.rest is not None:  # (a frame starts there: nothing else is kept)
            return [self.rest]
        if self.head:
            return [self.head]
        if not self.hold:
            return []
        out: list = [_SIZE(self.body)]
        if self.own is not None:
            out.append(self.own_data[:self.fill])
        else:
            out.extend(self.parts)
        return out

    def clear(self) -> None:
        """Let go of the incomplete frame (the connection is ending): its pieces, its
        own buffer and its share of the budget. The stream cannot be followed after
        this: do not feed this CutThrough again."""
        if self.own is not None:
            self.unfilled.room += self.left
            self.own = self.own_view = self.own_data = None
            self.fill = 0
        self.parts.clear()
        self.head = b""
        self.left = 0
        self.hold = False
        self.rest = None

    def feed(self, data: bytes, must_hold, limit: int = 0) -> list:
        """The events for ``data``, the next bytes of the stream (see the class);
        with ``limit`` (> 0), stops at the first frame starting once there are that
        many events, leaving the bytes from there in :attr:`rest`.

        Raises:
            FrameSizeError: see the class.
            RuntimeError: while a frame is read into its own buffer, or bytes are
                left in :attr:`rest` (feed those first).
        """
        n = len(data)
        if self.rest is not None and self.rest is not data:
            raise RuntimeError("CutThrough.feed() with bytes left in rest (feed those first)")
        self.rest = None
        if not self.left and not self.head and n >= 8:  # the common case: one whole frame
            size = _I(data, 0)[0]
            if size + 4 == n and 4 <= size <= self.max_frame:
                self._consumed += n
                if must_hold(_I(data, 4)[0]):
                    return [(END, data[4:], True)]
                return [(RAW, data, False), (END, data[4:], False)]
        if self.own is not None:
            raise RuntimeError("CutThrough.feed() while a frame is read into its own buffer "
                               "(read_buffer/read_done until it is whole)")
        ev: list = []
        mv = memoryview(data)
        pos = 0
        left = self.left
        hold = self.hold
        parts = self.parts
        run = -1 if (hold and (left or parts)) else 0  # start of bytes not yet emitted
        while pos < n:
            if left:
                k = left if left <= n - pos else n - pos
                if not parts and k == left:
                    frame = bytes(mv[pos:pos + k])  # the whole body is in this chunk
                    pos += k
                else:
                    parts.append(data if k == n else mv[pos:pos + k])
                    pos += k
                    left -= k
                    if left:
                        break
                    frame = b"".join(parts)
                    parts.clear()
                left = 0
                ev.append((END, frame, hold))
                if hold:
                    hold = False
                    run = pos
                continue
            # a frame starts here
            if limit and len(ev) >= limit:  # the rest in the next slice
                if 0 <= run < pos:
                    ev.append((RAW, data[run:pos], False))
                self.rest = data[pos:]
                self.left = 0
                self.hold = False
                self._consumed += pos
                return ev
            head = self.head
            hdr = head + bytes(mv[pos:pos + 8 - len(head)]) if head else bytes(mv[pos:pos + 8])
            if len(hdr) >= 4:
                size = _I(hdr, 0)[0]
                if size < 0 or size > self.max_frame:
                    if 0 <= run < pos:
                        ev.append((RAW, data[run:pos], False))
                    err = FrameSizeError(f"frame size {size} outside 0..{self.max_frame}",
                                         offset=self.consumed + pos - len(head),
                                         expected="int32 frame size")
                    err.events = ev
                    self._consumed += n
                    # a frame starts here: nothing of one is under way (unsent())
                    self.left, self.hold, self.head = 0, False, b""
                    self.parts.clear()
                    raise err
            if len(hdr) < 4 or (size >= 4 and len(hdr) < 8):
                if 0 <= run < pos:
                    ev.append((RAW, data[run:pos], False))
                self.head = hdr  # not enough to decide: keep these bytes back
                run = n
                pos = n
                break
            hold = bool(must_hold(_I(hdr, 4)[0] if size >= 4 else None))
            if hold:
                if 0 <= run < pos:
                    ev.append((RAW, data[run:pos], False))
                run = -1
            elif head:
                ev.append((RAW, head, False))  # at the start of ``data``: nothing before it
            self.body = size
            # the part of the header that belongs to the body (beyond the prefix)
            if head:
                self.head = b""
                pos += max(0, 4 - len(head))
                if len(head) > 4:
                    parts.append(head[4:])
                    left = size - (len(head) - 4)
                else:
                    left = size
            else:
                pos += 4
                left = size
            if left == 0:  # an empty body (or one that was all in ``head``)
                frame = b"".join(parts) if parts else b""
                parts.clear()
                ev.append((END, frame, hold))
                if hold:
                    hold = False
                    run = pos
        if 0 <= run < n:
            ev.append((RAW, data[run:] if run else data, False))
        self.left = left
        self.hold = hold
        self._consumed += n
        return ev


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
        # (the backlog again: create_server listens anew, with 100 unless told)
        self.server = await loop.create_server(
            lambda: _ClientSide(self.proxy, self), sock=self.sock, backlog=BACKLOG)
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
        #: (one bound method for every connection's hops)
        self.pipeline_kick = self.pipeline.kick
        self.stats = Stats()
        self.listeners: dict[tuple[str, int], Listener] = {}
        self.connections: set[Connection] = set()
        #: client transports that got FIN and may still send (see _end_client)
        self.lingering: set[asyncio.Transport] = set()
        #: the pipeline is too far behind: no connection is read (see overload)
        self.overloaded = False
        #: so many requests wait for answers that each connection may have only
        #: CROWDED_INFLIGHT waiting (see check_crowding)
        self.crowded = False
        self._crowding_checked = 0.0
        self._next_conn = 0
        self._next_flow = 0
        self._closing = False
        #: the bootstrap socket bound by bind() and not yet used by start()
        self._sock: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()  # listener start-ups in flight
        self._rw_cache: dict[tuple[int, int], bool] = {}
        #: where reads are dropped into (a connection ending while a frame is read
        #: into a buffer of its own)
        self.scratch = memoryview(bytearray(SCRATCH))
        #: what frame buffers not read into yet may come to, over all connections
        self.unfilled = Unfilled()
        self._trigger_cache: dict[tuple[int, int], frozenset[int] | None] = {}
        #: (api key, api version) -> what the short path notes for its requests
        #: (see response_check)
        self._checks: dict[tuple[int, int], tuple | None] = {}
        #: connections with frames forwarded on the short path and not paired yet
        #: (Connection.settle), and how many such frames (and bytes) there are
        self.unsettled: list[Connection] = []
        #: the counts every read moves (also the stats' byte counts)
        self.counters = self.stats.counters
        #: numbers the short path's frames in arrival order, across connections
        self.arrivals = itertools.count()
        self._request_mutator: Callable[[Flow, bytes], bytes | None] | None = None
        self._response_mutator: Callable[[Flow, bytes], bytes | None] | None = None

    unsettled_frames = _counter(
        "unsettled_frames", "Frames forwarded on the short path and not paired yet "
        "(all connections).")
    unsettled_bytes = _counter("unsettled_bytes", "Their bytes.")

    @property
    def request_mutator(self) -> Callable[[Flow, bytes], bytes | None] | None:
        """Optional request mutator (the tagged-field workbench): a callable ``(flow,
        frame) -> bytes | None`` returning a replacement frame (without size prefix)
        or ``None`` to leave the frame alone. Without one, requests are forwarded as
        they are read (the short path). May be set at any time."""
        return self._request_mutator

    @request_mutator.setter
    def request_mutator(self, mutator: Callable[[Flow, bytes], bytes | None] | None) -> None:
        self._request_mutator = mutator
        for c in self.connections:
            c._refresh_fast()

    @property
    def response_mutator(self) -> Callable[[Flow, bytes], bytes | None] | None:
        """Optional response mutator, as :attr:`request_mutator`."""
        return self._response_mutator

    @response_mutator.setter
    def response_mutator(self, mutator: Callable[[Flow, bytes], bytes | None] | None) -> None:
        self._response_mutator = mutator
        for c in self.connections:
            c._refresh_fast()

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

    def bind(self) -> None:
        """Bind the bootstrap listener's socket now, before :meth:`start` (which uses
        it): a port in use is then found before anything else is set up (a capture
        file created). Idempotent.

        Raises:
            OSError: the listen address cannot be bound.
        """
        if self._sock is None:
            self._sock = self._bind(self.config.listen[1])

    def listen_address(self) -> tuple[str, int]:
        """``(host, port)`` the bootstrap listener is bound to: the configured host
        and the port actually bound (the one the system chose for port 0). Binds
        first (:meth:`bind`).

        Raises:
            OSError: the listen address cannot be bound.
        """
        self.bind()
        if self._sock is not None:
            return self.config.listen[0], self._sock.getsockname()[1]
        return self.config.listen[0], self.bootstrap.port

    async def start(self) -> "Proxy":
        self.bind()
        sock, self._sock = self._sock, None
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
        """Shut down cleanly: stop accepting; stop forwarding requests (what clients
        still send is dropped); let the responses to requests already forwarded
        arrive and reach their clients (up to ``timeout`` s); then end every
        connection without a reset (flush, FIN, up to :data:`LINGER` s for the
        client to close) and flush the pipeline (captures end with whole frames)."""
        if self._closing:
            return
        self._closing = True
        if self._sock is not None:  # bound, never started
            self._sock.close()
            self._sock = None
        for lst in list(self.listeners.values()):
            lst.close()
        for c in list(self.connections):
            c.drain()
        deadline = time.monotonic() + timeout
        self.settle()
        while any(c.tracker.inflight for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            self.settle()
        for c in list(self.connections):
            c.close("proxy shutting down")
        deadline = time.monotonic() + LINGER
        while self.lingering and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for tr in list(self.lingering):
            tr.abort()
        self.lingering.clear()
        for lst in list(self.listeners.values()):
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
        sock.listen(BACKLOG)
        sock.setblocking(False)
        return sock

    # -- port-per-broker -------------------------------------------------------
    def listener_for(self, upstream: tuple[str, int]) -> Listener:
        """The listener forwarding to ``upstream``, created on first use.

        The socket is bound and listening before this returns, so a rewritten
        address is connectable at once; serving starts on the event loop.

        Raises:
            ListenerLimitError: :attr:`ProxyConfig.max_listeners` listeners exist.
            OSError: no port can be bound.
        """
        lst = self.listeners.get(upstream)
        if lst is not None:
            return lst
        if len(self.listeners) >= self.config.max_listeners:
            raise ListenerLimitError(
                f"broker {upstream[0]}:{upstream[1]} needs a listener, and all "
                f"{self.config.max_listeners} are taken (max_listeners)")
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
        if self._closing:  # a response drained during shutdown: nothing will connect
            lst.close()
        else:
            self._tasks.add(task := asyncio.get_running_loop().create_task(lst.start()))
            task.add_done_callback(self._tasks.discard)
        log.info("broker %s:%d mapped to %s:%d", *upstream, self.advertised_host(), lst.port)
        return lst

    def map_address(self, node_id: int | None, host: str, port: int) -> tuple[str, int]:
        return self.advertised_host(), self.listener_for((host, port)).port

    def rewrite_response(self, api_key: int, api_version: int, frame: bytes) -> bytes | None:
        """Rewrite the broker addresses in a response frame to this proxy's listeners
        (creating listeners for brokers seen for the first time).

        The new addresses are spliced into the broker's bytes
        (:meth:`AddressRewriter.splice <kinspect.proxy.rewrite.AddressRewriter.splice>`):
        the new frame differs from the broker's only in the addresses and the sizes
        of the tagged fields around them, however the broker encoded the rest. The
        response is walked, not decoded (the pipeline decodes it after forwarding).
        (Specs whose ``Host`` or ``Port`` is a tagged field, which no Kafka spec
        has, are decoded, rewritten and re-encoded instead.)
        Responses whose addresses can only be in top-level tagged fields (Produce
        v10+, Fetch v16+: KIP-951 ``NodeEndpoints``) are first scanned for those tags
        (:meth:`~kinspect.codec.Codec.response_top_level_tags`).

        Args:
            frame: the response frame without its size prefix.

        Returns:
            The new frame, or ``None`` when no address changed.
        Raises:
            DecodeError: the frame is malformed (as a decode tells it).
            ListenerLimitError: it names more brokers than ``max_listeners``.
        """
        tags = self._triggers(api_key, api_version)
        if tags is not None and not tags & self.codec.response_top_level_tags(
                frame, api_key, api_version):
            return None  # e.g. Produce/Fetch without NodeEndpoints: nothing to do
        offset = self.codec.decode_response(frame, api_key, api_version, body=False).body_offset
        try:
            new, changed = self.rewriter.splice(api_key, api_version, frame, offset,
                                                self.map_address)
        except DecodeError:
            # say where and what, as a decode does (the walk checks as much, less
            # precisely); a frame the walk refuses does not decode either
            self.codec.decode_response(frame, api_key, api_version)
            raise
        except Unspliceable:  # (a spec of one's own with a tagged Host or Port)
            resp = self.codec.decode_response(frame, api_key, api_version)
            changed = self.rewriter.rewrite(api_key, api_version, resp.body, self.map_address)
            new = self.codec.encode_response(resp) if changed else frame
        if not changed:
            return None
        self.stats.rewritten += 1
        return new

    def _triggers(self, api_key: int, api_version: int) -> frozenset[int] | None:
        """The top-level tags a response must carry to hold broker addresses, or
        ``None`` when they may be anywhere (``AddressRewriter.trigger_tags``, kept)."""
        key = (api_key, api_version)
        tags = self._trigger_cache.get(key, _UNSET)
        if tags is _UNSET:
            tags = self.rewriter.trigger_tags(api_key, api_version)
            if len(self._trigger_cache) < _CACHE_MAX or self._known(api_key, api_version):
                self._trigger_cache[key] = tags
        return tags

    def response_check(self, api_key: int, api_version: int) -> tuple | None:
        """What the short path notes (``Connection.apis``) for a request whose
        response it will forward: ``None`` when responses of this api key and
        version carry no broker address (:meth:`rewrite_needed`), else ``(api_key,
        api_version, scan)``. ``scan`` is ``(program, body offset in a read with its
        size prefix, trigger tags as a bit mask: 1 << tag)`` when every address sits
        under a top-level tagged field of a tag under 64 (KIP-951 ``NodeEndpoints``
        of Produce v10+ and Fetch v16+, tag 0) and the C scan is there
        (:meth:`Codec.response_tag_scanner
        <kinspect.codec.Codec.response_tag_scanner>`, and
        :data:`kinspect.codec.protocol.scan_clear`, which asks it in place): a
        response whose top-level tags include none of those is forwarded as read.
        Else ``None``: every response goes through :meth:`rewrite_response`. Kept
        per pair, as in :meth:`rewrite_needed`."""
        key = (api_key, api_version)
        chk = self._checks.get(key, _UNSET)
        if chk is not _UNSET:
            return chk
        chk = None
        if self.rewrite_needed(api_key, api_version):
            scan = None
            tags = self._triggers(api_key, api_version)
            if tags is not None and _scan_clear is not None and all(t < 64 for t in tags):
                try:
                    found = self.codec.response_tag_scanner(api_key, api_version)
                except Exception:  # noqa: BLE001 - a bug; the generic step still checks
                    log.exception("no in-place scan of %s v%d responses",
                                  self.codec.api_name(api_key), api_version)
                    found = None
                if found is not None:
                    scan = (found[0], found[1] + 4, sum(1 << t for t in tags))
            chk = (api_key, api_version, scan)
        if len(self._checks) < _CACHE_MAX or self._known(api_key, api_version):
            self._checks[key] = chk
        return chk

    def _known(self, api_key: int, api_version: int) -> bool:
        """A response spec defines this api key and version."""
        return self.codec.response_header_version(api_key, api_version) is not None

    def rewrite_needed(self, api_key: int, api_version: int) -> bool:
        """Whether responses of this api key and version may carry broker addresses
        to rewrite (remembered for every pair a spec defines, and for at most
        :data:`_CACHE_MAX` pairs in all: the pairs come from request headers, which
        a client may fill with anything)."""
        key = (api_key, api_version)
        r = self._rw_cache.get(key)
        if r is None:
            r = bool(self.config.rewrite and self.rewriter.needs_rewrite(api_key, api_version))
            if len(self._rw_cache) < _CACHE_MAX or self._known(api_key, api_version):
                self._rw_cache[key] = r
        return r

    def overload(self, on: bool) -> None:
        """Pause (``on``) or resume reading every connection, both ways: called by
        the pipeline when the frames waiting for it pass its high-water mark and
        when they fall back under its low-water mark. Frames are never dropped;
        forwarding waits instead, and memory stays bounded."""
        if on == self.overloaded:
            return
        self.overloaded = on
        self.stats.overloads += on
        if on:
            log.warning("pipeline behind: pausing all connections until it catches up")
        for c in list(self.connections):
            if c.closed or c.draining:
                continue
            if on:
                c.pause_client(HOLD_PIPELINE)
                c.pause_upstream(HOLD_PIPELINE)
            else:
                c.resume_client(HOLD_PIPELINE)
                c.resume_upstream(HOLD_PIPELINE)
                # the rest of a read that waited for the pipeline (see _after)
                if c.req_cut.rest is not None and c.client_side is not None \
                        and not c.client_hold & HOLD_INFLIGHT:
                    c.client_side.slice_later()
                if c.resp_cut.rest is not None and c.upstream_side is not None:
                    c.upstream_side.slice_later()

    @property
    def inflight_limit(self) -> int:
        """Requests one connection may have waiting for answers before it is not
        read: :data:`MAX_INFLIGHT`, or :data:`CROWDED_INFLIGHT` while crowded."""
        return CROWDED_INFLIGHT if self.crowded else MAX_INFLIGHT

    @property
    def slice_frames(self) -> int:
        """Frames of a client's read handled in one callback: :data:`SLICE_FRAMES`,
        or :data:`CROWDED_INFLIGHT` while crowded (one read passes the limit by
        little)."""
        return CROWDED_INFLIGHT if self.crowded else SLICE_FRAMES

    def check_crowding(self, now: float | None = None) -> None:
        """Look at the requests waiting for answers over all connections (called
        by the pipeline at the start of its batches, at most every
        :data:`CROWDING_CHECK_S`): past :data:`MAX_INFLIGHT_TOTAL` the proxy is
        crowded, and a connection with :data:`CROWDED_INFLIGHT` or more waiting is
        not read until half of them are answered (as for :data:`MAX_INFLIGHT`
        itself), the short path in C off meanwhile (it checks MAX_INFLIGHT); under
        half the total, the usual limit again. What one connection holds stays
        bounded by MAX_INFLIGHT, and what all do by about the total: the flows of
        requests sent ahead, some 800 bytes each however small the frame."""
        now = time.monotonic() if now is None else now
        if now - self._crowding_checked < CROWDING_CHECK_S:
            return
        self._crowding_checked = now
        conns = [c for c in self.connections if not c.closed]
        total = sum(len(c.tracker.inflight) + len(c.unsettled) for c in conns)
        if not self.crowded and total > MAX_INFLIGHT_TOTAL:
            self.crowded = True
            self.stats.crowdings += 1
            log.warning("%d requests wait for answers on %d connections: each connection "
                        "may have %d waiting until half of them are answered", total,
                        len(conns), CROWDED_INFLIGHT)
            for c in conns:
                c._refresh_fast()
                if len(c.tracker.inflight) + len(c.unsettled) >= CROWDED_INFLIGHT:
                    c._inflight_check()
        elif self.crowded and total <= MAX_INFLIGHT_TOTAL // 2:
            self.crowded = False
            log.info("%d requests wait for answers: the usual limit again", total)
            for c in conns:
                c._refresh_fast()
                if c.client_hold & HOLD_INFLIGHT:
                    c._inflight_answered()

    # -- per-frame helpers used by connections ---------------------------------
    def settle(self) -> None:
        """Pair every frame forwarded on the short path so far and hand the flows to
        the pipeline (:meth:`Connection.settle`), all connections' frames in the
        order they arrived: the pipeline, and so a capture, sees the frames in
        arrival order, as if each had been paired as it was forwarded. Called before
        each pipeline batch, and before any connection's long path, open or close."""
        conns = self.unsettled
        if not conns:
            return
        self.unsettled = []
        if len(conns) == 1:
            conns[0].settle()
            return
        streams = []
        for c in conns:
            events = c._take_unsettled()
            if events:
                streams.append([(ev[2], c, ev) for ev in events])
        for _seq, c, ev in heapq.merge(*streams, key=_first):  # by arrival
            c._settle_one(ev)

    def _unsettle(self, conn: "Connection") -> None:
        """``conn`` now has frames waiting to be paired: make sure the pipeline's
        next batch comes (within its ``delay``)."""
        if not self.unsettled:
            self.pipeline.expect()
        self.unsettled.append(conn)

    def new_conn_id(self) -> int:
        self._next_conn += 1
        return self._next_conn

    def new_flow_id(self) -> int:
        self._next_flow += 1
        return self._next_flow


class Connection:
    """One client connection and its upstream connection."""

    __slots__ = ("proxy", "listener", "id", "client", "upstream_addr", "client_tr", "up_tr",
                 "req_cut", "resp_cut", "tracker", "closed", "_early", "client_hold",
                 "up_hold", "opened", "closed_ns", "draining", "unsettled", "apis", "simple",
                 "half_closed", "client_side", "upstream_side", "hop_calls", "__weakref__")

    def __init__(self, proxy: Proxy, listener: Listener, client_tr: asyncio.Transport):
        self.proxy = proxy
        self.listener = listener
        self.id = proxy.new_conn_id()
        peer = client_tr.get_extra_info("peername") or ("?", 0)
        self.client = f"{peer[0]}:{peer[1]}"
        self.upstream_addr = "%s:%d" % listener.upstream
        self.client_tr = client_tr
        self.up_tr: asyncio.Transport | None = None
        #: framing of each direction (cut-through; see CutThrough)
        self.req_cut = CutThrough(proxy.config.max_frame, unfilled=proxy.unfilled)
        self.resp_cut = CutThrough(proxy.config.max_frame, unfilled=proxy.unfilled)
        self.tracker = FlowTracker(proxy.codec, self.id, self.client, self.upstream_addr,
                                   proxy.new_flow_id)
        self.closed = False
        #: shutting down: requests are no longer forwarded, responses still are
        self.draining = False
        self._early: list[bytes] = []
        #: why reading is paused (bit set of HOLD_*); reading resumes when empty
        self.client_hold = HOLD_CONNECTING
        self.up_hold = 0
        self.opened = time.time_ns()
        #: time.time_ns() when the connection was closed (``None`` while open)
        self.closed_ns: int | None = None
        #: frames forwarded on the short path, not paired yet, in order: requests
        #: ``(data, ns, arrival)``, responses ``(data, ns, arrival, rewrite
        #: outcome)``, ``arrival`` from Proxy.arrivals (see settle)
        self.unsettled: list[tuple] = []
        #: correlation id -> how the unsettled requests' responses are to be
        #: checked for broker addresses (Proxy.response_check), None when they are
        #: not: the tracker, which has not seen these requests, stands in for them
        #: only for ids not here (a client may reuse an id)
        self.apis: dict[int, tuple | None] = {}
        #: frames may take the short path (not after a SaslHandshake v0 request:
        #: raw SASL tokens follow, which only the tracker tells apart; nor once the
        #: client half-closed: each answer is then paired as it is sent)
        self.simple = True
        #: the client sent FIN with answers still to come (see client_eof)
        self.half_closed = False
        #: the client's protocol (_ClientSide), which handles a read's later slices
        self.client_side: Any = None
        self.upstream_side: Any = None
        #: what both sides' Hops call back (see _bind_hop)
        self.hop_calls: tuple | None = None

    def _refresh_fast(self) -> None:
        """Let each side's reads take the short path in C (:class:`Hop
        <kinspect.proxy._frames.Hop>`, ``fast``) exactly while the conditions of the
        short path hold, as the Python one checks them at every read: the connection
        open and not draining (requests), no SASL tokens to come and no half-close
        (``simple``), no frame under way on that side, no mutator for that side, and
        for answers, reading the client not held for :data:`MAX_INFLIGHT`; and the
        proxy not crowded (:meth:`Proxy.check_crowding`). Called
        wherever one of them may have changed: after every read Python handled (the
        C path changes none), after a read's later slice or a large frame read in
        place, on opening, closing and draining, and when a mutator or that hold is
        set. Nothing without the C extension."""
        if _Hop is None:
            return
        proxy = self.proxy
        # (crowded: the C path checks MAX_INFLIGHT, not the limit in effect)
        ok = not self.closed and self.simple and not proxy.crowded
        side = self.client_side
        if side is not None:
            cut = self.req_cut
            side.fast = ok and self.up_tr is not None and not self.draining and not cut.left \
                and not cut.head and cut.rest is None and cut.own is None \
                and proxy._request_mutator is None
        side = self.upstream_side
        if side is not None:
            cut = self.resp_cut
            side.fast = ok and not cut.left and not cut.head and cut.rest is None \
                and cut.own is None and proxy._response_mutator is None \
                and not self.client_hold & HOLD_INFLIGHT

    def settle(self) -> None:
        """Pair the frames forwarded on the short path (``data_received``), in their
        order, and hand the flows to the pipeline: what the long path does for each
        frame as it forwards it. :meth:`Proxy.settle` does this for every connection
        (in arrival order across them) before each pipeline batch, and before any
        other frame or event reaches the tracker or the pipeline (a long path, a
        connection's open or close). Pairing
        right after the write costs a round trip's latency on two cores (the peer
        woken by the write waits for the core); done here, it costs the same time
        off the forwarding path."""
        for ev in self._take_unsettled():
            self._settle_one(ev)

    def _take_unsettled(self) -> list:
        """The frames waiting to be paired (the list is this connection's no more)."""
        unsettled = self.unsettled
        if not unsettled:
            return []
        events = unsettled[:]  # (the list stays the connection's: the hops hold it)
        unsettled.clear()
        self.apis.clear()
        counters = self.proxy.counters
        counters.unsettled_frames -= len(events)
        counters.unsettled_bytes -= sum(len(ev[0]) for ev in events)
        return events

    def _settle_one(self, ev: tuple) -> None:
        data = ev[0]
        try:
            if len(ev) == 3:  # a request: (data, ns, arrival)
                self._request(data[4:], ev[1])
                return
            flow = self.tracker.response(data[4:], ev[1])  # (..., rewrite outcome)
            if ev[3] is not None and UNPAIRED not in flow.flags:
                _apply_outcome(flow, ev[3])
            self.proxy.pipeline.complete(flow)
        except Exception:  # noqa: BLE001 - a bug must not cost the other frames' flows
            log.exception("conn %d: cannot pair a frame (it was forwarded)", self.id)

    # -- client -> broker --------------------------------------------------------
    def client_read(self, n: int) -> None:
        """``n`` bytes were read from the client into ``req_cut.read_buffer()``."""
        self._from_client(n, self.req_cut.read_done, n)

    def client_data(self, data: bytes) -> None:
        """``data`` was read from the client by the event loop: handled up to
        :data:`SLICE_FRAMES` frames; the rest waits in ``req_cut.rest`` for
        :meth:`client_rest`."""
        n = len(data)
        cut = self.req_cut
        if cut.rest is not None:  # (read while a slice waits: not while reading is paused)
            data, cut.rest = cut.rest + data, None
        self._from_client(n, cut.take, data, self._hold_request, self.proxy.slice_frames)
        if cut.rest is not None:
            self.proxy.stats.sliced_reads += 1

    def client_rest(self, limit: int | None = None) -> None:
        """The next slice of what is left of a read from the client (``req_cut.rest``),
        of at most ``limit`` frames (``None``: :attr:`Proxy.slice_frames`; 0: all)."""
        cut = self.req_cut
        if cut.rest is not None:
            self._from_client(0, cut.take, cut.rest, self._hold_request,
                              self.proxy.slice_frames if limit is None else limit)

    def _from_client(self, n: int, framing: Callable[..., list], *args: Any) -> None:
        """``n`` bytes read from the client: framed by ``framing(*args)`` (a
        ``req_cut`` method), forwarded and noted."""
        if self.closed or self.draining:
            return  # read and dropped: the connection is ending
        if self.up_tr is None:  # read while the broker connection is being made
            # (uvloop, see pause_client): no more until it is up
            self.pause_client(HOLD_CONNECTING)
        proxy = self.proxy
        proxy.settle()  # first what came before, on every connection
        proxy.stats.bytes_from_clients += n
        try:
            events, error = framing(*args), None
        except FrameSizeError as e:  # forward what came before the bad size prefix
            events, error = e.events, e
        self._requests(events, error)
        if len(self.tracker.inflight) >= self.proxy.inflight_limit:
            self._inflight_check()

    def _inflight_check(self) -> None:
        """Many requests may be waiting for answers: stop reading the client while
        :data:`MAX_INFLIGHT` do (counted once the frames of the short path are paired).
        The rest of a read past the mark (its later slices) waits too, as bytes."""
        if not self.client_hold & HOLD_INFLIGHT and not self.closed:
            self.proxy.settle()
            if len(self.tracker.inflight) >= self.proxy.inflight_limit:
                self.pause_client(HOLD_INFLIGHT)

    def _inflight_answered(self) -> None:
        """Answers came while reading the client is held for :data:`MAX_INFLIGHT`:
        read again once half of them are answered."""
        self.proxy.settle()
        if len(self.tracker.inflight) <= self.proxy.inflight_limit // 2:
            self.resume_client(HOLD_INFLIGHT)
            if self.req_cut.rest is not None and self.client_side is not None:
                self.client_side.slice_later()  # the rest of the read that passed the mark

    def _requests(self, events: list, error: FrameSizeError | None) -> None:
        proxy = self.proxy
        out: list = []
        noted: list[bytes] = []  # frames that went through unheld: noted after the write
        for kind, x, held in events:
            if kind == RAW:
                out.append(x)
            elif not held:
                noted.append(x)
            else:  # a request mutator may replace the frame
                for f in noted:
                    self._request(f)
                noted.clear()
                flow = self._request(x)
                new = proxy.request_mutator(flow, x) if proxy.request_mutator else None
                if new is not None:
                    flow.request_sent = new
                    flow.flags.add(MUTATED)
                    x = new
                out.append(_SIZE(len(x)))
                out.append(x)
        if out:  # forward first
            if self.up_tr is None:
                self._early.extend(out)
            elif len(out) == 1:
                self.up_tr.write(out[0])
            else:
                self.up_tr.writelines(out)
        for f in noted:
            self._request(f)
        if noted or out:
            proxy.pipeline.kick()  # the broker has work now: time for the pipeline's
        if error is not None:
            self.close(f"client sent {error.reason}", logging.WARNING)

    def _hold_request(self, _corr: int | None) -> bool:
        return self.proxy.request_mutator is not None

    def _request(self, frame: bytes, now: int | None = None) -> Flow:
        flow = self.tracker.request(frame, time.time_ns() if now is None else now)
        if flow.api_key == SASL_HANDSHAKE and flow.api_version == 0:
            self.simple = False  # raw SASL tokens may follow (KIP-43): only the
            # tracker tells them from requests, so no short path from now on
            self._refresh_fast()
        pipeline = self.proxy.pipeline
        pipeline.request(flow)
        if NO_RESPONSE in flow.flags:
            pipeline.complete(flow)
        return flow

    # -- broker -> client --------------------------------------------------------
    def upstream_read(self, n: int) -> None:
        """``n`` bytes were read from the broker into ``resp_cut.read_buffer()``."""
        self._from_broker(n, self.resp_cut.read_done, n)

    def upstream_data(self, data: bytes) -> None:
        """``data`` was read from the broker by the event loop (handled a slice at a
        time, as :meth:`client_data`)."""
        n = len(data)
        cut = self.resp_cut
        if cut.rest is not None:  # (as in client_data)
            data, cut.rest = cut.rest + data, None
        self._from_broker(n, cut.take, data, self._must_hold, SLICE_FRAMES)
        if cut.rest is not None:
            self.proxy.stats.sliced_reads += 1

    def upstream_rest(self, limit: int | None = None) -> None:
        """The next slice of what is left of a read from the broker (``resp_cut.rest``),
        of at most ``limit`` frames (as in :meth:`client_rest`)."""
        cut = self.resp_cut
        if cut.rest is not None:
            self._from_broker(0, cut.take, cut.rest, self._must_hold,
                              SLICE_FRAMES if limit is None else limit)

    def _from_broker(self, n: int, framing: Callable[..., list], *args: Any) -> None:
        """``n`` bytes read from the broker: framed by ``framing(*args)`` (a
        ``resp_cut`` method), forwarded and paired."""
        if self.closed:
            return
        proxy = self.proxy
        proxy.settle()  # first what came before, on every connection
        proxy.stats.bytes_from_brokers += n
        try:
            events, error = framing(*args), None
        except FrameSizeError as e:  # forward what came before the bad size prefix
            events, error = e.events, e
        self._responses(events, error)
        if self.client_hold & HOLD_INFLIGHT and not self.closed:
            self._inflight_answered()

    def _responses(self, events: list, error: FrameSizeError | None) -> None:
        proxy = self.proxy
        out: list = []
        noted: list = []  # (frame, held): paired and handed on after the write
        for kind, x, held in events:
            if kind == RAW:
                out.append(x)
            elif not held:
                noted.append((x, False))
            elif proxy.response_mutator is None and not noted and not self.tracker.dups:
                sent = self._rewrite_held(x)  # held for address rewriting only
                out.append(_SIZE(len(sent)))
                out.append(sent)
                noted.append((x, True))
            else:  # a mutator sees the paired flow (and the request a frame answers
                # is known once the answers before it are paired: one of them may
                # have its correlation id): pair what came before first
                for f, h in noted:
                    self._response(f, h, False)
                noted.clear()
                sent = self._response(x, True, True)
                out.append(_SIZE(len(sent)))
                out.append(sent)
        if out and not self.client_tr.is_closing():
            if len(out) == 1:
                self.client_tr.write(out[0])
            else:
                self.client_tr.writelines(out)
        for f, h in noted:
            self._response(f, h, False)
        if error is not None:
            self.close(f"broker sent {error.reason}", logging.WARNING)
        elif self.half_closed and not self.tracker.inflight:
            self.close(None)  # the client half-closed and has every answer now

    def _rewrite_held(self, frame: bytes) -> bytes:
        """The bytes to send for a frame held for address rewriting (before it is
        paired: the flow it will pair with is looked up without changing state)."""
        flow = self._to_rewrite(_I(frame, 0)[0])
        return frame if flow is None else self._rewrite(flow, frame)

    def _to_rewrite(self, corr: int | None) -> Flow | None:
        """The flow the response with correlation id ``corr`` will pair with, when
        that response may carry broker addresses to rewrite; else ``None``."""
        if corr is None:
            return None
        flow = self.tracker.peek(corr)
        if flow is None or flow.api_key < 0:
            return None
        proxy = self.proxy
        need = proxy._rw_cache.get((flow.api_key, flow.api_version))
        if need is None:
            need = proxy.rewrite_needed(flow.api_key, flow.api_version)
        return flow if need else None

    def _must_hold(self, corr: int | None) -> bool:
        """Whether the response frame with correlation id ``corr`` must be held
        whole before it is sent: a mutator may replace it, or it may carry broker
        addresses to rewrite."""
        if self.proxy.response_mutator is not None or self._to_rewrite(corr) is not None:
            return True
        # a reused correlation id: the request it answers is known only once the
        # answers before it are paired (in _responses), so hold it until then
        dups = self.tracker.dups
        return bool(dups) and corr in dups

    def _response(self, frame: bytes, held: bool = True, change: bool = True) -> bytes:
        """Pair a response frame and hand it to the pipeline. With ``change``, a held
        frame is rewritten and given to the response mutator here, and the bytes to
        send are returned; without, it was already dealt with (``_rewrite_held``)."""
        proxy = self.proxy
        flow = self.tracker.response(frame, time.time_ns())
        sent = frame
        if UNPAIRED not in flow.flags:
            if held and change:
                if flow.api_key >= 0 and proxy.rewrite_needed(flow.api_key, flow.api_version):
                    sent = self._rewrite(flow, frame)
                mutator = proxy.response_mutator
                if mutator is not None:
                    new = mutator(flow, sent)
                    if new is not None:
                        flow.response_sent = sent = new
                        flow.flags.add(MUTATED)
            elif (not held and flow.api_key >= 0 and
                  proxy.rewrite_needed(flow.api_key, flow.api_version)):
                # its request came after the response started (a reused correlation id)
                flow.notes.append("forwarded unchanged: it was not held for rewriting")
        proxy.pipeline.complete(flow)
        return sent

    def _rewrite(self, flow: Flow, frame: bytes) -> bytes:
        sent, outcome = self._rewrite_frame(flow.api_key, flow.api_version, frame)
        _apply_outcome(flow, outcome)
        return sent

    def _rewrite_frame(self, api_key: int, api_version: int,
                       frame: bytes) -> tuple[bytes, tuple]:
        """Rewrite the broker addresses in a response frame: the bytes to send, and
        what happened, for :func:`_apply_outcome` to note on the flow."""
        try:
            new = self.proxy.rewrite_response(api_key, api_version, frame)
        except DecodeError as e:
            return frame, (_UNDECODED, f"response: {e}")
        except (KinspectError, OSError) as e:
            log.warning("conn %d: cannot rewrite %s v%d response, forwarded unchanged: %s",
                        self.id, self.proxy.codec.api_name(api_key), api_version, e)
            return frame, (_FAILED, f"rewrite failed: {e}")
        if new is None:
            return frame, _SCANNED
        return new, (_REWRITTEN, new)

    # -- lifecycle ---------------------------------------------------------------
    def client_eof(self) -> bool:
        """The client sent FIN (``eof_received``). With requests forwarded and not
        answered yet, and no request frame under way, the broker gets FIN too and
        its answers still go to the client, as they would without the proxy (a
        client may shut down its sending side after its last request, and Kafka
        brokers answer what they read before the end of stream); the connection
        ends when the last answer is sent (:meth:`_responses`) or the broker
        closes. Else it ends now. Returns whether the client's transport stays
        open (what ``eof_received`` returns)."""
        if self.closed:
            return False
        if self.half_closed:  # told again (reading was resumed after the end)
            return True
        self.proxy.settle()  # the short path's requests are in the tracker now
        cut = self.req_cut
        up = self.up_tr
        if up is None or up.is_closing() or not self.tracker.inflight or cut.left \
                or cut.head or cut.own is not None or cut.rest is not None:
            self.close(None)
            return False
        try:
            up.write_eof()
        except (RuntimeError, OSError) as e:  # pragma: no cover - the broker side is gone
            self.close(f"cannot pass the client's end of stream on: {e}")
            return False
        self.half_closed = True
        self.simple = False
        self._refresh_fast()
        return True

    def upstream_ready(self, tr: asyncio.Transport) -> None:
        self.up_tr = tr
        if self.closed:
            tr.close()
            return
        if _Hop is not None and self.client_side is not None:
            self.client_side.peer(tr.write, tr.is_closing)
        if self._early:
            tr.writelines(self._early)
            self._early = []
        if self.proxy.overloaded:
            self.up_hold |= HOLD_PIPELINE
            self.pause_client(HOLD_PIPELINE)
        if self.up_hold:  # paused before the transport was there (Proxy.overload while
            tr.pause_reading()  # connecting): pause the transport itself now
        self.resume_client(HOLD_CONNECTING)
        self._refresh_fast()

    def drain(self) -> None:
        """Shutting down: stop forwarding requests (what the client still sends
        is read and dropped); responses to forwarded requests still go through.
        Requests read before, and not handled yet (a slice of a read), go first."""
        if not self.closed and self.req_cut.rest is not None:
            self.rests(client=True, upstream=False)
            if self.closed:
                return
        self.draining = True
        self._refresh_fast()
        self._early = []
        self.resume_upstream(HOLD_PIPELINE)
        if self.resp_cut.rest is not None and self.upstream_side is not None:
            self.upstream_side.slice_later()  # (it may have waited for the pipeline)
        if self.client_hold and not self.client_tr.is_closing():
            self.client_hold = 0
            self.client_tr.resume_reading()
            self._refresh_fast()  # (a hold for in-flight requests gone)

    def close(self, reason: str | None = None, level: int = logging.INFO) -> None:
        """End both sides: the broker connection is closed; the client gets what
        was already buffered for it, then FIN (see :func:`_end_client`). ``reason``
        is logged at ``level``."""
        if self.closed:
            return
        if self.req_cut.rest is not None or self.resp_cut.rest is not None:
            # the later slices of a read came from their side before the end: they
            # go on whole, forwarded, paired and noted as the first slice was
            self.rests(client=not self.draining, upstream=True)
            if self.closed:  # (one of them ended the connection: a bad size prefix)
                return
        self.closed = True
        self._refresh_fast()
        if reason:
            log.log(level, "conn %d (%s): closing: %s", self.id, self.client, reason)
        # what either side sent of a frame the proxy held (or had not yet sized)
        # goes on, as it would have without the proxy: the other side sees the frame
        # cut where the sender cut it
        if not self.client_tr.is_closing():
            unsent = self.resp_cut.unsent()
            if unsent:
                self.client_tr.writelines(unsent)
        if self.up_tr is not None and not self.up_tr.is_closing():
            unsent = [] if self.draining else self.req_cut.unsent()
            if unsent:
                self.up_tr.writelines(unsent)
            self.up_tr.close()
        if self.half_closed:  # the client has sent all it will: nothing unread to
            self.client_tr.close()  # reset the connection; flushed, then closed
        else:
            _end_client(self.proxy, self.client_tr)
        self.req_cut.clear()
        self.resp_cut.clear()
        self.proxy.settle()  # first what came before, on every connection
        now = self.closed_ns = time.time_ns()
        for flow in self.tracker.close():
            self.proxy.pipeline.complete(flow)
        if self in self.proxy.connections:
            self.proxy.connections.discard(self)
            self.proxy.stats.connections_open -= 1
        self.proxy.pipeline.disconnected(self, now)

    def rests(self, client: bool, upstream: bool) -> None:
        """Handle what is left of the last read from the client (``client``) and from
        the broker (``upstream``) at once, as the connection ends or drains: each
        whole where its other side can still take it, else let go. An error doing
        so ends the connection (as it would have in the read's own callback)."""
        try:
            if client and self.req_cut.rest is not None:
                if self.up_tr is not None and not self.up_tr.is_closing():
                    self.client_rest(0)
                else:
                    self.req_cut.rest = None
            if upstream and self.resp_cut.rest is not None:
                if not self.client_tr.is_closing():
                    self.upstream_rest(0)
                else:
                    self.resp_cut.rest = None
        except Exception:  # noqa: BLE001 - a bug or a mutator's error: end this connection
            log.exception("conn %d (%s): error handling the rest of a read", self.id,
                          self.client)
            self.req_cut.rest = self.resp_cut.rest = None
            self.close("internal error", logging.ERROR)

    @property
    def client_paused(self) -> bool:
        """Reading from the client is paused (for any reason)."""
        return bool(self.client_hold)

    @property
    def up_paused(self) -> bool:
        """Reading from the broker is paused (for any reason)."""
        return bool(self.up_hold)

    def pause_client(self, why: int = HOLD_FLOW) -> None:
        """Stop reading the client for reason ``why`` (a HOLD_* bit). The transport
        is paused whenever it still reads, whatever the reasons before: uvloop
        ignores ``pause_reading()`` in ``connection_made`` (CPython's asyncio
        honours it since gh-103607), so a connection's transport may read although
        it holds HOLD_CONNECTING."""
        self.client_hold |= why
        if why & HOLD_INFLIGHT:
            self._refresh_fast()
        tr = self.client_tr
        if not self.closed and not tr.is_closing() and tr.is_reading():
            tr.pause_reading()

    def resume_client(self, why: int = HOLD_FLOW) -> None:
        was = self.client_hold
        self.client_hold = was & ~why
        if was & why & HOLD_INFLIGHT:
            self._refresh_fast()
        if was and not self.client_hold and not self.client_tr.is_closing():
            self.client_tr.resume_reading()

    def pause_upstream(self, why: int = HOLD_FLOW) -> None:
        was = self.up_hold
        self.up_hold = was | why
        if not was and self.up_tr is not None and not self.up_tr.is_closing():
            self.up_tr.pause_reading()

    def resume_upstream(self, why: int = HOLD_FLOW) -> None:
        was = self.up_hold
        self.up_hold = was & ~why
        if was and not self.up_hold and self.up_tr is not None and not self.up_tr.is_closing():
            self.up_tr.resume_reading()


_UNDECODED, _FAILED, _UNCHANGED, _REWRITTEN = range(4)
#: the outcome of a response walked for broker addresses (or scanned for their tags)
#: and forwarded as read
_SCANNED = (_UNCHANGED, None)


def _first(item: tuple) -> Any:
    return item[0]


def _apply_outcome(flow: Flow, outcome: tuple) -> None:
    """Note on ``flow`` what rewriting its response did (``Connection._rewrite_frame``)."""
    kind, value = outcome
    if kind == _UNCHANGED:
        return
    if kind == _REWRITTEN:
        flow.response_sent = value
        flow.flags.add(REWRITTEN)
    elif kind == _UNDECODED:
        flow.flags.add(UNDECODED)
        flow.error = value
    else:
        flow.notes.append(value)


def _end_client(proxy: Proxy, tr: asyncio.Transport) -> None:
    """Close a client transport without a TCP reset: buffered data is flushed, then
    FIN; what the client still sends is read and dropped until it closes its end,
    for at most :data:`LINGER` seconds (closing a socket with unread data would
    reset the connection and could destroy responses the client has not read)."""
    if tr.is_closing():
        return
    try:
        can_eof = tr.can_write_eof()
    except (RuntimeError, OSError):  # pragma: no cover - transport already gone
        can_eof = False
    if not can_eof:
        tr.close()
        return
    try:
        tr.write_eof()
        tr.resume_reading()
    except (RuntimeError, OSError):
        tr.abort()
        return
    proxy.lingering.add(tr)
    asyncio.get_running_loop().call_later(LINGER, _linger_over, proxy, tr)


def _linger_over(proxy: Proxy, tr: asyncio.Transport) -> None:
    proxy.lingering.discard(tr)
    if not tr.is_closing():
        tr.abort()


class _Slices:
    """For a side's protocol: the later slices of a read (``CutThrough.rest``),
    handled by its ``_next_slice`` at later loop iterations (``slice_due``: one is
    scheduled)."""

    __slots__ = ()

    def slice_later(self) -> None:
        """Handle the next slice of the read at the next loop iteration (once)."""
        if not self.slice_due:
            self.slice_due = True
            asyncio.get_running_loop().call_soon(self._slice)

    def _slice(self) -> None:
        self.slice_due = False
        conn = self.conn  # type: ignore[attr-defined]
        try:
            self._next_slice()  # type: ignore[attr-defined]
            conn._refresh_fast()
        except Exception:  # noqa: BLE001 - as an error in the read's own callback: the
            # connection ends (its transports closed), and nothing waits on it for ever
            log.exception("conn %d (%s): error handling a slice of a read", conn.id,
                          conn.client)
            conn.req_cut.rest = conn.resp_cut.rest = None
            conn.close("internal error", logging.ERROR)


class _NoHop:
    """Stands in for :class:`Hop <kinspect.proxy._frames.Hop>` without the C
    extension: the sides' ``data_received`` is then their Python ``_read``."""

    __slots__ = ()


def _bind_hop(side: Any, conn: "Connection", answers: bool) -> None:
    """Give a side's :class:`Hop <kinspect.proxy._frames.Hop>` what its short path
    reads and writes: the connection's containers (``unsettled``, ``apis``, the
    tracker's ``pending`` and ``inflight``), the proxy's answer checks, arrival count
    and counters, and what it calls (registering the connection as unsettled, the
    pipeline's kick, the in-flight check, the in-place scan of answers)."""
    if _Hop is None:
        return
    proxy = conn.proxy
    cut = conn.resp_cut if answers else conn.req_cut
    cut.hop = side
    if conn.hop_calls is None:  # (made once for both sides)
        conn.hop_calls = (functools.partial(proxy._unsettle, conn), conn._inflight_check)
    unsettle, inflight_check = conn.hop_calls
    side.bind(answers, cut.max_frame,
              conn.unsettled, conn.apis, conn.tracker.pending, proxy._checks,
              proxy.arrivals, unsettle, proxy.pipeline_kick, conn.tracker.inflight,
              inflight_check, proxy.counters, _scan_clear, _SCANNED,
              getattr(proxy.pipeline, "batch_events", 256), BATCH_KICK, MAX_INFLIGHT)


_HopBase: Any = _Hop if _Hop is not None else _NoHop


class _ClientSide(_HopBase, _Slices, asyncio.Protocol):
    """Client-facing half of a connection. Reads arrive as ``bytes`` from the event
    loop (``data_received``: its own C buffer, no Python call to ask for one), except
    while a large frame is read into a buffer of its own (:class:`CutThrough`): then
    the transport reads through :attr:`frame_side` (:class:`_FrameSide`) straight
    into that buffer, and comes back here when the frame is whole."""

    __slots__ = ("proxy", "listener", "conn", "transport", "frame_side", "slice_due",
                 "__weakref__")

    def __init__(self, proxy: Proxy, listener: Listener):
        self.proxy = proxy
        self.listener = listener
        self.conn: Connection | None = None
        self.transport: asyncio.Transport | None = None
        self.frame_side: _FrameSide | None = None
        self.slice_due = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        proxy = self.proxy
        if proxy._closing:
            transport.close()
            return
        tr: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = tr
        _nodelay(tr)
        conn = self.conn = Connection(proxy, self.listener, tr)
        conn.client_side = self
        _bind_hop(self, conn, answers=False)
        self.frame_side = _FrameSide(self, conn, client=True)
        tr.pause_reading()  # until the broker connection is up; resumed by upstream_ready
        proxy.connections.add(conn)
        proxy.stats.connections_total += 1
        proxy.stats.connections_open += 1
        if proxy.unsettled:
            proxy.settle()  # the frames that came before, first
        proxy.pipeline.connected(conn)
        asyncio.get_running_loop().create_task(self._connect_upstream(conn))

    async def _connect_upstream(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.listener.upstream
        try:
            tr, _ = await asyncio.wait_for(
                loop.create_connection(lambda: _UpstreamSide(conn), host, port),
                self.proxy.config.connect_timeout)
        except Exception as e:  # noqa: BLE001 - OSError, TimeoutError, and ValueError
            # (UnicodeError) for a host name IDNA cannot encode, e.g. "a..b" or a label
            # over 63 characters, which a broker may advertise: whatever it is, this
            # connection ends (with its reason) instead of hanging unread
            self.proxy.stats.connection_errors += 1
            conn.close(f"cannot reach broker {host}:{port}: {e or type(e).__name__}",
                       logging.WARNING)
            return
        _nodelay(tr)
        conn.upstream_ready(tr)

    def _slow(self, data: bytes) -> None:
        """A read the C short path (:class:`Hop <kinspect.proxy._frames.Hop>`) left
        to Python: handled by :meth:`_read`; the C path's conditions are then looked
        at again."""
        conn = self.conn
        if conn is None:
            return
        try:
            self._read(data)
        finally:
            conn._refresh_fast()

    def _read(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            return
        cut = conn.req_cut
        n = len(data)
        # The common case, in as few Python calls as possible (they are what a
        # request's latency through the proxy is made of): the read is one whole
        # request frame (with a header), none is under way, and nothing may change
        # it. Forwarded as client_data() would (CutThrough.feed's first branch);
        # paired later (Connection.settle).
        if n >= 12 and conn.up_tr is not None and not conn.closed and not conn.draining \
                and not cut.left and not cut.head and cut.rest is None and conn.simple \
                and self.proxy.request_mutator is None:
            size = _I(data, 0)[0]
            if size + 4 == n and size <= cut.max_frame:
                conn.up_tr.write(data)
                cut._consumed += n
                proxy = self.proxy
                counters = proxy.counters
                counters.bytes_from_clients += n
                api_key, api_version, corr = _HHI(data, 4)
                if api_key == SASL_HANDSHAKE:  # paired now: raw SASL tokens may follow
                    proxy.settle()
                    conn._request(data[4:])
                else:
                    unsettled = conn.unsettled
                    if not unsettled:
                        proxy._unsettle(conn)
                    unsettled.append((data, time.time_ns(), next(proxy.arrivals)))
                    counters.unsettled_frames += 1
                    counters.unsettled_bytes += n
                    # whether (and how) its response will be checked for broker
                    # addresses (Proxy.response_check)
                    chk = proxy._checks.get((api_key, api_version), _UNSET)
                    if chk is _UNSET:
                        chk = proxy.response_check(api_key, api_version)
                    apis = conn.apis
                    if corr in apis or corr in conn.tracker.pending:
                        # the id is taken by a request still waiting for its answer
                        # (a client may reuse one): answers come in request order and
                        # the tracker pairs each with the earliest request of its id,
                        # so this one goes to the tracker now, where the answers are
                        # then looked up. An acks=0 Produce expects no answer: the
                        # tracker neither pairs one with it nor lets it hide the
                        # earlier request of its id, which stays where it is.
                        if api_key != PRODUCE or \
                                conn.tracker.produce_acks(data, api_version, 4) != 0:
                            proxy.settle()
                    else:
                        # (also for a Produce, whose Acks is not read here: an answer
                        # to an acks=0 Produce, which some brokers send, is forwarded
                        # as read when chk is None, and else told apart by the
                        # tracker before it is decoded, in _UpstreamSide.data_received;
                        # the entry goes at the next settle. It also marks the id as
                        # waiting, for a later request reusing it.)
                        apis[corr] = chk
                proxy.pipeline.kick()  # as client_data does
                if len(conn.unsettled) + len(conn.tracker.inflight) >= proxy.inflight_limit:
                    conn._inflight_check()
                return
        conn.client_data(data)
        self._after(conn, cut)

    if _Hop is None:
        data_received = _read

    def _after(self, conn: Connection, cut: CutThrough) -> None:
        """After a read (or a slice of one) was handled: the rest of it at the next
        loop iteration, reading paused meanwhile; or read a large frame in place."""
        if conn.closed:
            return
        if cut.rest is not None:
            if not conn.client_hold & HOLD_SLICE:
                conn.pause_client(HOLD_SLICE)
            if not conn.client_hold & (HOLD_INFLIGHT | HOLD_PIPELINE):
                self.slice_later()  # (else once answers come, or the pipeline catches up)
            return
        if cut.own is not None:  # a large frame: read it in place
            self.transport.set_protocol(self.frame_side)
        if conn.client_hold & HOLD_SLICE:
            conn.resume_client(HOLD_SLICE)

    def _next_slice(self) -> None:
        conn = self.conn
        if conn.req_cut.rest is None or conn.client_hold & (HOLD_INFLIGHT | HOLD_PIPELINE):
            return  # ended (or drained) meanwhile; or wait for answers, for the pipeline
        conn.client_rest()
        self._after(conn, conn.req_cut)

    def eof_received(self) -> bool:
        if self.conn is not None:
            return self.conn.client_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.proxy.lingering.discard(self.conn.client_tr)
            self.conn.close(f"client error: {exc}" if exc else None)

    def pause_writing(self) -> None:  # client is slow: stop reading from the broker
        if self.conn is not None:
            self.conn.pause_upstream()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_upstream()


class _FrameSide(asyncio.BufferedProtocol):
    """What a side's transport reads through while a frame is read into a buffer of
    its own (``BufferedProtocol``: no copy by the event loop), until the frame is
    whole; events other than reads go to the side (:class:`_ClientSide`,
    :class:`_UpstreamSide`) as they would."""

    def __init__(self, side: Any, conn: Connection, client: bool):
        self.side = side
        self.conn = conn
        self.client = client
        self.cut = conn.req_cut if client else conn.resp_cut
        self.read = conn.client_read if client else conn.upstream_read

    def get_buffer(self, sizehint: int) -> memoryview:
        conn = self.conn
        cut = self.cut
        if cut.own_view is None or conn.closed or (self.client and conn.draining):
            return conn.proxy.scratch  # read and dropped: the connection is ending
        return cut.read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.read(nbytes)
        if self.cut.own is None:  # the frame is whole (or the connection ended)
            self.side.transport.set_protocol(self.side)
            self.conn._refresh_fast()

    def eof_received(self) -> bool:
        return self.side.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.side.connection_lost(exc)

    def pause_writing(self) -> None:
        self.side.pause_writing()

    def resume_writing(self) -> None:
        self.side.resume_writing()


class _UpstreamSide(_HopBase, _Slices, asyncio.Protocol):
    """Broker-facing half of a connection (reads as in :class:`_ClientSide`)."""

    __slots__ = ("conn", "transport", "frame_side", "slice_due", "__weakref__")

    def __init__(self, conn: Connection):
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.slice_due = False
        self.frame_side = _FrameSide(self, conn, client=False)
        conn.upstream_side = self
        if _Hop is not None:
            _bind_hop(self, conn, answers=True)
            self.peer(conn.client_tr.write, conn.client_tr.is_closing)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def _slow(self, data: bytes) -> None:
        """As :meth:`_ClientSide._slow`, for reads from the broker."""
        conn = self.conn
        try:
            self._read(data)
        finally:
            conn._refresh_fast()

    def _read(self, data: bytes) -> None:
        conn = self.conn
        cut = conn.resp_cut
        n = len(data)
        # The common case in few Python calls (see _ClientSide.data_received): the
        # read is one whole response frame, and nothing but address rewriting may
        # change it (a response mutator takes the long way). What upstream_data()
        # does for such a frame; paired later (Connection.settle).
        if n >= 8 and not conn.closed and not cut.left and not cut.head and cut.rest is None \
                and conn.simple:
            size, corr = _II(data, 0)
            proxy = conn.proxy
            if size + 4 == n and size <= cut.max_frame and proxy.response_mutator is None:
                # held for rewriting: e.g. Metadata, or Produce v10+ whose KIP-951
                # NodeEndpoints tag is looked for (and mostly not there). The request
                # is unsettled (conn.apis) or with the tracker (_to_rewrite).
                apis = conn.apis
                api = apis.pop(corr, _UNSET) if apis else _UNSET
                paired = api is _UNSET  # (its request is with the tracker already)
                if paired:
                    api = None
                    if conn.tracker.pending:
                        if conn.tracker.dups:  # a reused id: the answers before this
                            proxy.settle()     # one first (the tracker pairs in order)
                        flow = conn._to_rewrite(corr)
                        if flow is not None:
                            api = proxy.response_check(flow.api_key, flow.api_version)
                outcome = None
                tr = conn.client_tr
                if api is None:
                    if not tr.is_closing():
                        tr.write(data)
                else:
                    scan = api[2]
                    if (scan is not None and n > scan[1] and (scan[1] == 8 or data[8] == 0)
                            and type(data) is bytes
                            and _scan_clear(scan[0], data, scan[1], n, scan[2])):
                        # KIP-951 tags looked for in place (Proxy.response_check):
                        # the header has no tags, the body scans to the frame's end
                        # with none of the trigger tags at its top level
                        outcome = _SCANNED
                    if outcome is None and not paired and api[0] == PRODUCE:
                        # to be decoded, and its request's Acks was not read: the
                        # tracker tells whether it expects this answer (an acks=0
                        # Produce does not; some brokers answer it all the same, and
                        # such an answer is forwarded as read, as on the long path)
                        proxy.settle()
                        flow = conn._to_rewrite(corr)
                        api = None if flow is None else (flow.api_key, flow.api_version)
                    if api is not None and outcome is None:
                        sent, outcome = conn._rewrite_frame(api[0], api[1], data[4:])
                    if not tr.is_closing():
                        if outcome is None or outcome[0] != _REWRITTEN:
                            tr.write(data)
                        else:
                            tr.writelines((_SIZE(len(sent)), sent))
                cut._consumed += n
                counters = proxy.counters
                counters.bytes_from_brokers += n
                unsettled = conn.unsettled
                if not unsettled:
                    proxy._unsettle(conn)
                unsettled.append((data, time.time_ns(), next(proxy.arrivals), outcome))
                counters.unsettled_frames += 1
                counters.unsettled_bytes += n
                if counters.unsettled_bytes >= BATCH_KICK:  # large answers waiting
                    proxy.pipeline.kick()
                if conn.client_hold & HOLD_INFLIGHT:
                    conn._inflight_answered()
                return
        conn.upstream_data(data)
        self._after(conn, cut)

    if _Hop is None:
        data_received = _read

    def _after(self, conn: Connection, cut: CutThrough) -> None:
        """As :meth:`_ClientSide._after`, for reads from the broker."""
        if conn.closed:
            return
        if cut.rest is not None:
            if not conn.up_hold & HOLD_SLICE:
                conn.pause_upstream(HOLD_SLICE)
            if not conn.up_hold & HOLD_PIPELINE:  # else once the pipeline catches up
                self.slice_later()
            return
        if cut.own is not None:  # a large frame: read it in place
            self.transport.set_protocol(self.frame_side)
        if conn.up_hold & HOLD_SLICE:
            conn.resume_upstream(HOLD_SLICE)

    def _next_slice(self) -> None:
        conn = self.conn
        if conn.resp_cut.rest is None or conn.up_hold & HOLD_PIPELINE:
            return  # ended meanwhile; or wait for the pipeline
        conn.upstream_rest()
        self._after(conn, conn.resp_cut)

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
    """Set this process up to run a proxy: uvloop's event loop policy when uvloop is
    installed (returns whether it is), malloc settings that keep large frames'
    memory for reuse (:func:`kinspect.heap.keep_frame_memory`), and fewer garbage
    collections (:func:`kinspect.heap.collect_less`)."""
    from ..heap import collect_less, keep_frame_memory

    keep_frame_memory()
    collect_less()
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True

