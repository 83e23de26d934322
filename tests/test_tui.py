"""The live view and the line printer, fed real flows from a real session."""

from __future__ import annotations

import io
import os
import re
import sys
import time

import pytest
from clients import roundtrip_async
from proxyutil import bootstrap_of, running_proxy
from rich.console import Console

from kinspect.filters import parse
from kinspect.show import COLUMNS
from kinspect.tui import LinePrinter, LiveView, _Rate

#: the committed example capture (kafka-python through the real proxy into Tansu)
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "captures", "example.jsonl")


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


def _flows(n: int, value_size: int = 10, records: int | None = None):
    """``n`` complete, decoded ApiVersions flows (frames built with the codec, paired
    by the proxy's tracker); with ``records``, every second one a Produce v9 of that
    many records instead."""
    import itertools

    from proxyutil import codec, request_bytes
    from test_resilience import produce, record_batch
    from test_tracker import response_bytes

    from kinspect.proxy.pipeline import decode_flow
    from kinspect.proxy.tracker import FlowTracker

    c = codec()
    ids = itertools.count(1)
    t = FlowTracker(c, 1, "127.0.0.1:1", "127.0.0.1:2", lambda: next(ids))
    out = []
    for i in range(n):
        if records is not None and i % 2:
            t.request(produce(i, "t", record_batch([b"v%d" % j for j in range(records)])), i)
            flow = t.response(response_bytes(0, 9, i), i + 1)
            decode_flow(c, flow)
            out.append(flow)
            continue
        t.request(request_bytes(18, 3, i, ClientSoftwareName="x" * value_size,
                                ClientSoftwareVersion="1"), i)
        flow = t.response(response_bytes(18, 3, i), i + 1)
        decode_flow(c, flow)
        out.append(flow)
    return out


def test_live_view_renders_only_what_a_redraw_shows():
    """Under heavy traffic the view renders rows lazily: a redraw renders the newest
    rows that fit on screen; the flows waiting stay bounded by `keep`."""
    console = Console(file=io.StringIO(), width=200, height=14, force_terminal=False)
    view = LiveView(object(), console=console, keep=50)
    flows = _flows(300)
    for f in flows:
        view.on_flow(f)
        assert len(view._pending) <= 50
    assert not view._rows  # nothing rendered before a redraw
    text = view.table(10).plain
    assert len(view._rows) == 10 and not view._pending
    assert [r["id"] for r, _ in view._rows] == [str(f.id) for f in flows[-10:]]
    assert f" {flows[-1].id} " in f" {text} ".replace("\n", " ")
    # later flows come after the ones shown; `rows` renders whatever still waits
    for f in flows[:5]:
        view.on_flow(f)
    assert [r["id"] for r, _ in view.rows][-15:] == [str(f.id) for f in flows[-10:] + flows[:5]]


def test_rate_is_per_second_over_its_window_in_constant_memory():
    """The header's flows/s and bytes/s: events in the last `window` seconds over the
    time they span (at least 1 s); a burst of many events keeps only a bucket per
    0.1 s, and events older than the window drop out."""
    r = _Rate(window=5.0, bucket=0.1)
    assert r.rate(100.0) == 0.0
    for i in range(100_000):  # 100,000 events of 2 over 4 s
        r.add(100.0 + i * 4e-5, 2)
    assert len(r.buckets) <= 41
    assert abs(r.rate(104.0) - 200_000 / 4.0) < 1e-6 * 50_000
    # 3 s later, the first 2 s have left the window: half the events remain, over
    # the 5 s from the oldest of them
    rate = r.rate(107.0)
    assert abs(sum(x[1] for x in r.buckets) - 100_000) <= 2 * 2500  # a bucket: 2,500 events
    assert abs(rate - 100_000 / 5.0) < 0.03 * 20_000
    s = _Rate()
    s.add(10.0, 7)
    assert s.rate(10.25) == 7.0  # a span under 1 s counts as 1 s
    assert r.rate(200.0) == 0.0 and not r.buckets


def test_rate_loses_no_event_to_a_redraw_on_another_thread():
    """add() runs on the event loop and rate() on rich's refresh thread, without a
    lock: with thread switches forced as often as CPython allows, every event added
    is still counted."""
    import sys
    import threading

    r = _Rate(window=1e9, bucket=1e-4)  # nothing leaves the window
    done = threading.Event()
    rates = []

    def redraws():
        while not done.is_set():
            rates.append(r.rate(time.monotonic()))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=redraws)
    t.start()
    try:
        for _ in range(100_000):
            r.add(time.monotonic(), 3)
    finally:
        done.set()
        t.join()
        sys.setswitchinterval(old)
    assert rates and all(x >= 0 for x in rates)
    assert sum(x[1] for x in r.buckets) == 300_000


def test_live_view_renders_early_when_waiting_frames_pass_the_budget(monkeypatch):
    import kinspect.tui as tui

    monkeypatch.setattr(tui, "PENDING_BYTES", 4096)
    console = Console(file=io.StringIO(), width=200, height=14, force_terminal=False)
    view = LiveView(object(), console=console, keep=500)
    flows = _flows(40, value_size=300)
    for f in flows:
        view.on_flow(f)
        assert view._pending_bytes <= 4096
    size = len(flows[0].request) + len(flows[0].response)
    assert len(view._pending) == 4096 // size
    # the oldest were rendered, in order, and nothing was lost
    assert [r["id"] for r, _ in view.rows] == [str(f.id) for f in flows]


def test_large_flows_are_rendered_on_arrival_and_keep_their_place(monkeypatch):
    """A flow of RENDER_AT_ONCE bytes or more waits as its row (its frames let go at
    once), among small flows that wait unrendered; the rows come out in flow order
    and only small flows count toward the byte budget."""
    import kinspect.tui as tui

    small, large = _flows(6), _flows(3, value_size=2000)
    monkeypatch.setattr(tui, "RENDER_AT_ONCE", len(large[0].request) + len(large[0].response))
    console = Console(file=io.StringIO(), width=200, height=30, force_terminal=False)
    view = LiveView(object(), console=console, keep=50)
    order = [small[0], large[0], small[1], small[2], large[1], small[3], large[2], small[4],
             small[5]]
    for f in order:
        view.on_flow(f)
    assert [type(x) is tuple for x in view._pending] == [f in large for f in order]
    assert view._pending_bytes == sum(len(f.request) + len(f.response) for f in small)
    assert [(r["id"], r["req_bytes"]) for r, _ in view.rows] == [
        (str(f.id), str(len(f.request))) for f in order]
    assert not view._pending and view._pending_bytes == 0


def test_a_flow_that_cannot_be_rendered_is_logged_and_the_view_goes_on(monkeypatch, caplog):
    import kinspect.tui as tui

    flows = _flows(6)
    real = tui.flow_row

    def flaky(flow, *a, **kw):
        if flow is flows[2]:
            raise ValueError("bad row")
        return real(flow, *a, **kw)

    monkeypatch.setattr(tui, "flow_row", flaky)
    console = Console(file=io.StringIO(), width=200, height=14, force_terminal=False)
    view = LiveView(object(), console=console, keep=50)
    for f in flows:
        view.on_flow(f)
    with caplog.at_level("ERROR", logger="kinspect.tui"):
        view.table(10)
    assert "cannot render flow" in caplog.text
    assert [r["id"] for r, _ in view.rows] == [str(f.id) for f in flows if f is not flows[2]]


def test_table_lines_are_cropped_to_the_console_and_styled_per_row():
    """The table is drawn as one styled segment per line: no line is wider than the
    console (however long a cell), the header is bold, and a row's style (yellow
    for an undecoded flow) covers that row only."""
    from rich.segment import Segment

    flows = _flows(5, value_size=300)
    flows[2].flags.add("undecoded")
    console = Console(file=io.StringIO(), width=40, height=20, force_terminal=True,
                      color_system="standard")
    view = LiveView(object(), console=console, keep=50)
    for f in flows:
        view.on_flow(f)
    table = view.table(10)
    for (text, _), f in zip(table.lines[1:], flows, strict=True):
        assert text.split()[0] == str(f.id)
    segments = list(console.render(table))
    assert segments[-1] == Segment.line()  # ends its last line, as a Text would
    lines = list(Segment.split_lines(segments))
    assert len(lines) == 6  # the header and five rows
    for line in lines:
        assert Segment.get_line_length(line) <= 40
    styles = [[s.style for s in line if s.text] for line in lines]
    assert styles[0] and all(st is not None and st.bold for st in styles[0])
    assert styles[3] and all(st is not None and st.color.name == "yellow" for st in styles[3])
    assert all(st is None for i in (1, 2, 4, 5) for st in styles[i])
    # narrower than its content: each line is cut at the console's width, not wrapped
    wide = Console(file=io.StringIO(), width=12, height=20, force_terminal=True)
    shown = list(Segment.split_lines(wide.render(table)))
    assert len(shown) == 6 and all(Segment.get_line_length(x) == 12 for x in shown)


