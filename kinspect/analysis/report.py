"""A one-page HTML report of an analysis run, with charts drawn by matplotlib.

Charts are inline SVG (no external files, no JavaScript): latency histograms per
api, bytes per api (requests and responses), and the what-if savings per api.
Tables: per-api statistics, clients, topics, tagged fields.

Uses :class:`matplotlib.figure.Figure` directly (no pyplot, no global backend).
"""

from __future__ import annotations

import html
import io
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import schema
from .summary import VARIANT_LABELS, AnalysisResult, savings

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{padding:2px 8px;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child{text-align:left}
.meta{color:#666;font-size:.9em}.chart svg{max-width:100%;height:auto}
"""


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def latency_chart(hist: list[dict], apis: list[str]) -> str | None:
    """Small-multiple histograms of latency per api (log-spaced buckets)."""
    from matplotlib.figure import Figure

    by_api: dict[str, dict[int, int]] = defaultdict(dict)
    for r in hist:
        by_api[r["api_name"]][r["bucket"]] = r["count"]
    apis = [a for a in apis if a in by_api]
    if not apis:
        return None
    from matplotlib.ticker import LogLocator, NullFormatter

    lo = min(b for a in apis for b in by_api[a])
    hi = max(b for a in apis for b in by_api[a]) + 1
    lo, hi = min(lo, hi - 4), max(hi, lo + 4)  # at least one decade
    cols = min(4, len(apis))
    rows = math.ceil(len(apis) / cols)
    fig = Figure(figsize=(3.2 * cols, 2.2 * rows))
    for i, api in enumerate(apis):
        ax = fig.add_subplot(rows, cols, i + 1)
        buckets = by_api[api]
        lefts = [10 ** (b / 4) / 1e6 for b in sorted(buckets)]
        widths = [(10 ** ((b + 1) / 4) - 10 ** (b / 4)) / 1e6 for b in sorted(buckets)]
        ax.bar(lefts, [buckets[b] for b in sorted(buckets)], width=widths, align="edge",
               color="#4c78a8", edgecolor="white")
        ax.set_xscale("log")
        ax.set_xlim(10 ** (lo / 4) / 1e6, 10 ** (hi / 4) / 1e6)
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=8))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(api, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("latency (ms)", fontsize=7)
    fig.tight_layout()
    return _svg(fig)


def bytes_chart(api_stats: list[dict]) -> str | None:
    """Horizontal stacked bars: request and response bytes per api."""
    from matplotlib.figure import Figure

    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in api_stats:
        acc[r["api_name"]][0] += r["request_bytes"]
        acc[r["api_name"]][1] += r["response_bytes"]
    if not acc:
        return None
    names = sorted(acc, key=lambda n: sum(acc[n]))
    fig = Figure(figsize=(8, 0.3 * len(names) + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    req = [acc[n][0] for n in names]
    resp = [acc[n][1] for n in names]
    ax.barh(names, req, color="#4c78a8", label="requests")
    ax.barh(names, resp, left=req, color="#f58518", label="responses")
    ax.set_xlabel("bytes")
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _svg(fig)


def what_if_chart(rows: list[dict]) -> str | None:
    """Grouped horizontal bars: percent of bytes saved per api and variant."""
    from matplotlib.figure import Figure

    rows = [r for r in rows if r["bytes"]]
    if not rows:
        return None
    rows = list(reversed(rows))
    n = len(schema.VARIANTS)
    h = 0.8 / n
    fig = Figure(figsize=(8, 0.45 * len(rows) + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    for i, v in enumerate(schema.VARIANTS):
        ys = [j + i * h for j in range(len(rows))]
        ax.barh(ys, [r[f"{v}_pct"] or 0.0 for r in rows], height=h, label=VARIANT_LABELS[v])
    ax.set_yticks([j + 0.4 - h / 2 for j in range(len(rows))])
    ax.set_yticklabels([r["api_name"] for r in rows], fontsize=8)
    ax.axvline(0, color="#333", linewidth=0.8)
    ax.set_xlabel("bytes saved (%)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return _svg(fig)


def _table(headers: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('-' if c is None else str(c))}</td>"
                                    for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def render(result: AnalysisResult) -> str:
    """The report's HTML text."""
    tables = ", ".join(f"{html.escape(k)} ({v} rows)" for k, v in result.tables.items())
    parts = [("<!doctype html><html><head><meta charset='utf-8'>"
              f"<title>kinspect analysis</title><style>{_CSS}</style></head><body>"),
             "<h1>kinspect capture analysis</h1>",
             (f"<p class='meta'>{result.frames} frames, engine {html.escape(result.engine)}, "
              f"{result.seconds:.1f} s; tables in {html.escape(str(result.out))}: "
              f"{tables}</p>")]
    parts.append("<h2>Per api and version</h2>")
    parts.append(_table(
        ("api", "version", "count", "request bytes", "response bytes", "errors",
         "p50 ms", "p95 ms", "p99 ms", "max ms"),
        ((r["api_name"], r["api_version"], r["count"], r["request_bytes"],
          r["response_bytes"], r["errors"], _ms(r["latency_p50_ns"]), _ms(r["latency_p95_ns"]),
          _ms(r["latency_p99_ns"]), _ms(r["latency_max_ns"])) for r in result.api_stats)))
    apis = []
    for r in sorted(result.api_stats, key=lambda r: -r["count"]):
        if r["api_name"] not in apis:
            apis.append(r["api_name"])
    for title, svg in ((("Latency per api (nearest-rank percentiles above; histogram "
                         "buckets are 4 per decade)"), latency_chart(result.latency_hist, apis)),
                       ("Bytes per api", bytes_chart(result.api_stats))):
        if svg:
            parts.append(f"<h2>{html.escape(title)}</h2><div class='chart'>{svg}</div>")
    if result.what_if_summary:
        rows = savings(result.what_if_summary)
        parts.append("<h2>What-if encodings: bytes saved</h2>")
        parts.append("<p class='meta'>Frames (header and body) re-encoded from the decoded "
                     "values: int16/int32/int64 fields as zig-zag varints (packed), unsigned "
                     "varints (only messages without negative values), the better of the two "
                     "per field over this data, that rule applied to int arrays too; and the "
                     "two early drafts of tagged fields (a: tag section first, one varlong "
                     "header interleaving length and tag; b: optional-fields buffer of "
                     "length, int16 tag, value). Negative percentages are growth. "
                     "*Percentages are over the messages a variant can represent: unsigned "
                     "varints cannot carry a negative value.</p>")
        svg = what_if_chart([r for r in rows if r["api_name"] != "(all)"])
        if svg:
            parts.append(f"<div class='chart'>{svg}</div>")
        parts.append(_table(
            ["api", "messages", "bytes"] + [VARIANT_LABELS[v] for v in schema.VARIANTS],
            ([r["api_name"], r["messages"], r["bytes"]]
             + ["-" if r[f"{v}_pct"] is None else
                f"{r[v]} B ({r[f'{v}_pct']:.1f}%)" for v in schema.VARIANTS] for r in rows)))
    if result.clients:
        parts.append("<h2>Clients</h2>")
        parts.append(_table(
            ("client id", "software", "version", "connections", "flows", "apis"),
            ((r["client_id"], r["client_software_name"], r["client_software_version"],
              r["connections"], r["flows"], ", ".join(r["apis"])) for r in result.clients)))
    if result.topics:
        parts.append("<h2>Topics</h2>")
        parts.append(_table(
            ("topic", "partition", "codec", "produced records", "produced bytes",
             "fetched records", "fetched bytes", "compression ratio"),
            ((r["topic"], r["partition"], r["codec"], r["produced_records"], r["produced_bytes"],
              r["fetched_records"], r["fetched_bytes"],
              None if r["compression_ratio"] is None else f"{r['compression_ratio']:.2f}")
             for r in result.topics)))
    tags = [r for r in result.tagged if r["kind"] != "section"]
    if result.tagged:
        parts.append("<h2>Tagged fields</h2>")
        parts.append(_table(
            ("api", "version", "direction", "struct path", "tag", "name", "kind", "count",
             "bytes"),
            ((r["api_name"], r["api_version"], r["direction"], r["path"], r["tag"], r["name"],
              r["kind"], r["count"], r["bytes"]) for r in tags)))
        n = sum(r["count"] for r in result.tagged if r["kind"] == "section")
        b = sum(r["bytes"] for r in result.tagged if r["kind"] == "section")
        parts.append(f"<p class='meta'>{n} tag sections written, {b} bytes in all.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: AnalysisResult, path: str | Path) -> Path:
    """Write :func:`render`'s page to ``path`` (parent directories created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(result), encoding="utf-8")
    return path
