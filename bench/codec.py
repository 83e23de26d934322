"""Codec throughput: kinspect vs kafka-python 3 (compiled path) vs kio, side by side.

Usage::

    python bench/codec.py                 # table on stdout
    python bench/codec.py --rounds 9 --markdown
    python bench/codec.py --only metadata --profile decode

Method (see BENCHMARKS.md): every frame body is built once with kinspect, then
checked to decode and re-encode byte-identically with each library (a library that
cannot is reported, not timed). Timing is interleaved: in each round every
(library, operation) is timed once over a batch sized to take about
``--batch-ms`` milliseconds; the result is the median over ``--rounds`` rounds of
the per-operation time. Only message bodies are timed (no 4-byte size prefix, no
header): that is what all three libraries decode with one call.

Libraries:

* kinspect: ``MessageCodec.decode(body, version)`` / ``MessageCodec.encode(value, version)``
  (decoding through the C fast path, kinspect/codec/_native.c); ``kinspect-py``: the
  same decode on the generated Python decoder alone (as with ``KINSPECT_NATIVE=0``).
* kafka-python 3: ``Cls.decode(body, version=v)`` / ``obj.encode(version=v)``, its
  exec-compiled per-(struct, version) path (``compiled_decode_from`` /
  ``compiled_encode_into``).
* kio: ``kio.serial.entity_reader(Cls)(body, 0)`` (Rust) /
  ``kio.serial.entity_writer(Cls)(BytesIO, obj)`` (Python).
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kinspect.codec import MessageCodec, default_registry


@dataclass
class Case:
    name: str
    message: str  # kinspect spec name
    version: int
    value: Any
    kp: str  # kafka-python module.class
    kio: str  # kio module path (class name = message)


def _records(n: int, size: int, seed: int) -> bytes:
    """A real v2 record batch (kafka-python's builder) with ``n`` records of ``size`` bytes."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    rnd = random.Random(seed)
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 24)
    for i in range(n):
        b.append(timestamp=1_700_000_000_000 + i, key=f"key-{i}".encode(),
                 value=bytes(rnd.getrandbits(8) for _ in range(size)), headers=[])
    b.close()
    return bytes(b.buffer())


def metadata_case(reg) -> Case:
    mc = reg.codec("MetadataResponse")
    top = mc.spec.struct
    T = top.field("Topics").struct
    P = T.field("Partitions").struct
    B = top.field("Brokers").struct
    rnd = random.Random(1)
    topics = []
    for t in range(100):
        parts = [P.cls(ErrorCode=0, PartitionIndex=p, LeaderId=p % 3, LeaderEpoch=7,
                       ReplicaNodes=[p % 3, (p + 1) % 3, (p + 2) % 3],
                       IsrNodes=[p % 3, (p + 1) % 3, (p + 2) % 3], OfflineReplicas=[])
                 for p in range(12)]
        topics.append(T.cls(ErrorCode=0, Name=f"orders.region-{t:03d}.events",
                            TopicId=rnd.randbytes(16), IsInternal=False, Partitions=parts,
                            TopicAuthorizedOperations=-2147483648))
    value = mc.cls(ThrottleTimeMs=0,
                   Brokers=[B.cls(NodeId=i, Host=f"broker-{i}.kafka.internal", Port=9092,
                                  Rack=f"rack-{i}") for i in range(3)],
                   ClusterId="Kq3v1bQvQk2l0Xr5yYc0dA", ControllerId=1, Topics=topics,
                   ClusterAuthorizedOperations=-2147483648)
    return Case("MetadataResponse v12 (100 topics x 12 partitions)", "MetadataResponse", 12,
                value, "kafka.protocol.metadata.MetadataResponse",
                "kio.schema.metadata.v12.response")