def test_names_from_the_wire_reach_the_screen_escaped():
    """A client id or topic name with control characters (ESC, BEL, tab, CR...) or
    a bidirectional override is shown with escapes, in the live view, the line
    printer and `kinspect show`'s rows alike: nothing from the wire moves the
    cursor or starts an escape sequence."""
    from kinspect.show import flow_row

    flows = _flows(2)
    bad = "c\x1b[2J\x07\t\r\u202eid"
    flows[1].client_id = bad
    row = flow_row(flows[1])
    assert row["client_id"] == "c\\x1b[2J\\x07\\x09\\x0d\\u202eid"
    assert flow_row(flows[0])["client_id"] == flows[0].client_id  # printable: as it is
    console = Console(file=io.StringIO(), width=200, height=20, force_terminal=True)
    view = LiveView(object(), console=console, keep=10)
    for f in flows:
        view.on_flow(f)
    console.print(view.table(5))
    screen = console.file.getvalue()
    assert "\\x1b[2J" in screen and "\x07" not in screen and "\x1b[2J" not in screen
    out = io.StringIO()
    LinePrinter(out).on_flow(flows[1])
    assert "client=c\\x1b[2J\\x07" in out.getvalue() and "\x1b" not in out.getvalue()
    # a topic name, in the records column
    from kafka.record.memory_records import MemoryRecordsBuilder
    from proxyutil import codec, request_bytes

    from kinspect.flows import Flow
    from kinspect.proxy.pipeline import decode_flow

    c = codec()
    td = c.request_codec(0).spec.struct.field("TopicData").struct
    pd = td.field("PartitionData").struct
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    b.append(timestamp=1, key=None, value=b"v", headers=[])
    b.close()
    req = request_bytes(0, 9, 5, Acks=1, TimeoutMs=1000, TopicData=[td.cls(
        Name="t\x1b]0;owned\x07", PartitionData=[pd.cls(Index=0, Records=bytes(b.buffer()))])])
    produce = Flow(9, 1, "127.0.0.1:1", "127.0.0.1:2", 0, 9, 5, "Produce", req, 1)
    decode_flow(c, produce)
    assert produce.request_decoded is not None
    records = flow_row(produce)["records"]
    assert records.startswith("t\\x1b]0;owned\\x07[0] 1 rec") and "\x1b" not in records


def test_a_narrow_live_view_keeps_the_api_column_readable():
    """Too narrow for every column, the live view shrinks the secondary columns
    (records, client id, flags, error) before the api column: a 70-column terminal
    still tells a Produce from a Fetch."""
    flows = _flows(3, value_size=10)
    for f in flows:
        f.client_id = "a-rather-long-client-id"
        f.flags.add("rewritten")
    console = Console(file=io.StringIO(), width=70, height=20, force_terminal=True)
    view = LiveView(object(), console=console, keep=10)
    for f in flows:
        view.on_flow(f)
    table = view.table(10)
    assert all(len(text) <= 70 for text, _ in table.lines)
    for (text, _), f in zip(table.lines[1:], flows, strict=True):
        assert f"{f.api_name} v{f.api_version}" in text, text


def test_line_printer_shows_no_error_code_for_a_flow_without_response():
    """A request that got no response (its connection closed first) has no error
    code: the line says ``err=-``, not ``err=0`` (an answer without error), and its
    missing sizes and latency are ``-``, not ``-B`` / ``-ms``."""
    from proxyutil import codec, request_bytes

    from kinspect.proxy.tracker import FlowTracker

    t = FlowTracker(codec(), 1, "127.0.0.1:1", "127.0.0.1:2", lambda: 1)
    t.request(request_bytes(18, 3, 7, ClientSoftwareName="x", ClientSoftwareVersion="1"), 0)
    out = io.StringIO()
    printer = LinePrinter(out)
    for flow in t.close():
        printer.on_flow(flow)
    line = out.getvalue().strip()
    assert "closed" in line, line
    fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
    assert fields["err"] == "-" and fields["resp"] == "-" and fields["latency"] == "-", line
    answered = _flows(1)[0]
    out = io.StringIO()
    LinePrinter(out).on_flow(answered)
    fields = dict(w.split("=", 1) for w in out.getvalue().split() if "=" in w)
    assert fields["err"] == "0" and fields["resp"].endswith("B") and fields["resp"] != "-B"


def test_line_printer_shows_no_error_code_for_a_response_not_decoded():
    """``--no-decode`` (or decoding skipped): the response's error code is unknown,
    so the line says ``err=-``, not ``err=0``; once decoded, the broker's code."""
    from proxyutil import codec, request_bytes
    from test_tracker import response_bytes

    from kinspect.proxy.pipeline import decode_flow
    from kinspect.proxy.tracker import FlowTracker

    t = FlowTracker(codec(), 1, "127.0.0.1:1", "127.0.0.1:2", lambda: 1)
    t.request(request_bytes(18, 3, 7, ClientSoftwareName="x", ClientSoftwareVersion="1"), 0)
    flow = t.response(response_bytes(18, 3, 7, ErrorCode=35), 1)

    def err() -> str:
        out = io.StringIO()
        LinePrinter(out).on_flow(flow)
        return dict(w.split("=", 1) for w in out.getvalue().split() if "=" in w)["err"]

    assert err() == "-"
    decode_flow(codec(), flow)
    assert err() == "35"


def _unstarted_proxy():
    """A real proxy object, not listening (the view reads its config and stats)."""
    from proxyutil import codec

    from kinspect.proxy.server import Proxy, ProxyConfig

    return Proxy(ProxyConfig(upstream=("127.0.0.1", 9092)), codec())


def test_a_header_wrapped_on_a_narrow_terminal_leaves_the_newest_row_on_screen():
    """On a 40-column terminal the header wraps over several lines; the table gets
    the lines left, so the screen (rich's Live crops at its height) still ends with
    the newest flow."""
    from rich.segment import Segment

    flows = _flows(40)
    height = 20
    console = Console(file=io.StringIO(), width=40, height=height, force_terminal=False)
    view = LiveView(_unstarted_proxy(), console=console, keep=100)
    for f in flows:
        view.on_flow(f)
    lines = console.render_lines(view, console.options, pad=False)
    assert len(view.header().wrap(console, 40)) > 1  # (what this test is about)
    # Live keeps the last line for the cursor
    assert len(lines) <= height - 1, [Segment.get_line_length(x) for x in lines]
    assert "".join(s.text for s in lines[-1]).split()[0] == str(flows[-1].id)


def test_the_view_and_the_line_printer_write_to_a_terminal_that_is_not_utf8():
    """With a non-UTF-8 terminal (``PYTHONIOENCODING=ascii``) the live view's redraws
    and the line printer's lines are written, with what the encoding cannot show
    escaped: a redraw that raised ``UnicodeEncodeError`` ended the live view with the
    cursor hidden, and the line printer lost the flow."""
    flows = _flows(3)
    flows[1].client_id = "日本語-client"
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii", write_through=True)
    console = Console(file=out, width=200, height=20, force_terminal=True)
    view = LiveView(_unstarted_proxy(), console=console, keep=10)
    for f in flows:
        view.on_flow(f)
    console.print(view)
    screen = raw.getvalue().decode("ascii")
    assert "\\u65e5\\u672c\\u8a9e" in screen and "->" in screen
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii", write_through=True)
    LinePrinter(out).on_flow(flows[1])
    assert "client=\\u65e5\\u672c\\u8a9e-client" in raw.getvalue().decode("ascii")


