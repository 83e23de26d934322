"""``kinspect replay CAPTURE --upstream HOST:PORT``: send a capture's requests to a broker
again and compare the answers with the recorded ones.

Every recorded client connection is re-opened to the one ``--upstream`` broker
(a single-broker replay: Metadata-based redirection is not followed). Requests go
in recorded order, pipelined as recorded, with fresh correlation ids; ids the
broker hands out (member id, generation, producer id/epoch, fetch session, topic
ids) are carried forward into later requests. Volatile fields (timestamps, node
ids and addresses, epochs...) are ignored; ``--ignore`` adds patterns. Requests
whose secrets were redacted in the capture (recorded without ``--capture-secrets``)
are skipped, so the broker never gets the redaction marker as a password or config
value; ``--send-redacted`` sends them anyway.

Examples::

    kinspect replay captures/run.jsonl --upstream 127.0.0.1:9092 --as-fast-as-possible
    kinspect replay captures/run.jsonl --upstream 127.0.0.1:9092 --speed 2 \\
        --filter '!~api Heartbeat' --ignore offsets --report replay.json

Exit status: 0 when every replayed flow matched, 1 when some differ or failed, or
when the broker cannot be reached at all (one error, nothing replayed).
"""

from __future__ import annotations

import argparse
import json
import sys

from . import (
    add_spec_options,
    api_names,
    capture_path,
    check_capture_found,
    check_ignore,
    check_not_input,
    check_writable,
    hostport,
    make_codec,
    nonnegative_float,
    plain_help,
    positive_float,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="send a capture to a broker again and compare the "
                                      "responses with the recorded ones",
                       description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("capture", metavar="CAPTURE", type=capture_path, help="capture file (.jsonl or .jsonl.gz)")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT", type=hostport,
                   help="the broker every recorded connection is replayed against")
    p.add_argument("--filter", "-f", metavar="EXPR",
                   help="replay only the flows matching this filter (see kinspect.filters), "
                        "e.g. '!~api Heartbeat'")
    timing = p.add_mutually_exclusive_group()
    timing.add_argument("--speed", type=positive_float, default=1.0, metavar="N",
                        help="replay N times as fast as recorded (default 1)")
    timing.add_argument("--as-fast-as-possible", action="store_true",
                        help="no pauses: only the recorded ordering is kept")
    p.add_argument("--max-gap", type=nonnegative_float, metavar="S",
                   help="pause at most S seconds between two requests (after --speed): "
                        "longer recorded gaps are shortened, like tcpreplay's --maxsleep")
    p.add_argument("--report", metavar="FILE",
                   help="write every flow's result and differences as JSON")
    p.add_argument("--ignore", action="extend", nargs="+", default=[], metavar="FIELD",
                   help="more volatile fields: a field name pattern (*Offset), a dotted path "
                        "(Responses.Partitions.HighWatermark), API:PATTERN, entity:TYPE, or a "
                        "group (offsets, records, errors); added to the default list")
    p.add_argument("--no-default-ignore", action="store_true",
                   help="compare every field, volatile ones included")
    p.add_argument("--send-redacted", action="store_true",
                   help="also replay requests whose secrets were redacted in the capture "
                        "(config passwords, SCRAM credentials, token HMACs, SASL bytes), "
                        "with the redaction marker as the value; by default they are "
                        "skipped")
    p.add_argument("--timeout", type=positive_float, default=30.0, metavar="S",
                   help="seconds to wait for each response (default 30)")
    add_spec_options(p)
    p.set_defaults(func=run, usage_error=p.error)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ..filters import TopicIds, parse
    from ..replay import DEFAULT_IGNORE, Replayer, load_flows, run_with_uvloop

    upstream = args.upstream
    codec = make_codec(args)
    check_ignore(args, codec)
    flt = parse(args.filter, api_names(codec)) if args.filter else None
    if args.report:
        check_writable(args.report)  # before the replay, not after it has run
        check_not_input(args.report, [args.capture], parts=True)
    check_capture_found(args.capture)
    flows = load_flows(args.capture, codec)
    select = None
    if flt is not None:
        flt.topic_ids = TopicIds().learn_all(flows)
        select = flt.matches
    ignore = ([] if args.no_default_ignore else list(DEFAULT_IGNORE)) + args.ignore
    console = Console(stderr=True)
    speed = None if args.as_fast_as_possible else args.speed

    progress = Progress(TextColumn("[bold]replay[/]"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[counts]}"), TimeElapsedColumn(),
                        console=console, transient=True,
                        # (a pipe or a file gets no bar: rich would leave a blank line)
                        disable=not console.is_terminal)
    counts = {"matched": 0, "differing": 0, "failed": 0, "skipped": 0}

    def text() -> str:
        return (f"[green]{counts['matched']} matched[/] [yellow]{counts['differing']} "
                f"differing[/] [red]{counts['failed']} failed[/]")

    replayer = None
    with progress:
        task = None

        def on_result(res) -> None:
            counts[res.status] += 1
            progress.update(task, advance=1, counts=text())

        replayer = Replayer(codec, flows, upstream, speed=speed, ignore=ignore, select=select,
                            timeout=args.timeout, progress=on_result,
                            send_redacted=args.send_redacted, max_gap=args.max_gap,
                            check_upstream=True)
        if speed is not None:
            plan = replayer.schedule()
            span = max(plan.values(), default=0.0)
            if span > 600:
                console.print(f"[yellow]the replay follows the recorded timing: its requests "
                              f"span {_duration(span)}[/] (--max-gap S shortens pauses, "
                              f"--as-fast-as-possible drops them)")
        task = progress.add_task("replay", total=len(replayer.selected), counts=text())
        report = run_with_uvloop(replayer.run())

    print_summary(Console(), report, args.capture)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump({"capture": args.capture, **report.to_dict()}, fh, indent=1)
        Console().print(f"report written to [bold]{escape(args.report)}[/]")
    c = report.counts()
    return 0 if c["differing"] == 0 and c["failed"] == 0 else 1


