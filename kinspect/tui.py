"""The live view: a rich flow table redrawn at a fixed rate, and a line printer.

Both are pipeline addons (:mod:`kinspect.proxy.pipeline`): they receive each flow
once it is complete and decoded. The live view also shows the requests still
waiting for their responses (a long-polling Fetch, a JoinGroup held for a
rebalance, a request a broker never answers), below the complete flows, with the
time they have waited so far. On a terminal, keys select a row and open its flow
decoded (:meth:`LiveView.key`, :class:`KeyReader`).

The live view redraws at ``refresh_per_second`` whatever the traffic, and renders
rows lazily: a flow waits as it is until a redraw shows it, so under heavy traffic
only the flows that reach the screen cost a row (a few dozen per redraw instead of
one per flow). The flows waiting are bounded (the newest ``keep``, and at most
:data:`PENDING_BYTES` of frames; past that the oldest are rendered at once), so the
view never holds many frames in memory (an interactive view also holds the last
``keep`` flows, for their detail and for filters typed later: at most
:data:`HOLD_BYTES` of frames); a flow of :data:`RENDER_AT_ONCE` bytes or more is
rendered as it arrives. A flow that cannot be rendered is logged and left out;
the redraws go on.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any, Callable, Collection, Iterator, TextIO

from rich.cells import cell_len, set_cell_size
from rich.console import Console, ConsoleOptions, Group
from rich.live import Live
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from .codec import DecodeError
from .filters import Filter, TopicIds
from .flows import NO_RESPONSE, Flow
from .proxy.pipeline import decode_flow
from .show import COLUMNS, flow_row, flow_tree, printable

#: bytes of frames (requests and responses) of flows waiting to be rendered, past
#: which the oldest are rendered at once and let go (their decoded values, also
#: held while they wait, take a few times their frames' bytes)
PENDING_BYTES = 4 << 20
#: a flow with at least this many bytes of frames is rendered as it arrives, not when
#: a redraw needs it: its row costs no more than a small flow's, and its frames (and
#: their decoded values) are let go at once instead of keeping up to PENDING_BYTES of
#: them (page faults per 100 MB of 1 MB Produce requests through kinspect-full,
#: two runs each: 4,600-6,600 without, 2,500-3,900 with; BENCHMARKS.md, Proxy)
RENDER_AT_ONCE = 64 << 10

log = logging.getLogger("kinspect.tui")

#: flag shown on the live view's rows of requests still waiting for their responses
IN_FLIGHT = "in-flight"
#: bytes of frames (requests and responses) of the flows behind the live view's rows
#: that an interactive view holds for their detail, past which the oldest are let go.
#: It holds them without their decoded values (decoded again when opened or
#: filtered), which take a few times their frames' bytes, and up to some 40 times
#: (a request of 12 million 2-byte structs, 23 MiB, decoded to 900 MiB, which the
#: view kept until 500 other flows came)
HOLD_BYTES = 32 << 20

#: bytes of each frame an open flow's hex dumps show (key ``x``)
FRAMES_SHOWN = 64 << 10
#: elements of each array, and records of each records field, an open flow shows
#: (the rest counted): its tree is laid out on rich's refresh thread, which holds the
#: GIL the forwarding loop needs (a Produce of 20,000 records took 3.5 s to open)
ITEMS_SHOWN = 500

#: a filter typed in a view holding more flows than this is applied on a thread of
#: its own: the view keeps its rows, redraws and keys meanwhile, shows how far the
#: filter got, and Esc stops it (a filter reading decoded messages takes about
#: 60 µs a flow on a capture's flows, which are decoded for it: 9 s for 155,000)
FILTER_IN_BACKGROUND = 5000

#: columns of the live view shrunk first when the terminal is too narrow for every
#: column (then the others but the api column, then that one too)
_SHRINK_FIRST = ("records", "client_id", "flags", "error")


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def flow_line(flow: Flow, topic_ids: TopicIds | None = None) -> str:
    """One log line per flow (``--no-tui``), with the live view's columns; ``err=-``
    when there is no decoded response to take an error code from."""
    r = flow_row(flow, topic_ids, quick=True)
    # no response (acks=0, a closed connection, an unpaired response) or a response
    # not decoded (--no-decode, decoding skipped or failed): no error code to show,
    # not 0 (which says the broker answered without an error)
    known = flow.response is not None and (flow.response_decoded is not None
                                           or flow.error_code is not None)
    line = (f"{r['time']} #{r['id']} conn={r['conn']} client={r['client_id'] or '-'} {r['api']} "
            f"corr={r['corr'] or '-'} req={_unit(r['req_bytes'], 'B')} "
            f"resp={_unit(r['resp_bytes'], 'B')} latency={_unit(r['latency'], 'ms')} "
            f"err={(r['error'] or 0) if known else '-'}")
    if r["records"]:
        line += f" records={r['records']}"
    if r["flags"]:
        line += f" [{r['flags']}]"
    if flow.error:
        line += f" ({printable(str(flow.error))})"
    return line


def _unit(value: str, unit: str) -> str:
    """``value`` with its unit (``12B``), or ``-`` (not ``-B``) when there is none."""
    return f"{value}{unit}" if value else "-"


class _Rate:
    """Events (or bytes) per second over a sliding window of ``window`` seconds.

    Samples are summed into buckets of ``bucket`` seconds, so memory and the cost of
    :meth:`rate` (a sum over at most ``window / bucket`` buckets) stay small however
    many events arrive: a redraw holds the GIL the forwarding loop needs. :meth:`add`
    (the event loop) only touches the newest bucket and :meth:`rate` (rich's refresh
    thread) only drops buckets older than the window, so the two threads need no lock.
    """

    def __init__(self, window: float = 5.0, bucket: float = 0.1):
        self.window = window
        self.bucket = bucket
        self.buckets: deque[list[float]] = deque()  # [bucket start, sum], oldest first

    def add(self, now: float, value: float) -> None:
        b = self.buckets
        try:
            last = b[-1]
        except IndexError:  # (rate() may empty it meanwhile: it only drops old buckets)
            last = None
        if last is not None and now - last[0] < self.bucket:
            last[1] += value
        else:
            b.append([now, value])

    def rate(self, now: float) -> float:
        b = self.buckets
        while b and b[0][0] < now - self.window:
            b.popleft()
        items = list(b)  # (a copy: add() may append meanwhile)
        if not items:
            return 0.0
        return sum(x[1] for x in items) / max(now - items[0][0], 1.0)


class LiveView:
    """A pipeline addon drawing the flow table with rich ``Live``.

    Args:
        proxy: the :class:`~kinspect.proxy.server.Proxy` (for totals); ``None`` for
            flows read from a capture (:func:`browse`).
        console: rich console (default: stdout).
        keep: rows kept for display.
        match: optional filter (:class:`kinspect.filters.Filter`) selecting flows.
        interactive: keys select rows and open flows (:meth:`key`; :meth:`start`
            with ``keys`` sets it).
        codec: decodes what an open flow's tree needs besides its decoded values
            (default: the proxy's).
        hold_bytes: bytes of frames of the flows behind the rows an interactive view
            holds (``None``: no limit besides ``keep``).
        on_quit: called on ``q`` at the table (default: ``q`` does nothing there).
        bytes_limit: characters of keys, values and bytes fields an open flow's
            tree shows (``None``: everything).

    Below the complete flows, each redraw shows the requests forwarded and still
    waiting for their responses, oldest first, on at most a third of the table's
    rows (flag ``in-flight``, the ms column the time waited so far followed by
    ``+``, the response columns empty; the header counts them all as ``in
    flight``). Their rows come from the request header alone (the request is
    decoded with its response); with ``match``, those the filter matches on what is
    known so far are shown.
    """

    def __init__(self, proxy: Any, console: Console | None = None, keep: int = 500,
                 refresh_per_second: float = 4.0, match: Filter | None = None,
                 title: str = "kinspect", interactive: bool = False, codec: Any = None,
                 hold_bytes: int | None = HOLD_BYTES, on_quit: Any = None,
                 bytes_limit: int | None = 64, decode_on_demand: bool = False):
        self.proxy = proxy
        self.console = console or Console()
        self.keep = keep
        #: rows can be selected and opened (:meth:`key`), and filters typed; the last
        #: ``keep`` flows are held for that (at most ``hold_bytes`` of frames)
        self.interactive = interactive
        self.codec = codec if codec is not None else getattr(proxy, "codec", None)
        self.hold_bytes = hold_bytes
        self.on_quit = on_quit
        #: flows come with their decoded values let go (a capture's, see
        #: :func:`browse`): a row, a filter and the detail decode a copy of the flow
        self.decode_on_demand = decode_on_demand
        self.bytes_limit = bytes_limit
        #: flow id of the selected row (``None``: none, the newest rows are followed)
        self.selected: int | None = None
        #: flow id of the flow shown in detail (``None``: the table is shown)
        self.detail: int | None = None
        self._held: dict[int, Flow] = {}  # the last flows (interactive), oldest first
        #: the held flows whose decoded values the view let go (see HOLD_BYTES): as
        #: with decode_on_demand, a row, a filter and the detail decode a copy
        self._let_go: set[int] = set()
        self._held_bytes = 0
        #: the held flows the filter did not select (let go before the others: the
        #: others' rows are the ones on screen)
        self._others: dict[int, None] = {}
        #: the flow of the selected row (or the open one), kept while it is selected
        #: even once the held flows let it go
        self._pinned: Flow | None = None
        self._top = 0  # first row of the table's window while a row is selected
        self._at = 0  # where the selected row was last found among the rows
        self._page = 10  # rows in the table at the last redraw
        self._detail_lines: list[list[Segment]] | None = None  # the detail, rendered
        self._detail_for: tuple | None = None  # ... of (flow id, frames, width)
        self._detail_top = 0
        self._detail_page = 10  # the open flow's lines on screen at the last redraw
        #: the open flow's frames are shown as hex dumps too (key ``x``)
        self.frames = False
        #: the filter being typed (key ``f``), ``None`` when none is; and what was
        #: wrong with the one last entered
        self.prompt: str | None = None
        self.prompt_error: str | None = None
        #: the filter being applied on a thread of its own (see
        #: :data:`FILTER_IN_BACKGROUND`), ``None`` when none is
        self.filtering: _FilterJob | None = None
        #: one list per filter being applied (:meth:`_apply_filter`): the flows that
        #: come meanwhile, held or not, which it filters too before it takes over
        self._arrivals: list[list[Flow]] = []
        self._keys: KeyReader | None = None
        # (rendered row, style) of the newest flows, oldest first; and the flows
        # after them that no redraw has shown yet (rendered on demand; a large flow
        # waits there already rendered, see RENDER_AT_ONCE)
        self._rows: deque[tuple[dict[str, str], str | None]] = deque(maxlen=keep)
        self._pending: deque[Flow | tuple[dict[str, str], str | None]] = deque()
        self._pending_bytes = 0
        #: requests forwarded and not answered yet, by flow id, oldest first (each
        #: is also in its connection's tracker until answered or closed, so this
        #: holds no flow longer than the proxy does)
        self._waiting: dict[int, Flow] = {}
        self._lock = threading.Lock()  # redraws run on rich's refresh thread
        self.topic_ids = TopicIds()
        self.match = match
        self.title = title
        self._rate = _Rate()
        self._bytes = _Rate()
        self._log: _ViewLog | None = None  # while drawn: the log handler, and the
        self._muted: list[logging.Handler] = []  # handlers it stands in for
        self._tstp: Any = None  # the SIGTSTP handler before the view's
        #: the last warning (or worse) logged while the view is drawn, and how many
        self.last_warning: str | None = None
        self.warnings = 0
        self._live = Live(self, console=self.console, refresh_per_second=refresh_per_second,
                          screen=False, transient=False, redirect_stdout=False,
                          redirect_stderr=False, vertical_overflow="crop")

    def start(self, keys: int | None = None) -> "LiveView":
        """Start drawing; with ``keys`` (a terminal's file descriptor, e.g. stdin's)
        read keys from it (:class:`KeyReader`) to select and open rows (the view is
        then ``interactive``).

        While the view is drawn, log records go through it (:class:`_ViewLog`): the
        last warning is shown under its header, and the records are written once it
        stops (written to the terminal meanwhile, the next redraw erased them). On a
        terminal, Ctrl-Z
        shows the cursor before the process stops (SIGTSTP) and hides it again when
        it goes on."""
        root = logging.getLogger()
        # (the handlers writing to the terminal: basicConfig's)
        self._muted = [h for h in root.handlers if type(h) is logging.StreamHandler
                       and getattr(h, "stream", None) in (sys.stderr, sys.stdout)]
        for h in self._muted:
            root.removeHandler(h)
        self._log = _ViewLog(self)
        if self._muted:
            self._log.setFormatter(self._muted[0].formatter)
        root.addHandler(self._log)
        self._live.start()
        if (self.console.is_terminal and hasattr(signal, "SIGTSTP")
                and threading.current_thread() is threading.main_thread()):
            self._tstp = signal.signal(signal.SIGTSTP, self._suspend)
        if keys is not None:
            self.interactive = True
            self._keys = KeyReader(keys, self._on_key)
            self._keys.start()
        return self

    def _suspend(self, signum: int, frame: Any) -> None:
        """SIGTSTP (Ctrl-Z): show the cursor (rich's Live hides it), stop; hide it
        again and redraw once the process goes on (SIGCONT)."""
        try:
            self.console.show_cursor(True)
            self.console.file.flush()
        except (OSError, ValueError):
            pass
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here until SIGCONT
        signal.signal(signal.SIGTSTP, self._suspend)
        if self._log is None:  # (the view closed meanwhile)
            return
        # no redraw here: this runs on the main thread, which may hold the view's
        # lock (on_flow) that a redraw takes; the Live's own refresh redraws
        try:
            self.console.show_cursor(False)
        except (OSError, ValueError):
            pass

    def on_request(self, flow: Flow) -> None:
        if NO_RESPONSE not in flow.flags:  # (that flow is complete already)
            self._waiting[flow.id] = flow

    def on_flow(self, flow: Flow) -> None:
        now = time.monotonic()
        size = len(flow.request) + len(flow.response or b"")
        self._rate.add(now, 1)
        self._bytes.add(now, size)
        self.topic_ids.learn(flow)
        match = self.match
        matches = match is None or self._match(match, flow)
        with self._lock:  # (a redraw shows it waiting or complete, never both)
            self._waiting.pop(flow.id, None)
            for arrivals in self._arrivals:  # (a filter being applied takes it too)
                arrivals.append(flow)
            if self.match is not match:  # a new filter came meanwhile (filter())
                matches = self._matches(flow)
            if self.interactive:  # every flow: a filter typed later may want it
                self._hold(flow, size, matches)
            if not matches:
                return
            pending = self._pending
            if size >= RENDER_AT_ONCE:  # waits as its row, in its place
                row = self._row(flow)
                if row is not None:
                    pending.append(row)
            else:
                pending.append(flow)
                self._pending_bytes += size
            if len(pending) > self.keep:  # older than `keep` newer flows: never shown
                old = pending.popleft()
                if type(old) is not tuple:
                    self._pending_bytes -= len(old.request) + len(old.response or b"")
        if self._pending_bytes > PENDING_BYTES:
            self._render(None, budget=True)

    def _decoded(self, flow: Flow) -> Flow:
        """``flow``, or with :attr:`decode_on_demand` and its decoded values let go,
        a decoded copy of it (the flow itself is left as it is: redraws run on two
        threads)."""
        if (not (self.decode_on_demand or flow.id in self._let_go) or self.codec is None
                or flow.api_key < 0 or flow.request_decoded is not None
                or flow.response_decoded is not None):
            return flow
        copy = flow.copy()
        decode_flow(self.codec, copy)
        return copy

    def _match(self, match: Filter, flow: Flow) -> bool:
        """``match.matches(flow)``, decoding a copy of a flow without its decoded
        values (:attr:`decode_on_demand`) only when the filter reads them and
        cannot reject it without."""
        ids = self.topic_ids
        if match.needs_decoded and (self.decode_on_demand or flow.id in self._let_go):
            if match.rejects_undecoded(flow, topic_ids=ids):
                return False
            flow = self._decoded(flow)
        return match.matches(flow, topic_ids=ids)

    def _matches(self, flow: Flow) -> bool:
        """Whether ``match`` selects ``flow`` (a filter that fails on it: no)."""
        return self._matches_with(self.match, flow)

    def _matches_with(self, match: Filter | None, flow: Flow) -> bool:
        if match is None:
            return True
        try:
            return self._match(match, flow)
        except Exception:  # noqa: BLE001 - one odd flow must not stop the view
            log.exception("live view: filter failed on flow #%s", flow.id)
            return False

    def filter(self, text: str) -> None:
        """Show the flows ``text`` selects (a :mod:`kinspect.filters` expression; empty:
        every flow), from the flows the view holds (an interactive view holds the
        last ``keep`` flows, whatever the filter before) and those to come. Stops a
        filter being applied in the background (:attr:`filtering`) first.

        Raises:
            FilterError: ``text`` is not a filter expression, or names an api the
                codec's specs do not define.
        """
        match = self._parse_filter(text)
        self.stop_filtering()
        self._apply_filter(match)

    def _parse_filter(self, text: str) -> Filter | None:
        from .filters import parse

        codec = self.codec
        names = [codec.api_name(k) for k in codec.registry.api_keys()] if codec else None
        return parse(text, names) if text.strip() else None

    def filter_in_background(self, text: str) -> "_FilterJob":
        """As :meth:`filter`, on a thread of its own: until it is done the view
        shows the rows of the filter before, and :attr:`filtering` (shown in the
        header) how far it got. A new filter, or :meth:`stop_filtering`, stops it
        and leaves the filter before in place.

        Returns:
            the :class:`_FilterJob` (``wait()`` joins it).

        Raises:
            FilterError: as :meth:`filter` (at once, nothing started).
        """
        match = self._parse_filter(text)
        self.stop_filtering()
        job = _FilterJob(match, len(self._held))
        self.filtering = job
        job.thread = threading.Thread(target=self._apply_filter, args=(match, job),
                                      name="kinspect-filter", daemon=True)
        job.thread.start()
        return job

    def stop_filtering(self) -> bool:
        """Stop the filter being applied in the background, if any (the filter
        before stays); whether one was."""
        job = self.filtering
        if job is None:
            return False
        job.stopped = True
        with self._lock:
            if self.filtering is job:
                self.filtering = None
        if job.thread is not None and job.thread is not threading.current_thread():
            job.thread.join()
        return True

    def _apply_filter(self, match: Filter | None, job: "_FilterJob | None" = None) -> None:
        """Make ``match`` the filter and the held flows it selects the rows (the
        flows that came meanwhile too); with ``job``, unless it is stopped first."""
        arrivals: list[Flow] = []
        with self._lock:
            held = list(self._held.values())
            self._arrivals.append(arrivals)
        rows = []
        others: list[int] = []
        one = self._matches_with
        try:
            for i, flow in enumerate(held):
                if job is not None and not i & 255:
                    if job.stopped:
                        return
                    job.done = i
                if one(match, flow):
                    row = self._new_row(flow)
                    if row is not None:
                        rows.append(row)
                else:
                    others.append(flow.id)
            with self._lock:
                if job is not None and (job.stopped or self.filtering is not job):
                    return
                # the flows that came since (few): none reached the rows meanwhile
                rows.extend(r for r in (self._new_row(f) for f in arrivals
                                        if one(match, f)) if r is not None)
                others.extend(f.id for f in arrivals if not one(match, f))
                self._others = {i: None for i in others if i in self._held}
                self.match = match
                self._pending.clear()
                self._pending_bytes = 0
                self._rows = deque(rows, maxlen=self.keep)
                self._top = 0
                if job is not None:
                    job.done = len(held)
                    self.filtering = None
        except Exception:  # noqa: BLE001 - on a thread: say so, leave the view as it was
            if job is None:
                raise
            log.exception("live view: applying filter %r failed", match.text if match else "")
            with self._lock:
                if self.filtering is job:
                    self.filtering = None
        finally:
            with self._lock:
                self._arrivals.remove(arrivals)

    def _row(self, flow: Flow) -> tuple[dict[str, str], str | None] | None:
        """``(row, style)`` of a flow, or ``None`` (logged) when it cannot be rendered."""
        try:
            return flow_row(self._decoded(flow), self.topic_ids, quick=True), _style(flow)
        except Exception:  # noqa: BLE001 - one bad row must not stop the redraws
            log.exception("live view: cannot render flow #%s", flow.id)
            return None

    @property
    def rows(self) -> deque[tuple[dict[str, str], str | None]]:
        """``(row, style)`` of the newest ``keep`` matching flows, oldest first (every
        waiting flow is rendered first), less those a redraw let go unrendered: flows
        older than a whole screen of newer ones at the time of that redraw."""
        self._render(None)
        return self._rows

    def _render(self, newest: int | None, budget: bool = False) -> None:
        """Render waiting flows into rows: all of them, or only the ``newest`` (older
        waiting flows are let go: ``newest`` newer rows come after them), or with
        ``budget`` the oldest until the waiting frames fit :data:`PENDING_BYTES`."""
        # under the lock, so that rows keep the flows' order whichever thread renders
        # (the event loop's, or rich's refresh thread for a redraw)
        with self._lock:
            pending = self._pending
            if budget:
                take = []
                while pending and self._pending_bytes > PENDING_BYTES:
                    f = pending.popleft()
                    if type(f) is not tuple:
                        self._pending_bytes -= len(f.request) + len(f.response or b"")
                    take.append(f)
            else:
                take = list(pending)
                if newest is not None:
                    take = take[-newest:] if newest > 0 else []
                pending.clear()
                self._pending_bytes = 0
            rows = self._rows
            for f in take:
                row = f if type(f) is tuple else self._new_row(f)  # (rendered on arrival)
                if row is not None:
                    rows.append(row)

    def _new_row(self, flow: Flow) -> tuple[Mapping[str, str], str | None] | None:
        """The row of a flow joining the table: rendered now (:meth:`_row`), or, in a
        view that holds every flow (a capture's, ``hold_bytes`` ``None``), when a
        redraw first shows it (:class:`_LazyRow`)."""
        if self.interactive and self.hold_bytes is None:
            return _LazyRow(flow, self.topic_ids, self._decoded), _style(flow)
        return self._row(flow)

    def _hold(self, flow: Flow, size: int, matches: bool = True) -> None:
        """Keep ``flow`` for its row's detail and for filters typed later (under the
        lock); past ``keep`` flows or ``hold_bytes`` of frames, let the oldest go,
        those the filter did not select (``matches`` False) first: a filtered view
        keeps its rows openable however many other flows pass."""
        held = self._held
        limit = self.hold_bytes
        if limit is not None and size > limit:
            return
        if limit is not None and (flow.request_decoded is not None
                                  or flow.response_decoded is not None):
            flow = flow.copy()  # (the flow the other addons have keeps its own)
            flow.request_decoded = flow.response_decoded = None
            self._let_go.add(flow.id)
        held[flow.id] = flow
        others = self._others
        if not matches:
            others[flow.id] = None
        self._held_bytes += size
        while len(held) > self.keep or (limit is not None and self._held_bytes > limit):
            fid = next(iter(others)) if others else next(iter(held))
            others.pop(fid, None)
            if self._pinned is None or self._pinned.id != fid:
                self._let_go.discard(fid)
            old = held.pop(fid)
            self._held_bytes -= len(old.request) + len(old.response or b"")

    def _pin(self) -> None:
        """Keep the flow of the selected row, or the open one, while it is (under
        the lock)."""
        want = self.detail if self.detail is not None else self.selected
        pinned = self._pinned
        if want is None:
            self._pinned = None
        elif pinned is None or pinned.id != want:
            self._pinned = self._held.get(want)
        if pinned is not None and pinned is not self._pinned and pinned.id not in self._held:
            self._let_go.discard(pinned.id)  # (kept for it while it was pinned)

    def _held_flow(self, flow_id: int) -> Flow | None:
        """A held flow by id, the pinned one too (under the lock)."""
        flow = self._held.get(flow_id)
        if flow is None and self._pinned is not None and self._pinned.id == flow_id:
            flow = self._pinned
        return flow

    def waiting_rows(self, n: int, shown: set[str] | frozenset = frozenset()
                     ) -> list[tuple[dict[str, str], str | None]]:
        """``(row, style)`` of the (at most ``n``) oldest requests still waiting for
        their responses that ``match`` selects, oldest first (see the class), less
        the flows whose ids (as rows give them) are in ``shown``."""
        if n <= 0:
            return []
        with self._lock:
            waiting = list(self._waiting.values())
        now = time.time_ns()
        codec = self.codec
        out = []
        for flow in waiting:
            if flow.response is not None or str(flow.id) in shown:
                continue  # answered: shown complete (at a next redraw)
            if not self._matches(flow):
                continue
            try:
                row = flow_row(flow, self.topic_ids, quick=True)
                if flow.client_id is None and codec is not None and flow.api_key >= 0:
                    try:  # the header alone (the request is decoded with its response)
                        client_id = codec.decode_request(flow.request, body=False).client_id
                    except DecodeError:
                        client_id = None
                    row["client_id"] = printable(client_id or "")
                row["latency"] = f"{max(now - flow.request_ns, 0) / 1e6:.0f}+"
                row["flags"] = " ".join(x for x in (IN_FLIGHT, row["flags"]) if x)
            except Exception:  # noqa: BLE001 - one bad row must not stop the redraws
                log.exception("live view: cannot render waiting request #%s", flow.id)
                continue
            out.append((row, "dim"))
            if len(out) >= n:
                break
        return out

    def close(self) -> None:
        try:
            if self._keys is not None:
                self._keys.stop()
            self.stop_filtering()
            self._live.stop()
        finally:
            self._release()

    def _release(self) -> None:
        """Put back the SIGTSTP handler and the log handlers the view took, and
        hand them the records kept meanwhile."""
        if self._tstp is not None:
            try:
                signal.signal(signal.SIGTSTP, self._tstp)
            except ValueError:  # (closed off the main thread: it stays, and returns at
                pass  # once after a stop, the view being closed: see _suspend)
            self._tstp = None
        if self._log is not None:
            root = logging.getLogger()
            root.removeHandler(self._log)
            for h in self._muted:
                root.addHandler(h)
            self._log.replay(self._muted)
            self._log, self._muted = None, []

    def header(self) -> Text:
        p = self.proxy
        if p is None:  # a capture's flows
            t = Text()
            t.append(f" {self.title} ", style="bold reverse")
            with self._lock:
                shown, held = len(self._rows) + len(self._pending), len(self._held)
            t.append(f"   {shown} of {held} flows")
            if self.match is not None:
                t.append(f"   filter {printable(self.match.text)}", style="bold")
            self._progress(t)
            if self.selected is not None:
                t.append(f"   #{self.selected} selected")
            t.append(f"   {self._arrows()}/PgUp/PgDn/Home/End select, Enter opens, f filters"
                     "   q quits", style="dim")
            return t
        s = p.stats
        now = time.monotonic()
        up = "%s:%d" % p.config.upstream
        listen = "%s:%d" % p.address if p.listeners else "-"
        brokers = len(p.listeners)
        t = Text()
        t.append(f" {self.title} ", style="bold reverse")
        # (an ASCII arrow where the terminal's encoding has no "→": PYTHONIOENCODING=ascii)
        arrow = "→" if self.console.encoding.startswith("utf") else "->"
        t.append(f"  {listen} {arrow} {up}")
        if brokers > 1:
            t.append(f" (+{brokers - 1} broker listeners)")
        t.append(f"   conns {s.connections_open} open / {s.connections_total} total")
        t.append(f"   flows {s.flows}  {self._rate.rate(now):.1f}/s")
        t.append(f"   {human_bytes(self._bytes.rate(now))}/s")
        if self._waiting:
            t.append(f"   in flight {len(self._waiting)}")
        if s.undecoded:
            t.append(f"   undecoded {s.undecoded}", style="yellow")
        if s.decode_skipped:
            t.append(f"   decode skipped {s.decode_skipped}", style="yellow")
        if s.rewritten:
            t.append(f"   rewritten {s.rewritten}")
        if self.match is not None:
            t.append(f"   filter {printable(self.match.text)}", style="bold")
        self._progress(t)
        if self.interactive and (self._keys is None or self._keys.reading):
            t.append(f"   {self._arrows()} select, Enter opens, f filters, End follows"
                     if self.selected is None else
                     f"   #{self.selected} selected: Enter opens, End follows", style="dim")
        t.append("   Ctrl-C quits", style="dim")
        return t

    def _progress(self, t: Text) -> None:
        """A filter being applied in the background, and how far it got, on ``t``."""
        job = self.filtering
        if job is not None:
            text = printable(job.match.text) if job.match is not None else "(every flow)"
            t.append(f"   filtering {text}: {job.done * 100 // max(job.total, 1)} %",
                     style="bold yellow")
            t.append(" (Esc stops)", style="dim")

    def table(self, rows: int) -> "TableLines":
        """The newest ``rows`` rows as fixed-width lines, columns sized to their content
        (a :class:`TableLines`): rows of complete flows, then those of requests
        waiting for their responses (:meth:`waiting_rows`, on at most a third of
        ``rows``).

        Lines of text rather than a rich ``Table`` or ``Text``: a redraw runs on
        rich's refresh thread, holding the GIL the forwarding loop needs. rich lays
        out a ``Table`` in tens of milliseconds for a few dozen rows, and splitting a
        multi-line ``Text`` into styled lines took longer than the rest of a redraw;
        these lines are cropped already (measured in BENCHMARKS.md, Proxy)."""
        self._page = rows
        if self.selected is not None:
            shown = self._window(rows)
        else:
            # complete rows first: a flow that completes meanwhile is among them, and
            # not also among the waiting ones
            self._render(rows)
            complete = list(self._rows)[-rows:] if rows > 0 else []
            waiting = self.waiting_rows(rows // 3, {r["id"] for r, _ in complete})
            room = rows - len(waiting)
            shown = complete[max(len(complete) - room, 0):] if room > 0 else []
            shown += waiting
        heads = [h for _, h, _ in COLUMNS]
        cells = [[row[k] or "" for k, _, _ in COLUMNS] for row, _ in shown]
        encoding = self.console.encoding
        ellipsis = "…"
        if not encoding.startswith("utf"):  # what the terminal's encoding cannot show, escaped
            cells = [[_encodable(c, encoding) for c in r] for r in cells]
            ellipsis = "~"
        # widths in terminal cells, not characters: a CJK client id takes two cells a
        # character, and counted as one it pushed the columns after it out of line
        widths = [max([len(h)] + [cell_len(c[i]) for c in cells]) for i, h in enumerate(heads)]
        over = sum(widths) + len(widths) - 1 - self.console.size.width
        # shrink the widest columns first: the secondary ones (records, client id,
        # flags, error), then the others, the api column last, so that a narrow
        # terminal still shows which api each row is ("Produce v9", not "Pr…")
        keys = [k for k, _, _ in COLUMNS]
        for group in ([keys.index(k) for k in _SHRINK_FIRST if k in keys],
                      [j for j, k in enumerate(keys) if k != "api"],
                      list(range(len(widths)))):
            while over > 0 and group and max(widths[j] for j in group) > 3:
                j = max(group, key=lambda i: widths[i])
                cut = min(over, widths[j] - 3)
                widths[j] -= cut
                over -= cut

        def line(values: list[str]) -> str:
            out = []
            for (_, _, justify), w, v in zip(COLUMNS, widths, values):
                n = cell_len(v)
                if n > w:
                    v, n = set_cell_size(v, w - 1) + ellipsis, w
                out.append(" " * (w - n) + v if justify == "right" else v + " " * (w - n))
            return " ".join(out)

        return TableLines([(line(heads), "bold")] +
                          [(line(c), style) for (_, style), c in zip(shown, cells)])

    def _arrows(self) -> str:
        return "↑↓" if self.console.encoding.startswith("utf") else "Up/Down"

    def _window(self, rows: int) -> list[tuple[dict[str, str], str | None]]:
        """The ``rows`` rows around the selected one (the selected one in reverse)."""
        self._render(None)
        with self._lock:
            kept = list(self._rows)
            i = self._index(kept)
            if i is None:
                return []
            top = min(max(self._top, i - rows + 1), i)
            self._top = top = max(0, min(top, len(kept) - rows))
            shown = kept[top:top + rows]
        return [(row, "reverse") if top + j == i else (row, style)
                for j, (row, style) in enumerate(shown)]

    def _index(self, kept: list) -> int | None:
        """Where the selected row is in ``kept`` (the oldest one if it was let go,
        and that one is selected then); ``None`` when there are no rows."""
        if not kept:
            self.selected = None
            return None
        want = str(self.selected)
        i = self._at  # where it was last time (rows come and go at the ends only)
        for at in (i, i - 1, i + 1):
            if 0 <= at < len(kept) and kept[at][0]["id"] == want:
                self._at = at
                return at
        for i in range(len(kept) - 1, -1, -1):
            if kept[i][0]["id"] == want:
                self._at = i
                return i
        self.selected = int(kept[0][0]["id"])
        self._at = 0
        return 0

    def key(self, name: str) -> None:
        """Act on a key (names as :func:`parse_keys` gives them). On the table:
        ``up``/``down`` (``k``/``j``), ``pgup``/``pgdn``, ``home`` (``g``): select a
        row, which stops following the newest; ``end`` (``G``) or ``esc``:
        follow the newest rows again (``esc``: first stops a filter being applied
        in the background); ``enter`` (``right``, ``l``): open the
        selected row's flow (or the newest), decoded as ``kinspect show --flow``
        shows it; ``f`` (``/``): type a filter (:meth:`filter`; Enter applies it,
        in the background past :data:`FILTER_IN_BACKGROUND` held flows, an empty
        one shows every flow, Esc leaves it as it was). In a flow:
        ``up``/``down``, ``pgup``/``pgdn`` (``space``), ``home``/``end`` scroll;
        ``esc``, ``left`` (``h``), ``backspace`` or ``q``: back to the table; ``n``/``p``: the next or previous flow; ``x``: the
        frames' bytes as hex dumps too (the first :data:`FRAMES_SHOWN` bytes of
        each), or not."""
        if not self.interactive:
            return
        if self.prompt is not None:
            self._prompt_key(name)
            return
        if name in ("f", "/") and self.detail is None:
            job = self.filtering  # (the filter being applied, if one is)
            match = job.match if job is not None else self.match
            self.prompt = match.text if match is not None else ""
            self.prompt_error = None
            return
        self._render(None)
        with self._lock:
            if self.detail is not None:
                self._detail_key(name)
            else:
                self._table_key(name)
            self._pin()

    def _prompt_key(self, name: str) -> None:
        """A key while a filter is typed: Enter applies it (or says what is wrong
        with it), Esc leaves it as it was."""
        from .filters import FilterError

        text = self.prompt or ""
        if name == "enter":
            try:
                if len(self._held) > FILTER_IN_BACKGROUND:
                    self.filter_in_background(text)
                else:
                    self.filter(text)
            except FilterError as e:
                # one line, a caret under the prompt's text where it goes wrong (the
                # exception's text spans three lines: the expression is on screen)
                if e.expr == text and 0 <= e.position <= len(text):
                    at = cell_len(_PROMPT) + cell_len(printable(text[:e.position]))
                    self.prompt_error = " " * at + "^ " + printable(e.reason)
                else:
                    self.prompt_error = printable(f"bad filter: {e.reason}")
                return
            self.prompt = self.prompt_error = None
        elif name == "esc":
            self.prompt = self.prompt_error = None
        elif name == "backspace":
            self.prompt, self.prompt_error = text[:-1], None
        elif name == "space" or len(name) == 1:
            self.prompt, self.prompt_error = text + (" " if name == "space" else name), None

    def _table_key(self, name: str) -> None:
        if name == "q" and self.on_quit is not None:
            self.on_quit()
            return
        if name == "esc" and self.filtering is not None:
            # (the key thread holds the lock: the filter's thread stops at its next
            # look, and finds it is no longer the view's filter)
            self.filtering.stopped = True
            self.filtering = None
            return
        kept = list(self._rows)
        if name in ("end", "G", "esc"):
            self.selected = None
            return
        if not kept:
            return
        page = max(self._page - 1, 1)
        if self.selected is None:
            i = len(kept) - 1 if name in ("up", "k", "enter", "right", "l") else \
                0 if name in ("home", "g") else None
            if i is None and name == "pgup":
                i = max(len(kept) - 1 - page, 0)
            if i is None:
                return
        else:
            i = self._index(kept)
            step = {"up": -1, "k": -1, "down": 1, "j": 1, "pgup": -page, "pgdn": page}
            if name in step:
                i = min(max(i + step[name], 0), len(kept) - 1)
            elif name in ("home", "g"):
                i = 0
        self.selected, self._at = int(kept[i][0]["id"]), i
        if name in ("enter", "right", "l"):
            self._open(self.selected)

    def _open(self, flow_id: int) -> None:
        self.detail = flow_id
        self._detail_lines = self._detail_for = None
        self._detail_top = 0

    def _detail_key(self, name: str) -> None:
        if name in ("esc", "left", "h", "backspace", "q"):
            self.detail = None
            self._detail_lines = self._detail_for = None
            return
        if name in ("n", "p"):
            kept = list(self._rows)
            self.selected = self.detail
            i = self._index(kept)
            if i is not None:
                i = min(max(i + (1 if name == "n" else -1), 0), len(kept) - 1)
                self.selected, self._at = int(kept[i][0]["id"]), i
                if self.selected != self.detail:  # (the last or first flow: stays)
                    self._open(self.selected)
            return
        if name == "x":
            self.frames = not self.frames
            return
        page = max(self._detail_page - 1, 1)
        step = {"up": -1, "k": -1, "down": 1, "j": 1, "pgup": -page, "pgdn": page,
                "space": page, "home": -(1 << 30), "g": -(1 << 30), "end": 1 << 30,
                "G": 1 << 30}
        if name in step:
            self._detail_top = max(0, self._detail_top + step[name])  # (capped at render)

    def _on_key(self, name: str) -> None:
        """A key from the :class:`KeyReader` thread: act, then redraw at once."""
        try:
            self.key(name)
            self._live.refresh()
        except Exception:  # noqa: BLE001 - a key must not end the view
            log.exception("live view: key %r failed", name)

    def _detail_view(self, detail: int, width: int, height: int) -> Group:
        """Flow ``detail``, decoded, as lines scrolled to ``_detail_top``. (Rendered
        once per flow, hex dumps or not, and width, outside the lock: the event
        loop's ``on_flow`` takes it, and a large flow's tree takes a while.)"""
        key = (detail, self.frames, width)
        with self._lock:
            flow = self._held_flow(detail)
            lines = self._detail_lines if self._detail_for == key else None
        if lines is None:
            options = self.console.options.update(width=width, height=None)
            if flow is None:
                what: Any = Text(f"flow #{detail} is not held any more: the view holds the "
                                 f"last {self.keep} flows, at most "
                                 f"{(self.hold_bytes or 0) >> 20} MiB of frames",
                                 style="yellow")
            else:
                what = flow_tree(self._decoded(flow), self.codec, topic_ids=self.topic_ids,
                                 limit=self.bytes_limit, frames=key[1],
                                 frames_limit=FRAMES_SHOWN, items=ITEMS_SHOWN)
            lines = self.console.render_lines(what, options, pad=False)
            with self._lock:
                if self.detail == detail:
                    self._detail_lines, self._detail_for = lines, key
        def status(first: int, last: int) -> Text:
            return Text(f" #{detail}  lines {first}-{last} of {len(lines)}   "
                        f"{self._arrows()} PgUp PgDn scroll   n/p next/previous flow   "
                        f"x {'hides' if key[1] else 'shows'} bytes   Esc back", style="dim")

        # the status line wraps on a narrow terminal: the flow's lines get what is
        # left, less the line rich's Live leaves for the cursor and one to spare
        most = status(len(lines), len(lines))
        room = max(height - len(most.wrap(self.console, width)) - 2, 1)
        with self._lock:
            self._detail_page = room
            top = self._detail_top = max(0, min(self._detail_top, len(lines) - room))
        shown = lines[top:top + room]
        return Group(status(top + 1, top + len(shown)), _Lines(shown))

    def __rich__(self) -> Group:
        console = self.console
        width, height = console.size
        detail = self.detail
        if detail is not None:
            return self._detail_view(detail, width, height)
        header = self.header()
        # the header wraps on a narrow terminal: the table gets the lines left, less
        # its heading line and the line rich's Live leaves for the cursor (rows past
        # the screen's height would be cropped: the newest ones, at the bottom)
        rows = height - len(header.wrap(console, width)) - 2
        warning = self.last_warning
        if warning is not None:  # one line, under the header
            line = Text(f"{self.warnings} warning{'s' if self.warnings > 1 else ''}, the last: "
                        f"{warning}", style="yellow", no_wrap=True, overflow="ellipsis")
            header = Group(header, line)
            rows -= 1
        prompt = self.prompt
        if prompt is None:
            return Group(header, self.table(max(rows, 3)))
        lines = [Text.assemble((_PROMPT, "bold"), printable(prompt), ("_", "blink"),
                               ("   Enter applies, Esc cancels, empty: every flow", "dim"))]
        if self.prompt_error:
            lines.append(Text(self.prompt_error, style="red"))
        return Group(header, self.table(max(rows - len(lines), 3)), *lines)


#: what the line a filter is typed on starts with
_PROMPT = "filter: "


def browse(flows: list[Flow], title: str, *, codec: Any = None,
           topic_ids: TopicIds | None = None, console: Console | None = None,
           keys: int | None = None, bytes_limit: int | None = 64,
           match: Filter | None = None, decode_on_demand: bool = False,
           matched: Collection[int] | None = None) -> None:
    """Browse flows read from a capture at a terminal, as the live view's keys do
    (:meth:`LiveView.key`), starting at the first flow, until ``q`` (or Ctrl-C).

    Args:
        flows: the flows, in order (all held: a capture's are in memory already).
        title: the header's text.
        match: the filter to start with (``f`` types another).
        codec: for the open flows' trees.
        topic_ids: topic ids learnt from the capture (for ``~topic`` names).
        console: rich console (default: stdout's).
        keys: file descriptor of the terminal to read keys from (default: stdin's).
        bytes_limit: as :class:`LiveView`'s.
        decode_on_demand: the flows were decoded and their decoded values let go
            (their ``error_code``, ``client_id``, flags and errors kept): rows,
            filters and the detail decode a copy when they need one (``codec``
            required), so a large capture is not held decoded.
        matched: the ids of the flows ``match`` selects, found by the caller (while
            they were decoded): the view starts with those instead of decoding
            them again.
    """
    done = threading.Event()
    view = LiveView(None, console=console, keep=max(len(flows), 1), title=title,
                    interactive=True, codec=codec, hold_bytes=None, on_quit=done.set,
                    bytes_limit=bytes_limit, match=match, decode_on_demand=decode_on_demand)
    if topic_ids is not None:
        view.topic_ids = topic_ids
    if match is not None and matched is not None:
        view.match = _Chosen(match, matched)
    for flow in flows:
        view.on_flow(flow)
    view.match = match
    view._render(None)
    if flows:
        view.key("home")
    # SIGTERM, SIGHUP (the terminal closed) and SIGQUIT (Ctrl-\\) end the browsing as
    # q does, so that the terminal's mode is put back (a signal's default action
    # would end the process on the spot, with the terminal in cbreak mode)
    stops = [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]
    before = {sig: signal.signal(sig, lambda *_: done.set()) for sig in stops}
    try:
        view.start(keys=sys.stdin.fileno() if keys is None else keys)
        while not done.wait(0.2):
            if view._keys is None or not view._keys.running:
                break  # no keys to read (the terminal went away)
    except KeyboardInterrupt:
        pass
    finally:
        view.close()
        for sig, handler in before.items():
            signal.signal(sig, handler)


class _ViewLog(logging.Handler):
    """The log while a :class:`LiveView` is drawn, in place of the handlers writing
    to the terminal (whose lines the next redraw erased): a warning or worse becomes
    the view's :attr:`~LiveView.last_warning`, shown under its header, and every
    record is kept (the last :attr:`KEEP`) for those handlers to write once the
    view has stopped. Nothing is drawn per record: a burst of them (a thousand
    connections failing) costs the forwarding loop no redraws."""

    #: records kept for the end
    KEEP = 1000

    def __init__(self, view: LiveView):
        super().__init__()
        self.view = view
        self.records: deque[logging.LogRecord] = deque(maxlen=self.KEEP)
        self.total = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append(record)
            self.total += 1
            if record.levelno >= logging.WARNING:
                self.view.warnings += 1
                self.view.last_warning = printable(record.getMessage())
        except Exception:  # noqa: BLE001 - as logging.Handler.handleError does
            self.handleError(record)

    def replay(self, handlers: list[logging.Handler]) -> None:
        """Hand the kept records to ``handlers`` (after saying how many were let go)."""
        if not handlers:
            return
        records = list(self.records)
        if self.total > len(records):
            records.insert(0, logging.LogRecord(
                "kinspect.tui", logging.WARNING, __file__, 0,
                "%d log records while the live view was drawn; the last %d follow",
                (self.total, len(records)), None))
        for record in records:
            for h in handlers:
                if record.levelno >= h.level:
                    h.handle(record)


class _FilterJob:
    """A filter being applied on a thread of its own (:meth:`LiveView.filter_in_background`).

    Attributes:
        match: the filter (``None``: every flow).
        total: flows it looks at; ``done``: how many it has looked at so far.
        stopped: set to stop it (it looks every 256 flows).
    """

    def __init__(self, match: Filter | None, total: int):
        self.match = match
        self.total = total
        self.done = 0
        self.stopped = False
        self.thread: threading.Thread | None = None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for it to end; whether it has."""
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True


class _Chosen(Filter):
    """``match`` as a set of the flow ids it selects (see :func:`browse`)."""

    def __init__(self, match: Filter, ids: Collection[int]):
        self.text = match.text
        self.ids = ids

    def _eval(self, flow, direction, ids):
        return flow.id in self.ids


class _LazyRow(Mapping):
    """A flow's row (:func:`~kinspect.show.flow_row`), rendered when first read but
    for its ``id``: the rows of a view holding a whole capture cost nothing until
    shown. A flow that cannot be rendered is logged and shows as such."""

    __slots__ = ("flow", "topic_ids", "decoded", "_row")

    def __init__(self, flow: Flow, topic_ids: TopicIds, decoded: Callable[[Flow], Flow]):
        self.flow = flow
        self.topic_ids = topic_ids
        self.decoded = decoded  # the flow as rendered (see LiveView._decoded)
        self._row: dict[str, str] | None = None

    def _render(self) -> dict[str, str]:
        row = self._row
        if row is None:
            try:
                row = flow_row(self.decoded(self.flow), self.topic_ids, quick=True)
            except Exception:  # noqa: BLE001 - one bad row must not stop the redraws
                log.exception("live view: cannot render flow #%s", self.flow.id)
                row = {k: "" for k, _, _ in COLUMNS}
                row.update(id=str(self.flow.id), api="(cannot be shown)")
            self._row = row
        return row

    def __getitem__(self, key: str) -> str:
        if key == "id" and self._row is None:
            return str(self.flow.id)
        return self._render()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._render())

    def __len__(self) -> int:
        return len(COLUMNS)


class TableLines:
    """Lines of text, each with an optional rich style name, rendered as they are:
    one styled segment per line, cropped to the console's width (no wrapping), each
    line ended by a newline. The text must be printable already (the rows' cells
    are :func:`kinspect.show.printable`): it reaches the terminal as it is.

    Attributes:
        lines: ``(text, style)`` pairs, top first.
    """

    def __init__(self, lines: list[tuple[str, str | None]]):
        self.lines = lines

    @property
    def plain(self) -> str:
        """The text of the lines, joined by newlines, without styles."""
        return "\n".join(text for text, _ in self.lines)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        width = options.max_width
        get_style = console.get_style
        styles: dict[str | None, Style | None] = {None: None}
        newline = Segment.line()
        for text, name in self.lines:
            if name not in styles:
                styles[name] = get_style(name)
            if cell_len(text) > width:
                # in cells: a CJK character takes two, a combining accent none
                text = set_cell_size(text, width)
            yield Segment(text, styles[name])
            yield newline


class _Lines:
    """Lines of rendered segments, as they are (each ended by a newline)."""

    def __init__(self, lines: list[list[Segment]]):
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        newline = Segment.line()
        for line in self.lines:
            yield from line
            yield newline


#: escape sequences of the keys the live view knows (xterm's, in normal and
#: application cursor mode; ECMA-48 for the rest), longest first
_SEQUENCES = sorted({
    b"\x1b[A": "up", b"\x1b[B": "down", b"\x1b[C": "right", b"\x1b[D": "left",
    b"\x1bOA": "up", b"\x1bOB": "down", b"\x1bOC": "right", b"\x1bOD": "left",
    b"\x1b[5~": "pgup", b"\x1b[6~": "pgdn", b"\x1b[H": "home", b"\x1b[F": "end",
    b"\x1bOH": "home", b"\x1bOF": "end", b"\x1b[1~": "home", b"\x1b[4~": "end",
    b"\x1b[7~": "home", b"\x1b[8~": "end",
}.items(), key=lambda kv: -len(kv[0]))
_SINGLE = {b"\r": "enter", b"\n": "enter", b" ": "space", b"\x7f": "backspace",
           b"\x08": "backspace"}


def incomplete_at(data: bytes) -> int:
    """Where a key cut short at the end of ``data`` starts (``len(data)`` when none
    is): an ESC, or the start of an escape sequence without its final byte, or a
    UTF-8 character's first bytes. A terminal's read may end inside a key (a held
    arrow key's sequences come many to a read): its rest comes with the next read."""
    n = len(data)
    i = data.rfind(b"\x1b", max(0, n - 32))  # (a CSI with parameters runs long)
    if i >= 0:
        tail = data[i:]
        if tail == b"\x1b" or any(seq != tail and seq.startswith(tail) for seq, _ in _SEQUENCES):
            return i
        if tail[:2] in (b"\x1b[", b"\x1bO") and not any(0x40 <= c <= 0x7E for c in tail[2:]):
            return i  # a sequence not known here, its final byte still to come
    for back in (1, 2, 3):
        if back > n:
            break
        c = data[n - back]
        if 0xC2 <= c < 0xF5:  # the first byte of a character of 2, 3 or 4 bytes
            size = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return n - back if size > back else n
        if not 0x80 <= c < 0xC0:
            break
    return n


def parse_keys(data: bytes) -> list[str]:
    """Key names in bytes read from a terminal in cbreak mode: ``up``, ``down``,
    ``left``, ``right``, ``pgup``, ``pgdn``, ``home``, ``end``, ``enter``, ``esc``,
    ``space``, ``backspace``, and printable characters as themselves (``j``, ``G``,
    ``é``: UTF-8, as terminals send them). An escape sequence not known here is
    skipped whole (up to its final byte, ECMA-48 CSI); a lone ESC is ``esc``; other
    control bytes, and bytes that are not UTF-8, are skipped."""
    keys = []
    i, n = 0, len(data)
    while i < n:
        b = data[i:i + 1]
        if b == b"\x1b":
            for seq, name in _SEQUENCES:
                if data.startswith(seq, i):
                    keys.append(name)
                    i += len(seq)
                    break
            else:
                if data.startswith((b"\x1b[", b"\x1bO"), i):  # unknown: skip to its end
                    j = i + 2
                    while j < n and not 0x40 <= data[j] <= 0x7E:
                        j += 1
                    i = j + 1
                else:
                    keys.append("esc")
                    i += 1
            continue
        if b in _SINGLE:
            keys.append(_SINGLE[b])
        elif 0x21 <= data[i] <= 0x7E:
            keys.append(b.decode("ascii"))
        elif data[i] >= 0xC2:  # the first byte of a UTF-8 sequence of 2 to 4 bytes
            size = 2 if data[i] < 0xE0 else 3 if data[i] < 0xF0 else 4
            try:
                char = data[i:i + size].decode("utf-8")
            except UnicodeDecodeError:
                char = ""
            if len(char) == 1:
                if char.isprintable():
                    keys.append(char)
                i += size
                continue
        i += 1
    return keys


class KeyReader:
    """Read keys from a terminal on a thread of its own and hand each to
    ``on_key(name)`` (names from :func:`parse_keys`).

    While this process is in the terminal's foreground, the terminal is in cbreak
    mode (no echo, keys as they are typed; Ctrl-C still sends SIGINT), set again
    should something else put it back in line mode (a shell after Ctrl-Z and
    ``fg``). In the background (``kinspect proxy &``, or ``bg``) the terminal and
    its keys belong to the foreground program: nothing is read and the mode is left
    alone (reading or changing it would stop this process: SIGTTIN, SIGTTOU).
    :meth:`stop` (also run at exit) puts back the mode the terminal had before,
    from the foreground only. A file descriptor that is not a terminal is left
    alone and no keys are read."""

    #: seconds between looks at the foreground and the terminal's mode
    POLL = 0.5
    #: seconds a key cut short at the end of a read waits for its rest (a lone ESC
    #: is the Esc key once they have passed)
    ESC_WAIT = 0.05

    def __init__(self, fd: int, on_key: Any):
        self.fd = fd
        self.on_key = on_key
        #: the terminal's mode before the first cbreak (put back at the end)
        self._saved: list | None = None
        self._engaged = False  # cbreak mode set, this process in the foreground
        self._stopped = False
        self._lock = threading.Lock()  # setting the mode (the thread) vs putting it back
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="kinspect-keys", daemon=True)

    def start(self) -> "KeyReader":
        import termios

        try:
            termios.tcgetattr(self.fd)
        except (termios.error, OSError):  # not a terminal
            return self
        atexit.register(self._restore)  # (should the process end without stop())
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether keys are read, or will be once this process is in the foreground."""
        return self._thread.is_alive()

    @property
    def reading(self) -> bool:
        """Whether keys are being read now (cbreak mode, in the foreground)."""
        return self._engaged and self._thread.is_alive()

    def _foreground(self) -> bool:
        """Whether this process is in the terminal's foreground process group (a
        terminal that is not this process's controlling terminal has none, and
        stops nobody: True)."""
        try:
            return os.tcgetpgrp(self.fd) == os.getpgrp()
        except OSError:
            return True

    def _engage(self) -> bool:
        """Put the terminal in cbreak mode unless it is (from the foreground); False
        when that cannot be done."""
        import termios
        import tty

        with self._lock:
            if self._stopped:
                return False
            try:
                mode = termios.tcgetattr(self.fd)
                if self._saved is None:
                    self._saved = mode
                if mode[3] & (termios.ICANON | termios.ECHO):
                    tty.setcbreak(self.fd, termios.TCSANOW)
            except (termios.error, OSError):
                return False
            self._engaged = True
            return True

    def _run(self) -> None:
        pending = b""  # a key cut short at the end of the last read
        while True:
            try:
                if not self._foreground():  # the foreground program's terminal now
                    self._engaged = False
                    pending = b""
                    if select.select([self._wake_r], [], [], self.POLL)[0]:
                        return
                    continue
                if not self._engage():
                    return
                ready, _, _ = select.select([self.fd, self._wake_r], [], [],
                                            self.ESC_WAIT if pending else self.POLL)
                if self._wake_r in ready:
                    return
                if not ready:
                    if pending:  # its rest did not come: a lone ESC is the Esc key
                        keys, pending = parse_keys(pending), b""
                        for name in keys:
                            self.on_key(name)
                    continue
                data = os.read(self.fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:  # the terminal went away
                return
            data = pending + data
            cut = incomplete_at(data)
            pending = data[cut:]
            for name in parse_keys(data[:cut]):
                self.on_key(name)

    def stop(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(2 * self.POLL)
        self._restore()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _restore(self) -> None:
        import termios

        with self._lock:
            self._stopped = True
            saved, self._saved = self._saved, None
            self._engaged = False
        if saved is None:
            return
        atexit.unregister(self._restore)
        if not self._foreground():  # the foreground program's mode: not ours to set
            return
        # (should it go to the background right now, tcsetattr would stop the process,
        # SIGTTOU, unless the signal is ignored; a handler is set on the main thread only)
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN) if main else None
        try:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)
        except (termios.error, OSError):
            pass
        finally:
            if main:
                signal.signal(signal.SIGTTOU, old)


def _encodable(text: str, encoding: str) -> str:
    """``text`` with the characters ``encoding`` cannot encode written as ``\\xNN``,
    ``\\uNNNN`` escapes (a terminal or file that is not UTF-8, e.g.
    ``PYTHONIOENCODING=ascii``: writing them would raise ``UnicodeEncodeError``)."""
    try:
        text.encode(encoding)
        return text
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # an encoding Python does not know: keep ASCII
        return text.encode("ascii", "backslashreplace").decode("ascii")


def _style(flow: Flow) -> str | None:
    if flow.flags & {"undecoded", "trailing-bytes", "unpaired", "closed"}:
        return "yellow"
    if flow.error_code:
        return "red"
    if flow.flags & {"mutated", "rewritten"}:
        return "cyan"
    return None


class LinePrinter:
    """A pipeline addon printing one line per flow (for logs and CI).

    When the reader of ``out`` goes away (``kinspect proxy --no-tui | head``), the
    printer says so once (a warning) and prints no more; the proxy goes on
    forwarding, as a proxy must for its clients. ``out`` is then pointed at
    /dev/null when it is the process's stdout, so that the interpreter's last
    flush does not report the broken pipe either."""

    def __init__(self, out: TextIO | None = None, match: Filter | None = None):
        self.out = out or sys.stdout
        self.match = match
        self.topic_ids = TopicIds()
        #: the reader went away: nothing more is printed
        self.gone = False

    def on_flow(self, flow: Flow) -> None:
        self.topic_ids.learn(flow)
        if self.gone:
            return
        if self.match is None or self.match.matches(flow, topic_ids=self.topic_ids):
            line = flow_line(flow, self.topic_ids)
            encoding = getattr(self.out, "encoding", None)
            if encoding and not encoding.lower().startswith("utf"):
                line = _encodable(line, encoding)
            try:
                print(line, file=self.out, flush=True)
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.gone = True
        log.warning("the reader of the flow lines went away: no more are printed; "
                    "the proxy goes on")
        if self.out is sys.stdout:
            from .cli import quiet_broken_pipe

            quiet_broken_pipe()
