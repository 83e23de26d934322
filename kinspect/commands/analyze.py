"""``kinspect analyze``: capture analysis as a PySpark job (or in one process).

Reads capture files (JSON Lines, gzipped too), decodes every frame with the codec
on the Spark executors and writes Parquet tables (flows, api_stats, clients,
tagged_fields, topics, what_if) under ``--out``; prints a summary, optionally an
HTML report. See :mod:`kinspect.analysis.job`.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from . import add_spec_options, check_not_input


def add_arguments(p: argparse.ArgumentParser, *, master_default: str | None = "local[*]") -> None:
    p.add_argument("captures", nargs="+", metavar="CAPTURE",
                   help="capture files (.jsonl, .jsonl.gz) or directories of them")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="directory for the Parquet tables (one sub-directory per table)")
    p.add_argument("--master", default=master_default, metavar="URL",
                   help="Spark master URL (default: %(default)s; spark://host:7077, yarn, "
                        "k8s://..." + ("; default under spark-submit: its --master"
                                       if master_default is None else "") + ")")
    p.add_argument("--engine", choices=("spark", "python"), default="spark",
                   help="spark (default), or python: the single-process computation, "
                        "for small captures without Java")
    p.add_argument("--report", nargs="?", const="", default=None, metavar="HTML",
                   help="also write a one-page HTML report (default path: OUT/report.html; "
                        "./report.html when OUT is a URI)")
    p.add_argument("--no-what-if", dest="what_if", action="store_false",
                   help="skip the what_if table (the slowest pass)")
    p.add_argument("--no-ship-specs", dest="ship_specs", action="store_false",
                   help="do not ship the spec sources to the executors: they load --specs "
                        "paths as given (a shared filesystem) plus their own defaults")
    p.add_argument("--ship-code", dest="ship_code", action="store_true", default=None,
                   help="ship the kinspect package to the executors (default: when the "
                        "master is not local)")
    p.add_argument("--no-ship-code", dest="ship_code", action="store_false",
                   help="never ship the kinspect package (executors have it installed)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress and no summary")
    add_spec_options(p)


def _local_captures(paths: list[str]) -> list[str]:
    """The capture files the job reads of ``paths`` on this machine: files as given,
    the ``.jsonl``/``.jsonl.gz`` files of directories (URIs left out)."""
    out = []
    for p in paths:
        if "://" in p:
            continue
        if os.path.isdir(p):
            out += sorted(str(x) for x in Path(p).iterdir()
                          if x.name.endswith((".jsonl", ".jsonl.gz")))
        else:
            out.append(p)
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze", help="analyse captures with PySpark: Parquet tables, summary, HTML report",
        description=__doc__.split("\n\n")[0].replace("``", "'"))
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from ..analysis.summary import print_summary

    console = Console(stderr=True)
    out = Path(args.out)
    if args.report:  # (the default, OUT/report.html, is beside the tables)
        check_not_input(args.report, _local_captures(args.captures), parts=True)
    conf = {}
    for item in args.conf:
        k, sep, v = item.partition("=")
        if not sep:
            console.print(f"[red]--conf expects KEY=VALUE, got {escape(repr(item))}[/]")
            return 2
        conf[k] = v
    if args.engine == "python":
        spark_only = [name for name, given in (
            ("--master", args.master not in (None, "local[*]")), ("--conf", bool(args.conf)),
            ("--no-ship-specs", not args.ship_specs),
            ("--ship-code/--no-ship-code", args.ship_code is not None)) if given]
        if spark_only:  # (they were taken and ignored)
            console.print(f"[red]{escape(', '.join(spark_only))}: Spark options; "
                          f"--engine python runs no Spark[/]")
            return 2
        from ..analysis.reference import compute, write_tables
        from ..analysis.summary import result_from_tables

        t0 = time.perf_counter()
        tables = compute(args.captures, args.specs, what_if=args.what_if)
        write_tables(tables, out)
        result = result_from_tables(tables, out, seconds=time.perf_counter() - t0)
    else:
        from pyspark.errors import PySparkException
        from pyspark.sql import SparkSession

        from ..analysis.job import build_session, run_job, stop_session
        from ..codec.errors import KinspectError

        existing = SparkSession.getActiveSession()
        try:
            spark = existing or build_session(args.master, conf=conf)
        except PySparkException as e:  # e.g. a bad master URL: the JVM said why above
            raise KinspectError(f"Spark did not start with --master {args.master!r}: "
                                f"{e}") from None
        try:
            result = run_job(spark, args.captures, args.out, spec_paths=args.specs,
                             ship=args.ship_specs, code=args.ship_code, what_if=args.what_if,
                             console=None if args.quiet else console)
        finally:
            if existing is None:  # a session someone else runs is theirs to stop
                stop_session(spark)
    if not args.quiet:
        print_summary(Console(), result)
    if args.report is not None:
        from ..analysis.report import write_report

        if args.report:
            path = Path(args.report)
        else:  # beside the tables, or here when they went to a URI (hdfs://...)
            path = Path("report.html") if "://" in args.out else out / "report.html"
        write_report(result, path)
        if not args.quiet:
            console.print(f"report: {path}", markup=False)
    return 0
