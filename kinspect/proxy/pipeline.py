"""After forwarding: decode flows, feed captures and the live view.

The proxy hands every request and every completed flow to a :class:`Pipeline`
after forwarding the bytes: at once on its long path, and at the start of the next
batch for frames of its short path (``Proxy.settle``: pairing a request and its
response waits until then, off the forwarding path). The pipeline works through
them in batches, on
the event loop, in slices of bounded time (0.5 ms by default): a batch starts
``delay`` (20 ms) after its first event, or as soon as the proxy has just forwarded
requests (:meth:`Pipeline.kick`) while a full batch waits; a frame that arrives
during the work waits at most one slice. Batches keep the post-forwarding work
out of most request/response turnarounds and cost less CPU per flow than working
on every flow at once (the code and data stay in the caches; measured in
BENCHMARKS.md, Proxy). Under load it sheds work, never
frames:

* when more than ``max_backlog`` flows or ``skip_bytes`` bytes of frames wait,
  new flows are passed on undecoded (flag ``decode-skipped``, counted in
  ``Stats.decode_skipped``);
* when more than ``pause_bytes`` bytes of frames wait (addons such as a capture
  cannot keep up), the proxy stops reading every connection until the backlog is
  under half of that (``Proxy.overload``, counted in ``Stats.overloads``): the
  queue stays bounded and forwarding slows down instead. An addon with its own
  queue (a capture child process) exposes it as a ``backlog_bytes`` attribute,
  which counts here too, and may set its own, lower ``pause_bytes``.

Each waiting event counts its frames plus :data:`EVENT_COST` bytes (its flow), so
many small frames weigh what they cost. A request whose request event and flow
event both wait counts once: the flow event takes its bytes over.

Addons are plain objects with any of these methods (mitmproxy-style hooks):
``on_connect(conn)``, ``on_request(flow)``, ``on_flow(flow)``,
``on_disconnect(conn)``, ``close()`` (or ``async aclose()``, preferred when both
exist).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from ..codec import Codec, DecodeError
from ..flows import SKIPPED, TRAILING, UNDECODED, Flow, top_level_error_code

log = logging.getLogger("kinspect.pipeline")

_REQ, _FLOW, _CONN, _DISC = range(4)
#: bytes a queued request or flow event counts for beyond its frames: what its flow
#: costs in memory (some 800 bytes however small the frames), so that a flood of
#: small frames reaches ``pause_bytes`` as large ones do (1.5 million 11-byte
#: requests waited as 1.4 GB while they counted as 16 MB)
EVENT_COST = 1024


def decode_flow(codec: Codec, flow: Flow) -> None:
    """Decode a flow's request and response in place (``request_decoded``,
    ``response_decoded``, ``client_id``, ``error_code``); a failure sets the
    ``undecoded`` flag and ``error`` instead of raising, bytes after a message
    (which Kafka's parsers do not read) the ``trailing-bytes`` flag. Decoding a flow
    again (its decoded values let go) adds no error text it already has."""
    errors = []
    if flow.api_key >= 0 and flow.request_decoded is None and flow.request:
        try:
            flow.request_decoded = codec.decode_request(flow.request)
        except DecodeError as e:
            errors.append(f"request: {e}")
            try:
                flow.request_decoded = codec.decode_request(flow.request, body=False)
            except DecodeError:
                pass
        if flow.request_decoded is not None:
            flow.client_id = flow.request_decoded.client_id
    if flow.api_key >= 0 and flow.response is not None and flow.response_decoded is None:
        try:
            flow.response_decoded = codec.decode_response(flow.response, flow.api_key,
                                                          flow.api_version)
        except DecodeError as e:
            errors.append(f"response: {e}")
    if flow.response_decoded is not None:
        resp = flow.response_decoded
        flow.error_code = top_level_error_code(resp.body, getattr(resp, "body_version", None))
    for msg in (flow.request_decoded, flow.response_decoded):
        if msg is not None and msg.trailing:
            flow.flags.add(TRAILING)
    if errors:
        flow.flags.add(UNDECODED)
        had = flow.error.split("; ") if flow.error else []
        flow.error = "; ".join(had + [e for e in errors if e not in had])


def decode_recorded(codec: Codec, flow: Flow) -> None:
    """:func:`decode_flow` for a flow read from a capture: what the proxy's lines
    said of decoding it (``undecoded``, ``decode-skipped``) gives way to this
    decoding, which may have other specs, or be of frames kinspect once refused."""
    decode_flow(codec, flow)
    if flow.api_key < 0:  # (not decoded: a raw SASL token, or a frame without a header)
        return
    flow.flags.discard(SKIPPED)
    if flow.error is None:
        flow.flags.discard(UNDECODED)


class Pipeline:
    """Post-forwarding work queue.

    Args:
        codec: used to decode flows.
        addons: hook objects (see the module docstring).
        decode: decode flows at all.
        max_backlog: flows waiting beyond which decoding is skipped.
        skip_bytes: bytes of frames waiting (each event :data:`EVENT_COST` more)
            beyond which decoding is skipped.
        pause_bytes: bytes of frames waiting (likewise) beyond which the proxy stops
            reading (until they are under half of it); ``None``: never.
        slice_seconds: longest stretch of work before yielding to the event loop
            (the most a frame arriving meanwhile waits for it).
        delay: seconds between the first event of a batch and the start of work on
            it (work then continues until the queue is empty); with 0, every event
            schedules the work for the next loop iteration.
        batch_events, batch_bytes: a full batch: this many events, or this many
            bytes of frames, waiting. :meth:`kick` starts the work on a full batch
            without waiting for ``delay`` (so memory stays low under heavy traffic).

    An addon that raises is logged and skipped for that event; the others still run.
    """

    def __init__(self, codec: Codec, addons: list[Any] | None = None, *, decode: bool = True,
                 max_backlog: int = 10000, skip_bytes: int = 32 << 20,
                 pause_bytes: int | None = 128 << 20, slice_seconds: float = 0.0005,
                 delay: float = 0.02, batch_events: int = 256, batch_bytes: int = 1 << 20):
        self.codec = codec
        self.addons = list(addons or [])
        self.decode = decode
        self.max_backlog = max_backlog
        self.skip_bytes = skip_bytes
        self.pause_bytes = pause_bytes
        self.slice_seconds = slice_seconds
        self.delay = delay
        self.batch_events = batch_events
        self.batch_bytes = batch_bytes
        #: bytes of frames in queued events (a request event counts its request, a
        #: flow event its request and response, a request waiting in both once),
        #: each plus :data:`EVENT_COST`, released as events are handled
        self.backlog_bytes = 0
        #: flows whose request event waits (the flow objects: ids may repeat among
        #: flows not from one proxy): True while the request event owns the
        #: request's bytes, False once the flow event took them over
        self._req_owns: dict[Flow, bool] = {}
        self.proxy: Any = None
        self._q: deque = deque()
        self._cb_pending = False  # a call_soon(_on_callback) is queued
        self._timer: asyncio.TimerHandle | None = None
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting_flows = 0
        self._events = 0  # request and flow events queued (each in backlog_bytes)
        self._idle = asyncio.Event()
        self._queued_addons = [a for a in self.addons if hasattr(a, "backlog_bytes")]
        #: the addons' queued bytes when :meth:`behind` last looked
        self._addon_bytes = 0
        self._recheck: asyncio.TimerHandle | None = None

    def attach(self, proxy: Any) -> None:
        self.proxy = proxy

    def add(self, addon: Any) -> None:
        self.addons.append(addon)
        if hasattr(addon, "backlog_bytes"):
            self._queued_addons.append(addon)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle.set()

    # -- events from the proxy (hot path: append and schedule only) -------------
    def _push(self, item: tuple) -> None:
        self._q.append(item)
        self.expect()

    def _arm(self) -> None:
        """Make sure the queued events will be worked on (see ``delay``)."""
        self._idle.clear()
        if self.delay <= 0:
            self._schedule()
        else:
            # the fallback: work starts within ``delay`` even if no request comes.
            # One timer serves many events (it is not re-armed per event, nor
            # cancelled when a kick starts the work first).
            loop = self._loop or asyncio.get_running_loop()
            self._timer = loop.call_later(self.delay, self._on_timer)

    def _schedule(self) -> None:
        """Work at the next event-loop iteration (one callback at a time)."""
        if not self._cb_pending:
            self._cb_pending = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._on_callback)

    def _on_callback(self) -> None:
        self._cb_pending = False
        self._drain()

    def _on_timer(self) -> None:
        self._timer = None
        if not self._cb_pending:
            self._drain()

    def expect(self) -> None:
        """Make sure a batch comes for what waits: queued events, or frames of the
        proxy's short path waiting to be paired (``Proxy.settle``, at the start of
        each batch). Nothing to do while work is under way or scheduled, or the
        ``delay`` timer is armed."""
        if not (self._cb_pending or self._draining or self._timer is not None):
            self._arm()

    def request(self, flow: Flow) -> None:
        """A request was forwarded (called right after the write)."""
        self.backlog_bytes += len(flow.request) + EVENT_COST
        self._req_owns[flow] = True
        self._events += 1
        self._q.append((_REQ, flow))  # _push(), inline: this runs for every request
        if not (self._cb_pending or self._draining or self._timer is not None):
            self._arm()

    def kick(self) -> None:
        """Start the queued work now, for up to ``slice_seconds`` (the rest continues
        at the next loop iterations), if a full batch waits (``batch_events`` events
        or ``batch_bytes`` bytes of frames); otherwise the ``delay`` timer starts it.
        The proxy calls this right after forwarding requests: the broker is busy
        with them and the client has nothing to wait for, so the time is free."""
        q = self._q
        proxy = self.proxy
        if proxy is None:
            n, size = len(q), self.backlog_bytes
        else:  # frames of the short path, paired when the batch starts, count too
            counters = proxy.counters
            n = len(q) + counters.unsettled_frames
            size = self.backlog_bytes + counters.unsettled_bytes
        size -= EVENT_COST * self._events  # bytes of frames only
        if n and not self._cb_pending and (n >= self.batch_events or size >= self.batch_bytes):
            self._drain()

    def complete(self, flow: Flow) -> None:
        """A flow is complete (its response forwarded, or a request that has none)."""
        if self._req_owns.get(flow):  # its request event waits: the request
            self._req_owns[flow] = False  # is counted already; this event takes it over
            self.backlog_bytes += len(flow.response or b"") + EVENT_COST
        else:
            self.backlog_bytes += len(flow.request) + len(flow.response or b"") + EVENT_COST
        self._events += 1
        if self._waiting_flows >= self.max_backlog or self.backlog_bytes > self.skip_bytes:
            flow.flags.add(SKIPPED)
            if self.proxy is not None:
                self.proxy.stats.decode_skipped += 1
        self._waiting_flows += 1
        self._q.append((_FLOW, flow))  # _push(), inline: this runs for every flow
        if not (self._cb_pending or self._draining or self._timer is not None):
            self._arm()
        # Only this queue grew: the addons' queues grow when the work hands them
        # events (and are checked then), so their sizes as last seen are an upper bound.
        if self.pause_bytes is not None and \
                self.backlog_bytes + self._addon_bytes > self.pause_bytes:
            self._maybe_pause()

    def _maybe_pause(self) -> None:
        if self.pause_bytes is not None and self.proxy is not None and \
                not self.proxy.overloaded and self.behind():
            self.proxy.overload(True)
            self._arm_recheck()

    def total_backlog(self) -> int:
        """Bytes of frames waiting: in this queue plus in addons' own queues."""
        n = self.backlog_bytes
        for a in self._queued_addons:
            n += a.backlog_bytes
        return n

    def behind(self, fraction: float = 1.0) -> bool:
        """Whether the frames waiting pass ``fraction`` of ``pause_bytes``, or an
        addon's own queue passes that fraction of the addon's own ``pause_bytes``
        (a capture keeps its lag short that way)."""
        if self.pause_bytes is None:
            return False
        addons = 0
        over = False
        for a in self._queued_addons:
            b = a.backlog_bytes
            addons += b
            limit = getattr(a, "pause_bytes", None)
            if limit is not None and b > limit * fraction:
                over = True
        self._addon_bytes = addons
        return over or self.backlog_bytes + addons > self.pause_bytes * fraction

    def _arm_recheck(self) -> None:
        # while paused, look again every 10 ms: an addon's queue drains on its own
        # (another thread or process), with no pipeline event to notice it
        if self._recheck is None:
            loop = self._loop or asyncio.get_running_loop()
            self._recheck = loop.call_later(0.01, self._on_recheck)

    def _on_recheck(self) -> None:
        self._recheck = None
        self._check_overload()

    def _check_overload(self) -> None:
        """Resume the proxy once the backlog is under half the marks; while it is
        not, keep the (single) 10 ms re-check armed."""
        proxy = self.proxy
        if proxy is None or self.pause_bytes is None or not proxy.overloaded:
            return
        if not self.behind(0.5):
            proxy.overload(False)
        else:
            self._arm_recheck()

    def connected(self, conn: Any) -> None:
        self._push((_CONN, conn))

    def disconnected(self, conn: Any, ts: int) -> None:
        self._push((_DISC, conn))

    # -- work ------------------------------------------------------------------
    def _drain(self) -> None:
        if self._draining:  # an addon's hook led back here: the running drain goes on
            return
        self._draining = True
        try:
            if self.proxy is not None:
                try:
                    self.proxy.settle()
                    self.proxy.check_crowding()
                except Exception:  # noqa: BLE001 - the queued work must go on
                    log.exception("pipeline: error while pairing frames")
            self._drain_slice()
        finally:
            self._draining = False
        if self._q:
            self._schedule()  # the rest at the next iteration, after I/O
        else:
            self._idle.set()

    def _drain_slice(self) -> None:
        deadline = time.perf_counter() + self.slice_seconds
        q = self._q
        while q:
            kind, obj = q.popleft()
            try:
                if kind == _FLOW:
                    self._waiting_flows -= 1
                    self.backlog_bytes -= len(obj.request) + len(obj.response or b"") + EVENT_COST
                    self._events -= 1
                    self._flow(obj)
                elif kind == _REQ:
                    if self._req_owns.pop(obj, True):
                        self.backlog_bytes -= len(obj.request) + EVENT_COST
                    else:  # its flow event, still waiting, releases the request
                        self.backlog_bytes -= EVENT_COST
                    self._events -= 1
                    self._call("on_request", obj)
                elif kind == _CONN:
                    self._call("on_connect", obj)
                else:
                    self._call("on_disconnect", obj)
            except Exception:  # noqa: BLE001 - an addon bug must not stop the pipeline
                log.exception("pipeline: error while handling an event")
            if time.perf_counter() > deadline:
                break
        if self.proxy is not None:
            if self.proxy.overloaded:
                self._check_overload()
            elif self._queued_addons:
                self._maybe_pause()

    def _flow(self, flow: Flow) -> None:
        if self.decode and SKIPPED not in flow.flags:
            decode_flow(self.codec, flow)
        if self.proxy is not None:
            self.proxy.stats.flows += 1
            if UNDECODED in flow.flags:
                self.proxy.stats.undecoded += 1
        self._call("on_flow", flow)

    def _call(self, hook: str, arg: Any) -> None:
        for a in self.addons:
            fn = getattr(a, hook, None)
            if fn is not None:
                try:
                    fn(arg)
                except Exception:  # noqa: BLE001 - one addon's bug must not starve the others
                    log.exception("pipeline: %s.%s failed", type(a).__name__, hook)

    async def drained(self) -> None:
        """Wait until every queued event has been handled (in slices, yielding to
        the event loop between them)."""
        while True:
            if self.proxy is not None and not self._draining:
                self.proxy.settle()
            if not (self._q or self._cb_pending or self._draining):
                break
            self._idle.clear()
            if self._q and not self._cb_pending and not self._draining:
                self._schedule()
            await self._idle.wait()

    async def close(self) -> None:
        await self.drained()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        for a in self.addons:
            fn = getattr(a, "aclose", None) or getattr(a, "close", None)
            if fn is not None:
                try:  # every addon gets closed (a capture must be flushed) whatever the others do
                    res = fn()
                    if asyncio.iscoroutine(res):
                        await res
                except Exception:  # noqa: BLE001
                    log.exception("pipeline: closing %s failed", type(a).__name__)
