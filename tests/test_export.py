"""pcapng export, checked with tshark: Wireshark's own Kafka dissector must find the
api keys and correlation ids of the capture, on the capture's real ports, with valid
IP/TCP checksums and no TCP analysis complaints.

tshark is a test dependency (Debian package ``tshark``, installed by .ci/run); a
missing tshark fails these tests.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from kinspect import cli
from kinspect.capture import flows_from_records, load_capture, read_capture
from kinspect.codec import Codec
from kinspect.export import _checksum, _free_port, export_pcapng
from kinspect.filters import parse

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "captures" / "example.jsonl"
CODEC = Codec()


def tshark(pcap: Path, port: int, *fields: str, display: str = "kafka",
           extra: tuple[str, ...] = ()) -> list[list[str]]:
    exe = shutil.which("tshark")
    assert exe, "tshark is needed (Debian package tshark; .ci/run installs it)"
    cmd = [exe, "-r", str(pcap), "-d", f"tcp.port=={port},kafka", *extra, "-Y", display,
           "-T", "fields"]
    for f in fields:
        cmd += ["-e", f]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [line.split("\t") for line in res.stdout.splitlines() if line]


@pytest.fixture(scope="module")
def cap():
    return load_capture(EXAMPLE, CODEC)


def upstream_port(cap) -> int:
    return int(cap.session["upstream"].rsplit(":", 1)[1])


def test_tshark_dissects_every_frame_as_kafka(cap, tmp_path):
    out = tmp_path / "example.pcapng"
    stats = export_pcapng(cap, out)
    port = upstream_port(cap)
    assert stats.ports == {port}
    assert stats.frames == len(cap.frames) and stats.connections == len(cap.conns)
    reqs = tshark(out, port, "tcp.srcport", "kafka.api_key", "kafka.api_version",
                  "kafka.correlation_id", "kafka.len", display=f"kafka && tcp.dstport=={port}")
    want = [(str(int(r.flow.client.rsplit(":", 1)[1])), str(r.flow.api_key),
             str(r.flow.api_version), str(r.flow.correlation_id), str(len(r.flow.request)))
            for r in cap.frames if r.dir == "req"]
    assert [tuple(x) for x in reqs] == want
    resps = tshark(out, port, "kafka.correlation_id", "kafka.len",
                   display=f"kafka && tcp.srcport=={port}")
    want = [(str(r.flow.correlation_id), str(len(r.flow.response)))
            for r in cap.frames if r.dir == "resp"]
    assert [tuple(x) for x in resps] == want


def test_checksums_are_valid_and_tcp_streams_are_clean(cap, tmp_path):
    out = tmp_path / "example.pcapng"
    stats = export_pcapng(cap, out)
    port = upstream_port(cap)
    rows = tshark(out, port, "ip.checksum.status", "tcp.checksum.status", display="tcp",
                  extra=("-o", "tcp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE"))
    assert len(rows) == stats.packets
    assert {tuple(r) for r in rows} == {("1", "1")}  # 1 = good
    stamps = [float(r[0]) for r in tshark(out, port, "frame.time_epoch", display="tcp")]
    assert stamps == sorted(stamps), "packets are not in time order"
    assert tshark(out, port, "frame.number", display="tcp.analysis.flags && "
                  "!tcp.analysis.window_update") == []
    # every connection opens with a handshake and (closed by the client) finishes
    syn = tshark(out, port, "tcp.stream", display="tcp.flags.syn==1 && tcp.flags.ack==0")
    fin = tshark(out, port, "tcp.stream", display="tcp.flags.fin==1")
    assert len(syn) == len(cap.conns)
    closed = sum(1 for c in cap.conns.values() if c.get("close_ns") is not None)
    assert len(fin) == 2 * closed


def test_large_frames_are_segmented_and_reassembled(cap, tmp_path):
    out = tmp_path / "small-mss.pcapng"
    stats = export_pcapng(cap, out, mss=64)
    assert stats.packets > 2 * len(cap.frames)
    port = upstream_port(cap)
    reqs = tshark(out, port, "kafka.api_key", "kafka.correlation_id",
                  display=f"kafka && tcp.dstport=={port}")
    assert [tuple(x) for x in reqs] == [(str(r.flow.api_key), str(r.flow.correlation_id))
                                        for r in cap.frames if r.dir == "req"]


def test_filtered_export_keeps_only_matching_frames(cap, tmp_path):
    port = upstream_port(cap)
    out = tmp_path / "produce.pcapng"
    export_pcapng(cap, out, flt=parse("~api Produce"))
    rows = tshark(out, port, "kafka.correlation_id", "tcp.dstport")
    produce = [f for f in cap.flows if f.api_key == 0]
    assert len(rows) == 2 * len(produce)
    assert sorted(r[0] for r in rows if r[1] == str(port)) == sorted(
        str(f.correlation_id) for f in produce)
    out = tmp_path / "requests.pcapng"
    export_pcapng(cap, out, flt=parse("~dir req"))
    rows = tshark(out, port, "tcp.srcport")
    assert len(rows) == sum(1 for r in cap.frames if r.dir == "req")
    assert str(port) not in {r[0] for r in rows}


def test_sent_bytes_of_rewritten_responses(cap, tmp_path):
    rewritten = [f for f in cap.flows if f.response_sent is not None]
    assert rewritten
    port = upstream_port(cap)
    received, sent = tmp_path / "received.pcapng", tmp_path / "sent.pcapng"
    export_pcapng(cap, received, flt=parse("~rewritten & ~dir resp"))
    export_pcapng(cap, sent, flt=parse("~rewritten & ~dir resp"), sent=True)
    lens = [int(r[0]) for r in tshark(received, port, "kafka.len")]
    lens_sent = [int(r[0]) for r in tshark(sent, port, "kafka.len")]
    assert lens == [len(f.response) for f in rewritten]
    assert lens_sent == [len(f.response_sent) for f in rewritten]


def test_ipv6_and_host_names(tmp_path):
    recs = []
    for r in read_capture(EXAMPLE):
        if r.get("type") in ("frame", "conn"):
            r = dict(r, client="::1:" + r["client"].rsplit(":", 1)[1],
                     upstream="localhost:9092")
        recs.append(r)
    cap = flows_from_records(recs, CODEC, decode=False)
    out = tmp_path / "v6.pcapng"
    export_pcapng(cap, out)
    rows = tshark(out, 9092, "ipv6.src", "ipv6.dst", "kafka.api_key",
                  display="kafka && tcp.dstport==9092")
    assert {(r[0], r[1]) for r in rows} == {("::1", "::ffff:198.18.0.1")}
    assert len(rows) == sum(1 for r in cap.frames if r.dir == "req")


def test_lone_surrogates_and_times_before_the_epoch_export(tmp_path):
    """A capture's strings may hold lone surrogates (valid JSON escapes such as
    ``"\\ud800"``) and its times precede 1970: pcapng holds UTF-8 text and unsigned
    times, so the names and comments carry the escapes and such times are the epoch
    (both were a UnicodeEncodeError, or a time in the year 2554)."""
    recs = []
    for r in read_capture(EXAMPLE):
        if r.get("type") in ("frame", "conn"):
            r = dict(r, upstream="broker\ud800:9092")
        if r.get("type") == "frame":
            r = dict(r, flags=["x\udcff"], ts_ns=-1)
        recs.append(r)
    cap = flows_from_records(recs, CODEC, decode=False)
    out = tmp_path / "s.pcapng"
    export_pcapng(cap, out)
    rows = tshark(out, 9092, "frame.time_epoch", "frame.comment", display="kafka")
    assert len(rows) == len(cap.frames)
    assert all(float(r[0]) == 0.0 for r in rows)
    assert any("\\udcff" in r[1] for r in rows)


def test_export_command(tmp_path, capsys):
    out = tmp_path / "sub" / "cli.pcapng"
    assert cli.main(["export", str(EXAMPLE), "--pcapng", str(out), "--filter",
                     "~api Fetch"]) == 0
    err = capsys.readouterr().err
    assert f"wrote {out}" in err and "-d tcp.port==" in err
    port = int(err.split("-d tcp.port==")[1].split(",")[0])
    rows = tshark(out, port, "kafka.api_key", display=f"kafka && tcp.dstport=={port}")
    assert rows and {r[0] for r in rows} == {"1"}
    assert cli.main(["export", str(EXAMPLE), "--pcapng", str(out), "--filter", "(~api"]) == 1


def test_internet_checksum_known_value():
    # RFC 1071 section 3 example: words 0001 f203 f4f5 f6f7 sum to 0xddf2
    assert _checksum(bytes.fromhex("0001f203f4f5f6f7")) == ~0xDDF2 & 0xFFFF
    assert _checksum(b"") == 0xFFFF
    buf = io.BytesIO()
    export_pcapng(load_capture(EXAMPLE, CODEC, decode=False), buf)
    assert buf.getvalue()[:4] == b"\x0a\x0d\x0d\x0a"  # pcapng section header block


# -- synthesised captures: edge cases of the TCP framing ---------------------------------

T0 = 1_700_000_000_000_000_000


def _b64(b: bytes) -> str:
    import base64
    return base64.b64encode(b).decode()


def _frame(conn, direction, frame, ts, *, flow, client="127.0.0.1:40000",
           upstream="127.0.0.1:9092", api_key=18, api_version=0, corr=None, flags=None):
    rec = {"type": "frame", "ts_ns": ts, "conn": conn, "dir": direction, "client": client,
           "upstream": upstream, "flow": flow, "api_key": api_key, "api_version": api_version,
           "correlation_id": flow if corr is None else corr, "frame": _b64(frame)}
    if flags:
        rec["flags"] = flags
    return rec


def _conn(conn, event, ts, client="127.0.0.1:40000", upstream="127.0.0.1:9092"):
    return {"type": "conn", "event": event, "ts_ns": ts, "conn": conn, "client": client,
            "upstream": upstream}


def _api_versions_req(corr: int) -> bytes:
    # request header v1 (api key 18, version 0, correlation id, ClientId "c"), empty v0 body
    return struct.pack(">hhih", 18, 0, corr, 1) + b"c"


def _api_versions_resp(corr: int) -> bytes:
    # ApiVersions v0 response: ErrorCode 0, ApiKeys [ {18, 0, 0} ]
    return struct.pack(">ihihhh", corr, 0, 1, 18, 0, 0)


def tcp_analysis(pcap: Path) -> list[list[str]]:
    """Packets Wireshark's TCP sequence analysis complains about."""
    return tshark(pcap, 9092, "frame.number", "_ws.col.Info", display="tcp.analysis.flags",
                  extra=("-o", "tcp.analyze_sequence_numbers:TRUE"))


