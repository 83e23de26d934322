"""The live view: a rich flow table redrawn at a fixed rate, and a line printer.

Both are pipeline addons (:mod:`kinspect.proxy.pipeline`): they receive each flow
once it is complete and decoded. The live view redraws at ``refresh_per_second``
whatever the traffic; flows only append to a bounded ring.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from datetime import datetime
from typing import Any, Callable, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .flows import Flow

COLUMNS = ("time", "conn", "client id", "api", "corr", "req", "resp", "latency", "err", "flags")


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def human_latency(ns: int | None) -> str:
    if ns is None:
        return "-"
    us = ns / 1000
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.1f} ms"
    return f"{us / 1_000_000:.2f} s"


def flow_columns(flow: Flow) -> tuple[str, ...]:
    """The live view's columns for one flow (see :data:`COLUMNS`)."""
    t = datetime.fromtimestamp(flow.request_ns / 1e9).strftime("%H:%M:%S.%f")[:-3]
    api = flow.api_name if flow.api_version < 0 else f"{flow.api_name} v{flow.api_version}"
    resp_len = None if flow.response is None else len(flow.response)
    err = "-" if flow.error_code is None else str(flow.error_code)
    return (t, str(flow.conn), flow.client_id or "-", api,
            "-" if flow.correlation_id < 0 else str(flow.correlation_id),
            human_bytes(len(flow.request)), human_bytes(resp_len), human_latency(flow.latency_ns),
            err, ",".join(sorted(flow.flags)))


def flow_line(flow: Flow) -> str:
    """One log line per flow (``--no-tui``)."""
    c = flow_columns(flow)
    line = (f"{c[0]} conn={c[1]} client={c[2]} {c[3]} corr={c[4]} req={c[5]} resp={c[6]} "
            f"latency={c[7]} err={c[8]}")
    if flow.flags:
        line += f" [{c[9]}]"
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
        keep: flows kept for display.
        match: optional predicate selecting flows to show (a filter).
    """

    def __init__(self, proxy: Any, console: Console | None = None, keep: int = 2000,
                 refresh_per_second: float = 4.0, match: Callable[[Flow], bool] | None = None,
                 title: str = "kinspect"):
        self.proxy = proxy
        self.console = console or Console()
        self.flows: deque[Flow] = deque(maxlen=keep)
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
        if self.match is None or self.match(flow):
            self.flows.append(flow)

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

    def table(self, rows: int) -> Table:
        t = Table(expand=True, box=None, header_style="bold", pad_edge=False)
        for col in COLUMNS:
            t.add_column(col, justify="right" if col in ("conn", "corr", "req", "resp",
                                                          "latency", "err") else "left",
                         no_wrap=True, overflow="ellipsis")
        for flow in list(self.flows)[-rows:] if rows > 0 else []:
            cols = flow_columns(flow)
            style = None
            if flow.flags & {"undecoded", "unpaired", "closed"}:
                style = "yellow"
            elif flow.error_code:
                style = "red"
            elif flow.flags & {"mutated", "rewritten"}:
                style = "cyan"
            t.add_row(*cols, style=style)
        return t

    def __rich__(self) -> Group:
        height = self.console.size.height
        return Group(self.header(), self.table(max(height - 4, 3)))


class LinePrinter:
    """A pipeline addon printing one line per flow (for logs and CI)."""

    def __init__(self, out: TextIO | None = None, match: Callable[[Flow], bool] | None = None):
        self.out = out or sys.stdout
        self.match = match

    def on_flow(self, flow: Flow) -> None:
        if self.match is None or self.match(flow):
            print(flow_line(flow), file=self.out, flush=True)
