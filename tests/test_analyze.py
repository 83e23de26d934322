"""`kinspect analyze` on Spark: the job runs with local[2] on a capture recorded from
real traffic (kafka-python -> the real proxy -> a real Tansu broker) and its tables
must equal the single-process computation over the same capture; the facts the
tables state are also checked against the capture lines and the workload.

One SparkSession and one recorded capture serve the whole module.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kinspect.analysis import reference, schema
from kinspect.analysis.job import (
    JobConfig,
    build_session,
    run_job,
    ship_specs,
    spec_info,
    stop_session,
)
from kinspect.analysis.sample import record_sample
from kinspect.capture import CaptureWarning
from kinspect.codec import SpecRegistry, default_registry

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("KINSPECT_KAFKA_SPECS",
                             REPO.parent / "shared" / "kafka-message-specs" / "message"))


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """A real capture, plus a gzipped copy whose last line is torn (a crash)."""
    d = tmp_path_factory.mktemp("captures")
    result = record_sample(d / "a.jsonl", messages=30)
    lines = (d / "a.jsonl").read_bytes()
    frame_line = next(x for x in lines.splitlines() if b'"type":"frame"' in x)
    with gzip.open(d / "b.jsonl.gz", "wb") as fh:
        fh.write(lines + frame_line[: len(frame_line) // 2])  # torn, no newline
    return result, d


@pytest.fixture(scope="module")
def spark():
    session = build_session("local[2]")
    try:
        yield session
    finally:
        stop_session(session)  # (and its JVM, before pytest ends)
        stop_session(session)  # (a second call does nothing: no error)


@pytest.fixture(scope="module")
def job(spark, sample, tmp_path_factory):
    _, caps = sample
    out = tmp_path_factory.mktemp("analysis")
    with pytest.warns(CaptureWarning, match="torn"):  # b.jsonl.gz's last line, as reference
        result = run_job(spark, [str(caps)], out)
    return result, out


@pytest.fixture(scope="module")
def ref(sample):
    _, caps = sample
    with pytest.warns(CaptureWarning, match="torn"):
        return reference.compute([caps])


def parquet_rows(out: Path, table: str) -> list[dict]:
    return reference.sort_rows(table, pq.read_table(out / table).to_pylist())


def raw_frames(caps: Path) -> list[dict]:
    """Frame lines of both captures, read here with json (the gz copy's torn line
    dropped), each tagged with its capture."""
    out = []
    for path in sorted(caps.iterdir()):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            data = fh.read()
        for raw in data.split(b"\n"):
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if rec.get("type") == "frame":
                rec["capture"] = path.name
                out.append(rec)
    return out


# ---------------------------------------------------------------------------
# Spark == single process


@pytest.mark.parametrize("table", list(schema.TABLES))
def test_spark_tables_equal_the_single_process_computation(job, ref, table):
    _, out = job
    got = parquet_rows(out, table)
    want = ref[table]
    assert len(got) == len(want)
    assert got == want
    assert pq.read_table(out / table).schema.names == schema.TABLES[table].names


def test_result_counts_match_the_tables(job, ref):
    result, _ = job
    assert result.tables == {name: len(rows) for name, rows in ref.items()}
    assert result.api_stats == ref["api_stats"]


# ---------------------------------------------------------------------------
# what the tables say, checked against the capture and the workload


def test_every_frame_is_paired_by_connection_and_correlation_id(job, sample):
    _, caps = sample
    _, out = job
    frames = raw_frames(caps)
    flows = parquet_rows(out, "flows")
    by_flow = defaultdict(dict)
    for f in frames:
        by_flow[(f["capture"], f["flow"])][f["dir"]] = f
    assert len(flows) == len(by_flow)  # the proxy's own flow ids agree with our pairing
    assert sum(f["request_bytes"] is not None for f in flows) == \
        sum(f["dir"] == "req" for f in frames)
    for f in flows:
        lines = by_flow[(f["capture"], f["flow"])]
        req, resp = lines.get("req"), lines.get("resp")
        assert f["request_bytes"] == len(base64.b64decode(req["frame"]))
        assert f["correlation_id"] == req["correlation_id"]
        if resp is not None:
            assert f["response_bytes"] == len(base64.b64decode(resp["frame"]))
            assert f["latency_ns"] == resp["ts_ns"] - req["ts_ns"]
        assert f["decode_error"] is None and f["request_decoded"]
    assert {f["capture"] for f in flows} == {"a.jsonl", "b.jsonl.gz"}


def test_api_stats_use_nearest_rank_percentiles(job, sample):
    _, caps = sample
    _, out = job
    lat = defaultdict(list)
    by_flow = defaultdict(dict)
    for f in raw_frames(caps):
        by_flow[(f["capture"], f["flow"])][f["dir"]] = f
    for lines in by_flow.values():
        req, resp = lines["req"], lines.get("resp")
        if resp is not None:
            lat[(req["api_key"], req["api_version"])].append(resp["ts_ns"] - req["ts_ns"])
    stats = parquet_rows(out, "api_stats")
    assert {(r["api_key"], r["api_version"]) for r in stats} == set(lat)
    for r in stats:
        values = sorted(lat[(r["api_key"], r["api_version"])])
        assert r["latency_count"] == len(values)
        for p in (50, 95, 99):
            assert r[f"latency_p{p}_ns"] == values[math.ceil(p / 100 * len(values)) - 1]
        assert r["latency_p50_ns"] <= r["latency_p95_ns"] <= r["latency_p99_ns"] \
            <= r["latency_max_ns"] == values[-1]


def test_topics_count_records_and_compression_per_codec(job, sample):
    result, _ = sample
    _, out = job
    rows = parquet_rows(out, "topics")
    assert {r["topic"] for r in rows} == {result.topic}
    produced = defaultdict(int)
    fetched = defaultdict(int)
    for r in rows:
        produced[r["codec"]] += r["produced_records"]
        fetched[r["codec"]] += r["fetched_records"]
        ratio = r["compression_ratio"]
        if r["codec"] == "none":
            assert ratio == 1.0
        else:
            assert ratio > 1.0  # repetitive text compresses
    copies = 2  # the capture and its gzipped copy
    assert dict(produced) == {c: n * copies for c, n in result.produced.items()}
    assert sum(fetched.values()) >= result.consumed * copies


def test_clients_carry_the_software_name_and_version_from_api_versions(job):
    import kafka

    _, out = job
    rows = parquet_rows(out, "clients")
    ids = {r["client_id"] for r in rows}
    assert {"kinspect-analysis-consumer", "kinspect-analysis-gzip"} <= ids
    for r in rows:
        assert r["client_software_name"] == "kafka-python"
        assert r["client_software_version"] == kafka.__version__
        assert r["connections"] >= 1 and r["flows"] >= r["connections"]


def test_tagged_fields_count_sections_and_name_known_tags(job):
    _, out = job
    flows = parquet_rows(out, "flows")
    rows = parquet_rows(out, "tagged_fields")
    flexible_requests = defaultdict(int)
    for f in flows:
        if f["request_header_version"] == 2:
            flexible_requests[(f["api_key"], f["api_version"])] += 1
    header_sections = {(r["api_key"], r["api_version"]): r["count"] for r in rows
                       if r["path"] == "RequestHeader" and r["kind"] == "section"}
    assert header_sections == dict(flexible_requests)
    reg = default_registry()
    for r in rows:
        if r["kind"] != "known":
            continue
        spec = reg.messages[r["message"]]
        st = spec.struct
        for part in r["path"].split(".")[1:]:
            st = st.field(part).struct
        assert st.field(r["name"]).tag == r["tag"]
        assert r["bytes"] > r["data_bytes"] >= 0


def test_what_if_reencodes_losslessly_and_orders_the_variants(job, ref):
    _, out = job
    rows = parquet_rows(out, "what_if")
    flows = ref["flows"]
    assert len(rows) == sum(f["request_decoded"] + f["response_decoded"] for f in flows)
    for r in rows:
        assert r["fixed_bytes"] == r["bytes"]
        assert r["best_bytes"] <= r["packed_bytes"]
        if r["upacked_bytes"] is not None:
            assert r["upacked_bytes"] <= r["packed_bytes"]
    assert any(r["upacked_bytes"] is None for r in rows)  # -1 defaults exist in real traffic
    assert sum(r["best_bytes"] for r in rows) < sum(r["bytes"] for r in rows)


# ---------------------------------------------------------------------------
# specs on the executors, the command line, the report


def _executor_specs(spark, config: JobConfig) -> list[tuple]:
    sc = spark.sparkContext
    return sc.parallelize(range(2), 2).mapPartitions(spec_info(config)).collect()


def test_executors_load_the_shipped_spec_set(spark, tmp_path):
    config = ship_specs(spark, [], tmp_path)
    assert config.shipped and not config.defaults and config.spec_paths
    driver = default_registry()
    for sources, count, pid in _executor_specs(spark, config):
        assert count == len(driver.messages)
        assert all(Path(s).name in config.spec_paths for s in sources)
        assert all(not s.startswith(str(tmp_path)) for s in sources)  # executors' copies
        assert pid != os.getpid()


def test_executors_load_specs_given_with_specs(spark, tmp_path):
    corpus = SpecRegistry.load([str(CORPUS)])
    assert len(corpus.messages) > len(default_registry().messages)  # inter-broker apis
    config = ship_specs(spark, [str(CORPUS)], tmp_path)
    for _, count, _ in _executor_specs(spark, config):
        assert count == len(corpus.messages)


def test_cli_python_engine_writes_tables_and_report(sample, ref, tmp_path):
    from kinspect.cli import main

    _, caps = sample
    out = tmp_path / "out"
    with pytest.warns(CaptureWarning):
        assert main(["analyze", str(caps), "--out", str(out), "--engine", "python",
                     "--report", "--quiet"]) == 0
    for table in schema.TABLES:
        assert parquet_rows(out, table) == ref[table]
    page = (out / "report.html").read_text()
    assert page.count("<svg") == 3
    for title in ("Latency per api", "Bytes per api", "What-if encodings", "Clients", "Topics",
                  "Tagged fields"):
        assert title in page


@pytest.mark.parametrize("extra", [["--master", "spark://nowhere:7077"], ["--conf", "a=b"],
                                   ["--no-ship-specs"], ["--ship-code"]])
def test_cli_python_engine_refuses_spark_options(sample, tmp_path, capsys, extra):
    """The Spark options with --engine python are a usage error naming them (they
    were taken, and ignored, with exit 0)."""
    from kinspect.cli import main

    _, caps = sample
    out = tmp_path / "out"
    assert main(["analyze", str(caps), "--out", str(out), "--engine", "python", *extra]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert extra[0] in err and "Spark options; --engine python runs no Spark" in err, err
    assert not out.exists()


def test_cli_spark_engine_on_a_running_session(spark, sample, ref, tmp_path, capsys):
    from kinspect.cli import main

    _, caps = sample
    cap = tmp_path / "a capture.jsonl"  # Spark reports file paths %-escaped
    shutil.copy(caps / "a.jsonl", cap)
    out = tmp_path / "out"
    assert main(["analyze", str(cap), "--out", str(out), "--no-what-if",
                 "--report", str(tmp_path / "r.html")]) == 0
    assert not spark.sparkContext._jsc.sc().isStopped()  # the CLI left our session alone
    printed = capsys.readouterr()
    assert "writing flows" in printed.err  # progress, step by step
    assert "Per api and version" in printed.out  # the summary
    flows = parquet_rows(out, "flows")
    assert {f["capture"] for f in flows} == {"a capture.jsonl"}
    assert len(flows) == len([f for f in ref["flows"] if f["capture"] == "a.jsonl"])
    assert not (out / "what_if").exists()
    assert (tmp_path / "r.html").exists()


def _processes_with(marker: str) -> list[str]:
    """``"PID: command line"`` of the running processes whose environment holds
    ``marker`` (a variable every descendant of a process inherits; from /proc)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:  # (ended meanwhile, or not ours to read)
            continue
        found.append(f"{pid}: {cmd[:300]}")
    return found


