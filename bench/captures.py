"""Reading a capture: what `kinspect show` (and `--browse`, `replay`, `export`) pay
before the first row, side by side with another checkout.

Usage::

    python bench/captures.py                                # example.jsonl, 2000x, 5 rounds
    git worktree add /tmp/before <the commit before the change>
    (cd /tmp/before && python setup.py build_ext --inplace)
    python bench/captures.py --baseline /tmp/before --rounds 7

Method (see BENCHMARKS.md, section "Reading captures"):

* the input is ``captures/example.jsonl`` (a real capture, kafka-python through the
  proxy to Tansu) made large by repetition, as ``bench/analyze.py`` makes it
  (:func:`analyze.repeat_capture`: each copy's connection and flow ids shifted);
* each measurement is a fresh Python process that imports kinspect from one
  checkout (this one, or ``--baseline DIR``: first on its ``PYTHONPATH``, run in a
  temporary directory so that nothing else comes first; it says which kinspect
  it imported, and the run stops on the wrong one, or when the decoder does
  not use its C extension there) and times one step on the
  file: ``read`` (:func:`kinspect.capture.read_capture`: the checked records),
  ``load`` (:func:`kinspect.capture.load_capture` without decoding: the flows
  paired, what ``show`` does first) and ``decode`` (``load``, then every flow
  decoded with the codec and let go, as ``show --browse`` does before it opens);
* CPU seconds of the process (``time.process_time``) and wall seconds, around the
  step only (imports and loading the specs excluded; the decoders of the message
  versions met are compiled, or read from the code cache, on first use, within
  ``decode``, some 40 ms); the checkouts and steps take turns round by round, in an
  order rotated each round; the result is the median over the rounds, and the
  median over the rounds of each step's ratio this checkout / baseline (CPU),
  with the lowest and highest. Both checkouts must read the same number of
  records or flows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "captures" / "example.jsonl"
STEPS = ("read", "load", "decode")

#: what a measuring process runs (``python -c``): argv = step, capture
CHILD = r"""
import json, sys, time
import kinspect
from kinspect.capture import load_capture, read_capture
from kinspect.codec import Codec
from kinspect.codec.native import native_module
from kinspect.proxy.pipeline import decode_flow
step, path = sys.argv[1], sys.argv[2]
codec = Codec()
cpu, wall = time.process_time(), time.perf_counter()
if step == "read":
    n = sum(1 for _ in read_capture(path))
else:
    cap = load_capture(path, codec, decode=False)
    n = len(cap.flows)
    if step == "decode":
        for f in cap.flows:
            decode_flow(codec, f)
            f.request_decoded = f.response_decoded = None
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
native = native_module() is not None  # (the C fast path in use)
print(json.dumps({"kinspect": kinspect.__file__, "native": native, "cpu": cpu,
                  "wall": wall, "n": n}))
"""


def measure(checkout: Path, step: str, capture: Path, workdir: Path) -> dict:
    """One measuring process of ``step`` importing kinspect from ``checkout``.

    Raises:
        RuntimeError: the process failed, imported kinspect from elsewhere, or its
            decoder did not use the C extension."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.run([sys.executable, "-c", CHILD, step, str(capture)], env=env,
                          cwd=workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{step} from {checkout} failed:\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    want = checkout / "kinspect" / "__init__.py"
    if Path(out["kinspect"]).resolve() != want.resolve():
        raise RuntimeError(f"{step}: imported {out['kinspect']}, not {want}")
    if not out["native"]:
        raise RuntimeError(f"{checkout}: the decoder does not use its C extension there "
                           "(not built: python setup.py build_ext --inplace; or "
                           "KINSPECT_NATIVE=0)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=2000,
                   help="copies of captures/example.jsonl in the input (2000)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help="another checkout, measured in the same rounds")
    args = p.parse_args(argv)
    checkouts = {"this": ROOT}
    if args.baseline is not None:
        base = args.baseline.resolve()
        if not (base / "kinspect" / "__init__.py").is_file():
            p.error(f"--baseline {base}: no kinspect checkout there")
        checkouts["baseline"] = base
    sys.path.insert(0, str(HERE))
    from analyze import repeat_capture

    with tempfile.TemporaryDirectory(prefix="kinspect-bench-captures-") as tmp:
        work = Path(tmp)
        capture = work / "input.jsonl"
        lines = repeat_capture(EXAMPLE, capture, args.repeat)
        size = capture.stat().st_size
        print(f"input: {EXAMPLE.name} x {args.repeat}: {lines} frame lines, "
              f"{size / 1e6:.0f} MB", flush=True)
        turns = [(name, step) for step in args.steps for name in checkouts]
        results: dict[tuple[str, str], list[dict]] = {t: [] for t in turns}
        for r in range(args.rounds):
            k = r % len(turns)
            for name, step in turns[k:] + turns[:k]:
                one = measure(checkouts[name], step, capture, work)
                results[(name, step)].append(one)
                print(f"round {r + 1}: {name} {step}: cpu {one['cpu']:.2f} s, "
                      f"wall {one['wall']:.2f} s, {one['n']} items", flush=True)
    for step in args.steps:
        counts = {x["n"] for name in checkouts for x in results[(name, step)]}
        if len(counts) != 1:
            raise SystemExit(f"{step}: the checkouts read different counts: {sorted(counts)}")
    print()
    print(f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, input "
          f"{EXAMPLE.name} x {args.repeat} ({lines} frame lines, {size / 1e6:.0f} MB), "
          f"median of {args.rounds} rounds"
          + (f"; baseline {checkouts['baseline']}" if "baseline" in checkouts else ""))
    print()
    head = "| step | checkout | CPU s | wall s | µs per frame line (CPU) |"
    if "baseline" in checkouts:
        head += " CPU this / baseline (per round: lowest–highest) |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for step in args.steps:
        for name in checkouts:
            rs = results[(name, step)]
            cpu = statistics.median(x["cpu"] for x in rs)
            wall = statistics.median(x["wall"] for x in rs)
            row = (f"| {step} | {name} | {cpu:.2f} | {wall:.2f} | "
                   f"{cpu / lines * 1e6:.1f} |")
            if "baseline" in checkouts:
                if name == "this":
                    ratios = [a["cpu"] / b["cpu"] for a, b in
                              zip(rs, results[("baseline", step)])]
                    row += (f" ×{statistics.median(ratios):.2f} "
                            f"({min(ratios):.2f}–{max(ratios):.2f}) |")
                else:
                    row += " - |"
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
