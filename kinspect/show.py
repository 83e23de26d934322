"""Rendering flows for people: the flow table (``kinspect show``, the live view) and
one flow fully decoded (``show --flow N``: a rich tree, or JSON).

Reusable pieces:

* :data:`COLUMNS` and :func:`flow_row` — one table row per flow (display strings);
  :func:`flow_summary` gives the same facts as raw values; :func:`flow_table`
  builds a :class:`rich.table.Table`, and :func:`print_flow_table` prints the same
  table for any number of flows.
* :func:`flow_tree` — a :class:`rich.tree.Tree` of the request and response
  (header, body, record batches of ``records`` fields, before/after diff of
  rewritten or mutated frames); :func:`flow_json` — the same as JSON-able dicts.
* :func:`records_fields` — the ``records`` fields of a decoded message, found
  through the spec (fields of type ``records``), with their topic and partition;
  decoded with :func:`kinspect.codec.records.decode_records` (a truncated batch at
  the end is reported as ``partial``, not as an error).
* :func:`frame_diff` — decode two frames and diff their ``to_dict`` trees and bytes.

Sizes are frame bytes without the 4-byte size prefix; latencies milliseconds;
record timestamps epoch milliseconds shown as UTC ISO-8601.
"""

from __future__ import annotations

import base64
import datetime as _dt
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from .codec import Codec, DecodeError
from .codec.error_codes import error_name as _error_name
from .codec.records import RecordSet, decode_records, render_bytes, scan_batches
from .codec.spec import uuid_to_text
from .codec.values import tag_written
from .filters import TopicIds
from .flows import has_correlation_id

__all__ = ["COLUMNS", "RecordsField", "records_fields", "records_summary", "flow_summary",
           "flow_row", "flow_table", "print_flow_table", "flow_tree", "flow_json", "frame_diff",
           "error_name", "format_time", "format_latency", "printable"]

#: ``(key, header, justify)`` of the flow table, in order (shared with the live view).
COLUMNS: list[tuple[str, str, str]] = [
    ("id", "#", "right"),
    ("time", "time", "left"),
    ("conn", "conn", "right"),
    ("client_id", "client id", "left"),
    ("api", "api", "left"),
    ("corr", "corr", "right"),
    ("req_bytes", "req B", "right"),
    ("resp_bytes", "resp B", "right"),
    ("latency", "ms", "right"),
    ("error", "error", "left"),
    ("flags", "flags", "left"),
    ("records", "records", "left"),
]

#: Columns that wrap when the table is too wide (the others keep their width).
_WRAPPING = {"client_id": 10, "error": 12, "flags": 8, "records": 16}

#: Per-flow summary of decoded records is capped to this many decompressed bytes.
SUMMARY_MAX_DECOMPRESSED = 16 * 1024 * 1024


