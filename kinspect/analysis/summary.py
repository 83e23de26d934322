"""The result of an analysis run and its rich summary.

:class:`AnalysisResult` carries the small aggregates both engines produce
(``api_stats``, ``clients``, ``topics``, ``tagged_fields`` rows, a what-if summary
per api and latency histograms), which the terminal summary and the HTML report
are drawn from; the full tables are the Parquet files under ``out``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import schema

VARIANT_LABELS = {
    "packed": "packed varints",
    "upacked": "unsigned varints*",
    "best": "best per field",
    "best_elements": "best, int arrays too",
    "draft_a": "tags draft a",
    "draft_b": "tags draft b",
}


@dataclass
class AnalysisResult:
    """What a run wrote and computed (see the module docstring)."""

    engine: str
    out: Path
    tables: dict[str, int]
    api_stats: list[dict]
    clients: list[dict]
    topics: list[dict]
    tagged: list[dict]
    what_if_summary: list[dict]
    latency_hist: list[dict]
    frames: int = 0
    seconds: float = 0.0
    spec_sources: list[str] = field(default_factory=list)


def what_if_summary(rows: list[dict]) -> list[dict]:
    """Per (api, direction): ``messages``, ``bytes`` and per variant ``v``:
    ``v_messages`` (messages it can represent), ``v_bytes`` (their size under it)
    and ``v_base`` (their wire bytes). Same as the Spark job's aggregate."""
    acc: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        k = (r["api_key"], r["api_name"], r["direction"])
        a = acc.get(k)
        if a is None:
            a = acc[k] = {"api_key": k[0], "api_name": k[1], "direction": k[2],
                          "messages": 0, "bytes": 0}
            for v in schema.VARIANTS:
                a[f"{v}_messages"] = 0
                a[f"{v}_bytes"] = None
                a[f"{v}_base"] = None
        a["messages"] += 1
        a["bytes"] += r["bytes"]
        for v in schema.VARIANTS:
            x = r[f"{v}_bytes"]
            if x is not None:
                a[f"{v}_messages"] += 1
                a[f"{v}_bytes"] = (a[f"{v}_bytes"] or 0) + x
                a[f"{v}_base"] = (a[f"{v}_base"] or 0) + r["bytes"]
    return list(acc.values())


def latency_hist(flows: list[dict]) -> list[dict]:
    """Latency histogram per api (see :func:`kinspect.analysis.job.latency_hist_df`)."""
    acc: dict[tuple, int] = defaultdict(int)
    for f in flows:
        lat = f["latency_ns"]
        if lat is not None:
            acc[(f["api_name"], math.floor(math.log10(max(lat, 1)) * 4))] += 1
    return [{"api_name": a, "bucket": b, "count": n} for (a, b), n in acc.items()]


def result_from_tables(tables: dict[str, list[dict]], out: Path, *, engine: str = "python",
                       seconds: float = 0.0) -> AnalysisResult:
    """An :class:`AnalysisResult` from :func:`kinspect.analysis.reference.compute`'s tables."""
    frames = sum((f["request_bytes"] is not None) + (f["response_bytes"] is not None)
                 for f in tables["flows"])
    return AnalysisResult(
        engine=engine, out=Path(out), tables={k: len(v) for k, v in tables.items()},
        api_stats=tables["api_stats"], clients=tables["clients"], topics=tables["topics"],
        tagged=tables["tagged_fields"], what_if_summary=what_if_summary(tables["what_if"]),
        latency_hist=latency_hist(tables["flows"]), frames=frames, seconds=seconds)