def fetch_case(reg) -> Case:
    mc = reg.codec("FetchResponse")
    top = mc.spec.struct
    T = top.field("Responses").struct
    P = T.field("Partitions").struct
    A = P.field("AbortedTransactions").struct
    rnd = random.Random(2)
    responses = []
    for t in range(4):
        parts = []
        for p in range(4):
            parts.append(P.cls(PartitionIndex=p, ErrorCode=0, HighWatermark=1000 + p,
                               LastStableOffset=1000 + p, LogStartOffset=0,
                               AbortedTransactions=[A.cls(ProducerId=7, FirstOffset=3)] if p == 0 else [],
                               PreferredReadReplica=-1,
                               Records=_records(20, 200, seed=t * 10 + p)))
        responses.append(T.cls(Topic="", TopicId=rnd.randbytes(16), Partitions=parts))
    value = mc.cls(ThrottleTimeMs=0, ErrorCode=0, SessionId=123, Responses=responses)
    return Case("FetchResponse v13 (4 topics x 4 partitions, 20 x 200 B records each)",
                "FetchResponse", 13, value, "kafka.protocol.consumer.FetchResponse",
                "kio.schema.fetch.v13.response")


def produce_case(reg) -> Case:
    mc = reg.codec("ProduceRequest")
    top = mc.spec.struct
    T = top.field("TopicData").struct
    P = T.field("PartitionData").struct
    topics = [T.cls(Name=f"payments-{t}",
                    PartitionData=[P.cls(Index=p, Records=_records(10, 100, seed=100 + t * 10 + p))
                                   for p in range(3)])
              for t in range(5)]
    value = mc.cls(TransactionalId=None, Acks=-1, TimeoutMs=30000, TopicData=topics)
    return Case("ProduceRequest v9 (5 topics x 3 partitions, 10 x 100 B records each)",
                "ProduceRequest", 9, value, "kafka.protocol.producer.ProduceRequest",
                "kio.schema.produce.v9.request")


def api_versions_case(reg) -> Case:
    mc = reg.codec("ApiVersionsResponse")
    top = mc.spec.struct
    AV = top.field("ApiKeys").struct
    keys = [AV.cls(ApiKey=k, MinVersion=0, MaxVersion=(k * 7) % 17) for k in range(75)]
    value = mc.cls(ErrorCode=0, ApiKeys=keys, ThrottleTimeMs=0)
    return Case("ApiVersionsResponse v3 (75 api keys)", "ApiVersionsResponse", 3, value,
                "kafka.protocol.metadata.ApiVersionsResponse",
                "kio.schema.api_versions.v3.response")


CASES = {"metadata": metadata_case, "fetch": fetch_case, "produce": produce_case,
         "apiversions": api_versions_case}


def _import(dotted: str):
    mod, _, name = dotted.rpartition(".")
    return getattr(__import__(mod, fromlist=[name]), name)


def implementations(reg, case: Case, body: bytes) -> dict[str, tuple[Callable, Callable] | str]:
    """name -> (decode(), encode()) thunks, or a string saying why it is not timed."""
    out: dict[str, tuple[Callable, Callable] | str] = {}
    mc = reg.codec(case.message)
    v = case.version
    value = mc.decode(body, v)
    assert mc.encode(value, v) == body
    out["kinspect"] = (lambda: mc.decode(body, v), lambda: mc.encode(value, v))
    # the same codec on its generated Python decoder alone (as with KINSPECT_NATIVE=0)
    py = MessageCodec(mc.spec)
    py.compiled(v).native = None
    assert py.decode(body, v) == value
    out["kinspect-py"] = (lambda: py.decode(body, v), None)

    try:
        kcls = _import(case.kp)
        kobj = kcls.decode(body, version=v)
        # decode() builds the object with __new__; give it what encode() expects
        for attr in ("_header", "_min_version", "_max_version"):
            try:
                object.__getattribute__(kobj, attr)
            except AttributeError:
                object.__setattr__(kobj, attr, None)
        if kobj.encode(version=v) != body:
            out["kafka-python"] = "re-encodes differently"
        else:
            out["kafka-python"] = (lambda: kcls.decode(body, version=v),
                                   lambda: kobj.encode(version=v))
    except Exception as e:  # noqa: BLE001 - report, do not time
        out["kafka-python"] = f"{type(e).__name__}: {e}"

    try:
        from kio.serial import entity_reader, entity_writer

        kio_cls = getattr(__import__(case.kio, fromlist=[case.message]), case.message)
        reader = entity_reader(kio_cls)
        writer = entity_writer(kio_cls)
        obj, size = reader(body, 0)

        def kio_encode():
            buf = io.BytesIO()
            writer(buf, obj)
            return buf.getvalue()

        if size != len(body):
            out["kio"] = f"decoded {size} of {len(body)} bytes"
        elif kio_encode() != body:
            out["kio"] = "re-encodes differently"
        else:
            out["kio"] = (lambda: reader(body, 0), kio_encode)
    except Exception as e:  # noqa: BLE001
        out["kio"] = f"{type(e).__name__}: {e}"
    return out


