"""The single-process computation of the analysis tables: plain Python, no Spark.

It is the yardstick the Spark job is tested against (same counts, bytes and
percentiles over the same capture), the engine of ``kinspect analyze --engine
python`` for small captures on machines without Java, and the single-process
baseline of ``bench/analyze.py``.

Definitions shared with :mod:`kinspect.analysis.job` (keep them in step):

* pairing: frame lines are numbered per (capture, connection, direction,
  correlation id) in ``(ts_ns, line number)`` order (a null ``ts_ns`` first); the
  n-th request pairs with the n-th response of the same key (``seq``). Requests
  flagged ``no-response`` (acks=0 Produce) and responses flagged ``unpaired`` are
  numbered apart and pair with nothing (negative ``seq``: -2n, 1-2n), as the proxy
  paired them: they must not shift the pairing of a correlation id used again.
  Lines of a capture's rotated parts form one capture, named after the first
  part's file name. Captures appended to each other in one file (``cat a.jsonl
  b.jsonl``) have the connection and flow ids of each one after the first moved
  past those before it (:func:`read_frames`), as every capture reader does; an id
  moved past 2**63-1 (a 64-bit column's largest value) is a ``CaptureError``
  naming its line, not an id made up. A request that pairs with no response on a
  connection with a ``close`` line gets ``closed`` in its pair's ``req_flags``, as
  :func:`kinspect.capture.flows_from_records` flags such a flow (the proxy writes
  the flag on no frame line: it learns it after the request's line).
* lines: a line without ``type`` is a frame line, as for
  :func:`kinspect.capture.read_capture`'s readers (captures of other tools). A frame
  line's ``frame``/``frame_sent`` that is not a base64 string (strict: a number, a
  list, characters outside the alphabet, bad padding) is a ``CaptureError`` naming
  the key and line (:func:`bad_frame_key`), as ``kinspect show`` makes it, like
  every other line analyze cannot use.
* text: a lone surrogate in a capture line's strings (``client``, ``upstream``,
  ``flags``: a JSON escape such as ``"\\ud800"`` that is valid JSON but no Unicode
  text) is replaced by U+FFFD (:func:`valid_text`), as
  :func:`kinspect.codec.values.java_string` makes the decoded strings of those
  tables (Arrow and Parquet take valid Unicode only).
* percentiles: nearest rank (:func:`~kinspect.analysis.kernel.nearest_rank`).
* clients: a connection's software name/version is the one its first ApiVersions
  v3+ request carried (by request time, then flow id), applied to all its flows.
* topics: a topic known only by id takes the smallest name any response paired
  with that id, else the id text.
* what-if ``best``: a field is ``upacked`` unless any flow of the data holds a
  negative value in it.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..capture import CaptureError, _decode_b64
from ..codec.whatif import VarintSizer
from ..flows import CLOSED, NO_RESPONSE, UNPAIRED
from . import schema
from .kernel import FlowAnalyzer, load_registry, nearest_rank

PERCENTILES = (50, 95, 99)

#: the largest id a 64-bit column holds (``conn``, ``flow``)
MAX_ID = (1 << 63) - 1

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


# ---------------------------------------------------------------------------
# reading and pairing


def capture_files(paths: Iterable[str | os.PathLike]) -> list[tuple[str, list[Path]]]:
    """``[(capture name, [part files])]`` for capture files or directories of them
    (``*.jsonl`` / ``*.jsonl.gz``, rotated parts grouped with their first part).
    A URI (``hdfs://...``) is kept as one ``str`` entry for Spark to read (a file or
    a directory; Spark then names each file's capture by its file name). A capture
    is named by its first part's file name, made valid text (:func:`valid_text`:
    a file name that is not UTF-8 holds lone surrogates in Python).

    Raises:
        kinspect.capture.CaptureError: a missing path, or two captures of one name.
    """
    from ..capture import capture_parts, read_capture

    out: list[tuple[str, list[Path]]] = []
    seen: dict[str, Path] = {}
    firsts: list[Path] = []
    for p in paths:
        if "://" in str(p):  # a URI for Spark (hdfs://, s3a://...): passed on unchecked
            out.append((valid_text(str(p).rstrip("/").rsplit("/", 1)[-1]), [str(p)]))
            continue
        p = Path(p)
        if p.is_dir():
            files = sorted(x for x in p.iterdir()
                           if x.name.endswith((".jsonl", ".jsonl.gz")))
            parts = {q for f in files for q in capture_parts(f)[1:]}
            firsts.extend(f for f in files if f not in parts)
        elif p.exists():
            firsts.append(p)
        else:
            raise CaptureError("no such file", p)
    for first in firsts:
        parts = capture_parts(first)
        start = None
        keep = []
        for i, part in enumerate(parts):
            head = next(iter(read_capture(part, parts=False)), {})
            if head.get("type") != "session":
                if i:
                    break
            elif i == 0:
                start = head.get("start_ns")
            elif head.get("start_ns") != start:
                break
            keep.append(part)
        name = valid_text(first.name)
        if name in seen and seen[name] != first.resolve():
            raise CaptureError(f"two captures are named {name} ({seen[name]} and {first}); "
                               f"rename one", first)
        seen[name] = first.resolve()
        out.append((name, keep))
    return out


def segment_bases(maxima: Iterable[tuple[int | None, int | None]]) -> list[tuple[int, int]]:
    """``[(conn_base, flow_base)]`` per segment of one capture (see
    :func:`segment_starts`), given each segment's ``(highest conn, highest flow)``
    (``None``: none seen): a segment after the first starts past the highest
    connection and flow id before it, as :func:`read_frames` numbers them."""
    out = []
    max_conn = max_flow = 0
    for i, (mc, mf) in enumerate(maxima):
        base = (max_conn, max_flow) if i else (0, 0)
        out.append(base)
        if mc is not None:
            max_conn = max(max_conn, mc + base[0])
        if mf is not None:
            max_flow = max(max_flow, mf + base[1])
    return out


def segment_starts(sessions: list[tuple[Any, Any]]) -> list[bool]:
    """For each session line ``(start_ns, part)`` of a capture in order: does it start
    a new segment (a capture appended to another: ``cat a.jsonl b.jsonl``), rather
    than go on with the one before (the first line, or a rotated part: same
    ``start_ns`` and ``part`` > 0)? The rule of :func:`kinspect.capture.flows_from_records`."""
    out = []
    start: Any = None
    for i, (start_ns, part) in enumerate(sessions):
        out.append(bool(i) and (not part or start_ns != start))
        start = start_ns
    return out


def valid_text(text: str | None) -> str | None:
    """``text`` with each lone surrogate replaced by U+FFFD (``None`` stays ``None``).

    ``json.loads`` makes a JSON escape such as ``"\\ud800"`` (valid JSON) a lone
    surrogate, which no UTF-8 writer (Arrow, Parquet) takes; a surrogate pair
    (``"\\ud83d\\ude00"``) is one character already and is kept. The Spark job
    replaces the same escapes in the line's text before parsing it
    (:func:`kinspect.analysis.job.read_pairs`)."""
    if text is None or text.isascii():
        return text
    return _LONE_SURROGATE.sub("\ufffd", text)


#: the keys of a frame line holding frame bytes, as base64 text
_FRAME_KEYS = ("frame", "frame_sent")


def bad_frame_key(rec: dict) -> str | None:
    """``"frame"`` or ``"frame_sent"`` (the first) when that key of a frame line holds
    anything but base64 text, else ``None`` (absent and ``null`` are fine here;
    :func:`read_frames` refuses a frame line without ``frame``).

    Base64 as :func:`kinspect.capture.flows_from_records` reads it: strict
    (``validate=True``), so the string is ``[A-Za-z0-9+/]*`` then at most two ``=``,
    its length a multiple of 4; a number, list or other JSON value is not base64."""
    for key in _FRAME_KEYS:
        try:
            _decode_b64(rec, key, "")
        except CaptureError:
            return key
    return None


def id_overflow(key: str, value: int, base: int) -> str | None:
    """Why ``value + base`` (an id of a capture appended to another, moved past the
    ids before it) cannot be an id, or ``None``: more than a 64-bit column holds."""
    if value + base <= MAX_ID:
        return None
    return (f"{key!r} {value} of a capture appended to another, moved past the ids "
            f"before it (+{base}), is {value + base}: past 2**63-1")


def read_frames(captures: list[tuple[str, list[Path]]]) -> Iterator[dict]:
    """Frame records with ``capture`` and ``line`` (running number) added, ``frame``
    and ``frame_sent`` decoded from base64 (bytes, or ``None`` when absent),
    ``client``, ``upstream`` and ``flags`` made valid text (:func:`valid_text`). Captures
    appended to each other in one file number their connections and flows from 1
    again: those of each one after the first are moved past the ids used before
    it, as every capture reader does (:func:`kinspect.capture.flows_from_records`),
    so that two connections never merge. A line without ``type`` is a frame line.
    A connection's ``close`` line comes too, as ``{"type": "conn", "event": "close",
    "capture", "conn"}`` (its id moved likewise), for :func:`pair_frames`.

    Raises:
        kinspect.capture.CaptureError: what :func:`kinspect.capture.read_capture`
            raises; a frame line whose ``frame``/``frame_sent`` is not base64
            (:func:`bad_frame_key`); a ``conn`` or ``flow`` id moved past 2**63-1
            by the move (:func:`id_overflow`). Each names the file and line.
    """
    from ..capture import MAX_LINE_BYTES, _read_one

    for name, parts in captures:
        line = 0
        conn_base = flow_base = max_conn = max_flow = 0
        sessions = 0
        start: Any = None
        for part in parts:
            # (read_capture(part, parts=False), with the line numbers of the file)
            for lineno, rec in _read_one(Path(part), MAX_LINE_BYTES):
                line += 1
                typ = rec.get("type", "frame")
                if typ == "session":
                    if sessions and (not rec.get("part") or rec.get("start_ns") != start):
                        conn_base, flow_base = max_conn, max_flow
                    sessions += 1
                    start = rec.get("start_ns")
                    continue
                if typ == "frame":
                    try:  # decoded once, here (pair_frames takes the bytes)
                        raw = [_decode_b64(rec, k, "") for k in _FRAME_KEYS]
                    except CaptureError:
                        raise CaptureError(f"{bad_frame_key(rec)} is not base64",
                                           part, lineno) from None
                    if raw[0] is None:  # (frame_sent may be null: not changed)
                        raise CaptureError("frame is not base64", part, lineno)
                conn = rec.get("conn")
                if typ in ("conn", "frame") and type(conn) is int:
                    if conn + conn_base > MAX_ID:
                        raise CaptureError(id_overflow("conn", conn, conn_base), part, lineno)
                    max_conn = max(max_conn, conn + conn_base)
                if typ == "conn" and rec.get("event") == "close" and type(conn) is int:
                    yield {"type": "conn", "event": "close", "capture": name,
                           "conn": conn + conn_base}
                if typ != "frame":
                    continue
                rec = dict(rec)
                rec.update(zip(_FRAME_KEYS, raw))
                if type(conn) is int:
                    rec["conn"] = conn + conn_base
                flow = rec.get("flow")
                if type(flow) is int:
                    if flow + flow_base > MAX_ID:
                        raise CaptureError(id_overflow("flow", flow, flow_base), part, lineno)
                    rec["flow"] = flow + flow_base
                    max_flow = max(max_flow, rec["flow"])
                for k in ("client", "upstream"):
                    v = rec.get(k)
                    if v is not None and not v.isascii():
                        rec[k] = valid_text(v)
                flags = rec.get("flags")
                if flags and not all(f.isascii() for f in flags):
                    rec["flags"] = [valid_text(f) for f in flags]
                rec["capture"] = name
                rec["line"] = line
                yield rec


def _solo(rec: dict) -> bool:
    """A frame that pairs with nothing: a request the proxy knew expects no response
    (acks=0 Produce, flag ``no-response``) or a response it found no request for
    (flag ``unpaired``)."""
    flags = rec.get("flags") or ()
    return (NO_RESPONSE in flags) if rec.get("dir") == "req" else (UNPAIRED in flags)


def _seq(n: int, direction: str, solo: bool) -> int:
    """The pairing number of the ``n``-th frame of its group: ``n``, or for a solo
    frame a negative number no frame of the other direction has (-2n requests,
    1-2n responses)."""
    if not solo:
        return n
    return -2 * n if direction == "req" else 1 - 2 * n


def pair_frames(frames: Iterable[dict]) -> list[dict]:
    """Pairs (dicts with :data:`~kinspect.analysis.schema.PAIR`'s columns), in
    (capture, connection, correlation id, seq) order."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    closed: set[tuple[str, int]] = set()
    for rec in frames:
        if rec.get("type") == "conn":
            if rec.get("event") == "close":
                closed.add((rec["capture"], rec["conn"]))
            continue
        d = rec.get("dir")
        if d not in ("req", "resp"):
            continue
        corr = rec.get("correlation_id")
        groups[(rec["capture"], int(rec["conn"]), d, -1 if corr is None else corr,
                _solo(rec))].append(rec)
    keyed: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for (capture, conn, d, corr, solo), recs in groups.items():
        # like Spark's ascending order: a null ts_ns first
        recs.sort(key=lambda r: (r.get("ts_ns") is not None, r.get("ts_ns") or 0, r["line"]))
        for n, rec in enumerate(recs, 1):
            keyed[(capture, conn, corr, _seq(n, d, solo))][d] = rec
    pairs = []
    for key in sorted(keyed, key=lambda k: (k[0], k[1], k[2], k[3])):
        capture, conn, corr, seq = key
        req = keyed[key].get("req")
        resp = keyed[key].get("resp")
        sent = resp.get("frame_sent") if resp is not None else None

        def either(k: str, req: dict | None = req, resp: dict | None = resp) -> Any:
            v = req.get(k) if req is not None else None
            return resp.get(k) if v is None and resp is not None else v

        req_flags = list(req.get("flags") or ()) if req is not None else []
        if (req is not None and resp is None and seq > 0 and (capture, conn) in closed
                and CLOSED not in req_flags):
            req_flags.append(CLOSED)

        pairs.append({
            "capture": capture, "conn": conn, "correlation_id": corr, "seq": seq,
            "flow": either("flow"), "client": either("client"),
            "upstream": either("upstream"),
            "api_key": req.get("api_key") if req is not None else None,
            "api_version": req.get("api_version") if req is not None else None,
            "req_frame": req.get("frame") if req is not None else None,
            "resp_frame": resp.get("frame") if resp is not None else None,
            "req_ns": req.get("ts_ns") if req is not None else None,
            "resp_ns": resp.get("ts_ns") if resp is not None else None,
            "req_flags": req_flags,
            "resp_flags": list(resp.get("flags") or ()) if resp is not None else [],
            "resp_sent_bytes": len(sent) if sent is not None else None,
        })
    return pairs


# ---------------------------------------------------------------------------
# aggregation


def _sum(rows: Iterable[dict], key: str) -> int:
    return sum(r[key] or 0 for r in rows)


def api_stats(flows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for f in flows:
        groups[(f["api_key"], f["api_name"], f["api_version"])].append(f)
    out = []
    for (key, name, version), rows in groups.items():
        lat = sorted(r["latency_ns"] for r in rows if r["latency_ns"] is not None)
        req, resp = _sum(rows, "request_bytes"), _sum(rows, "response_bytes")
        row = {
            "api_key": key, "api_name": name, "api_version": version, "count": len(rows),
            "requests": sum(r["request_bytes"] is not None for r in rows),
            "responses": sum(r["response_bytes"] is not None for r in rows),
            "request_bytes": req, "response_bytes": resp, "bytes": req + resp,
            "errors": sum(bool(r["error_code"]) for r in rows),
            "undecoded": sum(r["decode_error"] is not None for r in rows),
            "latency_count": len(lat),
            "latency_max_ns": lat[-1] if lat else None,
        }
        for p in PERCENTILES:
            row[f"latency_p{p}_ns"] = nearest_rank(lat, p)
        out.append(row)
    return out


def clients(flows: list[dict]) -> list[dict]:
    software: dict[tuple, tuple] = {}
    best: dict[tuple, tuple] = {}
    for f in flows:
        if f["client_software_name"] is None and f["client_software_version"] is None:
            continue
        k = (f["capture"], f["conn"])
        # like Spark's struct ordering: nulls first
        order = (f["request_ns"] is not None, f["request_ns"] or 0,
                 f["flow"] is not None, f["flow"] or 0)
        if k not in best or order < best[k]:
            best[k] = order
            software[k] = (f["client_software_name"], f["client_software_version"])
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for f in flows:
        name, version = software.get((f["capture"], f["conn"]), (None, None))
        groups[(f["client_id"], name, version)].append(f)
    out = []
    for (cid, name, version), rows in groups.items():
        out.append({
            "client_id": cid, "client_software_name": name, "client_software_version": version,
            "connections": len({(r["capture"], r["conn"]) for r in rows}), "flows": len(rows),
            "request_bytes": _sum(rows, "request_bytes"),
            "response_bytes": _sum(rows, "response_bytes"),
            "apis": sorted({r["api_name"] for r in rows}),
        })
    return out


def tagged_fields(decoded: list[dict]) -> list[dict]:
    acc: dict[tuple, list[int]] = {}
    for f in decoded:
        for t in f["tagged"]:
            k = (f["api_key"], f["api_name"], f["api_version"], t["direction"], t["message"],
                 t["path"], t["tag"], t["name"], t["kind"])
            a = acc.setdefault(k, [0, 0, 0])
            a[0] += t["count"]
            a[1] += t["data_bytes"]
            a[2] += t["bytes"]
    cols = ("api_key", "api_name", "api_version", "direction", "message", "path", "tag", "name",
            "kind")
    return [dict(zip(cols, k, strict=True), count=a[0], data_bytes=a[1], bytes=a[2]) for k, a in acc.items()]


def topics(decoded: list[dict]) -> list[dict]:
    names: dict[str, str] = {}
    for f in decoded:
        for t in f["topic_names"]:
            cur = names.get(t["topic_id"])
            if cur is None or t["topic"] < cur:
                names[t["topic_id"]] = t["topic"]
    acc: dict[tuple, dict[str, int]] = {}
    for f in decoded:
        for t in f["topics"]:
            topic = t["topic"]
            if topic is None and t["topic_id"] is not None:
                topic = names.get(t["topic_id"], t["topic_id"])
            k = (topic, t["partition"], t["codec"])
            a = acc.setdefault(k, defaultdict(int))
            side = "produced" if t["direction"] == "produce" else "fetched"
            a[f"{side}_batches"] += t["batches"]
            a[f"{side}_records"] += t["records"]
            a[f"{side}_bytes"] += t["bytes"]
            a["payload_bytes"] += t["payload_bytes"]
            a["uncompressed_bytes"] += t["uncompressed_bytes"]
    out = []
    for (topic, partition, codec), a in acc.items():
        row = {"topic": topic, "partition": partition, "codec": codec}
        for c in ("produced_batches", "produced_records", "produced_bytes", "fetched_batches",
                  "fetched_records", "fetched_bytes", "payload_bytes", "uncompressed_bytes"):
            row[c] = a.get(c, 0)
        row["compression_ratio"] = (row["uncompressed_bytes"] / row["payload_bytes"]
                                    if row["payload_bytes"] else None)
        out.append(row)
    return out


def negative_set(decoded: Iterable[dict]) -> frozenset[str]:
    """Every field key seen negative in any flow (decides the ``best`` variant)."""
    out: set[str] = set()
    for f in decoded:
        out.update(f["negative_fields"])
    return frozenset(out)


def sort_rows(table: str, rows: list[dict]) -> list[dict]:
    """Rows in the table's deterministic order (:data:`schema.SORT_KEYS`; nulls first)."""
    keys = schema.SORT_KEYS[table]
    return sorted(rows, key=lambda r: tuple((r[k] is not None, r[k] if r[k] is not None else 0)
                                            for k in keys))


def compute(capture_paths: Iterable[str | os.PathLike], spec_paths: Iterable[str] = (), *,
            what_if: bool = True, progress: Any = None) -> dict[str, list[dict]]:
    """Every table as a list of row dicts, computed in this process.

    Args:
        capture_paths: capture files or directories.
        spec_paths: spec directories/archives searched first (like ``--specs``).
        what_if: compute the ``what_if`` table (the slowest part).
        progress: optional callable ``(step: str, done: int, total: int)``.
    """
    caps = capture_files(capture_paths)
    pairs = pair_frames(read_frames(caps))
    return compute_pairs(pairs, spec_paths, what_if=what_if, progress=progress)


def compute_pairs(pairs: list[dict], spec_paths: Iterable[str] = (), *, what_if: bool = True,
                  progress: Any = None) -> dict[str, list[dict]]:
    """:func:`compute` from already paired frames."""
    analyzer = FlowAnalyzer(load_registry(spec_paths))
    decoded = []
    for i, p in enumerate(pairs):
        decoded.append(analyzer.flow_row(p))
        if progress is not None and i % 200 == 0:
            progress("decoding", i, len(pairs))
    flow_cols = [n for n, _ in schema.FLOW_FIELDS]
    flows = [{c: f[c] for c in flow_cols} for f in decoded]
    tables = {
        "flows": flows,
        "api_stats": api_stats(flows),
        "clients": clients(flows),
        "tagged_fields": tagged_fields(decoded),
        "topics": topics(decoded),
    }
    rows: list[dict] = []
    if what_if:
        sizer = VarintSizer(negative_set(decoded))
        for i, p in enumerate(pairs):
            rows.extend(analyzer.what_if_rows(p, sizer))
            if progress is not None and i % 200 == 0:
                progress("what-if", i, len(pairs))
    tables["what_if"] = rows
    return {name: sort_rows(name, r) for name, r in tables.items()}


def write_tables(tables: dict[str, list[dict]], out: str | os.PathLike) -> None:
    """Write each table as ``OUT/<table>/part-0.parquet`` (the Spark job's layout)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out)
    for name, rows in tables.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("*.parquet"):
            old.unlink()
        pq.write_table(pa.Table.from_pylist(rows, schema=schema.TABLES[name]),
                       d / "part-0.parquet")