def test_wide_characters_keep_the_columns_in_line():
    """A client id of CJK characters takes two terminal cells a character: the live
    view's columns are measured in cells, so every line is as wide and the api
    column starts at the same cell in every row."""
    from rich.cells import cell_len

    flows = _flows(3)
    flows[0].client_id = "日本語クライアント"
    flows[2].client_id = "ascii-client"
    for width in (200, 70):  # room for everything; the client id column cropped
        console = Console(file=io.StringIO(), width=width, height=20, force_terminal=True)
        view = LiveView(_unstarted_proxy(), console=console, keep=10)
        for f in flows:
            view.on_flow(f)
        table = view.table(10)
        assert len({cell_len(text) for text, _ in table.lines}) == 1, table.plain
        starts = {cell_len(text[:text.index("ApiVersions")]) for text, _ in table.lines[1:]}
        assert len(starts) == 1, table.plain


def test_the_line_printer_stops_printing_once_its_reader_goes_away(caplog):
    """``kinspect proxy --no-tui | head``: once the pipe's reader has gone, the
    printer logs one warning and prints no more (before, every flow logged a
    BrokenPipeError traceback); the flows keep coming to it without error."""
    import logging

    r, w = os.pipe()
    os.close(r)  # the reader went away
    out = os.fdopen(w, "w", encoding="utf-8")
    printer = LinePrinter(out)
    flows = _flows(3)
    with caplog.at_level(logging.WARNING, logger="kinspect.tui"):
        for flow in flows:
            printer.on_flow(flow)  # no exception
    assert printer.gone
    warned = [r for r in caplog.records if r.name == "kinspect.tui"]
    assert len(warned) == 1 and "went away" in warned[0].getMessage()
    try:
        out.close()
    except BrokenPipeError:  # what the first print left in the buffer
        pass


async def test_a_request_waiting_for_its_response_shows_in_flight_until_answered(tansu, unique):
    """A Fetch the broker holds for its MaxWaitMs (an empty partition, MinBytes 1)
    shows as an in-flight row, with the time waited so far, until its answer comes;
    then as a complete flow."""
    import asyncio

    from proxyutil import codec, request_bytes
    from test_resilience import create_topic

    topic = unique("wait")
    create_topic(tansu.bootstrap, topic)
    body = codec().request_codec(1).cls.from_dict(dict(
        MaxWaitMs=3000, MinBytes=1, MaxBytes=1 << 20, IsolationLevel=0,
        Topics=[dict(Topic=topic, Partitions=[dict(Partition=0, FetchOffset=0,
                                                   PartitionMaxBytes=1 << 20)])]))
    fetch = request_bytes(1, 4, 77, client_id="long-poller",
                          **{k: body.get(k) for k in body.keys()})
    console = Console(file=io.StringIO(), width=200, height=30, force_terminal=False)
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        view = LiveView(proxy, console=console)
        proxy.pipeline.add(view)
        host, port = proxy.address
        reader, writer = await asyncio.open_connection(host, port)
        try:
            sent = time.monotonic()
            writer.write(len(fetch).to_bytes(4, "big") + fetch)

            def in_flight() -> list[str]:
                return [line for line, _ in view.table(24).lines[1:] if " in-flight" in line]

            seen: list[str] = []
            while not seen and time.monotonic() - sent < 2:  # (the broker holds it 3 s)
                await asyncio.sleep(0.05)
                seen = in_flight()
            assert seen, "no in-flight row while the broker held the Fetch"
            (row,) = seen
            cells = row.split()
            assert "long-poller" in cells and "Fetch" in cells and "v4" in cells
            assert "77" in cells  # its correlation id
            assert str(len(fetch)) in cells  # its size, and no response size yet
            waited = next(c for c in cells if c.endswith("+"))
            assert 0 <= int(waited[:-1]) <= (time.monotonic() - sent) * 1000 + 1
            assert "in flight 1" in view.header().plain
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
            await reader.readexactly(size)
            assert time.monotonic() - sent >= 2.5, "the broker did not hold the Fetch"
        finally:
            writer.close()
        await proxy.pipeline.drained()
        assert in_flight() == []
        assert "in flight" not in view.header().plain
        (flow,) = [f for f in rec.flows if f.api_name == "Fetch"]
        row, style = view.rows[-1]
        assert row["id"] == str(flow.id) and row["corr"] == "77" and row["resp_bytes"] == str(size)
        assert row["client_id"] == "long-poller" and "in-flight" not in row["flags"]


def test_key_names_from_xterm_escape_sequences():
    """Sequences as xterm sends them (XTerm Control Sequences: CSI and SS3 cursor
    keys, CSI 5~/6~ for PgUp/PgDn, CSI H/F and 1~/4~ for Home/End); an unknown
    sequence (Ctrl-Up, CSI 1;5A) is skipped whole, a lone ESC is Esc."""
    from kinspect.tui import parse_keys

    assert parse_keys(b"\x1b[A\x1b[B\x1b[C\x1b[D") == ["up", "down", "right", "left"]
    assert parse_keys(b"\x1bOA\x1bOB") == ["up", "down"]
    assert parse_keys(b"\x1b[5~\x1b[6~\x1b[H\x1b[F\x1b[1~\x1b[4~") == \
        ["pgup", "pgdn", "home", "end", "home", "end"]
    assert parse_keys(b"\x1b[1;5Aj\x1b") == ["j", "esc"]
    assert parse_keys(b"\r\n \x7fqG\x00\xff") == ["enter", "enter", "space", "backspace",
                                                   "q", "G"]
    # UTF-8 as a terminal sends it: é is c3 a9, ✓ e2 9c 93, 🙂 f0 9f 99 82 (RFC 3629);
    # a sequence cut short, or a lead byte alone, is skipped
    assert parse_keys(bytes.fromhex("c3a9 e29c93 f09f9982") + b"x") == ["é", "✓", "🙂", "x"]
    assert parse_keys(bytes.fromhex("e29c") + b"y" + bytes.fromhex("c3")) == ["y"]


async def test_rows_of_real_flows_are_selected_and_opened(tansu, unique):
    """Keys select a row (which stops following the newest rows), open its flow
    decoded, go to the next flow, back to the table, and follow the newest again."""
    topic = unique("t")
    console = Console(file=io.StringIO(), width=200, height=40, force_terminal=False)
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        view = LiveView(proxy, console=console, keep=100, interactive=True)
        proxy.pipeline.add(view)
        await roundtrip_async("kafka-python", bootstrap_of(proxy), ["a", "b"],
                              topic=topic, group=unique("g"))
        await proxy.pipeline.drained()

        def screen() -> str:
            console.file = io.StringIO()
            console.print(view)
            return console.file.getvalue()

        screen()  # a redraw renders the rows
        ids = [int(r["id"]) for r, _ in view.rows]
        assert view.selected is None
        view.key("up")  # selects the newest row
        assert view.selected == ids[-1]
        lines = view.table(20).lines
        assert [style for _, style in lines].count("reverse") == 1
        assert next(text for text, style in lines if style == "reverse").split()[0] == str(ids[-1])
        produce = next(f for f in rec.flows if f.api_name == "Produce" and f.id in ids)
        view.key("home")
        for _ in range(ids.index(produce.id)):
            view.key("down")
        assert view.selected == produce.id
        view.key("enter")
        assert view.detail == produce.id
        shown = screen()
        assert f"#{produce.id} Produce v{produce.api_version}" in shown
        assert "request (" in shown and "response (" in shown and "header v" in shown
        assert topic in shown  # the topic, from the decoded body
        assert "Esc back" in shown and "request bytes" not in shown
        view.key("x")  # the frames' bytes too, after the tree: scrolled to the end
        view.key("end")
        shown = screen()
        assert f"request bytes ({len(produce.request)} B" in shown
        assert "00000000  " + produce.request[:8].hex(" ") in shown
        view.key("x")
        assert "request bytes" not in screen()
        view.key("n")  # the next row's flow
        after = ids[ids.index(produce.id) + 1]
        assert view.detail == after and f"#{after} " in screen()
        view.key("esc")  # back to the table, the row still selected
        assert view.detail is None and view.selected == after
        assert f"#{after} selected" in screen()
        view.key("end")  # follow the newest rows again
        assert view.selected is None
        assert view.table(20).lines[-1][0].split()[0] == str(ids[-1])
        assert "reverse" not in [style for _, style in view.table(20).lines]


