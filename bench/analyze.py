"""Capture analysis throughput: single process vs Spark local[1] vs local[2].

Usage::

    python bench/analyze.py                       # captures/example.jsonl, 300x, 3 rounds
    python bench/analyze.py --capture captures/example.jsonl --repeat 500 --rounds 5
    python bench/analyze.py --repeat 2000 --rounds 5 --update BENCHMARKS.md

Method (see BENCHMARKS.md, section "Analysis"):

* the input is one real capture (``--capture``; default ``captures/example.jsonl``,
  else one recorded here through the real proxy from kafka-python against Tansu)
  made large by repetition: its frame
  lines are written ``--repeat`` times into one file, each copy with connection
  and flow ids shifted so that every copy pairs on its own;
* every mode runs the same pipeline on it: read, pair, decode every frame with the
  codec (records batches included), aggregate, write all tables as Parquet (the
  ``what_if`` pass only with ``--what-if``). "single" is the single-process
  computation (:mod:`kinspect.analysis.reference`); "local[N]" is the Spark job on
  an embedded local master with N cores;
* Spark start-up is excluded: each Spark run gets a fresh session that first runs
  the job on the small capture (JVM, Python workers and code paths warm), then the
  timed run;
* modes are interleaved round by round; the result is the median over
  ``--rounds`` of frames per second, and the ratios between modes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinspect.analysis import reference

EXAMPLE = Path(__file__).resolve().parents[1] / "captures" / "example.jsonl"
START = "<!-- bench/analyze.py results: start -->"
END = "<!-- bench/analyze.py results: end -->"


def repeat_capture(src: Path, dest: Path, times: int) -> int:
    """Write ``src``'s frame lines ``times`` times into ``dest`` (connection and flow
    ids shifted per copy, timestamps kept); return the number of frame lines."""
    from kinspect.capture import read_capture

    records = list(read_capture(src))
    frames = [r for r in records if r.get("type") == "frame"]
    session = next((r for r in records if r.get("type") == "session"), None)
    max_conn = max(int(r["conn"]) for r in frames) + 1
    max_flow = max(int(r.get("flow") or 0) for r in frames) + 1
    n = 0
    with open(dest, "w") as fh:
        if session is not None:
            fh.write(json.dumps(session) + "\n")
        for k in range(times):
            for r in frames:
                r2 = dict(r)
                r2["conn"] = r["conn"] + k * max_conn
                if r.get("flow") is not None:
                    r2["flow"] = r["flow"] + k * max_flow
                fh.write(json.dumps(r2, separators=(",", ":")) + "\n")
                n += 1
    return n


def run_single(capture: Path, out: Path, what_if: bool) -> float:
    t0 = time.perf_counter()
    tables = reference.compute([capture], what_if=what_if)
    reference.write_tables(tables, out)
    return time.perf_counter() - t0


def run_spark(master: str, small: Path, capture: Path, out: Path, what_if: bool) -> float:
    from kinspect.analysis.job import build_session, run_job, stop_session

    spark = build_session(master)
    try:
        run_job(spark, [str(small)], out / "warmup", what_if=what_if)
        t0 = time.perf_counter()
        run_job(spark, [str(capture)], out / "run", what_if=what_if)
        return time.perf_counter() - t0
    finally:
        stop_session(spark)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capture", type=Path,
                   help="capture to repeat (default: captures/example.jsonl, else record one)")
    p.add_argument("--repeat", type=int, default=300, help="copies of the capture (300)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="single,local[1],local[2]")
    p.add_argument("--what-if", action="store_true", help="include the what_if pass")
    p.add_argument("--update", type=Path, metavar="FILE",
                   help="replace the results block of BENCHMARKS.md's Analysis section")
    args = p.parse_args(argv)
    if args.capture is None and EXAMPLE.exists():
        args.capture = EXAMPLE

    work = Path(tempfile.mkdtemp(prefix="kinspect-bench-analyze-"))
    try:
        small = args.capture
        if small is None:
            from kinspect.analysis.sample import record_sample

            small = work / "sample.jsonl"
            record_sample(small, messages=30)
        big = work / "big.jsonl"
        frames = repeat_capture(small, big, args.repeat)
        print(f"input: {small} x {args.repeat} = {frames} frames, "
              f"{big.stat().st_size / 1e6:.1f} MB; what-if: {args.what_if}", file=sys.stderr)
        modes = args.modes.split(",")
        load_before = os.getloadavg()[0]
        times: dict[str, list[float]] = {m: [] for m in modes}
        for rnd in range(args.rounds):
            for m in modes:
                out = work / f"out-{m}"
                if m == "single":
                    t = run_single(big, out, args.what_if)
                else:
                    t = run_spark(m, small, big, out, args.what_if)
                shutil.rmtree(out, ignore_errors=True)
                times[m].append(t)
                print(f"round {rnd + 1} {m}: {t:.2f} s, {frames / t:.0f} frames/s",
                      file=sys.stderr)
        med = {m: statistics.median(v) for m, v in times.items()}
        fps = {m: frames / med[m] for m in modes}
        base = modes[0]
        load_after = os.getloadavg()[0]
        run = (f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
               f"{platform.python_implementation()} {platform.python_version()}, "
               f"{os.cpu_count()} cores, input {small.name} x {args.repeat} = {frames} frames "
               f"({big.stat().st_size / 1e6:.0f} MB), what-if pass: "
               f"{'yes' if args.what_if else 'no'}, median of {args.rounds} rounds. "
               f"Load average (1 min) before/after: {load_before:.1f} / {load_after:.1f}.")
        lines = [
            run,
            "",
            f"| mode | frames/s | seconds | × {base} | all rounds (s) |",
            "|---|---:|---:|---:|---|",
        ]
        for m in modes:
            lines.append(f"| {m} | {fps[m]:,.0f} | {med[m]:.1f} | {fps[m] / fps[base]:.2f} | "
                         + ", ".join(f"{t:.1f}" for t in times[m]) + " |")
        if "local[1]" in fps and "local[2]" in fps:
            lines += ["", f"local[2] / local[1] = {fps['local[2]'] / fps['local[1]']:.2f}"]
        text = "\n".join(lines)
        print(text)
        if args.update is not None:
            doc = args.update.read_text()
            if START not in doc or END not in doc:
                raise SystemExit(f"{args.update} has no {START} ... {END} block")
            head, rest = doc.split(START, 1)
            _, tail = rest.split(END, 1)
            args.update.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