def test_frames_with_unknown_or_earlier_timestamps_stay_in_connection_order(tmp_path):
    # ts_ns null (not known) and a response stamped before its request (clocks of
    # other tools' captures): TCP needs the connection's packets in its own order
    recs = [{"type": "session", "start_ns": T0, "part": 0},
            _conn(1, "open", T0),
            _frame(1, "req", _api_versions_req(1), T0 + 10_000, flow=1),
            _frame(1, "resp", _api_versions_resp(1), None, flow=1),
            _frame(1, "req", _api_versions_req(2), T0 + 30_000, flow=2),
            _frame(1, "resp", _api_versions_resp(2), T0 + 20_000, flow=2),
            _conn(1, "close", T0 + 40_000)]
    cap = flows_from_records(recs, CODEC, decode=False)
    out = tmp_path / "ts.pcapng"
    export_pcapng(cap, out)
    assert tcp_analysis(out) == []
    rows = tshark(out, 9092, "frame.time_epoch", "tcp.dstport", "tcp.flags.syn", "tcp.flags.fin",
                  "tcp.len", display="tcp")
    # handshake, request 1, response 1, request 2, response 2, FIN exchange
    to_broker = [r[1] == "9092" for r in rows]
    assert to_broker == [True, False, True, True, False, True, False, True, False, True]
    assert [r[2] for r in rows[:3]] == ["1", "1", "0"]
    assert [int(r[4]) for r in rows[3:7]] == [4 + 11, 4 + 16, 4 + 11, 4 + 16]  # size prefix + frame
    assert all(float(r[0]) >= T0 / 1e9 - 1 for r in rows), "a packet at the epoch"
    stamps = [float(r[0]) for r in rows]
    assert stamps == sorted(stamps)