def test_held_flows_are_kept_without_their_decoded_values_and_decoded_when_needed():
    """An interactive view holds the last flows for their detail and for filters
    typed later, without their decoded values (up to some 40 times the frames:
    a crafted 23 MiB request kept 900 MiB until 500 other flows came): the flow
    opened, a filter on decoded fields, and the pinned flow of a row no longer held
    decode a copy; the flow the other addons got keeps its own decoded values."""
    console = Console(file=io.StringIO(), width=160, height=30, force_terminal=False)
    view = LiveView(_unstarted_proxy(), console=console, keep=4, interactive=True)
    flows = _flows(4, value_size=7, records=3)  # (1 and 3: Produce to topic t)
    for f in flows:
        view.on_flow(f)
        assert f.request_decoded is not None and f.response_decoded is not None
    held = view._held
    assert set(held) == {f.id for f in flows}
    assert all(h.request_decoded is None and h.response_decoded is None for h in held.values())
    assert all(h.request == f.request and h.response == f.response
               for h, f in zip(held.values(), flows))
    view.table(10)
    view.key("home")
    view.key("enter")
    console.print(view)
    assert "ClientSoftwareName" in console.file.getvalue() and "xxxxxxx" in console.file.getvalue()
    view.key("esc")
    # a filter on a decoded field, typed later, decodes the held flows it reads
    view.filter("~topic t")
    assert [r["id"] for r, _ in view.rows] == [str(f.id) for f in (flows[1], flows[3])]
    view.filter("")
    # the selected row's flow, pinned once newer flows pass, is decoded when opened
    view.key("home")
    for f in _flows(6)[4:]:
        view.on_flow(f)
    assert flows[0].id not in held and view._pinned.id == flows[0].id
    view.key("enter")
    console.file = io.StringIO()
    console.print(view)
    assert "xxxxxxx" in console.file.getvalue(), console.file.getvalue()


def test_an_open_flow_stays_open_while_newer_ones_pass_and_one_not_held_says_so():
    """The open flow (as the selected row's) is kept while it is open, however many
    newer flows the view lets go meanwhile; back at the table, its row gone, the
    oldest row is selected. A row whose flow was not held (past ``hold_bytes``) says
    so when opened."""
    console = Console(file=io.StringIO(), width=160, height=30, force_terminal=False)
    view = LiveView(_unstarted_proxy(), console=console, keep=3, interactive=True)
    flows = _flows(10)
    for f in flows[:3]:
        view.on_flow(f)
    view.table(10)
    view.key("home")
    view.key("enter")
    assert view.detail == flows[0].id
    console.print(view)
    assert "ApiVersions v3" in console.file.getvalue()
    for f in flows[3:]:  # seven newer flows: the held ones are the last three
        view.on_flow(f)
    view.table(10)
    assert set(view._held) == {f.id for f in flows[-3:]}
    view.key("down")
    view._detail_lines = None  # as after a resize: drawn again, from the pinned flow
    console.file = io.StringIO()
    console.print(view)
    assert f"#{flows[0].id} ApiVersions v3" in console.file.getvalue()
    view.key("esc")  # its row is gone: the oldest row is selected instead
    assert view.detail is None and view.selected == flows[-3].id
    assert view._pinned is not None and view._pinned.id == flows[-3].id

    tiny = LiveView(_unstarted_proxy(), console=console, keep=3, interactive=True,
                    hold_bytes=1)  # (no flow fits: rows, but no flows behind them)
    for f in flows[:3]:
        tiny.on_flow(f)
    tiny.table(10)
    tiny.key("enter")
    console.file = io.StringIO()
    console.print(tiny)
    assert f"flow #{flows[2].id} is not held any more" in console.file.getvalue()


def test_a_capture_browsed_without_its_decoded_values_shows_what_it_would_with():
    """``show --browse`` lets each flow's decoded values go once its error code and
    flags are known (a large capture held decoded takes several times its size):
    rows, filters on decoded fields and the open flow decode a copy when they need
    one. What they show is what a view of the flows held decoded shows, and the
    flows are left without decoded values."""
    from kinspect.capture import load_capture
    from kinspect.codec import Codec
    from kinspect.proxy.pipeline import decode_flow

    codec = Codec()
    decoded = load_capture(EXAMPLE, codec).flows
    bare = load_capture(EXAMPLE, codec, decode=False).flows
    cut = bare[1].copy()  # an answer that does not decode: flagged, its error once
    cut.id, cut.response = 999, cut.response[:-3]
    for f in bare + [cut]:  # (as show does: Metadata kept, for topic ids)
        decode_flow(codec, f)
        if f.api_name != "Metadata":
            f.request_decoded = f.response_decoded = None
    assert "undecoded" in cut.flags and cut.error.count("response:") == 1
    fetch = next(f for f in decoded if f.api_name == "Fetch")

    def view_of(flows, on_demand):
        console = Console(file=io.StringIO(), width=200, height=200, force_terminal=False)
        view = LiveView(None, console=console, keep=len(flows), interactive=True,
                        hold_bytes=None, codec=codec, decode_on_demand=on_demand)
        for f in flows:
            view.on_flow(f)
        return view

    def rows(view):
        return [dict(r) for r, _ in view.rows]

    want, got = view_of(decoded, False), view_of(bare, True)
    assert rows(got) == rows(want) and any(r["records"] for r in rows(got))
    for text in ("~topic example", "~err", "~api Fetch & ~topic example"):
        want.filter(text)
        got.filter(text)
        assert rows(got) == rows(want) and rows(got), text
    for view in (want, got):
        view.filter("~api Fetch")
        view.key("home")
        view.key("enter")
        assert view.detail == fetch.id
        view.console.file = io.StringIO()
        view.console.print(view)
    shown = got.console.file.getvalue()
    assert shown == want.console.file.getvalue() and "value 'plain-2'" in shown
    assert not [f for f in bare if f.api_name != "Metadata"
                and (f.request_decoded or f.response_decoded)]
    view = view_of([cut], True)  # (rows and filters decode copies: the flow is left as it is)
    for _ in range(3):
        view.filter("~err | ~api Metadata")
        view.rows
    assert cut.error.count("response:") == 1 and cut.response_decoded is None


def test_a_view_that_is_not_interactive_ignores_keys_and_holds_no_flow():
    view = LiveView(_unstarted_proxy(), console=Console(file=io.StringIO()), keep=5)
    for f in _flows(4):
        view.on_flow(f)
    view.table(10)
    view.key("up")
    view.key("enter")
    assert view.selected is None and view.detail is None and not view._held


#: run the command in sys.argv[1:] at a terminal (stdin) as a shell runs it: this
#: process leads a session with the terminal as its controlling terminal, and the
#: command runs in a process group of its own, in the terminal's foreground, or with
#: "--background" first in the arguments, in the background (``command &``: this
#: process's group stays in the foreground). SIGUSR1 puts the command in the
#: background (as Ctrl-Z and ``bg`` do, without the stop), SIGUSR2 in the foreground
#: (``fg``). Signals INT, TERM, HUP and QUIT are passed on to the command. Exit status: the
#: command's, or 99 if it was stopped (SIGTTOU or SIGTTIN; it is then killed).
_AT_A_TERMINAL = """
import fcntl, os, signal, sys, termios
background = sys.argv[1] == "--background"
argv = sys.argv[2 if background else 1:]
os.setsid()
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # (to hand the foreground around)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    if not background:
        os.tcsetpgrp(0, os.getpgrp())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    os.execv(sys.executable, [sys.executable] + argv)
os.setpgid(pid, pid)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(sig, lambda s, _: os.kill(pid, s))
signal.signal(signal.SIGUSR1, lambda *_: os.tcsetpgrp(0, os.getpgrp()))
signal.signal(signal.SIGUSR2, lambda *_: os.tcsetpgrp(0, pid))
_, status = os.waitpid(pid, os.WUNTRACED)
if os.WIFSTOPPED(status):
    os.kill(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGCONT)
    os.waitpid(pid, 0)
    os._exit(99)
os._exit(os.waitstatus_to_exitcode(status))
"""


