"""The live view and the line printer, fed real flows from a real session."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from clients import roundtrip_async
from kinspect.filters import parse
from kinspect.show import COLUMNS
from kinspect.tui import LinePrinter, LiveView
from proxyutil import bootstrap_of, running_proxy

pytestmark = pytest.mark.asyncio


async def test_live_view_and_line_printer_show_real_flows(tansu, unique):
    out = io.StringIO()
    console = Console(file=io.StringIO(), width=200, height=40, force_terminal=False)
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        view = LiveView(proxy, console=console, keep=8, match=parse("!~api Heartbeat"))
        lines = LinePrinter(out, match=parse("~api Produce | ~api Fetch"))
        proxy.pipeline.add(view)
        proxy.pipeline.add(lines)
        await roundtrip_async("kafka-python", bootstrap_of(proxy), ["a", "b"],
                              topic=unique("t"), group=unique("g"))
        await proxy.pipeline.drained()
        shown = [f for f in rec.flows if f.api_name != "Heartbeat"]
        # the view keeps rendered rows only, the newest `keep` of the matching flows
        assert len(view.rows) == min(8, len(shown))
        assert [r["id"] for r, _ in view.rows] == [str(f.id) for f in shown[-8:]]
        console.print(view)
    screen = console.file.getvalue()
    for _, header, _ in COLUMNS:
        assert header in screen
    assert f"flows {len(rec.flows)}" in screen
    printed = out.getvalue().splitlines()
    expected = [f for f in rec.flows if f.api_name in ("Produce", "Fetch")]
    assert len(printed) == len(expected) and expected
    for line, flow in zip(printed, expected):
        assert f"#{flow.id} conn={flow.conn}" in line and f"{flow.api_name} v" in line
    assert any("records=" in line for line in printed if " Produce v" in line)