def savings(summary: list[dict], by: str = "api_name") -> list[dict]:
    """Bytes and percent saved per api (requests and responses together) and in
    total: ``{"api_name", "messages", "bytes", "<v>": bytes, "<v>_pct": percent saved
    over the messages the variant can represent, "<v>_messages"}``."""
    acc: dict[str, dict[str, Any]] = {}
    for r in summary:
        for key in (r[by], "(all)"):
            a = acc.setdefault(key, defaultdict(int))
            a["messages"] += r["messages"]
            a["bytes"] += r["bytes"]
            for v in schema.VARIANTS:
                a[f"{v}_messages"] += r[f"{v}_messages"] or 0
                a[f"{v}_bytes"] += r[f"{v}_bytes"] or 0
                a[f"{v}_base"] += r[f"{v}_base"] or 0
    out = []
    for key, a in acc.items():
        row: dict[str, Any] = {by: key, "messages": a["messages"], "bytes": a["bytes"]}
        for v in schema.VARIANTS:
            base = a[f"{v}_base"]
            row[v] = a[f"{v}_bytes"] if a[f"{v}_messages"] else None
            row[f"{v}_messages"] = a[f"{v}_messages"]
            row[f"{v}_pct"] = (100.0 * (base - a[f"{v}_bytes"]) / base) if base else None
        out.append(row)
    out.sort(key=lambda r: (r[by] == "(all)", -r["bytes"]))
    return out


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def print_summary(console: Any, result: AnalysisResult) -> None:
    """Print the run's summary tables with rich."""
    from rich.table import Table
    from rich.text import Text

    from ..show import printable

    console.print(f"[bold]kinspect analyze[/] ({result.engine}): {result.frames} frames in "
                  f"{result.seconds:.1f} s -> {result.out}")
    t = Table(title="Tables written", show_edge=False)
    t.add_column("table")
    t.add_column("rows", justify="right")
    for name in schema.TABLES:
        if name in result.tables:
            t.add_row(name, str(result.tables[name]))
    console.print(t)

    t = Table(title="Per api and version", show_edge=False)
    for c, j in (("api", "left"), ("v", "right"), ("count", "right"), ("bytes", "right"),
                 ("errors", "right"), ("p50 ms", "right"), ("p95 ms", "right"),
                 ("p99 ms", "right")):
        t.add_column(c, justify=j)
    for r in result.api_stats:
        t.add_row(r["api_name"], str(r["api_version"]), str(r["count"]), str(r["bytes"]),
                  str(r["errors"]), _ms(r["latency_p50_ns"]), _ms(r["latency_p95_ns"]),
                  _ms(r["latency_p99_ns"]))
    console.print(t)

    if result.clients:
        t = Table(title="Clients", show_edge=False)
        for c in ("client id", "software", "connections", "flows"):
            t.add_column(c)
        for r in result.clients:
            sw = " ".join(x for x in (r["client_software_name"], r["client_software_version"])
                          if x) or "-"
            # Text, escaped: client ids and topic names come from the wire (no markup,
            # no control characters)
            t.add_row(Text(printable(str(r["client_id"]))), Text(printable(sw)),
                      str(r["connections"]), str(r["flows"]))
        console.print(t)

    if result.topics:
        t = Table(title="Topics (record batches)", show_edge=False)
        for c in ("topic", "partition", "codec", "produced", "fetched", "ratio"):
            t.add_column(c)
        for r in result.topics:
            ratio = r["compression_ratio"]
            t.add_row(Text(printable(str(r["topic"]))), str(r["partition"]), r["codec"],
                      f"{r['produced_records']} rec / {r['produced_bytes']} B",
                      f"{r['fetched_records']} rec / {r['fetched_bytes']} B",
                      "-" if ratio is None else f"{ratio:.2f}")
        console.print(t)

    tags = [r for r in result.tagged if r["kind"] != "section"]
    sections = [r for r in result.tagged if r["kind"] == "section"]
    if sections:
        n = sum(r["count"] for r in sections)
        b = sum(r["bytes"] for r in sections)
        unknown = sum(r["count"] for r in tags if r["kind"] == "unknown")
        console.print(f"Tagged fields: {n} tag sections, {b} bytes; {len(tags)} distinct "
                      f"(api, version, path, tag) seen, {unknown} unknown tag occurrences")

    if result.what_if_summary:
        t = Table(title="What-if encodings: bytes saved", show_edge=False)
        t.add_column("api")
        t.add_column("bytes", justify="right")
        for v in schema.VARIANTS:
            t.add_column(VARIANT_LABELS[v], justify="right")
        for r in savings(result.what_if_summary):
            t.add_row(r["api_name"], str(r["bytes"]),
                      *[_pct(r[f"{v}_pct"]) for v in schema.VARIANTS])
        console.print(t)