class Terminal:
    """A pty of 40 x 180 cells running ``python -m kinspect ARGS`` (see
    :data:`_AT_A_TERMINAL`); what it writes is read as it comes (a full pty would
    stop its writer) and kept. :meth:`close` stops it (Ctrl-C) and returns its exit
    status."""

    def __init__(self, *args: str, background: bool = False):
        import fcntl
        import pty
        import struct
        import subprocess
        import sys
        import termios
        import threading

        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 180, 0, 0))
        self.before = termios.tcgetattr(self.slave)
        self.out = bytearray()
        self._lock = threading.Lock()
        env = dict(os.environ, TERM="xterm-256color")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _AT_A_TERMINAL] + (["--background"] if background else [])
            + ["-m", "kinspect", *args],
            stdin=self.slave, stdout=self.slave, stderr=self.slave, env=env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 1 << 16)
            except OSError:  # closed (EIO once every writer is gone, EBADF after close)
                return
            if not data:
                return
            with self._lock:
                self.out.extend(data)

    def clear(self) -> None:
        """Forget what was written so far."""
        with self._lock:
            del self.out[:]

    def mode(self) -> list:
        import termios

        return termios.tcgetattr(self.slave)

    def set_mode(self, mode: list) -> None:
        """Set the terminal's mode, as the foreground program (a shell) would."""
        import termios

        termios.tcsetattr(self.slave, termios.TCSANOW, mode)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def screen(self) -> str:
        with self._lock:
            text = self.out.decode("utf-8", "replace")
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)

    def read_until(self, pattern: str, timeout: float = 30) -> str:
        """The screen once ``pattern`` (a regular expression) is on it."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if re.search(pattern, text):
                return text
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"{pattern!r} not on the screen (rc {self.proc.poll()}"
                                     f"; 99: stopped); the screen ends: {text[-2000:]}")
            time.sleep(0.05)

    def wait_for_mode(self, cbreak: bool, timeout: float = 10) -> None:
        """Wait until the terminal is in cbreak mode (no echo, no line editing), or
        is not."""
        import termios

        deadline = time.monotonic() + timeout
        while bool(self.mode()[3] & (termios.ECHO | termios.ICANON)) == cbreak:
            if time.monotonic() > deadline:
                raise AssertionError(f"the terminal is {'not ' if cbreak else ''}in cbreak "
                                     f"mode after {timeout} s")
            time.sleep(0.05)

    def close(self) -> int:
        """Ctrl-C (if still running), wait for the exit (failing after 30 s), and
        close the pty; the exit status. ``after`` holds the terminal's mode then."""
        import signal
        import subprocess

        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("kinspect did not stop on Ctrl-C") from None
        finally:
            self.after = self.mode()
            os.close(self.slave)
            os.close(self.master)
            self._reader.join(5)


def test_keys_at_a_terminal_open_a_flow_of_a_real_client_and_the_terminal_is_restored(
        tansu, unique):
    """``kinspect proxy`` on a terminal (a pty) with a real client's flows: the
    arrow keys and Enter open a flow decoded; the terminal is in cbreak mode (no
    echo) while it runs, and as it was after Ctrl-C."""
    import termios

    from clients import roundtrip

    from kinspect.brokers import free_port

    port = free_port()
    term = Terminal("proxy", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}")
    assert term.before[3] & termios.ECHO and term.before[3] & termios.ICANON
    try:
        term.read_until(rf"127\.0\.0\.1:{port} ")  # the view's header
        during = term.mode()
        assert not during[3] & termios.ECHO and not during[3] & termios.ICANON
        roundtrip("kafka-python", f"127.0.0.1:{port}", ["x"], topic=unique("keys"),
                  group=unique("g"))
        term.read_until(r"Fetch v\d+")
        term.clear()
        term.type(b"\x1b[A")  # select the newest row
        term.read_until(r"#\d+ selected", 10)
        term.type(b"\r")  # open it
        text = term.read_until(r"Esc back", 10)
        assert re.search(r"header v\d", text) and "body v" in text, text[-2000:]
        term.type(b"\x1b")  # back to the table
        term.read_until(r"#\d+ selected: Enter opens", 10)
    finally:
        rc = term.close()
    assert rc == 0
    assert term.after == term.before, "the terminal was not restored"