def printable(text: str) -> str:
    """``text`` with every character that is not printable (``str.isprintable``:
    control characters such as ESC, BEL, CR and tab, line and paragraph separators,
    bidirectional overrides) written as an escape. Client ids and topic names come
    from the wire and are shown in terminals and logs, where they must not move the
    cursor or start an escape sequence.

    ``\\xNN`` is always a byte: an ASCII control character, or a byte that is not
    UTF-8, which the decoder keeps as a surrogate escape (U+DC80-U+DCFF, see
    :mod:`kinspect.codec.values`); other characters are ``\\uNNNN`` or
    ``\\UNNNNNNNN`` (the C1 control CSI is ``\\u009b``, the byte 0x9b ``\\x9b``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(ord(c)) for c in text)


def _escape(code: int) -> str:
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def error_name(code: int | None) -> str:
    """``"TOPIC_ALREADY_EXISTS"`` for 36 (Kafka's names:
    :mod:`kinspect.codec.error_codes`), ``""`` for ``None``, ``"ERROR_<n>"`` for codes
    it does not know."""
    if code is None:
        return ""
    return _error_name(code)


def format_time(ns: int | None) -> str:
    """Local wall-clock ``HH:MM:SS.mmm`` of a ``time.time_ns()`` value."""
    if not ns:
        return ""
    sec, rest = divmod(ns, 1_000_000_000)
    global _last_second
    if _last_second[0] != sec:
        _last_second = (sec, _dt.datetime.fromtimestamp(sec).strftime("%H:%M:%S."))
    return _last_second[1] + f"{rest // 1_000_000:03d}"


#: the last second formatted and its text (``None`` before the first: every int,
#: -1 included, is a second a capture may hold)
_last_second: tuple[int | None, str] = (None, "")


def format_latency(ns: int | None) -> str:
    """Milliseconds with 2 decimals (``""`` when unknown)."""
    return "" if ns is None else f"{ns / 1e6:.2f}"


def _ts_ms(ms: int | None) -> str:
    if ms is None:
        return "null"
    if ms < 0:
        return str(ms)
    try:
        return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    except (OverflowError, OSError, ValueError):
        return str(ms)


# ---------------------------------------------------------------------------
# Records fields
# ---------------------------------------------------------------------------

@dataclass
class RecordsField:
    """One ``records`` field of a decoded message.

    Attributes:
        path: field path, e.g. ``"TopicData[0].PartitionData[1].Records"``.
        topic: topic name, or the topic id text (``TopicId``) when only an id is
            known, or ``None``.
        partition: partition index (the int32 field ``Index``/``PartitionIndex``/
            ``Partition`` beside the records), or ``None``.
        data: the raw bytes (``None`` for a null field).
    """

    path: str
    topic: str | None
    partition: int | None
    data: bytes | None

    def decode(self, max_decompressed: int | None = None) -> RecordSet:
        """Decode the batches (:func:`~kinspect.codec.records.decode_records`).

        Raises:
            DecodeError: malformed record data.
        """
        if max_decompressed is None:
            return decode_records(self.data)
        return decode_records(self.data, max_decompressed=max_decompressed)


_PARTITION_NAMES = ("Index", "PartitionIndex", "Partition")


def records_fields(body: Any, topic_ids: TopicIds | None = None) -> list[RecordsField]:
    """Every field of spec type ``records`` in a decoded body (depth first), with the
    topic of the nearest enclosing struct that names one (a field with
    ``entityType: topicName``, or a ``TopicId`` resolved by ``topic_ids``) and the
    partition index beside it."""
    out: list[RecordsField] = []
    if body is not None and hasattr(body, "_spec"):
        _visit_records(body, "", None, topic_ids, out)
    return out


def _visit_records(s: Any, path: str, topic: str | None, topic_ids: TopicIds | None,
                   out: list[RecordsField]) -> None:
    # a module function, not a closure calling itself: such a closure is a reference
    # cycle that kept `out`, and so every records field's bytes, alive until the
    # cyclic GC ran (the live view's proxy grew by ~100 MB at 1 MB Produce requests)
    names, walk = _records_plan(s._spec)
    part = None
    for kind, name in names:
        v = getattr(s, name)
        if kind == _TOPIC:
            if isinstance(v, str) and v:
                topic = v
        elif kind == _TOPIC_ID:
            if v and any(v) and not topic:
                resolved = topic_ids.name(v) if topic_ids is not None else None
                topic = resolved or uuid_to_text(bytes(v))
        else:
            part = v
    for name, is_records, is_array in walk:
        v = getattr(s, name)
        p = f"{path}.{name}" if path else name
        if is_records:
            out.append(RecordsField(p, topic, part, None if v is None else bytes(v)))
        elif v is not None:
            if is_array:
                for i, item in enumerate(v):
                    _visit_records(item, f"{p}[{i}]", topic, topic_ids, out)
            else:
                _visit_records(v, p, topic, topic_ids, out)


_TOPIC, _TOPIC_ID, _PARTITION = range(3)
_PLANS: dict[int, tuple] = {}


def _records_plan(spec: Any) -> tuple[list, list]:
    """For one struct spec: the fields naming a topic or partition, and the fields
    worth walking (records, or structs with records somewhere below), in spec order."""
    got = _PLANS.get(id(spec))
    if got is not None and got[0] is spec:
        return got[1]
    names, walk = [], []
    for f in spec.fields:
        if f.entity_type == "topicName":
            names.append((_TOPIC, f.name))
        elif f.type == "uuid" and f.name == "TopicId":
            names.append((_TOPIC_ID, f.name))
        elif f.name in _PARTITION_NAMES and f.type == "int32":
            names.append((_PARTITION, f.name))
        if f.type == "records":
            walk.append((f.name, True, False))
        elif f.struct is not None and _holds_records(f.struct):
            walk.append((f.name, False, f.is_array))
    plan = (names, walk)
    _PLANS[id(spec)] = (spec, plan)
    return plan


def _holds_records(spec: Any, depth: int = 0) -> bool:
    if depth > 16:
        return False
    return any(f.type == "records" or (f.struct is not None and _holds_records(f.struct, depth + 1))
               for f in spec.fields)


def _flow_records(flow: Any, topic_ids: TopicIds | None) -> list[tuple[str, RecordsField]]:
    out = []
    for direction, msg in (("req", flow.request_decoded), ("resp", flow.response_decoded)):
        body = getattr(msg, "body", None)
        if body is not None:
            out += [(direction, rf) for rf in records_fields(body, topic_ids)]
    return out


def records_summary(flow: Any, topic_ids: TopicIds | None = None, *,
                    quick: bool = False) -> list[dict[str, Any]]:
    """Per ``records`` field of the flow: ``{"dir", "topic", "partition", "records",
    "batches", "compression" (sorted names), "bytes", "partial" (bool), "error"}``.
    Empty fields (0 bytes or null) are left out.

    With ``quick`` (live views), magic v2 batches are counted from their headers
    alone (:func:`~kinspect.codec.records.scan_batches`: no CRC check, no
    decompression); legacy message sets are still decoded."""
    out = []
    for direction, rf in _flow_records(flow, topic_ids):
        if not rf.data:
            continue
        item = {"dir": direction, "topic": rf.topic, "partition": rf.partition,
                "records": 0, "batches": 0, "compression": [], "bytes": len(rf.data),
                "partial": False, "error": None}
        try:
            scan = scan_batches(rf.data) if quick else None
            if scan is not None:
                item["records"] = scan.record_count
                item["batches"] = scan.batches
                item["compression"] = sorted(scan.compressions)
                item["partial"] = scan.partial
            else:
                rs = rf.decode(SUMMARY_MAX_DECOMPRESSED)
                item["records"] = rs.record_count
                item["batches"] = len(rs.batches)
                item["compression"] = sorted({b.compression for b in rs.batches})
                item["partial"] = rs.partial is not None
        except DecodeError as e:
            item["error"] = str(e)
        out.append(item)
    return out


def _records_text(items: list[dict[str, Any]], max_items: int = 2) -> str:
    if not items:
        return ""
    parts = []
    for it in items[:max_items]:
        comp = ",".join(c for c in it["compression"] if c != "none")
        s = f"{it['topic'] or '?'}[{it['partition'] if it['partition'] is not None else '?'}] "
        s += "error" if it["error"] else f"{it['records']} rec"
        if comp:
            s += f" {comp}"
        if it["partial"]:
            s += " +partial"
        parts.append(s)
    text = ", ".join(parts)
    if len(items) > max_items:
        total = sum(it["records"] for it in items)
        text += f", +{len(items) - max_items} more ({total} rec)"
    return text


# ---------------------------------------------------------------------------
# Table rows
# ---------------------------------------------------------------------------

def flow_summary(flow: Any, topic_ids: TopicIds | None = None, *,
                 quick: bool = False) -> dict[str, Any]:
    """Raw values behind a table row: ``id, time_ns, conn, client_id, api_name,
    api_key, api_version, correlation_id, req_bytes, resp_bytes, latency_ns,
    error_code, flags (sorted list), records (see records_summary; ``quick`` as
    there)``."""
    return {
        "id": flow.id, "time_ns": flow.request_ns, "conn": flow.conn,
        "client_id": flow.client_id, "api_name": flow.api_name, "api_key": flow.api_key,
        "api_version": flow.api_version, "correlation_id": flow.correlation_id,
        "req_bytes": len(flow.request) if flow.request else None,
        "resp_bytes": len(flow.response) if flow.response is not None else None,
        "latency_ns": flow.latency_ns, "error_code": flow.error_code,
        "flags": sorted(flow.flags),
        "records": records_summary(flow, topic_ids, quick=quick),
    }


def flow_row(flow: Any, topic_ids: TopicIds | None = None, *,
             quick: bool = False) -> dict[str, str]:
    """Display strings keyed by the :data:`COLUMNS` keys (``quick``: see
    :func:`records_summary`)."""
    s = flow_summary(flow, topic_ids, quick=quick)
    api = s["api_name"] if s["api_version"] < 0 else f"{s['api_name']} v{s['api_version']}"
    err = s["error_code"]
    return {
        "id": str(s["id"]),
        "time": format_time(s["time_ns"]),
        "conn": str(s["conn"]),
        "client_id": printable(s["client_id"] or ""),
        "api": api,
        "corr": str(s["correlation_id"]) if has_correlation_id(flow) else "",
        "req_bytes": "" if s["req_bytes"] is None else str(s["req_bytes"]),
        "resp_bytes": "" if s["resp_bytes"] is None else str(s["resp_bytes"]),
        "latency": format_latency(s["latency_ns"]),
        "error": "" if not err else f"{err} {error_name(err)}",
        "flags": printable(" ".join(s["flags"])),  # (a capture file's, as read)
        "records": printable(_records_text(s["records"])),
    }


def _row_style(flow: Any, row: dict[str, str]) -> str | None:
    return "red" if row["error"] else (
        "yellow" if flow.flags & {"undecoded", "trailing-bytes"} else None)


def _table_shell(rows: list[dict[str, str]], title: str | None) -> Table:
    """The flow table's columns, sized for ``rows``, without rows."""
    t = Table(title=None if title is None else Text(title), expand=False, pad_edge=False)
    for key, header, justify in COLUMNS:
        wrap = key in _WRAPPING
        widest = max([len(header)] + [len(r[key]) for r in rows])
        t.add_column(header, justify=justify, no_wrap=not wrap, overflow="fold",
                     min_width=min(widest, _WRAPPING[key]) if wrap else widest)
    return t


