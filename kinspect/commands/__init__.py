"""Subcommands of the ``kinspect`` CLI: one module each, exposing ``register(subparsers)``.

Shared option helpers live here.
"""

from __future__ import annotations

import argparse


def add_spec_options(p: argparse.ArgumentParser) -> None:
    """``--specs PATH`` (repeatable): spec directories or jars searched first."""
    p.add_argument("--specs", action="append", default=[], metavar="PATH",
                   help="directory or jar/zip of Kafka JSON message specs, searched before "
                        "KINSPECT_SPECS, the project's specs/ and kafka-python's bundled set "
                        "(repeatable)")


def make_codec(args: argparse.Namespace):
    """A :class:`~kinspect.codec.Codec` for the ``--specs`` given on the command line."""
    from ..codec import Codec, SpecRegistry

    return Codec(SpecRegistry.load(args.specs))


def hostport(text: str) -> tuple[str, int]:
    """argparse type for ``HOST:PORT`` (``[::1]:PORT`` for IPv6)."""
    from ..proxy.server import parse_hostport

    try:
        return parse_hostport(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