def test_a_view_in_the_background_of_its_terminal_leaves_the_terminal_alone(tansu):
    """``kinspect proxy &``: changing the terminal's mode, or reading it, from the
    background would stop the process (SIGTTOU, SIGTTIN); the view reads no keys
    there, and the proxy goes on serving."""
    from proxyutil import exchange_sync, request_bytes

    from kinspect.brokers import free_port

    port = free_port()
    term = Terminal("proxy", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{port}",
                    background=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                [resp] = exchange_sync("127.0.0.1", port, [request_bytes(18, 3, 9)])
                break
            except OSError:
                if time.monotonic() > deadline or term.proc.poll() is not None:
                    raise AssertionError(f"the proxy did not serve (rc {term.proc.poll()}; "
                                         "99: it was stopped, SIGTTOU or SIGTTIN)")
                time.sleep(0.1)
        assert resp[:4] == (9).to_bytes(4, "big")  # its correlation id
        term.read_until(rf"127\.0\.0\.1:{port} .*Ctrl-C quits")  # the view's header
        assert "Enter opens" not in term.screen()  # (no keys: no key hints)
        term.type(b"\x1b[A\r")  # keys for the foreground, not for the view
        time.sleep(0.5)
        assert term.proc.poll() != 99, "the proxy was stopped (SIGTTOU or SIGTTIN)"
        assert term.mode() == term.before, "the terminal's mode was changed"
        [resp] = exchange_sync("127.0.0.1", port, [request_bytes(18, 3, 10)])
        assert resp[:4] == (10).to_bytes(4, "big")
    finally:
        rc = term.close()
    assert rc == 0
    assert term.after == term.before


def test_a_capture_is_browsed_with_the_keys_at_a_terminal():
    """``kinspect show CAPTURE --browse``: the first flow selected, Enter opens it,
    n the next one, Esc back, q quits; the terminal as it was."""
    from kinspect.capture import load_capture

    flows = load_capture(EXAMPLE).flows
    first, second = flows[0], flows[1]
    term = Terminal("show", EXAMPLE, "--browse")
    try:
        term.read_until(rf"#{first.id} selected")
        term.read_until(r"q quits")
        term.clear()
        term.type(b"\r")
        text = term.read_until(r"Esc back", 10)
        assert f"#{first.id} {first.api_name} v{first.api_version}" in text
        assert re.search(r"header v\d", text) and f"ClientId: '{first.client_id}'" in text
        term.clear()
        term.type(b"n")
        term.read_until(rf"#{second.id} {second.api_name} v{second.api_version}", 10)
        term.type(b"\x1b")
        term.read_until(rf"#{second.id} selected", 10)
        metadata = sum(f.api_name == "Metadata" for f in flows)
        term.type(b"f~api Metadata\r")  # a filter, typed
        term.read_until(rf"{metadata} of {len(flows)} flows   filter ~api Metadata", 10)
        term.type(b"q")
        rc = term.proc.wait(30)
    finally:
        if term.proc.poll() is None:
            term.close()
            raise AssertionError("q did not quit")
        term.close()
    assert rc == 0
    assert term.after == term.before, "the terminal was not restored"


def test_browse_needs_a_terminal():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "kinspect", "show", EXAMPLE, "--browse"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert proc.returncode == 2
    assert "--browse: needs a terminal" in proc.stderr


async def test_a_filter_typed_in_the_view_chooses_among_the_flows_it_holds(tansu, unique):
    """``f`` types a filter: Enter shows only the flows it selects, among those the
    view holds whatever the filter before (so a wider filter brings rows back), and
    the flows to come; a bad one is shown with its error, the filter unchanged."""
    from kinspect.filters import FilterError

    console = Console(file=io.StringIO(), width=200, height=40, force_terminal=False)
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        view = LiveView(proxy, console=console, keep=100, interactive=True)
        proxy.pipeline.add(view)
        await roundtrip_async("kafka-python", bootstrap_of(proxy), ["a", "b"],
                              topic=unique("t"), group=unique("g"))
        await proxy.pipeline.drained()
        every = [str(f.id) for f in rec.flows][-100:]
        produce = [str(f.id) for f in rec.flows if f.api_name == "Produce"]
        assert produce and len(produce) < len(every)

        def shown() -> list[str]:
            return [r["id"] for r, _ in view.rows]

        assert shown() == every
        for name in ["f", *"~api", "space", *"Produce"]:
            view.key(name)
        assert view.prompt == "~api Produce"
        console.file = io.StringIO()
        console.print(view)
        assert "filter: ~api Produce_" in console.file.getvalue()
        view.key("enter")
        assert view.prompt is None and shown() == produce
        assert "filter ~api Produce" in view.header().plain
        view.filter("")  # every flow again, from those held
        assert shown() == every and view.match is None
        for name in ["f", *"~api", "space", *"Nope", "enter"]:
            view.key(name)
        assert view.prompt == "~api Nope" and "Nope" in view.prompt_error
        console.file = io.StringIO()
        console.print(view)
        shown_lines = console.file.getvalue().splitlines()
        typed = next(i for i, line in enumerate(shown_lines) if "filter: ~api Nope" in line)
        # one line under the prompt, its caret under the api name, no escaped newline
        assert shown_lines[typed + 1].index("^") == shown_lines[typed].index("Nope")
        assert "no api is named" in shown_lines[typed + 1] and "\\x0a" not in view.prompt_error
        assert view.match is None and shown() == every
        view.key("esc")
        assert view.prompt is None and view.prompt_error is None
        for name in ["f", *"~client", "space", *'"ü"', "enter"]:  # (typed, not ASCII)
            view.key(name)
        assert view.match.text == '~client "ü"' and shown() == []
        view.filter("")
        with pytest.raises(FilterError):
            view.filter("~api (")
        view.filter("~api Fetch | ~api Produce")
        # flows to come are filtered too
        await roundtrip_async("kafka-python", bootstrap_of(proxy), ["c"],
                              topic=unique("t"), group=unique("g"))
        await proxy.pipeline.drained()
    wanted = [str(f.id) for f in rec.flows if f.api_name in ("Fetch", "Produce")][-100:]
    assert shown() == wanted


def test_browse_starts_with_the_filter_and_errors_given():
    from kinspect.capture import load_capture
    from kinspect.filters import parse as parse_filter

    flows = load_capture(EXAMPLE).flows
    # (the filter language is tested on its own: here, that browse starts with both)
    want = parse_filter("(~api Produce | ~api Metadata) & (~err)")
    n = sum(want.matches(f) for f in flows)
    term = Terminal("show", EXAMPLE, "--browse", "--filter", "~api Produce | ~api Metadata",
                    "--errors")
    try:
        term.read_until(rf"{n} of {len(flows)} flows   filter \(~api Produce \| ~api "
                        rf"Metadata\) & \(~err\)")
        term.type(b"q")
        assert term.proc.wait(30) == 0
    finally:
        term.close()


def test_a_view_sent_to_the_background_and_back_leaves_the_terminal_to_the_front():
    """``kinspect show --browse`` put in the background (as Ctrl-Z and ``bg`` do)
    leaves the terminal's mode to the foreground program, and does not set it back
    on exit from there; back in the foreground (``fg``, after which a shell has put
    the terminal in line mode), it reads keys in cbreak mode again."""
    import signal
    import termios

    from kinspect.capture import load_capture

    flows = load_capture(EXAMPLE).flows
    term = Terminal("show", EXAMPLE, "--browse")
    # the foreground program's own mode: no echo, line editing (neither the mode the
    # terminal had, nor cbreak)
    theirs = term.mode()
    theirs[3] &= ~termios.ECHO
    try:
        term.read_until(rf"#{flows[0].id} selected")
        term.wait_for_mode(cbreak=True)
        term.proc.send_signal(signal.SIGUSR1)  # to the background
        time.sleep(0.3)
        term.set_mode(theirs)
        time.sleep(1.5)  # three looks of the key reader at the foreground
        assert term.mode() == theirs, "a view in the background changed the mode"
        assert term.proc.poll() is None, "stopped in the background"
        term.proc.send_signal(signal.SIGUSR2)  # back to the foreground, in line mode
        term.set_mode(term.before)
        term.wait_for_mode(cbreak=True)
        term.clear()
        term.type(b"j")  # a key, without Enter
        term.read_until(rf"#{flows[1].id} selected", 10)
        term.proc.send_signal(signal.SIGUSR1)  # to the background again, and stopped
        time.sleep(0.3)
        term.set_mode(theirs)
    finally:
        rc = term.close()
    assert rc == 0
    assert term.after == theirs, "the view set its mode over the foreground program's"


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGQUIT"])
def test_browse_ended_by_a_signal_puts_the_terminal_back(sig):
    """SIGTERM, SIGHUP and SIGQUIT (Ctrl-\\) end ``show --browse`` as q does: with
    the terminal's mode put back (a signal's default action would leave it in
    cbreak mode; SIGQUIT's would also dump core)."""
    import signal

    term = Terminal("show", EXAMPLE, "--browse")
    try:
        term.read_until(r"q quits")
        term.wait_for_mode(cbreak=True)
        term.proc.send_signal(getattr(signal, sig))
        rc = term.proc.wait(30)
    finally:
        term.close()
    assert rc == 0
    assert term.after == term.before, "the terminal was not put back"


def test_a_view_holding_a_whole_capture_renders_only_the_rows_it_shows(monkeypatch):
    """``show --browse`` holds every flow of the capture: a row is rendered when a
    redraw shows it, not before (a capture of 200,000 flows took 7.5 s to open when
    every row was rendered first)."""
    import kinspect.tui as tui

    rendered = []
    real = tui.flow_row
    monkeypatch.setattr(tui, "flow_row",
                        lambda f, *a, **k: rendered.append(f.id) or real(f, *a, **k))
    flows = _flows(300)
    view = LiveView(None, console=Console(file=io.StringIO(), width=160, height=30), keep=300,
                    interactive=True, hold_bytes=None)
    for f in flows:
        view.on_flow(f)
    view.key("home")
    lines = view.table(10)
    assert [line.split()[0] for line, _ in lines.lines[1:]] == [str(f.id) for f in flows[:10]]
    assert sorted(set(rendered)) == [f.id for f in flows[:10]]
    view.key("end")  # the newest ten
    view.table(10)
    assert sorted(set(rendered)) == [f.id for f in flows[:10] + flows[-10:]]


def _gate_filters(view, flow_id: int, monkeypatch):
    """Make a filter applied in ``view`` stop at flow ``flow_id`` until the returned
    ``gate`` is set (while it is clear); ``reached`` is set when one stops there."""
    import threading

    gate, reached = threading.Event(), threading.Event()
    real = view._matches_with

    def slow(match, flow):
        if flow.id == flow_id and not gate.is_set():
            reached.set()
            assert gate.wait(30), "the test never opened the gate"
        return real(match, flow)

    monkeypatch.setattr(view, "_matches_with", slow)
    return gate, reached


def test_a_long_filter_runs_in_the_background_shows_its_progress_and_stops_on_esc(
        monkeypatch):
    """In a view holding more than ``FILTER_IN_BACKGROUND`` flows, a filter typed
    there is applied on a thread of its own: the view keeps the rows of the filter
    before (and its keys) until the filter is done, the header says how far it
    got, Esc stops it (the filter before stays), and a flow that comes meanwhile is
    filtered too."""
    import threading

    import kinspect.tui as tui
    from kinspect.flows import Flow

    monkeypatch.setattr(tui, "FILTER_IN_BACKGROUND", 100)
    flows = []
    for i in range(600):
        name, key = ("Produce", 0) if i % 3 == 0 else ("ApiVersions", 18)
        f = Flow(i + 1, 1, "127.0.0.1:1", "127.0.0.1:2", key, 3, i, name, b"q", i)
        f.response = b"r"
        flows.append(f)
    view = LiveView(None, console=Console(file=io.StringIO(), width=160, height=30),
                    keep=1000, interactive=True, hold_bytes=None)
    for f in flows:
        view.on_flow(f)
    every = [str(f.id) for f in flows]

    def shown() -> list[str]:
        return [r["id"] for r, _ in view.rows]

    gate, reached = _gate_filters(view, 301, monkeypatch)
    for name in ["f", *"~api", "space", *"Produce", "enter"]:
        view.key(name)  # Enter returns at once: the filter runs on its own thread
    job = view.filtering
    assert job is not None and reached.wait(10)
    assert view.prompt is None and view.match is None and shown() == every
    assert "filtering ~api Produce: 42 % (Esc stops)" in view.header().plain
    view.key("down")  # keys still work meanwhile
    view.key("esc")  # stops the filter: the one before stays
    assert view.filtering is None and "filtering" not in view.header().plain
    gate.set()
    assert job.wait(10)
    assert view.match is None and shown() == every

    gate.clear()
    reached.clear()
    job = view.filter_in_background("~api Produce")
    assert reached.wait(10)
    view.key("f")  # a filter typed meanwhile starts from the one being applied
    assert view.prompt == "~api Produce"
    view.key("esc")
    assert view.prompt is None and view.filtering is job
    late = Flow(601, 1, "127.0.0.1:1", "127.0.0.1:2", 0, 3, 600, "Produce", b"q", 600)
    late.response = b"r"
    view.on_flow(late)  # comes while the filter runs
    gate.set()
    assert job.wait(10) and view.filtering is None
    assert view.match.text == "~api Produce"
    assert shown() == [str(f.id) for f in flows + [late] if f.api_name == "Produce"]
    # a new filter stops the one under way; only the new one is applied
    gate.clear()
    reached.clear()
    first = view.filter_in_background("~api ApiVersions")
    assert reached.wait(10)
    threading.Timer(0.2, gate.set).start()
    second = view.filter_in_background("")
    assert first.stopped and second.wait(10)
    assert view.match is None and len(shown()) == 601
    view.close()


def test_a_browsed_capture_names_the_topics_of_fetches_by_topic_id():
    """Fetch v13+ names its topics by id only. Browsing a capture (flows held
    without their decoded values, the topic ids learnt from the Metadata that
    ``show --browse`` decodes first handed to the view) shows the name in the Fetch
    row, and ``~topic NAME`` typed there selects the Fetch. (The Metadata is left
    out of the flows browsed: the names come from the ids handed over.)"""
    import itertools

    from proxyutil import codec, request_bytes
    from test_resilience import record_batch
    from test_tracker import response_bytes

    from kinspect.filters import TopicIds
    from kinspect.proxy.pipeline import decode_flow
    from kinspect.proxy.tracker import FlowTracker

    c = codec()
    tid = bytes(range(1, 17))
    md = c.response_codec(3).cls
    md_topic = md._spec.field("Topics").struct.cls
    fetch_req = c.request_codec(1).cls
    req_topic = fetch_req._spec.field("Topics").struct.cls
    req_part = req_topic._spec.field("Partitions").struct.cls
    fetch_resp = c.response_codec(1).cls
    resp_topic = fetch_resp._spec.field("Responses").struct.cls
    resp_part = resp_topic._spec.field("Partitions").struct.cls
    ids = itertools.count(1)
    t = FlowTracker(c, 1, "127.0.0.1:1", "127.0.0.1:2", lambda: next(ids))
    t.request(request_bytes(3, 12, 1, Topics=None), 1)
    meta = t.response(response_bytes(3, 12, 1, Topics=[
        md_topic(Name="orders", TopicId=tid, ErrorCode=0, Partitions=[])]), 2)
    t.request(request_bytes(1, 13, 2, Topics=[req_topic(TopicId=tid, Partitions=[
        req_part(Partition=0, FetchOffset=0, PartitionMaxBytes=1 << 20)])]), 3)
    fetch = t.response(response_bytes(1, 13, 2, Responses=[resp_topic(TopicId=tid, Partitions=[
        resp_part(PartitionIndex=0, HighWatermark=1, Records=record_batch([b"v"]))])]), 4)
    t.request(request_bytes(18, 3, 3, ClientSoftwareName="x", ClientSoftwareVersion="1"), 5)
    other = t.response(response_bytes(18, 3, 3), 6)
    decode_flow(c, meta)  # show decodes Metadata first, and keeps it decoded
    topic_ids = TopicIds().learn_all([meta])
    for f in (fetch, other):  # the others are held bare (decode_on_demand)
        decode_flow(c, f)
        f.request_decoded = f.response_decoded = None
    assert topic_ids.name(tid) == "orders"

    view = LiveView(None, console=Console(file=io.StringIO(), width=200, height=30),
                    keep=10, interactive=True, codec=c, hold_bytes=None,
                    decode_on_demand=True)
    view.topic_ids = topic_ids  # (the Metadata is not among the flows browsed)
    for f in (fetch, other):
        view.on_flow(f)
    rows = {r["id"]: r for r, _ in view.rows}
    assert rows[str(fetch.id)]["records"].startswith("orders[0] 1 rec")
    assert fetch.request_decoded is None  # a copy was decoded for the row
    view.filter("~topic orders")
    assert [r["id"] for r, _ in view.rows] == [str(fetch.id)]
    view.filter("~api Fetch & ~topic nope")
    assert [r["id"] for r, _ in view.rows] == []


def test_a_flow_too_large_to_hold_that_comes_while_a_filter_applies_gets_its_row(monkeypatch):
    """A flow the view does not hold (its frames over ``hold_bytes``) still gets its
    row when the filter applied meanwhile selects it, as when no filter is being
    applied."""
    from kinspect.flows import Flow

    def flow(i: int, name: str, size: int = 1) -> Flow:
        f = Flow(i, 1, "127.0.0.1:1", "127.0.0.1:2", 0 if name == "Produce" else 18, 3, i,
                 name, b"q" * size, i)
        f.response = b"r"
        return f

    view = LiveView(None, console=Console(file=io.StringIO(), width=160, height=30),
                    keep=100, interactive=True, hold_bytes=1000)
    for i in range(1, 51):
        view.on_flow(flow(i, "Produce" if i % 2 else "ApiVersions"))
    gate, reached = _gate_filters(view, 25, monkeypatch)
    job = view.filter_in_background("~api Produce")
    assert reached.wait(10)
    view.on_flow(flow(51, "Produce", size=5000))  # not held: over hold_bytes
    view.on_flow(flow(52, "ApiVersions"))
    view.on_flow(flow(53, "Produce"))
    assert 51 not in view._held
    gate.set()
    assert job.wait(10) and view.match.text == "~api Produce"
    want = [str(i) for i in range(1, 52, 2)] + ["53"]
    assert [r["id"] for r, _ in view.rows] == want
    view.close()


# -- found by an exploratory run of the live view at a terminal (session 29) ---------


def test_fewer_flows_than_the_screen_holds_are_all_shown():
    """With room for more rows than there are flows, every flow is on the screen
    (between half and all of the room, the table showed ever fewer)."""
    console = Console(file=io.StringIO(), width=160, height=40, force_terminal=False)
    view = LiveView(_unstarted_proxy(), console=console, keep=100)
    flows = _flows(15)
    for f in flows:
        view.on_flow(f)
    for rows in (15, 16, 26, 40):
        lines = view.table(rows).lines
        assert [t.split()[0] for t, _ in lines[1:]] == [str(f.id) for f in flows], rows


def test_rows_with_combining_characters_are_cut_by_cells():
    """A line is cut to the terminal's width in cells: a combining accent takes
    none, so a row with some keeps its last cells."""
    from rich.cells import cell_len

    from kinspect.tui import TableLines

    text = "e\u0301" * 10 + "1 rec"  # 15 cells, 25 characters
    console = Console(file=io.StringIO(), width=15, force_terminal=False)
    console.print(TableLines([(text, None), ("x" * 20, None)]))
    first, second = console.file.getvalue().splitlines()
    assert first.endswith("1 rec") and cell_len(first) == 15
    assert second == "x" * 15


def test_a_key_cut_between_two_reads_is_one_key():
    """A terminal's read may end inside a key's escape sequence (a held arrow key
    sends them many to a read): the rest comes with the next read, and the key is
    whole, not an Esc and stray bytes; a lone ESC is Esc once ``ESC_WAIT`` passed."""
    import pty

    from kinspect.tui import KeyReader, incomplete_at, parse_keys

    assert incomplete_at(b"ab\x1b") == 2 and incomplete_at(b"\x1b[B\x1b[") == 3
    assert incomplete_at(b"\x1b[5") == 0 and incomplete_at(b"\x1b[B") == 3
    assert incomplete_at(b"\x1b[1;5") == 0  # (a sequence not known here, cut)
    assert incomplete_at("é".encode()[:1]) == 0 and incomplete_at("é".encode()) == 2
    assert incomplete_at("漢".encode()[:2]) == 0
    master, slave = pty.openpty()
    keys: list[str] = []
    reader = KeyReader(slave, keys.append).start()
    try:
        deadline = time.monotonic() + 10
        while not reader.reading:
            assert time.monotonic() < deadline, "no cbreak mode"
            time.sleep(0.01)
        os.write(master, b"\x1b[B" * 21 + b"\x1b")
        time.sleep(0.01)  # (well under ESC_WAIT)
        os.write(master, b"[Bj")
        deadline = time.monotonic() + 10
        while len(keys) < 23:
            assert time.monotonic() < deadline, keys
            time.sleep(0.01)
        assert keys == ["down"] * 22 + ["j"]
        os.write(master, b"\x1b")  # the Esc key: nothing follows
        while len(keys) < 24:
            assert time.monotonic() < deadline, keys
            time.sleep(0.01)
        assert keys[23:] == ["esc"]
    finally:
        reader.stop()
        os.close(slave)
        os.close(master)
    assert parse_keys(b"\x1b[B" * 2) == ["down", "down"]


def test_the_open_flow_fills_a_narrow_terminal_and_pages_by_its_height():
    """On a narrow terminal the status line wraps: the flow's lines get the rest,
    the last of them reachable, and PgDn moves by the lines shown."""
    console = Console(file=io.StringIO(), width=30, height=12, force_terminal=False)
    view = LiveView(_unstarted_proxy(), console=console, keep=10, interactive=True)
    flows = _flows(2)
    for f in flows:
        view.on_flow(f)
    view.table(5)
    view.key("home")
    view.key("enter")
    console.print(view)
    first = console.file.getvalue().splitlines()
    assert len(first) <= 12 - 1  # (rich's Live keeps a line for the cursor)
    shown = view._detail_page
    assert shown >= 1 and len(first) == shown + len(view.__rich__().renderables[0]
                                                    .wrap(console, 30))
    view.key("pgdn")
    assert view._detail_top == shown - 1
    view.key("end")
    console.file = io.StringIO()
    console.print(view)
    status = console.file.getvalue().replace("\n", " ")
    m = re.search(r"lines (\d+)-(\d+) of (\d+)", status)
    assert m and m.group(2) == m.group(3), status


def test_a_filtered_view_keeps_its_rows_openable_while_other_flows_pass():
    """The view holds its last ``keep`` flows for their rows' detail; those the
    filter does not select go first, so a filtered row stays openable however many
    other flows pass."""
    from kinspect.filters import parse

    console = Console(file=io.StringIO(), width=160, height=30, force_terminal=False)
    flows = _flows(40, records=1)
    produce = [f for f in flows if f.api_name == "Produce"]
    others = [f for f in flows if f.api_name != "Produce"]
    assert produce and len(others) > 10
    view = LiveView(_unstarted_proxy(), console=console, keep=10, interactive=True,
                    match=parse("~api Produce"))
    for f in produce[:2] + others:
        view.on_flow(f)
    assert {f.id for f in produce[:2]} <= set(view._held) and len(view._held) == 10
    view.table(10)
    view.key("home")
    view.key("enter")
    console.print(view)
    assert f"#{produce[0].id} Produce" in console.file.getvalue()
    assert "not held" not in console.file.getvalue()


def test_a_large_flow_opens_with_its_first_records_and_says_how_many_more():
    """An open flow shows the first ``ITEMS_SHOWN`` records of a records field (and
    elements of an array): its tree is laid out on rich's refresh thread, which
    holds the GIL the forwarding loop needs. ``show --flow`` shows them all."""
    from proxyutil import codec

    from kinspect.show import flow_tree
    from kinspect.tui import ITEMS_SHOWN

    flow = _flows(2, records=ITEMS_SHOWN + 30)[1]
    assert flow.api_name == "Produce"
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    console.print(flow_tree(flow, codec(), items=ITEMS_SHOWN))
    text = console.file.getvalue()
    total = int(re.search(r"(\d+) record\(s\) of t\[0\]", text).group(1))
    assert total > ITEMS_SHOWN  # (the batch builder takes what fits its size)
    assert text.count("· value ") == ITEMS_SHOWN
    assert f"… {total - ITEMS_SHOWN} more records" in text
    console.file = io.StringIO()
    console.print(flow_tree(flow, codec()))
    assert console.file.getvalue().count("· value ") == total


def test_log_records_wait_for_the_end_of_the_view_and_the_last_warning_shows(capsys):
    """While the view is drawn, a log record written to the terminal would be erased
    by the next redraw: the last warning is shown under the header, and the records
    are written by the terminal's handlers once the view stops."""
    import logging

    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)  # (as basicConfig's, on the captured stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    console = Console(file=io.StringIO(), width=160, height=30, force_terminal=False)
    view = LiveView(_unstarted_proxy(), console=console, keep=10)
    try:
        view.start()
        assert handler not in root.handlers
        logging.getLogger("kinspect.proxy").warning("conn %d: closing: \x1b[2J cannot reach", 7)
        logging.getLogger("kinspect.proxy").warning("conn %d: closing: cannot reach", 8)
        assert capsys.readouterr().err == ""
        console.print(view)
        screen = console.file.getvalue()
        assert "2 warnings, the last: conn 8: closing: cannot reach" in screen
    finally:
        view.close()
        root.removeHandler(handler)
    assert handler not in root.handlers  # (put back at close, then taken away above)
    err = capsys.readouterr().err.splitlines()
    assert err == ["WARNING kinspect.proxy: conn 7: closing: \x1b[2J cannot reach",
                   "WARNING kinspect.proxy: conn 8: closing: cannot reach"]