def flow_table(flows: Iterable[Any], topic_ids: TopicIds | None = None,
               title: str | None = None) -> Table:
    """A :class:`rich.table.Table` of :func:`flow_row` rows (errors in red,
    undecoded flows in yellow). ``title`` is plain text (a file name or an address
    with ``[...]`` in it is shown as it is, not read as markup).

    rich lays out a table cell by cell, some 2.5 ms a row here: for more than a few
    thousand flows use :func:`print_flow_table`, which prints the same text."""
    rows = [(f, flow_row(f, topic_ids)) for f in flows]
    t = _table_shell([r for _, r in rows], title)
    for f, row in rows:
        # Text, not str: rich would read "[...]" in a client id or topic name as markup
        t.add_row(*(Text(row[k]) for k, _, _ in COLUMNS), style=_row_style(f, row))
    return t


#: Lines :func:`print_flow_table` hands to rich at once.
_PRINT_BATCH = 500


def _longest_word(text: str) -> str:
    return max(text.split() or [""], key=cell_len)


def _column_widths(console: Console, rows: list[dict[str, str]]) -> list[int] | None:
    """The content width of each column as rich lays out :func:`flow_table` for
    ``rows`` on ``console``. rich sizes a column from its cells' widest text and
    longest word (a :class:`~rich.measure.Measurement`): a table of two rows, one
    with each column's widest cell and one with its longest word, gets the same
    widths; they are read off the line under its header (the top border of an
    ASCII table has no column marks)."""
    t = _table_shell(rows, None)
    if rows:
        t.add_row(*(Text(max((r[k] for r in rows), key=cell_len)) for k, _, _ in COLUMNS))
        t.add_row(*(Text(max((_longest_word(r[k]) for r in rows), key=cell_len))
                    for k, _, _ in COLUMNS))
    # (render, not render_lines: a table wider than the console is cropped by the
    # latter, and its lines with it)
    box = _table_box(console)
    marks = {box.head_row_horizontal, box.head_row_cross}
    for line in "".join(seg.text for seg in console.render(t)).split("\n"):
        if (len(line) > 2 and line[0] == box.head_row_left and line[-1] == box.head_row_right
                and set(line[1:-1]) <= marks):
            cells = [cell_len(c) for c in line[1:-1].split(box.head_row_cross)]
            if len(cells) != len(COLUMNS):
                return None
            # (padding: one column each side, none at the table's edges: pad_edge=False)
            return [w - (1 if i in (0, len(cells) - 1) else 2) for i, w in enumerate(cells)]
    return None


