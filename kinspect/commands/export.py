"""``kinspect export CAPTURE --pcapng OUT``: write a capture as pcapng for Wireshark/tshark.

Examples::

    kinspect export captures/example.jsonl --pcapng out/example.pcapng
    kinspect export captures/example.jsonl --pcapng out/produce.pcapng --filter '~api Produce'
    tshark -r out/example.pcapng -d tcp.port==PORT,kafka -Y kafka
"""

from __future__ import annotations

import argparse
import sys

from . import (add_spec_options, api_names, check_capture_found, check_not_input, make_codec,
               plain_help)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a capture as pcapng (synthesised TCP/IP packets "
                                      "on the real ports) for Wireshark and tshark",
                       description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("capture", metavar="CAPTURE", help="capture file (.jsonl or .jsonl.gz)")
    p.add_argument("--pcapng", metavar="OUT", required=True, help="pcapng file to write")
    p.add_argument("--filter", "-f", metavar="EXPR",
                   help="export only the frames this filter matches (see kinspect.filters; "
                        "~dir req|resp selects directions)")
    p.add_argument("--sent", action="store_true",
                   help="export the bytes forwarded (rewritten/mutated frames as sent) "
                        "instead of the bytes received")
    add_spec_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..capture import load_capture
    from ..export import export_pcapng
    from ..filters import parse

    check_capture_found(args.capture)
    check_not_input(args.pcapng, [args.capture], parts=True)
    codec = make_codec(args)
    flt = parse(args.filter, api_names(codec)) if args.filter else None
    cap = load_capture(args.capture, codec, decode=flt is not None)
    stats = export_pcapng(cap, args.pcapng, flt=flt, sent=args.sent)
    ports = ",".join(str(p) for p in sorted(stats.ports))
    print(f"wrote {args.pcapng}: {stats.frames} Kafka frames in {stats.packets} packets over "
          f"{stats.connections} connection(s)", file=sys.stderr)
    if ports:
        print(f"dissect with: tshark -r {args.pcapng} "
              + " ".join(f"-d tcp.port=={p},kafka" for p in sorted(stats.ports)),
              file=sys.stderr)
    return 0
