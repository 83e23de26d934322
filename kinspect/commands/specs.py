"""``kinspect specs``: list the loaded APIs, their versions and where each spec came from."""

from __future__ import annotations

import argparse
import json
import sys

from . import add_spec_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("specs", help="list APIs, valid/flexible versions and spec sources",
                       description="List the APIs the spec search path defines, their valid "
                                   "and flexible versions and the spec file each came from.")
    add_spec_options(p)
    p.add_argument("--all", action="store_true",
                   help="also list header/data messages, not only request/response pairs")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="a table (default) or JSON with the full source paths")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..codec import SpecRegistry

    reg = SpecRegistry.load(args.specs)
    rows = []
    for key in reg.api_keys():
        req, resp = reg.request(key), reg.response(key)
        spec = req or resp
        rows.append({
            "api_key": key, "api": reg.api_name(key),
            "valid_versions": str(spec.valid_versions),
            "flexible_versions": str(spec.flexible_versions),
            "request_source": req.source if req else None,
            "response_source": resp.source if resp else None,
        })
    others = [m for m in reg.messages.values() if m.type not in ("request", "response")]
    if args.format == "json":
        out = {"sources": [vars(s) for s in reg.sources], "apis": rows}
        if args.all:
            out["other"] = [{"name": m.name, "type": m.type, "valid_versions": str(m.valid_versions),
                             "source": m.source} for m in others]
        print(json.dumps(out, indent=2))
        return 0
    # a pipe or a file gets whole lines (rich's 80 columns broke the source paths across
    # lines and cut the source column); a terminal its own width
    console = Console() if sys.stdout.isatty() else Console(width=100_000, soft_wrap=True)
    console.print("[bold]Spec search path[/] (first wins):")
    for s in reg.sources:
        console.print(f"  {s.origin:>14}  {s.kind:7}  {s.path}", markup=False)
    t = Table(title=f"{len(rows)} APIs")
    for col in ("key", "api", "valid", "flexible", "source"):
        t.add_column(col, justify="right" if col == "key" else "left")
    for r in rows:
        src = r["request_source"] or r["response_source"]
        t.add_row(str(r["api_key"]), r["api"], r["valid_versions"], r["flexible_versions"],
                  _short(src))
    console.print(t)
    if args.all:
        t2 = Table(title="other messages")
        for col in ("name", "type", "valid", "source"):
            t2.add_column(col)
        for m in others:
            t2.add_row(m.name, m.type, str(m.valid_versions), _short(m.source))
        console.print(t2)
    return 0


def _short(path: str | None) -> str:
    if not path:
        return "-"
    if "site-packages/" in path:
        return "…/" + path.split("site-packages/", 1)[1]
    return path