def _table_box(console: Console) -> Any:
    """The box characters rich draws a table with on ``console`` (ASCII ones where
    its encoding is not UTF-8)."""
    t = Table()
    return t.box.substitute(console.options, safe=t.safe_box if t.safe_box is not None
                            else console.safe_box)


def _cell_lines(console: Console, text: str, width: int, justify: str,
                wrap: bool) -> list[str]:
    if cell_len(text) <= width:
        pad = " " * (width - cell_len(text))
        return [pad + text if justify == "right" else text + pad]
    lines = Text(text).wrap(console, width, justify=justify, overflow="fold", no_wrap=not wrap)
    return [line.plain for line in lines]


class _Title:
    """A table's title rendered as :class:`rich.table.Table` renders it (centred in
    the table's width, with the options of the print call: a console that soft-wraps
    leaves it as it is). A :class:`~rich.text.Text` title keeps its own style."""

    def __init__(self, text: Text, width: int):
        self.text = text
        self.width = width

    def __rich_console__(self, console: Console, options: Any) -> Any:
        yield from console.render(self.text, options.update(
            width=self.width, highlight=False, height=None, justify="center"))


def print_flow_table(console: Console, flows: Iterable[Any],
                     topic_ids: TopicIds | None = None,
                     title: str | Callable[[int], str] | None = None) -> int:
    """Print what ``console.print(flow_table(flows, topic_ids, title))`` prints, in
    a fraction of the time (the rows laid out here, in the column widths rich
    gives the table; rich wraps only the cells that do not fit). ``flows`` is read
    once, each flow turned into its row as it comes (a generator can decode each
    flow and let it go); ``title`` may be a function of the number of rows. Returns
    how many rows were printed."""
    rows: list[tuple[dict[str, str], str | None]] = []
    for f in flows:
        row = flow_row(f, topic_ids)
        rows.append((row, _row_style(f, row)))
    if callable(title):
        title = title(len(rows))
    widths = _column_widths(console, [r for r, _ in rows])
    box = _table_box(console)
    table_width = 0 if widths is None else sum(widths) + 3 * len(widths) - 1
    if (widths is None or table_width > console.width
            or any(w < cell_len(header) for w, (_, header, _) in zip(widths, COLUMNS))):
        # too wide for the console even with its cells wrapped: rich squeezes columns
        # below their headers, even to nothing and their padding with them, and crops
        # the lines; left to rich (slow, and rare: the command gives a terminal's
        # table at least 150 columns)
        t = _table_shell([r for r, _ in rows], title)
        for row, style in rows:
            t.add_row(*(Text(row[k]) for k, _, _ in COLUMNS), style=style)
        console.print(t)
        return len(rows)
    color = console.color_system is not None

    def padded(cells: list[str]) -> list[str]:
        last = len(cells) - 1
        return [(c if i == 0 else " " + c) + ("" if i == last else " ")
                for i, c in enumerate(cells)]

    out: list[str] = []
    spans: list[tuple[int, int, str]] = []
    size = 0

    def emit(line: str, style: str | None = None, cells: list[str] | None = None) -> None:
        nonlocal size
        if style is not None and color:
            if cells is None:
                spans.append((size, size + len(line), style))
            else:  # the cells and their padding, not the borders
                pos = size + 1
                for c in cells:
                    spans.append((pos, pos + len(c), style))
                    pos += len(c) + 1
        out.append(line)
        size += len(line) + 1
        if len(out) >= _PRINT_BATCH:
            flush()

    def flush() -> None:
        nonlocal size
        if not out:
            return
        text = Text("\n".join(out))
        for start, end, style in spans:
            text.stylize(style, start, end)
        console.print(text, soft_wrap=True, crop=False, highlight=False)
        out.clear()
        spans.clear()
        size = 0

    if title is not None:
        console.print(_Title(Text(title), table_width))
    # each column's width with its padding (none at the table's edges)
    paddings = [w + (1 if i in (0, len(widths) - 1) else 2) for i, w in enumerate(widths)]
    emit(box.get_top(paddings))
    head = padded([_cell_lines(console, header, w, justify, False)[0]
                   for (_, header, justify), w in zip(COLUMNS, widths)])
    emit(box.head_left + box.head_vertical.join(head) + box.head_right, "table.header", head)
    emit(box.get_row(paddings, "head"))
    for row, style in rows:
        cols = [_cell_lines(console, row[k], w, justify, k in _WRAPPING)
                for (k, _, justify), w in zip(COLUMNS, widths)]
        for n in range(max(len(c) for c in cols)):
            cells = padded([c[n] if n < len(c) else " " * w for c, w in zip(cols, widths)])
            emit(box.mid_left + box.mid_vertical.join(cells) + box.mid_right, style, cells)
    emit(box.get_bottom(paddings))
    flush()
    return len(rows)


