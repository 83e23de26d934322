"""``kinspect tolerate``: the tagged-field tolerance matrix of a broker (KIP-482)."""

from __future__ import annotations

import argparse
import json
import sys

from . import add_spec_options, check_writable, hostport, positive_float, positive_int

EPILOG = """\
Each cell sends one request, on a fresh connection, with one unknown tagged field
injected: in the request header, at the top level, or in a nested struct (arrays
get one element so every level exists). Tag numbers: just above the highest tag the
spec defines there, 10000, and 2^31-1; payloads: 0 B, 1 B, 1 KiB, 1 MiB.

  ✓ tolerated: the answer equals the baseline (fields that differ between two
    baseline answers, and ThrottleTimeMs, are ignored)
  E<n> a new error code n (not in the baseline's answer)
  ≠ a different answer without a new error code
  ✗ disconnect          T timeout      ? undecodable answer      - not run

The client side (does *my client* skip unknown tags?): run the proxy with rules
that inject unknown tags into responses, and point the client at the proxy:

  kinspect proxy --upstream BROKER:9092 \\
      --inject '*:response:header:tag=10000:size=16' \\
      --inject '*:response:top:tag=10000:hex=cafe' \\
      --inject 'Metadata:response:Topics[]:tag=10000:string=hello' \\
      --inject 'Fetch:response:Responses[].Partitions[]:tag=10000:size=1KiB'

and strip the tagged fields a broker sends (known ones reset to defaults):

  kinspect proxy --upstream BROKER:9092 --strip '*:response:top:all'

See docs/tagged-fields.md."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tolerate",
        help="tagged-field tolerance matrix: does a broker skip unknown tagged fields?",
        description="Send baseline requests and variants with unknown tagged fields "
                    "injected (KIP-482) to a broker, and classify each answer.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", required=True, metavar="HOST:PORT", type=hostport,
                   help="the broker")
    p.add_argument("--include-writes", action="store_true",
                   help="create a scratch topic and add Produce, OffsetCommit and "
                        "InitProducerId (they write to the scratch topic and group, "
                        "which are deleted at the end)")
    p.add_argument("--keep-scratch", action="store_true",
                   help="with --include-writes: leave the scratch topic and group on the "
                        "broker")
    p.add_argument("--json", metavar="OUT", help="write the JSON report here ('-' = stdout)")
    p.add_argument("--timeout", type=positive_float, default=2.0, metavar="S",
                   help="seconds to wait for each answer (default 2)")
    p.add_argument("--max-cells", type=positive_int, default=3000, metavar="N",
                   help="most requests to send, baselines included (default 3000)")
    p.add_argument("--budget", type=positive_float, default=45.0, metavar="S",
                   help="start no request after this many seconds (default 45)")
    p.add_argument("--apis", metavar="LIST",
                   help="comma-separated api names instead of the default safe set")
    p.add_argument("--payloads", metavar="LIST", default="0,1,1KiB,1MiB",
                   help="payload sizes (default 0,1,1KiB,1MiB)")
    p.add_argument("--tags", metavar="LIST", default="above,large,max",
                   help="tag numbers: above (highest known + 1), large (10000), max "
                        "(2^31-1); default all three")
    p.add_argument("--fail-on-intolerance", action="store_true",
                   help="exit 1 when a variant is not tolerated")
    add_spec_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..codec.errors import KinspectError
    from ..proxy.rules import parse_size
    from ..tolerate import TAG_KINDS, MatrixConfig, run_matrix
    from . import make_codec

    bootstrap = args.bootstrap
    sizes = tuple(parse_size(x) for x in args.payloads.split(",") if x.strip())
    kinds = tuple(x.strip() for x in args.tags.split(",") if x.strip())
    bad = [k for k in kinds if k not in TAG_KINDS]
    if args.keep_scratch and not args.include_writes:
        raise KinspectError("--keep-scratch goes with --include-writes (without it no "
                            "scratch topic is made)")
    if bad or not kinds or not sizes:
        raise KinspectError(f"--tags takes {', '.join(TAG_KINDS)}; --payloads at least one size")
    cfg = MatrixConfig(
        bootstrap=bootstrap, include_writes=args.include_writes,
        keep_scratch=args.keep_scratch, timeout=args.timeout,
        max_cells=args.max_cells, budget=args.budget,
        apis=tuple(a.strip() for a in args.apis.split(",") if a.strip()) if args.apis else None,
        payload_sizes=sizes, tag_kinds=kinds)
    to_stdout = args.json == "-"
    stream = sys.stderr if to_stdout else sys.stdout
    # a pipe or a file gets the whole table (rich's 80 columns fold it), a terminal its width
    console = Console(stderr=to_stdout, width=None if stream.isatty() else 200)
    codec = make_codec(args)
    unknown = []
    for name in cfg.apis or ():
        try:
            codec.registry.api_key(name)
        except KeyError:
            unknown.append(name)
    if unknown:  # (a typo would otherwise test nothing, and say so only in passing)
        raise KinspectError(f"--apis: no spec defines {', '.join(unknown)} "
                            f"(api names as 'kinspect specs' lists them, e.g. Metadata)")
    if args.json and not to_stdout:
        check_writable(args.json)  # before the matrix is sent, not after it has run
    count = 0
    with console.status("tolerance matrix: starting") as status:
        def progress(cell) -> None:
            nonlocal count
            count += 1
            status.update(f"tolerance matrix: {count} cells, now {cell.api} v{cell.version} "
                          f"{cell.place}")
        report = run_matrix(cfg, codec, progress)
    console.print(report.table())
    for note in report.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    for name, why in report.skipped.items():
        console.print(f"skipped {name}: {why}", highlight=False, style="dim", markup=False)
    if report.truncated:
        console.print(f"[yellow]truncated:[/] {report.truncated}")
    s = report.summary()
    console.print((", ".join(f"{k} {v}" for k, v in s.items() if v) or "no variants") +
                  f" ({len(report.cells)} cells, {report.requests} requests in "
                  f"{report.elapsed:.1f} s)", highlight=False)
    failed = [c for c in report.cells if c.place == "baseline"
              and c.outcome in ("undecodable", "disconnect", "timeout")]
    if failed:  # (those versions got no variants: their tolerance is not known)
        console.print(f"untested, the baseline got no usable answer: " + ", ".join(
            f"{c.api} v{c.version} ({c.outcome})" for c in failed), highlight=False,
            markup=False, style="yellow")
    if args.json:
        text = json.dumps(report.to_dict(), indent=1)
        if to_stdout:
            sys.stdout.write(text + "\n")
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
            console.print(f"JSON report: {args.json}", highlight=False, markup=False)
    if args.fail_on_intolerance and sum(s.values()) != s["tolerated"]:
        return 1
    return 0