def _per_op(fn: Callable, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _calibrate(fn: Callable, batch_s: float) -> int:
    n = 1
    while True:
        t = _per_op(fn, n) * n
        if t >= batch_s / 4 or n >= 1 << 20:
            return max(1, int(n * batch_s / max(t, 1e-9)))
        n *= 4


def run(case: Case, reg, rounds: int, batch_s: float) -> dict:
    mc = reg.codec(case.message)
    body = mc.encode(case.value, case.version)
    impls = implementations(reg, case, body)
    timed = {k: v for k, v in impls.items() if not isinstance(v, str)}
    ops = [(lib, op, fns[i]) for lib, fns in timed.items() for i, op in enumerate(("decode", "encode"))
           if fns[i] is not None]
    sizes = {(lib, op): _calibrate(fn, batch_s) for lib, op, fn in ops}
    samples: dict[tuple[str, str], list[float]] = {(lib, op): [] for lib, op, _ in ops}
    for r in range(rounds):
        order = ops[:] if r % 2 == 0 else ops[::-1]
        for lib, op, fn in order:
            samples[(lib, op)].append(_per_op(fn, sizes[(lib, op)]))
    med = {k: statistics.median(v) for k, v in samples.items()}
    best = {k: min(v) for k, v in samples.items()}
    return {"case": case.name, "bytes": len(body), "median": med, "best": best,
            "skipped": {k: v for k, v in impls.items() if isinstance(v, str)}}


def run_scan(case: Case, reg, rounds: int, batch_s: float) -> dict:
    """kinspect only: ``MessageCodec.top_level_tags`` (a walk without building
    values) against ``MessageCodec.decode`` of the same body, interleaved."""
    mc = reg.codec(case.message)
    body = mc.encode(case.value, case.version)
    v = case.version
    fns = {"decode": lambda: mc.decode(body, v), "scan": lambda: mc.top_level_tags(body, v)}
    sizes = {k: _calibrate(f, batch_s) for k, f in fns.items()}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            samples[k].append(_per_op(fns[k], sizes[k]))
    return {"case": case.name, "bytes": len(body),
            "median": {k: statistics.median(x) for k, x in samples.items()}}


def report_scan(results: list[dict]) -> str:
    lines = ["| frame | bytes | decode ms | scan ms | decode / scan |", "|---|---:|---:|---:|---:|"]
    for r in results:
        d, sc = r["median"]["decode"], r["median"]["scan"]
        lines.append(f"| {r['case']} | {r['bytes']} | {_fmt_ms(d)} | {_fmt_ms(sc)} | {d / sc:.2f}x |")
    return "\n".join(lines)


def _fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def report(results: list[dict], markdown: bool) -> str:
    libs = ["kinspect", "kafka-python", "kio", "kinspect-py"]
    lines = []
    if markdown:
        lines.append("| frame | bytes | op | kinspect ms | kafka-python ms | kio ms | "
                     "kafka-python / kinspect | kio / kinspect | kafka-python / kinspect, "
                     "best rounds | kinspect, Python decoder alone: ms (kafka-python / it) |")
        lines.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for res in results:
        for op in ("decode", "encode"):
            t = {lib: res["median"].get((lib, op)) for lib in libs}
            b = {lib: res["best"].get((lib, op)) for lib in libs}
            ki = t["kinspect"]
            ratio = {lib: (f"{t[lib] / ki:.2f}x" if t[lib] and ki else "-") for lib in libs}
            best_kp = (f"{b['kafka-python'] / b['kinspect']:.2f}x"
                       if b["kafka-python"] and b["kinspect"] else "-")
            kpy = t["kinspect-py"]
            py_col = (f"{_fmt_ms(kpy)} ({t['kafka-python'] / kpy:.2f}x)"
                      if kpy and t["kafka-python"] else "-")
            if markdown:
                lines.append(f"| {res['case']} | {res['bytes']} | {op} | {_fmt_ms(ki)} | "
                             f"{_fmt_ms(t['kafka-python'])} | {_fmt_ms(t['kio'])} | "
                             f"{ratio['kafka-python']} | {ratio['kio']} | {best_kp} | {py_col} |")
            else:
                lines.append(f"{res['case'][:48]:48} {res['bytes']:>7} {op:6} "
                             f"kinspect {_fmt_ms(ki):>8}  kafka-python {_fmt_ms(t['kafka-python']):>8} "
                             f"({ratio['kafka-python']:>6}, best {best_kp:>6})  "
                             f"kio {_fmt_ms(t['kio']):>8} ({ratio['kio']:>6})"
                             + (f"  Python decoder alone {py_col}" if kpy else ""))
        for lib, why in res["skipped"].items():
            lines.append(f"{'' if not markdown else '<!-- '}{res['case']}: {lib} not timed: "
                         f"{why}{'' if not markdown else ' -->'}")
    return "\n".join(lines)


def machine_note() -> str:
    import kafka
    try:
        import kio
        kio_v = kio.__version__
    except ImportError:
        kio_v = "absent"
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"Python {platform.python_version()} on {platform.machine()} "
            f"({os.cpu_count()} cores, {platform.processor() or platform.system()}), "
            f"kafka-python {kafka.__version__}, kio {kio_v}, load average {load[0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch-ms", type=float, default=100.0)
    ap.add_argument("--only", action="append", choices=sorted(CASES))
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--scan", action="store_true",
                    help="time kinspect's scan (top-level tags, no values built) against its decode")
    ap.add_argument("--profile", choices=("decode", "encode"),
                    help="profile kinspect on the chosen cases instead of timing")
    args = ap.parse_args(argv)
    reg = default_registry()
    cases = [CASES[k](reg) for k in (args.only or CASES)]
    if args.profile:
        import cProfile
        import pstats

        for c in cases:
            mc = reg.codec(c.message)
            body = mc.encode(c.value, c.version)
            val = mc.decode(body, c.version)
            if args.profile == "decode":
                fn = functools.partial(mc.decode, body, c.version)
            else:
                fn = functools.partial(mc.encode, val, c.version)
            prof = cProfile.Profile()
            prof.runcall(lambda f=fn: [f() for _ in range(200)])
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return 0
    if args.scan:
        print(machine_note())
        print(f"median of {args.rounds} interleaved rounds, per operation")
        print(report_scan([run_scan(c, reg, args.rounds, args.batch_ms / 1e3) for c in cases]))
        return 0
    results = [run(c, reg, args.rounds, args.batch_ms / 1e3) for c in cases]
    print(machine_note())
    print(f"median of {args.rounds} interleaved rounds, per operation (best = fastest rounds)")
    print(report(results, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