# ---------------------------------------------------------------------------
# Values → tree / JSON
# ---------------------------------------------------------------------------

def _leaf(f: Any, v: Any, limit: int | None) -> str:
    if v is None:
        return "null"
    t = f.element_type
    if f.is_array:
        return "[" + ", ".join(_prim(t, x, limit) for x in v) + "]"
    return _prim(t, v, limit)


def _prim(t: str, v: Any, limit: int | None) -> str:
    if v is None:
        return "null"
    if t in ("bytes", "records"):
        return render_bytes(v, limit)
    if t == "uuid":
        return uuid_to_text(bytes(v))
    if t == "string":
        return repr(v)
    if t == "bool":
        return "true" if v else "false"
    return str(v)


def message_nodes(node: Tree, msg: Any, limit: int | None = 64,
                  topic_ids: TopicIds | None = None, api_version: int | None = None,
                  items: int | None = None) -> bool:
    """Add a decoded message's header and body under ``node`` (``kinspect show
    --flow`` and ``kinspect decode --format tree``): each struct's fields that exist
    at its version (the header's at the header version, the body's at the version
    it was decoded as), record batches decoded; ``limit`` caps rendered bytes (see
    :func:`~kinspect.codec.records.render_bytes`), ``items`` the elements shown of
    each array and the records of each records field (the rest counted; ``None``:
    all). Returns whether there was a body."""
    hv = getattr(msg, "header_version", None)
    if getattr(msg, "header", None) is not None:
        _struct_tree(node.add(Text(f"header v{hv}", style="bold")), msg.header, limit,
                     topic_ids, hv, items=items)
    if getattr(msg, "body", None) is None:
        return False
    bv = getattr(msg, "body_version", api_version if api_version is not None
                  else getattr(msg, "api_version", None))
    _struct_tree(node.add(Text(f"body v{bv}", style="bold")), msg.body, limit, topic_ids, bv,
                 items=items)
    trailing = getattr(msg, "trailing", b"")
    if trailing:
        node.add(Text(f"{len(trailing)} trailing bytes after the body, which Kafka's parsers "
                      f"do not read: {render_bytes(trailing, limit)}", style="yellow"))
    return True


def _more(node: Tree, n: int, what: str) -> None:
    node.add(Text(f"… {n} more {what} (the live view shows the first ones; kinspect show "
                  f"--flow N shows all)", style="dim"))


def _struct_tree(node: Tree, s: Any, limit: int | None, topic_ids: TopicIds | None,
                 version: int | None, topic: str | None = None,
                 items: int | None = None) -> None:
    """Add the fields of ``s`` that exist at ``version`` (all when ``None``); the
    first ``items`` elements of each array (``None``: all)."""
    spec = s._spec
    part = None
    for f in spec.fields:
        v = getattr(s, f.name)
        if f.entity_type == "topicName" and isinstance(v, str) and v:
            topic = v
        elif f.type == "uuid" and f.name == "TopicId" and v and any(v) and not topic:
            topic = (topic_ids.name(v) if topic_ids else None) or uuid_to_text(bytes(v))
        elif f.name in _PARTITION_NAMES and f.type == "int32":
            part = v
    present = getattr(s, "_present", None)
    for f in spec.fields:
        if version is not None and not f.versions.contains(version):
            continue
        v = getattr(s, f.name)
        if version is not None and f.tagged_in(version) and not tag_written(f, v, present):
            continue  # a tagged field not on the wire (KIP-482), as to_dict leaves it out
        if f.type == "records":
            _records_node(node, f.name, v, limit, topic, part, items)
        elif f.struct is not None and v is not None:
            if f.is_array:
                sub = node.add(Text.assemble((f.name, "bold"), f" [{len(v)}]"))
                for i, item in enumerate(v if items is None else v[:items]):
                    _struct_tree(sub.add(f"[{i}]"), item, limit, topic_ids, version, topic,
                                 items)
                if items is not None and len(v) > items:
                    _more(sub, len(v) - items, "elements")
            else:
                _struct_tree(node.add(Text(f.name, style="bold")), v, limit, topic_ids,
                             version, topic, items)
        else:
            node.add(Text.assemble((f.name, "bold"), ": ", _leaf(f, v, limit)))
    unknown = getattr(s, "_unknown", None)
    if unknown:
        node.add(Text.assemble(("unknown tagged fields", "magenta"), ": " + ", ".join(
            f"{t}={bytes(b).hex()}" for t, b in unknown.items())))


