"""The live view: a rich flow table redrawn at a fixed rate, and a line printer.

Both are pipeline addons (:mod:`kinspect.proxy.pipeline`): they receive each flow
once it is complete and decoded. The live view redraws at ``refresh_per_second``
whatever the traffic. It keeps rendered rows, not flows, so frames are not held
in memory by the view.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from .filters import Filter, TopicIds
from .flows import Flow
from .show import COLUMNS, flow_row



def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def flow_line(flow: Flow, topic_ids: TopicIds | None = None) -> str:
    """One log line per flow (``--no-tui``), with the live view's columns."""
    r = flow_row(flow, topic_ids, quick=True)
    line = (f"{r['time']} #{r['id']} conn={r['conn']} client={r['client_id'] or '-'} {r['api']} "
            f"corr={r['corr'] or '-'} req={r['req_bytes'] or '-'}B "
            f"resp={r['resp_bytes'] or '-'}B latency={r['latency'] or '-'}ms "
            f"err={r['error'] or 0}")
    if r["records"]:
        line += f" records={r['records']}"
    if r["flags"]:
        line += f" [{r['flags']}]"
    if flow.error:
        line += f" ({flow.error})"
    return line


class _Rate:
    """Events per second over a sliding window."""

    def __init__(self, window: float = 5.0):
        self.window = window
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, now: float, value: float) -> None:
        self.samples.append((now, value))

    def rate(self, now: float) -> float:
        s = self.samples
        while s and s[0][0] < now - self.window:
            s.popleft()
        if not s:
            return 0.0
        span = max(now - s[0][0], 1.0)
        return sum(v for _, v in s) / span


class LiveView:
    """A pipeline addon drawing the flow table with rich ``Live``.

    Args:
        proxy: the :class:`~kinspect.proxy.server.Proxy` (for totals).
        console: rich console (default: stdout).
        keep: rows kept for display.
        match: optional filter (:class:`kinspect.filters.Filter`) selecting flows.
    """

    def __init__(self, proxy: Any, console: Console | None = None, keep: int = 500,
                 refresh_per_second: float = 4.0, match: Filter | None = None,
                 title: str = "kinspect"):
        self.proxy = proxy
        self.console = console or Console()
        #: (rendered row, style) of the newest flows
        self.rows: deque[tuple[dict[str, str], str | None]] = deque(maxlen=keep)
        self.topic_ids = TopicIds()
        self.match = match
        self.title = title
        self._rate = _Rate()
        self._bytes = _Rate()
        self._live = Live(self, console=self.console, refresh_per_second=refresh_per_second,
                          screen=False, transient=False, redirect_stdout=False,
                          redirect_stderr=False, vertical_overflow="crop")

    def start(self) -> "LiveView":
        self._live.start()
        return self

    def on_flow(self, flow: Flow) -> None:
        now = time.monotonic()
        self._rate.add(now, 1)
        self._bytes.add(now, len(flow.request) + len(flow.response or b""))
        self.topic_ids.learn(flow)
        if self.match is None or self.match.matches(flow, topic_ids=self.topic_ids):
            self.rows.append((flow_row(flow, self.topic_ids, quick=True), _style(flow)))

    def close(self) -> None:
        self._live.stop()

    def header(self) -> Text:
        p = self.proxy
        s = p.stats
        now = time.monotonic()
        up = "%s:%d" % p.config.upstream
        listen = "%s:%d" % p.address if p.listeners else "-"
        brokers = len(p.listeners)
        t = Text()
        t.append(f" {self.title} ", style="bold reverse")
        t.append(f"  {listen} → {up}")
        if brokers > 1:
            t.append(f" (+{brokers - 1} broker listeners)")
        t.append(f"   conns {s.connections_open} open / {s.connections_total} total")
        t.append(f"   flows {s.flows}  {self._rate.rate(now):.1f}/s")
        t.append(f"   {human_bytes(self._bytes.rate(now))}/s")
        if s.undecoded:
            t.append(f"   undecoded {s.undecoded}", style="yellow")
        if s.decode_skipped:
            t.append(f"   decode skipped {s.decode_skipped}", style="yellow")
        if s.rewritten:
            t.append(f"   rewritten {s.rewritten}")
        t.append("   Ctrl-C quits", style="dim")
        return t

    def table(self, rows: int) -> Text:
        """The newest ``rows`` rows as fixed-width text, columns sized to their content.

        One :class:`~rich.text.Text` rather than a rich ``Table``: a Table of a few
        dozen rows costs tens of milliseconds per redraw, on a thread that holds the
        GIL the forwarding loop needs (measured in bench/proxy.py)."""
        shown = list(self.rows)[-rows:] if rows > 0 else []
        heads = [h for _, h, _ in COLUMNS]
        cells = [[row[k] or "" for k, _, _ in COLUMNS] for row, _ in shown]
        widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
        over = sum(widths) + len(widths) - 1 - self.console.size.width
        while over > 0 and max(widths) > 3:  # shrink the widest columns first
            j = widths.index(max(widths))
            cut = min(over, widths[j] - 3)
            widths[j] -= cut
            over -= cut

        def line(values: list[str]) -> str:
            out = []
            for (_, _, justify), w, v in zip(COLUMNS, widths, values):
                v = v if len(v) <= w else v[:w - 1] + "…"
                out.append(v.rjust(w) if justify == "right" else v.ljust(w))
            return " ".join(out)

        text = Text(line(heads), style="bold", no_wrap=True, overflow="crop")
        for (_, style), c in zip(shown, cells):
            text.append("\n" + line(c), style=style)
        return text

    def __rich__(self) -> Group:
        height = self.console.size.height
        return Group(self.header(), self.table(max(height - 4, 3)))


def _style(flow: Flow) -> str | None:
    if flow.flags & {"undecoded", "unpaired", "closed"}:
        return "yellow"
    if flow.error_code:
        return "red"
    if flow.flags & {"mutated", "rewritten"}:
        return "cyan"
    return None


class LinePrinter:
    """A pipeline addon printing one line per flow (for logs and CI)."""

    def __init__(self, out: TextIO | None = None, match: Filter | None = None):
        self.out = out or sys.stdout
        self.match = match
        self.topic_ids = TopicIds()

    def on_flow(self, flow: Flow) -> None:
        self.topic_ids.learn(flow)
        if self.match is None or self.match.matches(flow, topic_ids=self.topic_ids):
            print(flow_line(flow, self.topic_ids), file=self.out, flush=True)