def test_cli_stops_the_jvm_it_started_before_it_exits(sample, tmp_path):
    """``kinspect analyze`` with Spark ends its JVM before it exits: the JVM of a
    session it built is waited for (``spark.stop()`` alone left it running, orphaned,
    until it noticed its parent was gone, a second or two later)."""
    _, caps = sample
    marker = f"kinspect-test-{os.getpid()}-{time.monotonic_ns()}"
    # output to a file, not a pipe: the JVM holds the pipe too, and reading a pipe to
    # its end would wait for the JVM as well
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "kinspect", "analyze", str(caps / "a.jsonl"), "--out",
             str(tmp_path / "out"), "--master", "local[1]", "--no-what-if", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, timeout=600,
            check=False, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "KINSPECT_TEST_MARKER": marker})
        left = _processes_with(marker)
        for line in left:  # (every process a test starts, it stops)
            with contextlib.suppress(OSError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
        err.seek(0)
        assert proc.returncode == 0, err.read()[-3000:]
    assert len(parquet_rows(tmp_path / "out", "flows")) > 0
    assert not left, left


@pytest.mark.slow
def test_spark_submit_runs_the_job_script(sample, tmp_path):
    import pyspark

    _, caps = sample
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    out = tmp_path / "out"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(submit), "--master", "local[1]", str(REPO / "kinspect/analysis/job.py"),
         str(caps / "a.jsonl"), "--out", str(out), "--no-what-if", "--quiet", "--ship-code"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(parquet_rows(out, "flows")) > 0
    shutil.rmtree(out)


# ---------------------------------------------------------------------------
# pairing: a correlation id used again after an acks=0 Produce


def _send(sock, codec, req) -> None:
    import struct

    frame = codec.encode_request(req)
    sock.sendall(struct.pack(">i", len(frame)) + frame)


def _read_until(sock, corr: int) -> bytes:
    """Response frames (no size prefix) until the one answering ``corr``."""
    import struct

    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "the proxy closed the connection"
            buf += chunk
        return buf

    while True:
        (size,) = struct.unpack(">i", exact(4))
        frame = exact(size)
        if struct.unpack(">i", frame[:4])[0] == corr:
            return frame


@pytest.fixture(scope="module")
def acks0_capture(tmp_path_factory):
    """A capture of one raw client connection through the real proxy to a real Tansu:
    ApiVersions (corr 1), an acks=0 Produce (corr 7, which expects no answer),
    Metadata (corr 8), then Metadata again with corr 7. Returns the capture
    directory and the bytes of the answer to the second Metadata request."""
    import socket

    from kinspect.analysis.sample import ProxyThread
    from kinspect.brokers import TansuBroker
    from kinspect.codec import Codec
    from kinspect.tolerate import BaselineContext, _records, build_request

    d = tmp_path_factory.mktemp("acks0")
    codec = Codec()
    ctx = BaselineContext("kinspect-acks0", "g", bytes(16), "kinspect-acks0", _records())
    with TansuBroker() as broker, ProxyThread(broker.bootstrap, d / "acks0.jsonl") as pt:
        host, port = pt.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            _send(sock, codec, build_request(codec, 18, 0, ctx, correlation_id=1))
            apis = {k.ApiKey: k.MaxVersion
                    for k in codec.decode_response(_read_until(sock, 1), 18, 0).body.ApiKeys}
            pv = min(apis[0], codec.registry.request(0).valid_versions.highest)
            mv = min(apis[3], codec.registry.request(3).valid_versions.highest)
            produce = build_request(codec, 0, pv, ctx, correlation_id=7)
            produce.body.Acks = 0
            _send(sock, codec, produce)
            _send(sock, codec, build_request(codec, 3, mv, ctx, correlation_id=8))
            _read_until(sock, 8)  # answers come in order: nothing for corr 7 is left
            _send(sock, codec, build_request(codec, 3, mv, ctx, correlation_id=7))
            answer = _read_until(sock, 7)
    return d, answer


def test_acks0_produce_does_not_take_the_answer_of_a_reused_correlation_id(
        spark, acks0_capture, tmp_path):
    """An acks=0 Produce gets no answer, so the next request with its correlation id
    owns the next answer with that id: both engines pair them as the proxy did."""
    caps, answer = acks0_capture
    ref = reference.compute([caps])
    run_job(spark, [str(caps)], tmp_path, what_if=False)
    spark_flows = parquet_rows(tmp_path, "flows")
    assert spark_flows == ref["flows"]
    flows = [f for f in spark_flows if f["correlation_id"] == 7 and f["request_bytes"]]
    by_api = {f["api_name"]: f for f in flows}
    assert set(by_api) == {"Produce", "Metadata"}
    assert by_api["Produce"]["response_bytes"] is None
    assert by_api["Produce"]["latency_ns"] is None
    meta = by_api["Metadata"]
    assert meta["response_bytes"] == len(answer)
    assert meta["response_decoded"] and meta["decode_error"] is None
    assert meta["latency_ns"] is not None and meta["latency_ns"] >= 0


def test_pairing_takes_a_line_without_ts_ns_first_as_spark_does():
    """``ts_ns`` may be null on a frame line (not known): the reference orders it
    first, as Spark's ascending order does, instead of failing to compare it."""
    def line(n, d, ts):
        return {"type": "frame", "capture": "c", "line": n, "conn": 1, "dir": d,
                "correlation_id": 3, "ts_ns": ts, "frame": bytes([n])}  # as read_frames

    pairs = reference.pair_frames([line(1, "req", 50), line(2, "req", None),
                                   line(3, "resp", 60), line(4, "resp", 70)])
    assert [(p["seq"], p["req_frame"], p["resp_frame"]) for p in pairs] == [
        (1, b"\x02", b"\x03"), (2, b"\x01", b"\x04")]


def test_appended_captures_keep_their_connections_apart(spark, sample, tmp_path):
    """``cat a.jsonl a.jsonl > c.jsonl``: the second capture numbers its connections
    and flows from 1 again; both engines move them past the first one's, as the
    capture reader of every other command does (kinspect.capture.load_capture), so
    no two connections merge (clients count each, and pairing stays per connection)."""
    from kinspect.capture import load_capture

    _, caps = sample
    d = tmp_path / "caps"
    d.mkdir()
    data = (caps / "a.jsonl").read_bytes()
    (d / "c.jsonl").write_bytes(data + data)
    # and a rotated capture (a second part: same start_ns, part 1) goes on as it is
    lines = data.splitlines(keepends=True)
    session = json.loads(lines[0])
    half = len(lines) // 2
    (d / "r.jsonl").write_bytes(b"".join(lines[:half]))
    (d / "r.1.jsonl").write_bytes(json.dumps({**session, "part": 1}).encode() + b"\n"
                                  + b"".join(lines[half:]))
    single = load_capture(caps / "a.jsonl", decode=False)
    both = load_capture(d / "c.jsonl", decode=False)
    want = sorted((f.conn, f.id) for f in both.flows)
    assert len(want) == 2 * len(single.flows)
    assert len({c for c, _ in want}) == 2 * len({f.conn for f in single.flows})
    rotated = sorted((f.conn, f.id) for f in single.flows)
    assert sorted((f.conn, f.id) for f in load_capture(d / "r.jsonl", decode=False).flows) \
        == rotated

    ref = reference.compute([d], what_if=False)
    run_job(spark, [str(d)], tmp_path / "out", what_if=False)
    for flows in (ref["flows"], parquet_rows(tmp_path / "out", "flows")):
        assert sorted((f["conn"], f["flow"]) for f in flows if f["capture"] == "c.jsonl") \
            == want
        assert sorted((f["conn"], f["flow"]) for f in flows if f["capture"] == "r.jsonl") \
            == rotated
        assert all(f["decode_error"] is None for f in flows)
    assert parquet_rows(tmp_path / "out", "clients") == ref["clients"]
    conns = {f.conn for f in single.flows}
    assert sum(r["connections"] for r in ref["clients"]) == 3 * len(conns)


def test_a_corrupt_line_is_an_error_in_both_engines_and_a_torn_last_line_a_warning(
        spark, sample, tmp_path):
    """A frame line cut short in the middle of a capture, one without its frame, or
    one with a non-integer id, is a CaptureError for the reference
    (kinspect.capture.read_capture), so the Spark job must not drop the frame without
    a word either; a torn last line is skipped by both, with a warning."""
    from kinspect.capture import CaptureError

    _, caps = sample
    lines = (caps / "a.jsonl").read_bytes().splitlines(keepends=True)
    i = next(n for n, x in enumerate(lines) if b'"type":"frame"' in x and n > 2)
    cases = {
        "cut.jsonl": lines[:i] + [lines[i][: len(lines[i]) // 2] + b"\n"] + lines[i + 1:],
        "strconn.jsonl": lines[:i] + [lines[i].replace(b'"conn":', b'"conn":"', 1)
                                      .replace(b',"dir"', b'","dir"', 1)] + lines[i + 1:],
        # an integer beyond 64 bits: Spark cannot hold it, the reference refuses it too
        "bigts.jsonl": lines[:i] + [re.sub(rb'"ts_ns":\d+', b'"ts_ns":%d' % 2**70, lines[i],
                                           count=1)] + lines[i + 1:],
        # a frame line without its frame: kinspect show refuses it too
        "nullframe.jsonl": lines[:i] + [re.sub(rb'"frame":"[^"]*"', b'"frame":null', lines[i],
                                               count=1)] + lines[i + 1:],
    }
    assert json.loads(cases["nullframe.jsonl"][i])["frame"] is None
    assert json.loads(cases["strconn.jsonl"][i])["conn"].isdigit()
    assert json.loads(cases["bigts.jsonl"][i])["ts_ns"] == 2**70
    for name, content in cases.items():
        d = tmp_path / name.split(".")[0]
        d.mkdir()
        (d / name).write_bytes(b"".join(content))
        with pytest.raises(CaptureError) as ref_err:
            reference.compute([d], what_if=False)
        with pytest.raises(CaptureError, match=name) as job_err:
            run_job(spark, [str(d)], tmp_path / "out" / "tables", what_if=False)
        # (the job left the directories it made for its tables: an empty --out)
        assert not (tmp_path / "out").exists()
        if name == "cut.jsonl":  # both name the line (the job named none)
            assert f"{name}:{i + 1}:" in str(ref_err.value), ref_err.value
            assert f"{name}:{i + 1}:" in str(job_err.value), job_err.value

    d = tmp_path / "torn"
    d.mkdir()
    (d / "torn.jsonl").write_bytes(b"".join(lines) + lines[i][: len(lines[i]) // 2])
    with pytest.warns(CaptureWarning, match="torn"):
        ref = reference.compute([d], what_if=False)
    with pytest.warns(CaptureWarning, match="torn"):
        run_job(spark, [str(d)], tmp_path / "torn-out", what_if=False)
    assert parquet_rows(tmp_path / "torn-out", "flows") == ref["flows"]


MAX_ID = 2**63 - 1


def _both_fail(spark, d: Path, out: Path) -> tuple[str, str]:
    """The CaptureError texts of both engines on the captures in ``d``."""
    from kinspect.capture import CaptureError

    with pytest.raises(CaptureError) as ref_err:
        reference.compute([d], what_if=False)
    with pytest.raises(CaptureError) as job_err:
        run_job(spark, [str(d)], out, what_if=False)
    return str(ref_err.value), str(job_err.value)


def test_lone_surrogates_in_line_strings_are_written_as_u_fffd(spark, sample, tmp_path):
    """A JSON escape such as "\ud800" is valid JSON but decodes to a lone surrogate,
    which Parquet cannot hold (the python engine raised UnicodeEncodeError; Spark
    wrote "?"). Both engines write each lone surrogate of a line's client,
    upstream and flags as U+FFFD and keep a surrogate pair, and an escaped
    backslash followed by "ud800" stays that text."""
    _, caps = sample
    # client text per connection (conn % 4), and what the tables must hold
    clients = {0: ("\udc80\ud800:1", "\ufffd\ufffd:1"),
               1: ("\\ud800", "\\ud800"),  # a backslash, then "ud800": no escape
               2: ("\U0001f600:2", "\U0001f600:2"),  # written as a pair of escapes
               3: ("\\\ud800:3", "\\\ufffd:3")}  # a backslash, then a lone surrogate
    out_lines = []
    for raw in (caps / "a.jsonl").read_bytes().splitlines():
        rec = json.loads(raw)
        if rec.get("type") == "frame":
            rec["client"] = clients[rec["conn"] % 4][0]
            rec["upstream"] = "UPSTREAM"
            rec["flags"] = [*rec.get("flags", ()), "\ud800", "x"]
        text = json.dumps(rec)  # ensure_ascii: every surrogate written as an escape
        # upper-case hex: a pair (U+10FFFF), then a lone high surrogate
        out_lines.append(text.replace('"UPSTREAM"', '"\\uDBFF\\uDFFF\\uDBFFx"'))
    assert "\\udc80\\ud800:1" in "".join(out_lines)
    d = tmp_path / "caps"
    d.mkdir()
    (d / "s.jsonl").write_text("\n".join(out_lines) + "\n")

    ref = reference.compute([d])
    reference.write_tables(ref, tmp_path / "py")  # Parquet takes them now
    run_job(spark, [str(d)], tmp_path / "spark")
    for out in (tmp_path / "py", tmp_path / "spark"):
        flows = parquet_rows(out, "flows")
        assert flows
        assert {f["client"] for f in flows} == {want for _, want in clients.values()}
        for f in flows:
            assert f["client"] == clients[f["conn"] % 4][1]
            assert f["upstream"] == "\U0010ffff\ufffdx"
            assert "\ufffd" in f["flags"] and "x" in f["flags"]
            assert not any("\ud800" <= c <= "\udfff" for c in f["client"] + "".join(f["flags"]))
    for table in schema.TABLES:
        assert parquet_rows(tmp_path / "spark", table) == parquet_rows(tmp_path / "py", table)

    # a file name that is not UTF-8 (lone surrogates in Python) names its capture
    # with U+FFFD; Spark cannot open such a path (Java paths are text) and says so
    from kinspect.capture import CaptureError

    d = tmp_path / "names"
    d.mkdir()
    (d / os.fsdecode(b"\xffcap.jsonl")).write_bytes((caps / "a.jsonl").read_bytes())
    ref = reference.compute([d], what_if=False)
    reference.write_tables(ref, tmp_path / "named")
    assert {f["capture"] for f in parquet_rows(tmp_path / "named", "flows")} == \
        {"\ufffdcap.jsonl"}
    with pytest.raises(CaptureError, match="not UTF-8; rename it"):
        run_job(spark, [str(d)], tmp_path / "named-spark", what_if=False)


def test_ids_moved_past_64_bits_in_appended_captures_are_an_error_naming_the_line(
        spark, sample, tmp_path, capsys):
    """``cat a.jsonl b.jsonl``: b's connections and flows are moved past a's ids; when
    that passes 2**63-1 (a's ids near it) both engines stop with the same
    CaptureError naming the file, the line and the id (OverflowError before), and
    the command exits with 1 and no traceback."""
    from kinspect.cli import main

    _, caps = sample
    lines = (caps / "a.jsonl").read_bytes().splitlines(keepends=True)

    def first_with(key: str) -> tuple[int, int]:
        """1-based line of the second capture's first line holding ``key``, its value."""
        for n, raw in enumerate(lines, len(lines) + 1):
            rec = json.loads(raw)
            if rec.get("type") in ("conn", "frame") and key in rec:
                return n, rec[key]
        raise AssertionError(key)

    for key in ("conn", "flow"):
        big = [re.sub(rb'"%s":\d+' % key.encode(), b'"%s":%d' % (key.encode(), MAX_ID), x)
               for x in lines]
        assert big != lines
        d = tmp_path / key
        d.mkdir()
        (d / "c.jsonl").write_bytes(b"".join(big + lines))
        n, value = first_with(key)
        base = MAX_ID  # the highest id before it
        ref_text, job_text = _both_fail(spark, d, tmp_path / "out")
        assert ref_text == job_text
        assert ref_text.startswith(f"{d / 'c.jsonl'}:{n}: {key!r} {value} ")
        assert str(value + base) in ref_text and "2**63-1" in ref_text

    assert main(["analyze", str(tmp_path / "conn"), "--out", str(tmp_path / "cli"),
                 "--engine", "python", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "kinspect: error:" in err and "c.jsonl:" in err and "Traceback" not in err


def test_a_frame_that_is_not_base64_is_an_error_in_both_engines(spark, tmp_path):
    """``frame``/``frame_sent`` are strict base64 strings, as ``kinspect show`` reads
    them: a number, ``true``, a list, characters outside the alphabet or bad
    padding stop both engines with the same CaptureError naming the key and line
    (a TypeError, or bytes made up by lenient decoding, before). A string of
    digits, or "true", is base64 text and is read."""
    session = json.dumps({"type": "session", "start_ns": 1, "part": 0})

    def capture(req_extra: str) -> str:
        req = ('{"type":"frame","ts_ns":1,"conn":1,"dir":"req","flow":1,"api_key":18,'
               '"api_version":4,"correlation_id":1,' + req_extra + "}")
        resp = ('{"type":"frame","ts_ns":2,"conn":1,"dir":"resp","flow":1,"api_key":18,'
                '"api_version":4,"correlation_id":1,"frame":"AAAAAQAA"}')
        return "\n".join([session, req, resp]) + "\n"

    bad = {"int": ('"frame":123', "frame"),
           "digits_int": ('"frame":1234', "frame"),  # its text "1234" is base64
           "true": ('"frame":true', "frame"),
           "bang": ('"frame":"!!!!"', "frame"),
           "padding": ('"frame":"AAAAA"', "frame"),
           "inner_pad": ('"frame":"AA=A"', "frame"),
           "newline": ('"frame":"AAAA\\n"', "frame"),
           "sent_list": ('"frame":"AAAA","frame_sent":[1]', "frame_sent"),
           "sent_big": ('"frame":"AAAA","frame_sent":12345678901234567890123456789012',
                        "frame_sent")}
    for name, (extra, key) in bad.items():
        d = tmp_path / name
        d.mkdir()
        (d / f"{name}.jsonl").write_text(capture(extra))
        ref_text, job_text = _both_fail(spark, d, tmp_path / "out")
        assert ref_text == job_text == f"{d / f'{name}.jsonl'}:2: {key} is not base64", name

    d = tmp_path / "good"
    d.mkdir()
    (d / "digits.jsonl").write_text(capture('"frame":"1234"'))
    (d / "true.jsonl").write_text(capture('"frame":"true","frame_sent":""'))
    ref = reference.compute([d], what_if=False)
    run_job(spark, [str(d)], tmp_path / "good-out", what_if=False)
    flows = parquet_rows(tmp_path / "good-out", "flows")
    assert flows == ref["flows"]
    assert sorted(f["request_bytes"] for f in flows) == [3, 3]  # 4 base64 letters: 3 bytes


def test_lines_without_type_are_frame_lines_in_both_engines(spark, sample, tmp_path):
    """capture.py's readers (``show``, ``export``...) take a line without ``type`` as
    a frame line (captures of other tools); analyze dropped them. Without the
    key the frames give the flows they give with it; ``"type": null`` is no frame
    line, as for those readers."""
    _, caps = sample
    lines = (caps / "a.jsonl").read_bytes().splitlines(keepends=True)
    untyped = [x.replace(b'"type":"frame",', b"", 1) for x in lines]
    assert sum(b'"type":"frame"' in x for x in untyped) == 0
    i = next(n for n, x in enumerate(lines) if b'"dir":"req"' in x)
    null = re.sub(rb'"correlation_id":\d+', b'"correlation_id":987654',
                  lines[i].replace(b'"type":"frame"', b'"type":null', 1), count=1)
    assert json.loads(null)["type"] is None
    d = tmp_path / "caps"
    d.mkdir()
    (d / "t.jsonl").write_bytes(b"".join(lines))
    (d / "u.jsonl").write_bytes(b"".join(untyped[:i + 1] + [null] + untyped[i + 1:]))
    requests = sum(b'"dir":"req"' in x for x in lines)

    ref = reference.compute([d], what_if=False)
    run_job(spark, [str(d)], tmp_path / "out", what_if=False)
    for flows in (ref["flows"], parquet_rows(tmp_path / "out", "flows")):
        typed = [{**f, "capture": None} for f in flows if f["capture"] == "t.jsonl"]
        bare = [{**f, "capture": None} for f in flows if f["capture"] == "u.jsonl"]
        assert sum(f["request_bytes"] is not None for f in typed) == requests
        assert bare == typed
    assert parquet_rows(tmp_path / "out", "flows") == ref["flows"]


def test_rotated_parts_pair_in_part_order_without_timestamps(spark, tmp_path):
    """Lines without ``ts_ns`` (another tool's capture) pair in line order; across
    rotated parts that is part order, whatever order Spark reads the files in (it
    packs the larger part first). A correlation id used twice on a connection,
    its first request in part 0 and the rest in part 1, pairs each request with
    its own answer in both engines."""
    from kinspect.codec import Codec, Response
    from kinspect.tolerate import BaselineContext, build_request

    codec = Codec()
    ctx = BaselineContext("t", "g", bytes(16), "kinspect-test", b"")

    def response(api_key, version, body):
        cls = codec.response_codec(api_key).cls
        hcls = codec.registry.header("ResponseHeader").cls
        return codec.encode_response(Response(
            api_key, version, 5, codec.response_header_version(api_key, version),
            hcls(CorrelationId=5), cls.from_dict(body), 0, codec.api_name(api_key), version))

    def line(d, frame, api_key=None, version=None, conn=1):
        rec = {"type": "frame", "ts_ns": None, "conn": conn, "dir": d, "correlation_id": 5,
               "frame": base64.b64encode(frame).decode()}
        if d == "req":
            rec.update(api_key=api_key, api_version=version)
        return json.dumps(rec) + "\n"

    api_req = codec.encode_request(build_request(codec, 18, 0, ctx, correlation_id=5))
    api_resp = response(18, 0, {"ErrorCode": 0, "ApiKeys": [
        {"ApiKey": 18, "MinVersion": 0, "MaxVersion": 3},
        {"ApiKey": 3, "MinVersion": 0, "MaxVersion": 12}]})
    meta_req = codec.encode_request(build_request(codec, 3, 1, ctx, correlation_id=5))
    meta_resp = response(3, 1, {"Brokers": [], "ControllerId": 1, "Topics": []})
    session = {"type": "session", "start_ns": 1, "part": 0}
    d = tmp_path / "caps"
    d.mkdir()
    (d / "r.jsonl").write_text(json.dumps(session) + "\n" + line("req", api_req, 18, 0))
    padding = "".join(line("req", api_req, 18, 0, conn=2) + line("resp", api_resp, conn=2)
                      for _ in range(200))  # part 1 is the larger file
    (d / "r.1.jsonl").write_text(json.dumps({**session, "part": 1}) + "\n"
                                 + line("resp", api_resp) + line("req", meta_req, 3, 1)
                                 + line("resp", meta_resp) + padding)
    ref = reference.compute([d], what_if=False)
    run_job(spark, [str(d)], tmp_path / "out", what_if=False)
    assert len(api_resp) != len(meta_resp)
    for flows in (ref["flows"], parquet_rows(tmp_path / "out", "flows")):
        conn1 = {f["api_name"]: f for f in flows if f["conn"] == 1}
        assert set(conn1) == {"ApiVersions", "Metadata"}
        assert conn1["ApiVersions"]["response_bytes"] == len(api_resp)
        assert conn1["Metadata"]["response_bytes"] == len(meta_resp)
        assert all(f["decode_error"] is None and f["response_decoded"] for f in flows)


def test_file_names_with_glob_and_uri_characters_are_read_as_named(spark, sample, tmp_path):
    """Spark expands glob characters in the paths it reads and names files by their
    %-escaped URI: a capture named ``x[1].jsonl`` or ``a{b,c}.jsonl`` must be read
    (it was an AnalysisException), ``st*r.jsonl`` must not read ``stXr.jsonl`` a
    second time, and every capture keeps its own name, as the reference reads them."""
    _, caps = sample
    lines = (caps / "a.jsonl").read_bytes().splitlines(keepends=True)
    d = tmp_path / "odd [dir]"
    d.mkdir()
    names = ["x[1].jsonl", "a{b,c}.jsonl", "st*r.jsonl", "stXr.jsonl", "a b#%20.jsonl",
             "q?ü.jsonl"]
    for i, name in enumerate(names):  # each its own number of lines
        (d / name).write_bytes(b"".join(lines[: len(lines) - 3 * i]))
    ref = reference.compute([d], what_if=False)
    assert {f["capture"] for f in ref["flows"]} == set(names)
    run_job(spark, [str(d)], tmp_path / "out", what_if=False)
    for table in ("flows", "api_stats", "clients"):
        assert reference.sort_rows(table, parquet_rows(tmp_path / "out", table)) \
            == ref[table], table


def test_a_file_spark_cannot_read_as_named_is_a_capture_error(spark, sample, tmp_path):
    """Spark picks the decompression by the file suffix and Hadoop cannot open a
    file whose name holds ':'; the reference reads both. The job refuses them up
    front with a CaptureError naming the file, rather than failing in a task with
    a Java stack trace."""
    from kinspect.capture import CaptureError

    _, caps = sample
    plain = (caps / "a.jsonl").read_bytes()
    for name, data in {"plain.jsonl.gz": plain, "at-12:30.jsonl": plain,
                       "packed.jsonl": gzip.compress(plain)}.items():
        d = tmp_path / name.replace(":", "_")
        d.mkdir()
        (d / name).write_bytes(data)
        assert reference.compute([d / name], what_if=False)["flows"]
        with pytest.raises(CaptureError, match=name):
            run_job(spark, [str(d / name)], tmp_path / "out", what_if=False)


def test_cli_errors_are_one_line_not_tracebacks(spark, sample, tmp_path, capsys):
    """An --out that is a file fails before any Spark work, with the path named; a
    master Spark refuses is a plain error too (the JVM already said why). Both
    printed as ``kinspect: error: ...`` with status 1, no Python traceback."""
    from kinspect.cli import main

    _, caps = sample
    (tmp_path / "taken").write_text("a file")
    assert main(["analyze", str(caps / "a.jsonl"), "--out", str(tmp_path / "taken"),
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "kinspect: error:" in err and "taken" in err and "Not a directory" in err
    assert (tmp_path / "taken").read_text() == "a file"

    proc = subprocess.run([sys.executable, "-m", "kinspect", "analyze", str(caps / "a.jsonl"),
                           "--out", str(tmp_path / "out"), "--master", "nowhere://x",
                           "--quiet"], capture_output=True, text=True, timeout=300, check=False,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "kinspect: error: Spark did not start with --master 'nowhere://x'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_request_cut_off_by_its_connection_closing_is_flagged_closed(spark, sample,
                                                                        tmp_path):
    """A request with no response on a connection that has a close line is flagged
    ``closed`` in the flows table of both engines, as ``kinspect show`` flags it
    (``flows_from_records``; the proxy writes the flag on no frame line). In a
    capture appended to another, the close line of the first one's connection of the
    same number does not count (ids moved past, as for the frames)."""
    from kinspect.capture import flows_from_records, read_capture

    _, caps = sample
    lines = (caps / "a.jsonl").read_bytes().splitlines(keepends=True)
    recs = [json.loads(x) for x in lines]
    resp = next(i for i, r in enumerate(recs) if r.get("type") == "frame"
                and r["dir"] == "resp" and r["api_key"] != 18)
    conn, flow = recs[resp]["conn"], recs[resp]["flow"]
    assert any(r.get("type") == "conn" and r.get("event") == "close" and r["conn"] == conn
               for r in recs)
    # one: the response gone; two: a.jsonl, then a copy with that response and the
    # connection's close line gone (its request: not closed, only unanswered)
    one = [x for i, x in enumerate(lines) if i != resp]
    second = [x for i, x in enumerate(lines) if i != resp and not (
        recs[i].get("type") == "conn" and recs[i].get("event") == "close"
        and recs[i]["conn"] == conn)]
    d = tmp_path / "caps"
    d.mkdir()
    (d / "one.jsonl").write_bytes(b"".join(one))
    (d / "two.jsonl").write_bytes(b"".join(lines + second))

    shown = {f.id: f.flags for f in flows_from_records(read_capture(d / "one.jsonl"),
                                                        decode=False).flows}
    assert "closed" in shown[flow]
    assert sum("closed" in f for f in shown.values()) == 1
    ref = reference.compute([d], what_if=False)
    run_job(spark, [str(d)], tmp_path / "out", what_if=False)
    spark_flows = parquet_rows(tmp_path / "out", "flows")
    assert spark_flows == ref["flows"]
    closed = [(f["capture"], f["flow"]) for f in spark_flows if "closed" in f["flags"]]
    assert closed == [("one.jsonl", flow)]
    two = [f for f in spark_flows if f["capture"] == "two.jsonl"]
    cut = max(f["flow"] for f in two if f["response_bytes"] is None)
    assert cut > flow and "closed" not in next(f for f in two if f["flow"] == cut)["flags"]