def _records_node(node: Tree, name: str, data: Any, limit: int | None, topic: str | None,
                  partition: int | None, items: int | None = None) -> None:
    if data is None:
        node.add(Text.assemble((name, "bold"), ": null"))
        return
    data = bytes(data)
    try:
        rs = decode_records(data)
    except DecodeError as e:
        sub = node.add(Text.assemble((name, "bold"), f": {len(data)} B ",
                                     ("undecodable records", "red")))
        sub.add(Text(str(e), style="red"))
        sub.add(Text("raw: " + render_bytes(data, limit)))
        return
    head = f": {len(data)} B, {len(rs.batches)} batch(es), {rs.record_count} record(s)"
    if topic is not None or partition is not None:
        head += f" of {printable(topic or '?')}[{partition if partition is not None else '?'}]"
    sub = node.add(Text.assemble((name, "bold"), head))
    left = items  # records still to show (None: all)
    for i, b in enumerate(rs.batches):
        if left is not None and left <= 0:
            _more(sub, sum(len(x.records) for x in rs.batches[i:]), "records")
            break
        crc = Text("CRC ok", style="green") if b.crc_valid else Text(
            f"CRC INVALID (wire {b.crc:#010x}, computed {b.crc_computed:#010x})", style="red")
        label = Text.assemble(
            f"batch {i} @{b.position}: magic {b.magic}, {b.compression}, ", crc,
            f", base offset {b.base_offset}, {b.record_count} record(s), "
            f"{b.size_bytes} B")
        if b.compression != "none":
            label.append(f" ({b.compressed_size} B compressed → {b.uncompressed_size} B)")
        bn = sub.add(label)
        extra = []
        if b.timestamp_type:
            extra.append(f"timestamps {b.timestamp_type}")
        if b.magic >= 2:
            extra.append(f"producer id {b.producer_id} epoch {b.producer_epoch} "
                         f"base sequence {b.base_sequence}")
            extra.append(f"partition leader epoch {b.partition_leader_epoch}")
            extra.append(f"last offset delta {b.last_offset_delta}")
        if b.is_transactional:
            extra.append("transactional")
        if b.is_control:
            extra.append("control batch")
        if extra:
            bn.add(Text(", ".join(extra), style="dim"))
        records = b.records
        if left is not None:
            if len(records) > left:
                records = records[:left]
            left -= len(records)
        for r in records:
            rl = Text(f"offset {r.offset} · {_ts_ms(r.timestamp)} · key ")
            rl.append(render_bytes(r.key, limit))
            rl.append(" · value ")
            rl.append(render_bytes(r.value, limit))
            if r.crc_valid is False:
                rl.append(" · message CRC INVALID", style="red")
            rn = bn.add(rl)
            if r.control is not None:
                rn.add(Text(f"control {r.control.type_name} (type {r.control.type}, "
                            f"coordinator epoch {r.control.coordinator_epoch})",
                            style="magenta"))
            for hk, hv in r.headers:
                rn.add(Text(f"header {hk!r} = {render_bytes(hv, limit)}"))
        if len(records) < len(b.records):  # (the later batches are counted as they come)
            _more(bn, len(b.records) - len(records), "records")
            left = 0
    if rs.partial is not None:
        p = rs.partial
        sub.add(Text(f"partial batch at {p.offset}: {p.available} of "
                     f"{p.needed if p.needed is not None else '?'} B present "
                     "(normal at the end of a Fetch)", style="yellow"))


def _frame_bytes_info(frame: bytes | None) -> str:
    return "none" if frame is None else f"{len(frame)} B"


def hexdump(data: bytes) -> str:
    """``data`` as lines of 16 bytes, laid out as ``hexdump -C`` does: the offset of
    the first (hex, from 0: a frame's offsets as :class:`~kinspect.codec.DecodeError`
    gives them), the bytes in hex (two groups of eight) and as ASCII between bars
    (``.`` for bytes that are not printable)."""
    lines = []
    for at in range(0, len(data), 16):
        chunk = bytes(data[at:at + 16])
        left, right = chunk[:8].hex(" "), chunk[8:].hex(" ")
        text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{at:08x}  {left:<23}  {right:<23}  |{text}|")
    return "\n".join(lines)


