"""``kinspect show CAPTURE``: the flow table of a capture, or one flow fully decoded.

Examples::

    kinspect show captures/example.jsonl
    kinspect show captures/example.jsonl --filter '~api Produce | ~api Fetch'
    kinspect show captures/example.jsonl --errors
    kinspect show captures/example.jsonl --flow 11
    kinspect show captures/example.jsonl --flow 11 --format json
    kinspect show captures/example.jsonl --flow 11 --hex
    kinspect show captures/example.jsonl --browse

``--browse`` pages through the flow table at a terminal: Up/Down, PgUp/PgDn,
Home/End select a row, Enter opens its flow decoded (n/p: the next or previous
flow, x: its frames' bytes too, Esc: back to the table), f types a filter (--filter
and --errors give the one it starts with), q quits.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterator

from . import (
    add_spec_options,
    api_names,
    capture_path,
    check_capture_found,
    is_terminal,
    make_codec,
    nonnegative_int,
    plain_help,
)


#: api key of Metadata, whose answers name the topics of topic ids
_METADATA = 3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="print the flows of a capture file (table, or one flow "
                                    "decoded as a tree or JSON)",
                       description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("capture", metavar="CAPTURE", type=capture_path,
                   help="capture file (.jsonl or .jsonl.gz; rotated parts are followed)")
    p.add_argument("--filter", "-f", metavar="EXPR",
                   help="filter expression, e.g. '~api Produce & ~topic orders' "
                        "(see kinspect.filters)")
    p.add_argument("--errors", action="store_true",
                   help="only flows with a non-zero error code (same as --filter '~err')")
    p.add_argument("--flow", type=int, action="append", metavar="N",
                   help="print flow N fully decoded (repeatable)")
    p.add_argument("--hex", action="store_true",
                   help="with --flow: each frame's bytes as a hex dump too (offsets "
                        "from the frame's start, as decode errors give them)")
    p.add_argument("--browse", "-b", action="store_true",
                   help="page through the table at a terminal and open flows with "
                        "the keys (Up/Down, Enter, Esc, q)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="table/tree (default) or JSON")
    p.add_argument("--bytes-limit", type=nonnegative_int, default=None, metavar="N",
                   help="show at most N characters of keys, values and bytes fields "
                        "(0: everything; default: 64 in tables and trees, everything "
                        "with --format json, which is for programs)")
    add_spec_options(p)
    p.set_defaults(func=run, usage_error=p.error)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..capture import load_capture
    from ..filters import TopicIds, parse
    from ..flows import Flow
    from ..proxy.pipeline import decode_recorded
    from ..show import flow_json, flow_summary, flow_tree, print_flow_table, printable

    if args.flow and (args.filter or args.errors):
        # --flow N prints flow N whatever it is: the filter would be ignored silently.
        # (argparse's usage error: the usage and this on stderr, exit status 2)
        args.usage_error(f"argument --flow: not allowed with argument "
                         f"{'--filter' if args.filter else '--errors'} (--flow N prints "
                         f"flow N whatever it is; filters choose the rows of the table)")
    if args.hex and (not args.flow or args.format == "json"):
        args.usage_error("argument --hex: only with --flow N, as a tree (not --format json, "
                         "which holds the frames in base64)")
    if args.browse:
        if args.flow or args.format == "json":
            args.usage_error("argument --browse: not allowed with argument "
                             f"{'--flow' if args.flow else '--format json'}")
        if not (is_terminal(sys.stdin) and is_terminal(sys.stdout)):
            args.usage_error("argument --browse: needs a terminal (stdin and stdout)")
    # parsed before reading the file, each on its own: pasted into one expression, the
    # user's filter could close the parenthesis around it ("~api A) | (~api B" parsed)
    # and its errors would name positions in a text the user did not write
    codec = make_codec(args)
    filters = [parse(args.filter, api_names(codec))] if args.filter else []
    if args.errors:
        filters.append(parse("~err"))
    check_capture_found(args.capture)
    # decoded flow by flow below, and let go once shown: the decoded values of a
    # large capture take several times its size in memory
    cap = load_capture(args.capture, codec, decode=False)
    ids = TopicIds()
    for f in cap.flows:  # (topic ids first: a Fetch may name its topics by id only)
        if f.api_key == _METADATA:
            decode_recorded(codec, f)
            ids.learn(f)
    if args.bytes_limit is None:  # (JSON is read by programs: nothing cut by default)
        limit = None if args.format == "json" else 64
    else:
        limit = args.bytes_limit or None
    # a pipe or file gets full-width lines; a terminal at least 150 columns (a narrower
    # table squeezes the api and records columns to nothing)
    if sys.stdout.isatty():
        console = Console()
        console.width = max(console.width, 150)
    else:
        console = Console(width=100_000, soft_wrap=True)

    if args.flow:
        rc = 0
        docs = []
        for n in args.flow:
            flow = cap.flow(n)
            if flow is None:
                print(f"kinspect: error: no flow {n} in {args.capture} "
                      f"(flows {cap.flows[0].id}..{cap.flows[-1].id})" if cap.flows else
                      f"kinspect: error: {args.capture} has no flows", file=sys.stderr)
                rc = 1
                continue
            decode_recorded(codec, flow)
            if args.format == "json":
                docs.append(flow_json(flow, codec, topic_ids=ids, limit=limit))
            else:
                console.print(flow_tree(flow, codec, topic_ids=ids, limit=limit,
                                        frames=args.hex))
        if docs:
            print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
        return rc

    def shown() -> Iterator[Flow]:
        """The flows the filters let through, each decoded while it is looked at."""
        for f in cap.flows:
            if f.api_key != _METADATA:  # (Metadata: decoded above, and kept)
                decode_recorded(codec, f)
            if all(x.matches(f, topic_ids=ids) for x in filters):
                yield f
            if f.api_key != _METADATA:
                f.request_decoded = f.response_decoded = None

    sess = cap.session
    if args.format == "json":
        # what json.dumps(list, indent=2) prints, written summary by summary
        out = sys.stdout
        first = True
        for f in shown():
            item = json.dumps(flow_summary(f, ids), indent=2).replace("\n", "\n  ")
            out.write(("[\n  " if first else ",\n  ") + item)
            first = False
        out.write("[]\n" if first else "\n]\n")
        return 0
    if args.browse:  # every flow: a filter typed there may want any of them
        from ..tui import browse

        # error codes and flags for the rows' colours, and the filter given, while
        # each flow is decoded; then its decoded values are let go
        matched = {f.id for f in shown()}
        # one expression the view can show and edit (each part parsed on its own
        # above, so each is whole: in parentheses it means what it meant alone)
        match = parse(" & ".join(f"({x.text})" for x in filters),
                      api_names(codec)) if filters else None
        browse(cap.flows, printable(f"{args.capture} · upstream {sess.get('upstream')}"
                                    if sess.get("upstream") else str(args.capture)),
               codec=codec, topic_ids=ids, bytes_limit=limit, match=match,
               decode_on_demand=True, matched=matched)
        return 0
    # (printable: the session line's upstream is the capture file's text, as the rows are)
    print_flow_table(console, shown(), ids, title=lambda n: printable(
        f"{args.capture}: {n} of {len(cap.flows)} flows"
        + (f" · upstream {sess.get('upstream')}" if sess.get("upstream") else "")))
    return 0