def test_every_connection_is_its_own_tcp_stream(tmp_path):
    # two captures appended to each other (cat a.jsonl a.jsonl): the same client
    # ports and times again, as new connections; and a client port reused later
    recs = list(read_capture(EXAMPLE)) * 2
    cap = flows_from_records(recs, CODEC, decode=False)
    n = len(cap.conns)
    out = tmp_path / "cat.pcapng"
    stats = export_pcapng(cap, out)
    port = upstream_port(cap)
    assert stats.connections == n
    rows = tshark(out, port, "tcp.stream", "kafka.correlation_id",
                  display=f"kafka && tcp.dstport=={port}",
                  extra=("-o", "tcp.analyze_sequence_numbers:TRUE"))
    assert len({r[0] for r in rows}) == n
    want = sorted((r.flow.conn, r.flow.correlation_id) for r in cap.frames if r.dir == "req")
    streams: dict[str, list[str]] = {}
    for s, corr in rows:
        streams.setdefault(s, []).append(corr)
    got = sorted(sorted(v) for v in streams.values())
    by_conn: dict[int, list[str]] = {}
    for c, corr in want:
        by_conn.setdefault(c, []).append(str(corr))
    assert got == sorted(sorted(v) for v in by_conn.values())
    assert tshark(out, port, "frame.number", display="tcp.analysis.flags",
                  extra=("-o", "tcp.analyze_sequence_numbers:TRUE")) == []

    recs = [{"type": "session", "start_ns": T0, "part": 0}]
    for c in (1, 2):  # the same client address and port, one connection after the other
        t = T0 + c * 1_000_000
        recs += [_conn(c, "open", t), _frame(c, "req", _api_versions_req(1), t + 10, flow=c),
                 _frame(c, "resp", _api_versions_resp(1), t + 20, flow=c),
                 _conn(c, "close", t + 30)]
    out = tmp_path / "reuse.pcapng"
    export_pcapng(flows_from_records(recs, CODEC, decode=False), out)
    assert tcp_analysis(out) == []
    assert len({r[0] for r in tshark(out, 9092, "tcp.stream", display="tcp")}) == 2


