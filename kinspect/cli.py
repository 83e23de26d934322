"""The ``kinspect`` command line.

Each subcommand lives in a module of :mod:`kinspect.commands` that defines
``register(subparsers)``; modules are discovered, so features add commands
without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from . import __version__, commands
from .codec.errors import KinspectError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinspect",
        description="Kafka wire-traffic proxy and inspector.")
    parser.add_argument("--version", action="version", version=f"kinspect {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KinspectError as e:
        print(f"kinspect: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # e.g. a listen port in use, a file that cannot be read
        print(f"kinspect: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