def test_ctrl_z_shows_the_cursor_before_the_view_stops():
    """Ctrl-Z at the terminal: the view shows the cursor (rich's Live hides it) before
    the process stops, so the shell's prompt has one. (The pty's wrapper ends a
    stopped process: exit status 99.)"""
    term = Terminal("show", EXAMPLE, "--browse")
    try:
        term.read_until(r"q quits")
        time.sleep(0.3)
        with term._lock:
            assert b"\x1b[?25l" in term.out  # hidden while drawn
            del term.out[:]
        term.type(b"\x1a")  # Ctrl-Z
        rc = term.proc.wait(30)
        with term._lock:
            assert b"\x1b[?25h" in term.out, bytes(term.out)
    finally:
        term.close()
    assert rc == 99


def test_records_cut_across_batches_are_counted_once():
    """Three batches of five records, three shown: the notes count the other twelve,
    two under the cut batch and ten for the batches after it."""
    from rich.tree import Tree
    from test_resilience import record_batch

    from kinspect.show import _records_node

    data = b"".join(record_batch([b"v%d" % i for i in range(5)]) for _ in range(3))
    t = Tree("x")
    _records_node(t, "Records", data, 64, "t", 0, 3)
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    console.print(t)
    text = console.file.getvalue()
    assert text.count("· value ") == 3
    counts = [int(n) for n in re.findall(r"… (\d+) more records", text)]
    assert sorted(counts) == [2, 10], text