def test_an_empty_frame_is_on_the_wire(tmp_path):
    # SaslHandshake v0, then raw SASL tokens without a Kafka header: an empty token
    # is a frame of size 0 (4 zero bytes) both ways
    handshake = struct.pack(">hhih", 17, 0, 1, 1) + b"c" + struct.pack(">h", 5) + b"PLAIN"
    answer = struct.pack(">ihih", 1, 0, 1, 5) + b"PLAIN"
    recs = [{"type": "session", "start_ns": T0, "part": 0},
            _conn(1, "open", T0),
            _frame(1, "req", handshake, T0 + 10, flow=1, api_key=17),
            _frame(1, "resp", answer, T0 + 20, flow=1, api_key=17),
            _frame(1, "req", b"", T0 + 30, flow=2, api_key=-1, api_version=-1, corr=-1,
                   flags=["sasl"]),
            _frame(1, "resp", b"", T0 + 40, flow=2, api_key=-1, api_version=-1, corr=-1,
                   flags=["sasl"])]
    cap = flows_from_records(recs, CODEC, decode=False)
    out = tmp_path / "sasl.pcapng"
    stats = export_pcapng(cap, out)
    assert stats.frames == 4
    sent = tshark(out, 9092, "tcp.payload", display="tcp.dstport==9092 && tcp.len>0")
    got = bytes.fromhex("".join(r[0] for r in sent))
    assert got == struct.pack(">i", len(handshake)) + handshake + b"\0\0\0\0"
    back = tshark(out, 9092, "tcp.payload", display="tcp.srcport==9092 && tcp.len>0")
    assert bytes.fromhex("".join(r[0] for r in back)) == (
        struct.pack(">i", len(answer)) + answer + b"\0\0\0\0")
    assert tcp_analysis(out) == []