def print_summary(console, report, capture: str) -> None:
    """Per-api counts, then the differing and failed flows with their explanations."""
    from rich.markup import escape
    from rich.table import Table

    from ..replay import DIFFERING, FAILED

    per_api: dict[str, dict[str, int]] = {}
    for r in report.results:
        d = per_api.setdefault(r.flow.api_name, {"matched": 0, "differing": 0, "failed": 0,
                                                 "skipped": 0})
        d[r.status] += 1
    c = report.counts()
    t = Table(title=f"replay of {escape(capture)} against {escape(report.upstream)} "
                    f"({report.elapsed_s:.1f} s)")
    for col in ("api", "matched", "differing", "failed", "skipped"):
        t.add_column(col, justify="left" if col == "api" else "right")
    for api, d in sorted(per_api.items()):
        t.add_row(api, str(d["matched"]), _nz(d["differing"], "yellow"), _nz(d["failed"], "red"),
                  str(d["skipped"]))
    t.add_row("[bold]total[/]", f"[bold]{c['matched']}[/]", _nz(c["differing"], "yellow"),
              _nz(c["failed"], "red"), str(c["skipped"]))
    console.print(t)
    for note in report.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
    if report.mappings:
        console.print(f"carried forward {len(report.mappings)} handed-out value(s): " + ", ".join(
            f"{m['kind']} (flow #{m['flow']})" for m in report.mappings[:8]))
    bad = [r for r in report.results if r.status in (DIFFERING, FAILED)]
    for r in bad[:20]:
        color = "yellow" if r.status == DIFFERING else "red"
        console.print(f"[{color}]#{r.flow.id} {r.flow.api_name} v{r.flow.api_version} "
                      f"(conn {r.flow.conn}) {r.status}[/]: {escape(r.explanation)}")
    if len(bad) > 20:
        console.print(f"... and {len(bad) - 20} more (see --report)")


def _duration(seconds: float) -> str:
    """``seconds`` in the largest unit that keeps it at least 1 (minutes to years)."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds / 60:.1f} minutes"


def _nz(n: int, color: str) -> str:
    return f"[{color}]{n}[/]" if n else "0"