def flow_tree(flow: Any, codec: Codec | None = None, *, topic_ids: TopicIds | None = None,
              limit: int | None = 64, frames: bool = False,
              frames_limit: int | None = None, items: int | None = None) -> Tree:
    """A :class:`rich.tree.Tree` of one flow: summary line, request and response
    (header and body fields, record batches decoded), and for rewritten or mutated
    frames the before/after diff; with ``frames``, each frame's bytes as a
    :func:`hexdump` too (as received, and as sent when kinspect changed it; the first
    ``frames_limit`` bytes of each, ``None``: all). ``limit`` caps rendered bytes (see
    :func:`~kinspect.codec.records.render_bytes`); ``None`` shows everything.
    ``items``: as :func:`message_nodes`'s."""
    row = flow_row(flow, topic_ids)
    # addresses, flags and errors as a capture file has them: escaped like names from
    # the wire (rich's Text keeps ESC, so a crafted capture could drive the terminal)
    title = Text.assemble((f"#{flow.id} {row['api']}", "bold cyan"),
                          f" · conn {flow.conn} · corr {row['corr'] or '-'}"
                          f" · {printable(str(flow.client))} → {printable(str(flow.upstream))}")
    if flow.client_id:
        title.append(f" · client id {flow.client_id!r}")
    if row["latency"]:
        title.append(f" · {row['latency']} ms")
    if flow.flags:
        title.append(" · " + row["flags"], style="yellow")
    tree = Tree(title)
    if flow.error:
        tree.add(Text(f"decode error: {printable(str(flow.error))}", style="red"))
    for note in flow.notes:
        tree.add(Text(f"note: {printable(str(note))}", style="dim"))
    for direction, label, frame, msg in (
            ("req", "request", flow.request, flow.request_decoded),
            ("resp", "response", flow.response, flow.response_decoded)):
        if direction == "req" and not frame and "unpaired" in flow.flags:
            continue  # unpaired response (an empty raw SASL token is still a request)
        node = tree.add(Text.assemble((label, "bold green"),
                                      f" ({_frame_bytes_info(frame)})"))
        if frame is None:
            if "no-response" in flow.flags:
                # (a request too short for a header: no correlation id to pair by)
                why = ("no response expected (acks=0)" if flow.api_key == 0 else
                       "none can be paired with it: it has no request header"
                       if flow.api_key < 0 else "no response expected")
            else:
                why = "connection closed first" if "closed" in flow.flags else "no response"
            node.add(Text(why, style="dim"))
            continue
        if msg is None:
            node.add(Text("raw: " + render_bytes(frame, limit)))
            continue
        if not message_nodes(node, msg, limit, topic_ids, flow.api_version, items):
            node.add(Text("body not decoded; raw: " + render_bytes(frame, limit)))
    if codec is None and (flow.request_sent is not None or flow.response_sent is not None):
        codec = Codec()
    for direction in ("req", "resp"):
        d = frame_diff(codec, flow, direction) if codec is not None else None
        if d is None:
            continue
        why = "mutated" if "mutated" in flow.flags else (
            "rewritten" if direction == "resp" and "rewritten" in flow.flags else "changed")
        node = tree.add(Text.assemble((f"{'request' if direction == 'req' else 'response'} "
                                       f"as sent ({why})", "bold magenta"),
                                      f": {d['bytes']['before_size']} B → "
                                      f"{d['bytes']['after_size']} B"))
        for side in ("before", "after"):
            if d.get(f"{side}_error"):
                node.add(Text(f"{side}: decode error {d[side + '_error']}", style="red"))
        for ch in d["fields"]:
            node.add(Text.assemble((ch["path"], "bold"), ": ",
                                   (_short_json(ch["before"]), "red"), " → ",
                                   (_short_json(ch["after"]), "green")))
        b = d["bytes"]
        if b["first_difference"] is not None:
            node.add(Text(f"bytes differ from offset {b['first_difference']}: "
                          f"{b['before_hex']} → {b['after_hex']}", style="dim"))
    if frames:
        for label, frame in (("request", flow.request), ("request as sent", flow.request_sent),
                             ("response", flow.response),
                             ("response as sent", flow.response_sent)):
            if frame is None or (not frame and label == "request"
                                 and "unpaired" in flow.flags):
                continue
            node = tree.add(Text.assemble((f"{label} bytes", "bold blue"),
                                          f" ({len(frame)} B, without the size prefix)"))
            if frame:
                cut = frames_limit is not None and len(frame) > frames_limit
                node.add(Text(hexdump(frame[:frames_limit] if cut else frame)))
                if cut:
                    node.add(Text(f"… {len(frame) - frames_limit} more bytes", style="dim"))
    return tree


def _short_json(v: Any, n: int = 80) -> str:
    import json
    if v is _ABSENT:
        return "(absent)"
    s = json.dumps(v)
    return s if len(s) <= n else s[: n - 1] + "…"


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------

def _records_json(data: Any, limit: int | None) -> Any:
    if data is None:
        return None
    data = bytes(data)
    out: dict[str, Any] = {"size": len(data), "base64": base64.b64encode(data).decode("ascii")}
    try:
        out["record_set"] = decode_records(data).to_dict(limit)
    except DecodeError as e:
        out["error"] = str(e)
    return out


def _patch_records(s: Any, d: dict[str, Any], limit: int | None) -> None:
    for f in s._spec.fields:
        if f.name not in d:  # not on the wire at the message's version
            continue
        v = getattr(s, f.name)
        if f.type == "records":
            d[f.name] = _records_json(v, limit)
        elif f.struct is not None and v is not None:
            if f.is_array:
                for item, dd in zip(v, d[f.name]):
                    _patch_records(item, dd, limit)
            else:
                _patch_records(v, d[f.name], limit)


def _msg_json(msg: Any, frame: bytes | None, limit: int | None) -> dict[str, Any] | None:
    if frame is None:
        return None
    out: dict[str, Any] = {"size": len(frame)}
    if msg is None:
        out["base64"] = base64.b64encode(frame).decode("ascii")
        return out
    d = msg.to_dict()
    if getattr(msg, "body", None) is not None and d.get("body") is not None:
        _patch_records(msg.body, d["body"], limit)
    out.update(d)
    return out