@pytest.mark.parametrize("client", ["127.0.0.1:40000", "[::1]:40000"])
def test_segments_fit_one_ip_packet_whatever_the_mss(tmp_path, client):
    # IPv4 total length and IPv6 payload length are 16 bits: a 200 kB frame with an
    # mss past 65495 (IPv4) / 65515 (IPv6) must still be cut into packets that fit
    body = bytes(200_000)
    req = _api_versions_req(7) + body
    recs = [{"type": "session", "start_ns": T0, "part": 0},
            _frame(1, "req", req, T0 + 10, flow=7, client=client, upstream=client.replace(
                "40000", "9092")),
            _frame(1, "resp", _api_versions_resp(7), T0 + 20, flow=7, client=client,
                   upstream=client.replace("40000", "9092"))]
    cap = flows_from_records(recs, CODEC, decode=False)
    out = tmp_path / "big.pcapng"
    export_pcapng(cap, out, mss=100_000)
    v6 = client.startswith("[")
    lens = tshark(out, 9092, "ipv6.plen" if v6 else "ip.len", "tcp.len",
                  display="tcp.dstport==9092 && tcp.len>0")
    assert all(int(r[0]) <= 65535 for r in lens)
    assert sum(int(r[1]) for r in lens) == 4 + len(req)
    assert tcp_analysis(out) == []
    rows = tshark(out, 9092, "kafka.len", "kafka.correlation_id",
                  display="kafka && tcp.dstport==9092")
    assert rows == [[str(len(req)), "7"]]
    with pytest.raises(ValueError):
        export_pcapng(cap, io.BytesIO(), mss=0)


def test_flagged_frames_carry_a_packet_comment(tmp_path):
    # a redacted SaslAuthenticate exchange and a response to no known request: the
    # marker bytes and the undecodable answer are explained next to the packet
    marker = b"<kinspect:redacted>"
    auth = struct.pack(">hhih", 36, 0, 5, 1) + b"c" + struct.pack(">i", 19) + marker
    recs = [{"type": "session", "start_ns": T0, "part": 0},
            _frame(1, "req", auth, T0 + 10, flow=5, api_key=36),
            _frame(1, "resp", _api_versions_resp(99), T0 + 20, flow=6, api_key=-1,
                   api_version=-1, corr=99)]
    recs[1]["redacted"] = True
    cap = flows_from_records(recs, CODEC, decode=False)
    out = tmp_path / "flagged.pcapng"
    export_pcapng(cap, out, mss=16)  # several segments: the comment goes on the first
    rows = tshark(out, 9092, "frame.number", "frame.comment", "tcp.dstport", display="tcp.len>0")
    comments = [(r[2] == "9092", r[1]) for r in rows if r[1]]
    assert len(comments) == 2
    (to_broker, c1), (from_broker, c2) = comments
    assert to_broker and "flow 5 request" in c1 and "redacted" in c1
    assert not from_broker and "flow 6 response" in c2 and "unpaired" in c2
    first = {r[2] == "9092": r for r in reversed(rows)}
    assert first[True][1] == c1 and first[False][1] == c2
    assert all(not r[1] for r in rows if r is not first[True] and r is not first[False])