def test_going_on_after_ctrl_z_does_not_wait_for_the_view_s_lock(monkeypatch):
    """The SIGTSTP handler runs on the main thread, which may hold the view's lock
    (on_flow): after the stop it must not redraw (a redraw takes that lock)."""
    import signal
    import threading

    from kinspect import tui

    console = Console(file=io.StringIO(), width=100, height=20, force_terminal=True)
    view = LiveView(_unstarted_proxy(), console=console, keep=10)
    monkeypatch.setattr(tui.os, "kill", lambda pid, sig: None)  # (no real stop)
    before = signal.getsignal(signal.SIGTSTP)
    view.start()
    fired = threading.Event()

    def watchdog():  # (a plain Lock: any thread may release it, ending a self-wait)
        fired.set()
        view._lock.release()

    timer = threading.Timer(5, watchdog)
    try:
        view._lock.acquire()  # as on_flow holds it when the signal comes
        timer.start()
        view._suspend(signal.SIGTSTP, None)  # (on the main thread, as a handler runs)
        timer.cancel()
        if not fired.is_set():
            view._lock.release()
        assert not fired.is_set(), "the handler waited for the view's lock"
    finally:
        view.close()
        signal.signal(signal.SIGTSTP, before)
    assert "\x1b[?25h" in console.file.getvalue()