def flow_json(flow: Any, codec: Codec | None = None, *, topic_ids: TopicIds | None = None,
              limit: int | None = 64) -> dict[str, Any]:
    """One flow as a JSON-able dict: metadata (``notes``: what the proxy noted on
    it, see :attr:`Flow.notes <kinspect.flows.Flow>`), ``request``/``response`` (``size``,
    ``header``, ``body`` as ``to_dict`` with every ``records`` field replaced by
    ``{"size", "base64", "record_set"|"error"}``), ``records`` summary and
    ``diff`` (``{"req": ..., "resp": ...}`` from :func:`frame_diff`) when frames were
    changed."""
    out = {
        "id": flow.id, "conn": flow.conn, "client": flow.client, "upstream": flow.upstream,
        "client_id": flow.client_id, "api_key": flow.api_key, "api_name": flow.api_name,
        "api_version": flow.api_version, "correlation_id": flow.correlation_id,
        "request_ns": flow.request_ns, "response_ns": flow.response_ns,
        "latency_ns": flow.latency_ns, "flags": sorted(flow.flags), "error": flow.error,
        "notes": list(flow.notes), "error_code": flow.error_code,
        "error_name": error_name(flow.error_code) or None,
        "request": _msg_json(flow.request_decoded, flow.request if flow.request else None,
                             limit),
        "response": _msg_json(flow.response_decoded, flow.response, limit),
        "records": records_summary(flow, topic_ids),
    }
    if flow.request_sent is not None or flow.response_sent is not None:
        codec = codec or Codec()
        out["diff"] = {d: frame_diff(codec, flow, d) for d in ("req", "resp")}
    return out


# ---------------------------------------------------------------------------
# Diff
# ---------------------------------------------------------------------------

class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def _diff_values(a: Any, b: Any, path: str, out: list[dict[str, Any]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a.keys()) + [k for k in b.keys() if k not in a]:
            _diff_values(a.get(k, _ABSENT), b.get(k, _ABSENT), f"{path}.{k}" if path else k,
                         out)
        return
    if isinstance(a, list) and isinstance(b, list):
        for i in range(max(len(a), len(b))):
            _diff_values(a[i] if i < len(a) else _ABSENT, b[i] if i < len(b) else _ABSENT,
                         f"{path}[{i}]", out)
        return
    if a is _ABSENT or b is _ABSENT or a != b or type(a) is not type(b):
        out.append({"path": path or "(frame)",
                    "before": a if a is not _ABSENT else _ABSENT,
                    "after": b if b is not _ABSENT else _ABSENT})


def _jsonable_change(ch: dict[str, Any]) -> dict[str, Any]:
    return {k: ("(absent)" if v is _ABSENT else v) for k, v in ch.items()}


def frame_diff(codec: Codec, flow: Any, direction: str, *,
               context: int = 8) -> dict[str, Any] | None:
    """Before/after difference of a frame the proxy changed, or ``None`` if the frame
    was forwarded as received.

    Both frames (``flow.request``/``request_sent`` or ``flow.response``/
    ``response_sent``) are decoded with ``codec`` and their ``to_dict`` trees
    compared. Returns ``{"fields": [{"path", "before", "after"}...], "bytes":
    {"before_size", "after_size", "first_difference", "before_hex", "after_hex"},
    ["before_error"|"after_error": str]}``; a value missing on one side is
    ``"(absent)"`` (``_ABSENT`` internally).
    """
    if direction == "req":
        before, after = flow.request, flow.request_sent
    else:
        before, after = flow.response, flow.response_sent
    if after is None or before is None:
        return None
    out: dict[str, Any] = {"fields": []}
    trees = []
    for side, frame in (("before", before), ("after", after)):
        try:
            if direction == "req":
                msg = codec.decode_request(frame)
            else:
                msg = codec.decode_response(frame, flow.api_key, flow.api_version)
            trees.append(msg.to_dict())
        except DecodeError as e:
            out[f"{side}_error"] = str(e)
            trees.append(None)
    if trees[0] is not None and trees[1] is not None:
        changes: list[dict[str, Any]] = []
        _diff_values(trees[0], trees[1], "", changes)
        # ``_present_tags`` lists the tagged fields on the wire at their default value
        # (to_dict leaves those out): a field set away from its default leaves that
        # list, which says nothing of the wire. Its changes are shown only when they
        # are all there is (a default-valued tagged field added or stripped).
        fields = [c for c in changes if "_present_tags" not in c["path"]]
        out["fields"] = [_jsonable_change(c) for c in (fields or changes)]
    first = next((i for i in range(min(len(before), len(after))) if before[i] != after[i]),
                 None)
    if first is None and len(before) != len(after):
        first = min(len(before), len(after))
    lo = max(0, (first or 0) - context)
    out["bytes"] = {
        "before_size": len(before), "after_size": len(after), "first_difference": first,
        "before_hex": None if first is None else before[lo:first + context].hex(),
        "after_hex": None if first is None else after[lo:first + context].hex(),
    }
    return out