def test_a_capture_naming_no_addresses_gets_two_distinct_hosts(tmp_path):
    # captures of other tools need only conn, dir and frame (kinspect.capture)
    recs = [{"type": "frame", "conn": 1, "dir": "req", "frame": _b64(_api_versions_req(3))},
            {"type": "frame", "conn": 1, "dir": "resp", "frame": _b64(_api_versions_resp(3))}]
    cap = flows_from_records(recs, CODEC, decode=False)
    out = tmp_path / "bare.pcapng"
    export_pcapng(cap, out)
    rows = tshark(out, 9092, "ip.src", "ip.dst", "kafka.correlation_id", display="kafka")
    assert len(rows) == 2 and rows[0][2] == rows[1][2] == "3"
    assert rows[0][0] != rows[0][1] and (rows[1][0], rows[1][1]) == (rows[0][1], rows[0][0])
    names = subprocess.run(["tshark", "-r", str(out), "-N", "n", "-T", "fields", "-e", "ip.src_host",
                            "-e", "ip.dst_host", "-c", "1"], capture_output=True, text=True,
                           check=True)
    assert names.stdout.split() == ["kinspect-client", "kinspect-broker"]


def test_a_reused_client_port_never_takes_the_brokers_port(tmp_path):
    # the client port 9091 reused on the broker's host: the next free port is not
    # 9092, the broker's (a packet from 127.0.0.1:9092 to itself is no TCP stream)
    recs = [{"type": "session", "start_ns": T0, "part": 0}]
    for c in (1, 2):
        t = T0 + c * 1_000_000
        recs += [_frame(c, "req", _api_versions_req(c), t + 10, flow=c, client="127.0.0.1:9091"),
                 _frame(c, "resp", _api_versions_resp(c), t + 20, flow=c,
                        client="127.0.0.1:9091")]
    out = tmp_path / "broker-port.pcapng"
    export_pcapng(flows_from_records(recs, CODEC, decode=False), out)
    assert tcp_analysis(out) == []
    rows = tshark(out, 9092, "tcp.stream", "tcp.srcport", "kafka.correlation_id",
                  display="kafka && tcp.dstport==9092")
    assert [r[2] for r in rows] == ["1", "2"]
    assert rows[0][1] == "9091" and rows[1][1] not in ("9091", "9092")
    assert rows[0][0] != rows[1][0]


def test_free_client_ports_wrap_and_run_out():
    pair = ("client", "broker", 9092)
    cursor: dict = {}
    assert _free_port({9}, cursor, pair, 7) == 7  # not taken: kept
    used = {7, 8, 10}
    assert _free_port(used, cursor, pair, 7) == 9
    used.add(9)
    # the search goes on from where it stopped, not from the port again
    assert _free_port(used, cursor, pair, 7) == 11
    full = set(range(1, 65536)) - {3}
    assert _free_port(full, {}, pair, 65535) == 3  # wraps past 65535 to 1
    full.add(3)
    assert _free_port(full, {}, pair, 65535) is None


@pytest.mark.parametrize("client", ["127.0.0.1:70000", "127.0.0.1:-5"])
def test_a_port_out_of_range_gets_one_in_range(tmp_path, client):
    recs = [{"type": "session", "start_ns": T0, "part": 0},
            _frame(1, "req", _api_versions_req(4), T0 + 10, flow=4, client=client),
            _frame(1, "resp", _api_versions_resp(4), T0 + 20, flow=4, client=client)]
    out = tmp_path / "port.pcapng"
    export_pcapng(flows_from_records(recs, CODEC, decode=False), out)
    rows = tshark(out, 9092, "ip.src", "tcp.srcport", "kafka.correlation_id",
                  display="kafka && tcp.dstport==9092")
    assert rows[0][0] == "127.0.0.1" and 1 <= int(rows[0][1]) <= 65535 and rows[0][2] == "4"
    assert tcp_analysis(out) == []


def test_export_under_a_regular_file_says_not_a_directory(tmp_path, capsys):
    """An output path whose parent is a regular file: "FILE: Not a directory", not
    ``mkdir``'s "File exists" (which names a file that rightly exists)."""
    blocker = tmp_path / "ex.jsonl"
    blocker.write_text("x")
    assert cli.main(["export", str(EXAMPLE), "--pcapng", str(blocker / "x.pcapng")]) == 1
    err = capsys.readouterr().err
    assert f"kinspect: error: {blocker}: Not a directory" in err, err
    assert "File exists" not in err and "Traceback" not in err
