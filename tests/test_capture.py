"""Capture files: the CaptureWriter addon, reading back (torn lines, rotation, gzip),
redaction of secrets, rebuilding flows — and real clients (kafka-python and
confluent-kafka, with gzip, snappy, lz4 and zstd) recorded through the real proxy
in front of a real Tansu broker, then looked at with ``show``, filters and export.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kinspect import cli
from kinspect.brokers import TansuBroker
from kinspect.capture import (
    REDACTION_MARKER,
    CaptureError,
    CaptureWarning,
    CaptureWriter,
    add_capture_options,
    capture_addon_from_args,
    flows_from_records,
    load_capture,
    part_path,
    read_capture,
    redact_frame,
    redaction_marker,
)
from kinspect.capture_process import CaptureProcess
from kinspect.codec import Codec
from kinspect.codec.protocol import Request, Response
from kinspect.export import export_pcapng
from kinspect.filters import TopicIds, parse
from kinspect.flows import CLOSED, MUTATED, SASL_TOKEN, Flow
from kinspect.proxy.server import Proxy, ProxyConfig
from kinspect.show import flow_row, flow_summary, records_fields, records_summary

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "captures" / "example.jsonl"
CODEC = Codec()
COMPRESSIONS = ("gzip", "snappy", "lz4", "zstd")


# ---------------------------------------------------------------------------
# helpers: frames built with the codec, flows around them
# ---------------------------------------------------------------------------

def request_frame(api_key: int, api_version: int, corr: int, client_id: str = "t",
                  **body) -> bytes:
    cls = CODEC.request_codec(api_key).cls
    req = Request(api_key, api_version, corr, client_id,
                  CODEC.request_header_version(api_key, api_version), None, cls(**body), 0, "")
    return CODEC.encode_request(req)


def response_frame(api_key: int, api_version: int, corr: int, **body) -> bytes:
    cls = CODEC.response_codec(api_key).cls
    resp = Response(api_key, api_version, corr, CODEC.response_header_version(api_key, api_version),
                    None, cls(**body), 0, "", api_version)
    return CODEC.encode_response(resp)


def make_flow(fid: int, api_key: int, api_version: int, corr: int, request: bytes,
              response: bytes | None, conn: int = 1) -> Flow:
    f = Flow(fid, conn, "127.0.0.1:50000", "127.0.0.1:9092", api_key, api_version, corr,
             CODEC.api_name(api_key) if api_key >= 0 else "SaslToken", request, 1_000 + fid)
    f.response = response
    f.response_ns = None if response is None else 2_000 + fid
    return f


def write_flows(path: Path, flows: list[Flow], **kw) -> CaptureWriter:
    w = CaptureWriter(path, CODEC, upstream="127.0.0.1:9092", listen="127.0.0.1:19092", **kw)
    for f in flows:
        w.on_request(f)
        w.on_flow(f)
    w.close()
    return w


def lines_of(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def metadata_flows(n: int) -> list[Flow]:
    return [make_flow(i, 3, 12, i, request_frame(3, 12, i, Topics=None),
                      response_frame(3, 12, i, ClusterId="c", ControllerId=1))
            for i in range(1, n + 1)]


# ---------------------------------------------------------------------------
# writer and reader
# ---------------------------------------------------------------------------

def test_session_line_and_frame_lines(tmp_path):
    flows = metadata_flows(3)
    path = tmp_path / "cap.jsonl"
    write_flows(path, flows)
    lines = lines_of(path)
    assert lines[0]["type"] == "session"
    assert lines[0]["upstream"] == "127.0.0.1:9092" and lines[0]["listen"] == "127.0.0.1:19092"
    assert lines[0]["specs"] and all("path" in s and "origin" in s for s in lines[0]["specs"])
    frames = lines[1:]
    assert [(x["flow"], x["dir"]) for x in frames] == [
        (1, "req"), (1, "resp"), (2, "req"), (2, "resp"), (3, "req"), (3, "resp")]
    for x, f in zip(frames[::2], flows):
        assert base64.b64decode(x["frame"]) == f.request
        assert (x["api_key"], x["api_version"], x["correlation_id"]) == (3, 12, f.correlation_id)
        assert x["ts_ns"] == f.request_ns
    for x, f in zip(frames[1::2], flows):
        assert base64.b64decode(x["frame"]) == f.response
        assert x["ts_ns"] == f.response_ns
    assert not any("frame_sent" in x or "redacted" in x for x in frames)


def _expected_line(f: Flow, direction: str, frame: bytes, sent: bytes | None,
                   ts_ns, flags=None, redacted=False) -> bytes:
    """A frame line as the format defines it: compact json.dumps of the record."""
    rec = {"type": "frame", "ts_ns": ts_ns, "conn": f.conn, "dir": direction,
           "client": f.client, "upstream": f.upstream, "flow": f.id, "api_key": f.api_key,
           "api_version": f.api_version, "correlation_id": f.correlation_id}
    if flags:
        rec["flags"] = flags
    if redacted:
        rec["redacted"] = True
    rec["frame"] = base64.b64encode(frame).decode()
    if sent is not None:
        rec["frame_sent"] = base64.b64encode(sent).decode()
    return json.dumps(rec, separators=(",", ":")).encode() + b"\n"


def test_frame_lines_are_byte_for_byte_compact_json(tmp_path):
    """Frame lines are formatted directly, not through json.dumps of a dict; they
    must still be exactly that text, whatever the addresses hold (quotes,
    backslashes, non-ASCII) and for values a proxy never records (None, bool)."""
    odd = Flow(7, 3, 'h\u00e9"\\:1', "\u30d6\u30ed\u30fc\u30ab\u30fc:9092", 3, 12, -5, "Metadata",
               request_frame(3, 12, 1, Topics=None), 11)
    odd.flags = {"unpaired", "closed"}
    none = Flow(8, 1, None, "u:1", -1, -1, None, "SaslToken", b"\x00\x01", 12)
    boolish = Flow(9, True, "c:1", "u:1", 3, 12, 4, "Metadata", b"\x00" * 3, 13)
    # addresses that are not strings, and values equal to each other as dict keys
    # (True == 1 == 1.0): each written as json.dumps writes it
    others = [Flow(10 + i, 1, c, "u:1", 3, 12, 4, "Metadata", b"\x01", 14)
              for i, c in enumerate([True, 1, 1.0, ("10.0.0.1", 5555), ["h", 1]])]
    path = tmp_path / "cap.jsonl"
    w = CaptureWriter(path, CODEC, upstream="u:1", listen="l:1", secrets=True)
    w.write_frame(odd, "req", odd.request, b"other", 2**62)
    w.write_frame(none, "resp", none.request, None, 5)
    w.write_frame(boolish, "req", boolish.request, boolish.request, 6)
    for f in others:
        w.write_frame(f, "resp", f.request, None, 7)
    w.close()
    got = path.read_bytes().splitlines(keepends=True)[1:]
    assert got == [
        _expected_line(odd, "req", odd.request, b"other", 2**62, ["closed", "unpaired"]),
        _expected_line(none, "resp", none.request, None, 5),
        _expected_line(boolish, "req", boolish.request, None, 6),
    ] + [_expected_line(f, "resp", f.request, None, 7) for f in others]
    assert json.loads(got[0])["client"] == 'h\u00e9"\\:1'


def test_gzip_capture_reads_back(tmp_path):
    flows = metadata_flows(4)
    path = tmp_path / "cap.jsonl.gz"
    write_flows(path, flows)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    cap = load_capture(path, CODEC)
    assert [(f.id, f.request, f.response) for f in cap.flows] == [
        (f.id, f.request, f.response) for f in flows]
    assert all(f.response_decoded.body.ClusterId == "c" for f in cap.flows)


def test_a_gzip_line_longer_than_the_limit_is_an_error_read_in_bounds(tmp_path):
    """A small gzip file can hold a line of gigabytes (a compression bomb): the reader
    stops at ``max_line_bytes`` with a CaptureError naming the line, holding no more
    than that, instead of reading the whole line into memory."""
    import tracemalloc

    flows = metadata_flows(2)
    path = tmp_path / "cap.jsonl.gz"
    write_flows(path, flows)
    before = len(list(read_capture(path)))
    with open(path, "ab") as fh:  # one more gzip member: 64 MiB of one line, 64 KiB packed
        fh.write(gzip.compress(b'{"type":"' + b"x" * (64 << 20) + b'"}\n', 1))
    assert path.stat().st_size < 1 << 20
    got = []
    tracemalloc.start()
    try:
        with pytest.raises(CaptureError) as e:
            for rec in read_capture(path, max_line_bytes=1 << 20):
                got.append(rec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == before  # every line before the long one
    assert e.value.line == before + 1 and "longer than 1048576 bytes" in str(e.value)
    assert peak < 16 << 20, peak  # the line was 64 MiB
    # the default limit reads every line a capture of frames up to 100 MiB can hold:
    # a frame and its sent version, both in base64
    from kinspect.capture import MAX_LINE_BYTES
    from kinspect.codec import DEFAULT_MAX_FRAME

    base64_len = 4 * -(-DEFAULT_MAX_FRAME // 3)  # (base64: 4 characters per 3 bytes)
    assert MAX_LINE_BYTES > 2 * base64_len + len(b',"frame":"","frame_sent":""')
    # an uncompressed file has no such limit: its lines are as long as what was read
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    recs = list(read_capture(plain, max_line_bytes=1 << 20))
    assert len(recs) == before + 1 and len(recs[-1]["type"]) == 64 << 20


def test_flush_by_line_count_writes_whole_lines_before_close(tmp_path):
    path = tmp_path / "cap.jsonl"
    w = CaptureWriter(path, CODEC, flush_lines=3, flush_interval=3600, direct=False)
    for f in metadata_flows(2):  # session + 4 frame lines: one flush after 3 lines
        w.on_request(f)
        w.on_flow(f)
    data = path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 3
    w.close()
    assert path.read_bytes().count(b"\n") == 5


async def test_flush_timer_on_the_event_loop(tmp_path):
    path = tmp_path / "cap.jsonl"
    w = CaptureWriter(path, CODEC, flush_lines=10_000, flush_interval=0.05)
    w.on_request(metadata_flows(1)[0])
    deadline = time.monotonic() + 10
    while path.read_bytes().count(b"\n") < 2:
        assert time.monotonic() < deadline, "the flush timer never wrote the buffered lines"
        await asyncio.sleep(0.02)
    w.close()


def test_torn_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "cap.jsonl"
    write_flows(path, metadata_flows(3))
    whole = path.read_bytes()
    path.write_bytes(whole[:-40])  # crash in the middle of the last line
    with pytest.warns(CaptureWarning, match="torn last line"):
        recs = list(read_capture(path))
    assert len(recs) == 6 and recs[-1]["dir"] == "req"  # the response of flow 3 is lost
    with pytest.warns(CaptureWarning):
        cap = load_capture(path, CODEC)
    assert [f.id for f in cap.flows] == [1, 2, 3] and cap.flows[-1].response is None


@pytest.mark.parametrize("text", [b"hello world\n", b"not json", b'["a list"]\n'])
def test_a_file_whose_only_line_is_not_a_json_object_is_no_capture(tmp_path, text):
    """A lone torn line is what a crash leaves of a capture's last line, never of
    a whole file: a file with nothing else is not a capture (an error, not a
    warning and zero flows)."""
    path = tmp_path / "notes.txt"
    path.write_bytes(text)
    with pytest.raises(CaptureError, match="not a kinspect capture"):
        list(read_capture(path))
    with pytest.raises(CaptureError, match="not a kinspect capture"):
        load_capture(path, CODEC)


def test_lines_read_as_json_reads_them(tmp_path):
    """Lines are parsed by orjson, and what orjson refuses or may read otherwise by
    json (NaN, a lone surrogate, an integer past 64 bits, which orjson makes a float,
    nesting json cannot follow, which orjson can to 1023 levels): such a line loads
    as json reads it, and a checked key holding such a value is the error json's
    reading makes it."""
    path = tmp_path / "cap.jsonl"
    write_flows(path, metadata_flows(2))
    lines = path.read_bytes().splitlines(keepends=True)
    big = (1 << 70) + 1  # (no float is this integer)

    def edited(i: int, extra: bytes) -> Path:
        out = tmp_path / f"edited-{len(list(tmp_path.iterdir()))}.jsonl"
        line = lines[i].rstrip(b"\n")
        assert line.endswith(b"}")
        out.write_bytes(b"".join(lines[:i]) + line[:-1] + b"," + extra + b"}\n"
                        + b"".join(lines[i + 1:]))
        return out

    # keys no reader checks: the values json gives
    recs = list(read_capture(edited(1, b'"note": %d, "ratio": NaN, "who": "\\ud800"' % big)))
    assert type(recs[1]["note"]) is int and recs[1]["note"] == big
    assert math.isnan(recs[1]["ratio"])
    assert recs[1]["who"] == "\ud800"
    recs = list(read_capture(edited(1, b'"note": [%d, {"n": %d}]' % (big, -big))))
    assert recs[1]["note"] == [big, {"n": -big}] and type(recs[1]["note"][0]) is int
    cap = load_capture(edited(1, b'"note": %d' % big), CODEC)
    assert [f.id for f in cap.flows] == [1, 2] and cap.flows[0].response is not None
    with pytest.raises(CaptureError, match=f"'flags' must be a list of strings, got \\[{big}\\]"):
        list(read_capture(edited(2, b'"flags": [%d]' % big)))
    # nesting within orjson's reach (1023 levels): json's verdict, whether its
    # recursion limit lets it follow (a library may have raised the limit) or not
    deep = edited(2, b'"note": ' + b"[" * 1020 + b"]" * 1020)
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(1000)  # (the default)
        with pytest.raises(CaptureError, match="nested too deeply") as ei:
            list(read_capture(deep))
        assert ei.value.line == 3
        sys.setrecursionlimit(5000)
        note = list(read_capture(deep))[2]["note"]
        for _ in range(1019):
            assert type(note) is list and len(note) == 1
            note = note[0]
        assert note == []
    finally:
        sys.setrecursionlimit(limit)
    # and past both (orjson before 3.9.15 overflowed the stack here)
    with pytest.raises(CaptureError, match="nested too deeply") as ei:
        list(read_capture(edited(2, b'"note": ' + b"[" * 200_000 + b"]" * 200_000)))
    assert ei.value.line == 3
    # a checked key: json's reading, then the check
    with pytest.raises(CaptureError, match=f"'ts_ns' must be a 64-bit integer, got {big}") as ei:
        list(read_capture(edited(2, b'"ts_ns": %d' % big)))
    assert ei.value.line == 3
    with pytest.raises(CaptureError, match="'conn' must be an integer, got NaN"):
        list(read_capture(edited(2, b'"conn": NaN')))
    # a line that is JSON's null is no object, whichever parser reads it
    path.write_bytes(b"".join(lines[:2]) + b"null\n" + b"".join(lines[2:]))
    with pytest.raises(CaptureError, match="not a JSON object") as ei:
        list(read_capture(path))
    assert ei.value.line == 3


def test_a_deeply_nested_line_is_a_capture_error(tmp_path, capsys):
    """A line of 100 000 nested arrays is valid JSON that json.loads cannot follow
    (RecursionError): a CaptureError naming the line for every reader, not a
    traceback; as the last line, it is a torn line like any other that is no object."""
    path = tmp_path / "cap.jsonl"
    write_flows(path, metadata_flows(2))
    lines = path.read_bytes().splitlines(keepends=True)
    deep = b"[" * 100_000 + b"]" * 100_000 + b"\n"
    path.write_bytes(b"".join(lines[:2]) + deep + b"".join(lines[2:]))
    with pytest.raises(CaptureError, match="nested too deeply") as ei:
        list(read_capture(path))
    assert ei.value.line == 3
    for argv in (["show", str(path)], ["export", str(path), "--pcapng",
                                       str(tmp_path / "x.pcapng")]):
        assert cli.main(argv) == 1
        assert "nested too deeply" in capsys.readouterr().err
    path.write_bytes(b"".join(lines) + deep.rstrip())
    with pytest.warns(CaptureWarning, match="torn last line"):
        assert len(list(read_capture(path))) == len(lines)


def test_whole_last_line_without_newline_is_kept(tmp_path, recwarn):
    path = tmp_path / "cap.jsonl"
    write_flows(path, metadata_flows(2))
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    recs = list(read_capture(path))
    assert len(recs) == 5 and recs[-1]["dir"] == "resp"
    assert not [w for w in recwarn if issubclass(w.category, CaptureWarning)]


def test_truncated_gzip_capture_keeps_the_complete_lines(tmp_path):
    path = tmp_path / "cap.jsonl.gz"
    write_flows(path, metadata_flows(30))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    with pytest.warns(CaptureWarning):
        recs = list(read_capture(path))
    assert recs[0]["type"] == "session" and 1 < len(recs) < 61
    # every record yielded is a whole, valid line
    assert all(base64.b64decode(r["frame"]) for r in recs[1:])


def test_corrupt_line_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "cap.jsonl"
    write_flows(path, metadata_flows(2))
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"{not json"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CaptureError) as e:
        list(read_capture(path))
    assert e.value.line == 3


@pytest.mark.parametrize("gz", [False, True])
def test_blank_lines_are_skipped_wherever_they_are(tmp_path, gz):
    """Blank lines (an editor, ``cat`` of files ending in an empty line) are skipped,
    as ``kinspect decode --jsonl`` does; line numbers still count them."""
    plain = tmp_path / "cap.jsonl"
    write_flows(plain, metadata_flows(2))
    lines = plain.read_bytes().splitlines(keepends=True)
    text = b"\n" + lines[0] + b"  \n" + b"".join(lines[1:3]) + b"\n" + b"".join(lines[3:]) + b"\n"
    path = tmp_path / ("blank.jsonl.gz" if gz else "blank.jsonl")
    path.write_bytes(gzip.compress(text) if gz else text)
    assert list(read_capture(path)) == list(read_capture(plain))
    assert [f.response for f in load_capture(path, CODEC).flows] == \
        [f.response for f in load_capture(plain, CODEC).flows]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n\n" + lines[0] + b"{not json\n" + lines[1])
    with pytest.raises(CaptureError) as e:
        list(read_capture(bad))
    assert e.value.line == 4


def test_missing_file_is_a_capture_error(tmp_path):
    with pytest.raises(CaptureError, match="no such file"):
        list(read_capture(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize("name", ["cap.jsonl", "cap.jsonl.gz"])
def test_rotation_by_size(tmp_path, name):
    path = tmp_path / name
    flows = metadata_flows(20)
    limit = 2000  # a session line and a few frame lines
    w = write_flows(path, flows, max_bytes=limit)
    assert len(w.paths) > 3
    assert w.paths[1] == part_path(path, 1)
    assert w.paths[1].name == ("cap.1.jsonl" if name == "cap.jsonl" else "cap.1.jsonl.gz")
    sessions = []
    for i, p in enumerate(w.paths):
        lines = lines_of(p)
        assert lines[0]["type"] == "session" and lines[0]["part"] == i
        sessions.append(lines[0]["start_ns"])
        assert len(lines) > 1  # never a part with only its session line
        # every part respects the limit (JSON bytes, counted before gzip)
        assert sum(len(json.dumps(x, separators=(",", ":"))) + 1 for x in lines) <= limit
    assert len(set(sessions)) == 1
    cap = load_capture(path, CODEC)
    assert [f.id for f in cap.flows] == list(range(1, 21))
    assert all(f.response is not None for f in cap.flows)  # pairs across part boundaries


def test_stale_rotated_part_of_another_capture_is_not_followed(tmp_path):
    path = tmp_path / "cap.jsonl"
    write_flows(path, metadata_flows(2))
    stale = part_path(path, 1)
    write_flows(stale, metadata_flows(5))  # a part left by an older capture
    cap = load_capture(path, CODEC)
    assert len(cap.flows) == 2


# ---------------------------------------------------------------------------
# redaction
# ---------------------------------------------------------------------------

SECRET = b"\x00alice\x00s3cr3t-password"


@pytest.mark.parametrize("version", [0, 1, 2])
def test_sasl_authenticate_bytes_are_redacted_in_both_directions(tmp_path, version):
    req = request_frame(36, version, 7, AuthBytes=SECRET)
    resp_fields = dict(ErrorCode=0, ErrorMessage=None, AuthBytes=b"server-final:" + SECRET)
    if version >= 1:
        resp_fields["SessionLifetimeMs"] = 60_000
    resp = response_frame(36, version, 7, **resp_fields)
    flow = make_flow(1, 36, version, 7, req, resp)
    path = tmp_path / "cap.jsonl"
    write_flows(path, [flow])
    raw = path.read_bytes()
    lines = lines_of(path)[1:]
    assert all(x["redacted"] for x in lines)
    for x, original in zip(lines, (req, resp)):
        stored = base64.b64decode(x["frame"])
        assert b"s3cr3t" not in stored and len(stored) == len(original)
    assert b"s3cr3t" not in raw
    cap = load_capture(path, CODEC)
    f = cap.flows[0]
    assert "undecoded" not in f.flags and "redacted" in f.flags
    assert f.request_decoded.body.AuthBytes == redaction_marker(len(SECRET))
    assert f.response_decoded.body.AuthBytes == redaction_marker(len(SECRET) + 13)
    assert f.response_decoded.body.ErrorCode == 0
    if version >= 1:
        assert f.response_decoded.body.SessionLifetimeMs == 60_000


def test_capture_secrets_keeps_auth_bytes(tmp_path):
    req = request_frame(36, 2, 7, AuthBytes=SECRET)
    flow = make_flow(1, 36, 2, 7, req, None)
    path = tmp_path / "cap.jsonl"
    write_flows(path, [flow], secrets=True)
    x = lines_of(path)[1]
    assert base64.b64decode(x["frame"]) == req and "redacted" not in x
    assert lines_of(path)[0]["secrets"] is True


def test_raw_sasl_tokens_and_mutated_copies_are_redacted(tmp_path):
    token = make_flow(1, -1, -1, -1, SECRET, b"\x00\x00server-challenge")
    token.flags.add(SASL_TOKEN)
    mutated = make_flow(2, 36, 1, 8, request_frame(36, 1, 8, AuthBytes=SECRET), None)
    mutated.request_sent = request_frame(36, 1, 8, AuthBytes=SECRET + b"!")
    mutated.flags.add(MUTATED)
    path = tmp_path / "cap.jsonl"
    write_flows(path, [token, mutated])
    lines = lines_of(path)[1:]
    assert [x["dir"] for x in lines] == ["req", "resp", "req"]
    assert base64.b64decode(lines[0]["frame"]) == redaction_marker(len(SECRET))
    assert base64.b64decode(lines[1]["frame"]) == redaction_marker(18)
    sent = base64.b64decode(lines[2]["frame_sent"])
    assert b"s3cr3t" not in sent and len(sent) == len(mutated.request_sent)
    assert CODEC.decode_request(sent).body.AuthBytes == redaction_marker(len(SECRET) + 1)


def test_unpaired_responses_are_redacted_past_their_correlation_id(tmp_path):
    """A response the proxy could not pair (api unknown: -1) may be a SaslAuthenticate
    answer; without --capture-secrets only its correlation id reaches the file."""
    from kinspect.flows import UNPAIRED

    answer = response_frame(36, 2, 8, ErrorCode=0, AuthBytes=SECRET)
    stray = make_flow(1, -1, -1, 8, b"", answer)
    stray.flags.add(UNPAIRED)
    path = tmp_path / "cap.jsonl"
    write_flows(path, [stray])
    [line] = lines_of(path)[1:]
    stored = base64.b64decode(line["frame"])
    assert line["dir"] == "resp" and line["redacted"] is True
    assert stored == answer[:4] + redaction_marker(len(answer) - 4)
    [flow] = load_capture(path, CODEC).flows
    assert flow.correlation_id == 8 and UNPAIRED in flow.flags
    kept = tmp_path / "kept.jsonl"
    write_flows(kept, [stray], secrets=True)
    assert base64.b64decode(lines_of(kept)[1]["frame"]) == answer


def test_redaction_marker_is_documented_ascii_cut_to_length():
    assert redaction_marker(0) == b""
    assert redaction_marker(5) == b"<kins"
    assert redaction_marker(len(REDACTION_MARKER) + 3) == REDACTION_MARKER + b"<ki"


def test_undecodable_secret_frame_is_redacted_past_its_header():
    bad = request_frame(36, 2, 9, AuthBytes=SECRET)[:-3]  # truncated: does not decode
    out = redact_frame(CODEC, bad, "req", 36, 2)
    assert out[:8] == bad[:8] and len(out) == len(bad) and b"s3cr3t" not in out
    assert redact_frame(CODEC, request_frame(3, 12, 1, Topics=None), "req", 3, 12) is None


@pytest.mark.parametrize("api_key,version,body", [
    (36, 2, {"AuthBytes": SECRET}),  # SaslAuthenticate: a secret field as well
    (33, 1, {"Resources": [], "ValidateOnly": False}),  # AlterConfigs: none in its fields
])
def test_bytes_after_the_body_of_a_frame_that_may_hold_secrets_are_redacted(
        api_key, version, body):
    """A frame with bytes after its body decodes (Kafka's parsers do not read them),
    but what they hold cannot be told: in the frame of an api that carries secrets
    they are replaced by the marker too, as an undecodable frame's are."""
    frame = request_frame(api_key, version, 9, **body)
    extra = b"\x00alice\x00hunter2"
    out = redact_frame(CODEC, frame + extra, "req", api_key, version)
    assert out is not None and len(out) == len(frame + extra)
    assert b"hunter2" not in out and b"s3cr3t" not in out
    req = CODEC.decode_request(out)
    assert req.trailing == redaction_marker(len(extra))
    # elsewhere they are kept: a frame of an api without secrets is not touched
    assert redact_frame(CODEC, request_frame(3, 12, 1, Topics=None) + extra, "req", 3,
                        12) is None


# ---------------------------------------------------------------------------
# rebuilding flows from other tools' captures (only conn, dir, frame)
# ---------------------------------------------------------------------------

def test_pairing_without_flow_ids_matches_pairing_with_them():
    recs = list(read_capture(EXAMPLE))
    stripped = []
    for r in recs:
        if r.get("type") == "frame":
            r = {"conn": r["conn"], "dir": r["dir"], "frame": r["frame"], "ts_ns": r["ts_ns"]}
        stripped.append(r)
    with_ids = flows_from_records(recs, CODEC)
    without = flows_from_records(stripped, CODEC)

    def key(c):
        return sorted((f.conn, f.api_key, f.api_version, f.correlation_id, f.request, f.response)
                      for f in c.flows)
    assert key(with_ids) == key(without)
    assert all(f.response is not None for f in without.flows)


def test_answers_in_reverse_order_pair_with_their_requests():
    """Many requests in flight, answered last first (a broker may answer different
    partitions' fetches out of order): each response pairs with its own request by
    correlation id, and the one left unanswered on a closed connection is ``closed``.
    (This pairing was quadratic in the requests in flight; the speed is not asserted.)"""
    n = 500
    reqs = [request_frame(3, 12, corr, Topics=None) for corr in range(n)]
    resps = [response_frame(3, 12, corr, ClusterId=f"c{corr}") for corr in range(n)]

    def rec(d, b, **extra):
        return {"type": "frame", "conn": 1, "dir": d, "frame": base64.b64encode(b).decode(),
                **extra}
    for with_ids in (False, True):
        ids = (lambda i: {"flow": i}) if with_ids else (lambda i: {})
        recs = [rec("req", reqs[i], **ids(i)) for i in range(n)]
        recs += [rec("resp", resps[i], **ids(i)) for i in reversed(range(1, n))]
        recs.append({"type": "conn", "event": "close", "conn": 1, "ts_ns": 1})
        cap = flows_from_records(recs, CODEC, decode=False)
        assert len(cap.flows) == n, with_ids
        by_corr = {f.correlation_id: f for f in cap.flows}
        assert all(by_corr[i].request == reqs[i] and by_corr[i].response == resps[i]
                   for i in range(1, n)), with_ids
        assert by_corr[0].response is None and CLOSED in by_corr[0].flags, with_ids
        assert not any(CLOSED in by_corr[i].flags for i in range(1, n)), with_ids


def test_raw_sasl_tokens_pair_in_order_after_handshake_v0():
    hs_req = request_frame(17, 0, 1, Mechanism="PLAIN")
    hs_resp = response_frame(17, 0, 1, ErrorCode=0, Mechanisms=["PLAIN"])
    token, answer = b"\x00user\x00password", b""
    md = request_frame(3, 12, 2, Topics=None)
    md_resp = response_frame(3, 12, 2, ClusterId="c")

    def rec(d, b):
        return {"type": "frame", "conn": 1, "dir": d, "frame": base64.b64encode(b).decode()}
    cap = flows_from_records([rec("req", hs_req), rec("resp", hs_resp), rec("req", token),
                              rec("resp", answer), rec("req", md), rec("resp", md_resp)], CODEC)
    names = [(f.api_name, f.request, f.response) for f in cap.flows]
    assert names == [("SaslHandshake", hs_req, hs_resp), ("SaslToken", token, answer),
                     ("Metadata", md, md_resp)]
    assert SASL_TOKEN in cap.flows[1].flags


# ---------------------------------------------------------------------------
# CLI glue for `kinspect proxy`
# ---------------------------------------------------------------------------

def test_capture_options_and_addon(tmp_path, monkeypatch):
    p = argparse.ArgumentParser()
    add_capture_options(p)
    cfg = ProxyConfig(upstream=("127.0.0.1", 9092), listen=("127.0.0.1", 19092))
    assert capture_addon_from_args(p.parse_args([]), cfg, CODEC) is None
    monkeypatch.chdir(tmp_path)
    args = p.parse_args(["--capture", "run.jsonl.gz", "--capture-max-bytes", "2M"])
    w = capture_addon_from_args(args, cfg, CODEC)
    try:
        assert w.path == Path("captures/run.jsonl.gz") and w.max_bytes == 2 << 20
        assert w.secrets is False and w.gzip
    finally:
        w.close()
    session = lines_of(tmp_path / "captures" / "run.jsonl.gz")[0]
    assert session["upstream"] == "127.0.0.1:9092" and session["listen"] == "127.0.0.1:19092"
    args = p.parse_args(["--capture", str(tmp_path / "d" / "x.jsonl"), "--capture-secrets"])
    w = capture_addon_from_args(args, cfg, CODEC)
    w.close()
    assert w.path == tmp_path / "d" / "x.jsonl" and w.secrets
    with pytest.raises(SystemExit):
        p.parse_args(["--capture-max-bytes", "lots"])


# ---------------------------------------------------------------------------
# real clients through the real proxy
# ---------------------------------------------------------------------------

class ProxyThread:
    """The real proxy on its own event loop in a thread, with a CaptureWriter and,
    writing the same events to ``child_capture``, a CaptureProcess."""

    def __init__(self, upstream: str, capture: Path, child_capture: Path | None = None):
        host, port = upstream.rsplit(":", 1)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.proxy = Proxy(ProxyConfig(upstream=(host, int(port))), CODEC)
        self.writer = CaptureWriter(capture, CODEC, upstream=upstream)
        self.proxy.pipeline.add(self.writer)
        if child_capture is not None:
            self.child = CaptureProcess(child_capture, CODEC, upstream=upstream,
                                        start_ns=self.writer.start_ns)
            self.proxy.pipeline.add(self.child)

    def __enter__(self) -> "ProxyThread":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(10)
        return self

    @property
    def bootstrap(self) -> str:
        return "%s:%d" % self.proxy.address

    def __exit__(self, *exc) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


def _kafka_python(bootstrap: str, topic: str) -> list[bytes]:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    common = {"bootstrap_servers": bootstrap, "client_id": "cap-kafka-python",
              "request_timeout_ms": 10_000}
    admin = KafkaAdminClient(**common)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    for comp in COMPRESSIONS:
        producer = KafkaProducer(compression_type=comp, linger_ms=20, acks="all", **common)
        try:
            futs = [producer.send(topic, key=f"{comp}-k{i}".encode(),
                                  value=f"kafka-python {comp} value {i} ".encode() * 8,
                                  headers=[("codec", comp.encode())]) for i in range(3)]
            for f in futs:
                f.get(timeout=10)
        finally:
            producer.close(timeout=5)
    consumer = KafkaConsumer(**common, auto_offset_reset="earliest", enable_auto_commit=False,
                             fetch_max_wait_ms=100)
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 30
        while len(got) < 3 * len(COMPRESSIONS):
            assert time.monotonic() < deadline, f"kafka-python consumed only {len(got)}"
            for recs in consumer.poll(timeout_ms=200).values():
                got += [r.value for r in recs]
    finally:
        consumer.close()
    return got


def _confluent(bootstrap: str, topic: str) -> list[bytes]:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    common = {"bootstrap.servers": bootstrap, "client.id": "cap-confluent"}
    admin = AdminClient(common)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    for comp in COMPRESSIONS:
        producer = Producer({**common, "compression.type": comp, "linger.ms": 20,
                             "acks": "all", "enable.idempotence": False})
        for i in range(3):
            producer.produce(topic, key=f"{comp}-k{i}".encode(),
                             value=f"confluent {comp} value {i} ".encode() * 8,
                             headers=[("codec", comp.encode())])
        assert producer.flush(15) == 0, "confluent-kafka could not deliver"
    consumer = Consumer({**common, "group.id": "cap-unused", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 100})
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(got) < 3 * len(COMPRESSIONS):
            assert time.monotonic() < deadline, f"confluent-kafka consumed only {len(got)}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            got.append(msg.value())
    finally:
        consumer.close()
    return got


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A capture of both clients (4 compressions each) through the proxy into Tansu."""
    path = tmp_path_factory.mktemp("real") / "clients.jsonl.gz"
    with TansuBroker() as broker:
        with ProxyThread(broker.bootstrap, path, path.with_name("child.jsonl.gz")) as pt:
            kp = _kafka_python(pt.bootstrap, "cap-kafka-python")
            cf = _confluent(pt.bootstrap, "cap-confluent")
    return path, {"cap-kafka-python": kp, "cap-confluent": cf}


def test_capture_process_writes_what_the_in_process_writer_writes(recorded):
    """The capture child process (what `kinspect proxy --capture` uses) writes,
    for the same real traffic, the very bytes CaptureWriter writes in-process."""
    path, _ = recorded
    child = path.with_name("child.jsonl.gz")
    mine = gzip.decompress(path.read_bytes())
    theirs = gzip.decompress(child.read_bytes())
    assert mine.count(b"\n") > 50 and b'"type":"frame"' in mine
    assert theirs == mine


def _produced_batches(cap, topic):
    out = []
    for f in cap.flows:
        if f.api_key == 0 and f.request_decoded is not None:
            for rf in records_fields(f.request_decoded.body):
                if rf.topic == topic and rf.data:
                    out += rf.decode().batches
    return out


@pytest.mark.parametrize("topic,client_id,prefix", [
    ("cap-kafka-python", "cap-kafka-python", "kafka-python"),
    ("cap-confluent", "cap-confluent", "confluent"),
])
def test_real_clients_recorded_with_every_compression(recorded, topic, client_id, prefix):
    path, consumed = recorded
    cap = load_capture(path, CODEC)
    assert cap.session["upstream"] and cap.flows
    assert not [f for f in cap.flows if "undecoded" in f.flags]
    batches = _produced_batches(cap, topic)
    assert {b.compression for b in batches} == set(COMPRESSIONS)
    assert all(b.crc_valid for b in batches)
    values = [r.value for b in batches for r in b.records]
    expected = [f"{prefix} {c} value {i} ".encode() * 8 for c in COMPRESSIONS for i in range(3)]
    assert sorted(values) == sorted(expected)
    for b in batches:
        for r in b.records:
            assert r.headers == [("codec", b.compression.encode())]
            assert r.key.decode().startswith(b.compression + "-k")
    # the client consumed exactly what it produced, and the Fetch responses the proxy
    # recorded carry those same values (decoded from the captured bytes)
    assert sorted(consumed[topic]) == sorted(expected)
    fetched = []
    for f in cap.flows:
        if f.api_key == 1 and f.response_decoded is not None:
            for rf in records_fields(f.response_decoded.body, TopicIds().learn_all(cap.flows)):
                if rf.data and rf.topic == topic:
                    fetched += [r.value for r in rf.decode().iter_records()]
    assert set(fetched) == set(expected)
    # filters over the real capture
    mine = parse(f"~client {client_id} & ~api Produce")
    produce = [f for f in cap.flows if mine.matches(f)]
    assert produce and all(f.client_id == client_id and f.api_key == 0 for f in produce)
    ids = TopicIds().learn_all(cap.flows)
    by_topic = [f for f in cap.flows if parse(f"~topic {topic} & ~api Fetch").matches(
        f, topic_ids=ids)]
    assert by_topic and all(f.client_id == client_id for f in by_topic)
    assert all(s["topic"] == topic for f in produce for s in records_summary(f, ids))


def test_show_cli_over_the_real_capture(recorded, capsys):
    path, _ = recorded
    assert cli.main(["show", str(path), "--filter", "~api Produce", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    comps = {c for r in rows for s in r["records"] for c in s["compression"]}
    assert comps == set(COMPRESSIONS)
    assert {r["api_name"] for r in rows} == {"Produce"}
    fid = rows[0]["id"]
    assert cli.main(["show", str(path), "--flow", str(fid)]) == 0
    out = capsys.readouterr().out
    assert "CRC ok" in out and "header 'codec'" in out


def test_export_of_the_real_capture_is_dissected_by_tshark(recorded, tmp_path):
    path, _ = recorded
    cap = load_capture(path, CODEC, decode=False)
    out = tmp_path / "clients.pcapng"
    stats = export_pcapng(cap, out)
    (port,) = stats.ports
    tshark = shutil.which("tshark")
    assert tshark, "tshark is needed (Debian package tshark; .ci/run installs it)"
    res = subprocess.run([tshark, "-r", str(out), "-d", f"tcp.port=={port},kafka", "-Y",
                          f"kafka && tcp.dstport=={port}", "-T", "fields", "-e",
                          "kafka.api_key", "-e", "kafka.correlation_id"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    seen = [tuple(map(int, line.split("\t"))) for line in res.stdout.split("\n") if line]
    want = [(r.flow.api_key, r.flow.correlation_id) for r in cap.frames if r.dir == "req"]
    assert seen == want


def test_secret_config_values_and_token_hmacs_are_redacted(tmp_path):
    from kinspect.codec.values import struct_class

    spec = CODEC.request_codec(33).spec.struct
    res_cls = struct_class(spec.field("Resources").struct)
    cfg_cls = struct_class(spec.field("Resources").struct.field("Configs").struct)
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule password="hunter2";'
    req = request_frame(33, 1, 9, Resources=[res_cls(
        ResourceType=2, ResourceName="t",
        Configs=[cfg_cls(Name="sasl.jaas.config", Value=jaas),
                 cfg_cls(Name="retention.ms", Value="1000")])], ValidateOnly=False)
    flows = [make_flow(1, 33, 1, 9, req, None)]
    path = tmp_path / "cap.jsonl"
    write_flows(path, flows)
    line = lines_of(path)[1]
    stored = base64.b64decode(line["frame"])
    assert line["redacted"] and b"hunter2" not in stored and len(stored) == len(req)
    body = load_capture(path, CODEC).flows[0].request_decoded.body
    configs = {c.Name: c.Value for c in body.Resources[0].Configs}
    assert configs["retention.ms"] == "1000"
    assert configs["sasl.jaas.config"] == redaction_marker(len(jaas)).decode()


@pytest.mark.parametrize("api_key", [39, 40])
def test_delegation_token_hmacs_are_redacted(api_key):
    """Renew/ExpireDelegationToken are not in kafka-python's spec set: use Kafka's corpus."""
    import os
    from pathlib import Path

    from kinspect.capture import redact_frame
    from kinspect.codec import SpecRegistry

    corpus = Path(os.environ.get("KINSPECT_KAFKA_SPECS",
                                 Path(__file__).resolve().parents[2] / "shared"
                                 / "kafka-message-specs")) / "message"
    codec = Codec(SpecRegistry.load([str(corpus)], use_default=False, use_project=False,
                                    use_env=False))
    cls = codec.request_codec(api_key).cls
    hmac = b"\x01\x02token-hmac-secret"
    body = cls(Hmac=hmac)
    req = Request(api_key, 2, 5, "t", codec.request_header_version(api_key, 2), None, body, 0, "")
    frame = codec.encode_request(req)
    out = redact_frame(codec, frame, "req", api_key, 2)
    assert out is not None and len(out) == len(frame) and b"token-hmac-secret" not in out
    assert codec.decode_request(out).body.Hmac == redaction_marker(len(hmac))


def test_writev_all_resumes_after_short_writes(tmp_path, monkeypatch):
    """Every piece reaches the file in order even when the kernel takes fewer bytes
    than offered (as os.writev may after a signal) and pieces outnumber IOV_MAX."""
    from kinspect import capture as cap

    real = os.writev
    calls = []

    def short_writev(fd, parts):
        calls.append(len(parts))
        assert len(parts) <= cap._IOV_MAX
        data = b"".join(bytes(p) for p in parts)
        return real(fd, [data[:7]])  # at most 7 bytes per call

    monkeypatch.setattr(cap.os, "writev", short_writev)
    pieces = [bytes([65 + i % 26]) * (i % 5) for i in range(3000)]
    path = tmp_path / "out"
    with open(path, "wb", buffering=0) as fh:
        cap._writev_all(fh.fileno(), list(pieces))
    assert path.read_bytes() == b"".join(pieces)
    assert len(calls) > 1


async def test_capture_process_waits_for_a_full_pipe_and_loses_nothing(tmp_path):
    """Frames handed on faster than the child takes them (48 MiB at once, far more
    than the pipe holds): the rest waits on the event loop, counted in
    ``backlog_bytes``; after ``aclose`` the file holds every frame, exactly as the
    in-process writer writes them."""
    from kinspect.flows import Flow

    start = time.time_ns()
    child = CaptureProcess(tmp_path / "child.jsonl", CODEC, upstream="u:1", start_ns=start)
    mine = CaptureWriter(tmp_path / "mine.jsonl", CODEC, upstream="u:1", start_ns=start)
    frames = [bytes([i]) * (1 << 20) + b"tail" for i in range(48)]
    try:
        for i, f in enumerate(frames):
            flow = Flow(i + 1, 1, "c:1", "u:1", 0, 9, i, "Produce", f, start + i)
            flow.flags.add("decode-skipped")
            for w in (child, mine):
                w.on_request(flow)
        assert child.backlog_bytes > 0  # nothing could be written yet
        await asyncio.sleep(0)  # the first write: the pipe fills, the rest waits
        assert 0 < child.backlog_bytes < sum(map(len, frames))
    finally:
        await child.aclose()
        mine.close()
    assert child.backlog_bytes == 0 and child.frames == 48
    assert child.lines == mine.lines == 49
    assert (tmp_path / "child.jsonl").read_bytes() == (tmp_path / "mine.jsonl").read_bytes()


async def test_the_proxy_s_notes_on_a_flow_are_kept_by_both_writers_and_shown(tmp_path):
    """A flow's notes (the rule that changed it, why a rule was not applied) go on
    its frame lines, the response line repeating the request line's; the child
    process writes the same bytes; reading the capture gives the notes once each,
    in order, and ``show --flow`` and its JSON show them."""
    import io

    from rich.console import Console

    from kinspect.capture import load_capture
    from kinspect.show import flow_json, flow_tree

    start = time.time_ns()
    child = CaptureProcess(tmp_path / "child.jsonl", CODEC, upstream="u:1", start_ns=start)
    mine = CaptureWriter(tmp_path / "mine.jsonl", CODEC, upstream="u:1", start_ns=start)
    req = request_frame(3, 12, 5, Topics=None)
    flow = make_flow(1, 3, 12, 5, req, None)
    plain = make_flow(2, 3, 12, 6, request_frame(3, 12, 6, Topics=None), None)
    try:
        for w in (child, mine):
            flow.notes = ["rule --inject #1: inject Metadata:request:top:tag=9"]
            w.on_request(flow)
            w.on_request(plain)
            flow.notes.append("rules not applied: cannot decode the response: \x1b[31m")
            flow.response, flow.response_ns = response_frame(3, 12, 5), start + 9
            w.on_flow(flow)
    finally:
        await child.aclose()
        mine.close()
    assert (tmp_path / "child.jsonl").read_bytes() == (tmp_path / "mine.jsonl").read_bytes()
    lines = [rec for rec in lines_of(tmp_path / "mine.jsonl") if rec["type"] == "frame"]
    assert [rec.get("notes") for rec in lines] == [flow.notes[:1], None, flow.notes]
    got = {f.id: f for f in load_capture(tmp_path / "child.jsonl", CODEC).flows}
    assert got[1].notes == flow.notes and got[2].notes == []
    out = io.StringIO()
    Console(file=out, width=200).print(flow_tree(got[1], CODEC))
    text = out.getvalue()
    assert "note: rule --inject #1: inject Metadata:request:top:tag=9" in text
    assert "\x1b" not in text and "note: rules not applied: cannot decode the response" in text
    assert flow_json(got[1], CODEC)["notes"] == flow.notes


async def _ring_case(tmp_path, name: str, ring_bytes: int, sizes: list[int],
                     yield_every: int = 1):
    """Hand frames of ``sizes`` to a CaptureProcess with a ring of ``ring_bytes`` and
    to the in-process writer (yielding to the event loop every ``yield_every`` frames,
    so the child takes some meanwhile); the files must be byte-for-byte the same."""
    from kinspect.flows import Flow

    start = time.time_ns()
    child = CaptureProcess(tmp_path / f"{name}-child.jsonl", CODEC, upstream="u:1",
                           start_ns=start, ring_bytes=ring_bytes)
    mine = CaptureWriter(tmp_path / f"{name}-mine.jsonl", CODEC, upstream="u:1",
                         start_ns=start)
    try:
        for i, size in enumerate(sizes):
            body = (bytes([i % 251]) * size)[:size]
            flow = Flow(i + 1, 1, "c:1", "u:1", 0, 9, i, "Produce", body, start + i)
            flow.response = bytes([(i + 7) % 251]) * (size // 3)
            flow.response_sent = flow.response + b"rewritten"  # two pieces in one message
            flow.response_ns = start + i + 1
            flow.flags.add("decode-skipped")
            for w in (child, mine):
                w.on_request(flow)
                w.on_flow(flow)
            if i % yield_every == 0:
                await asyncio.sleep(0.002)
    finally:
        await child.aclose()
        mine.close()
    assert child.lines == mine.lines == 1 + 2 * len(sizes)
    assert (tmp_path / f"{name}-child.jsonl").read_bytes() == \
        (tmp_path / f"{name}-mine.jsonl").read_bytes()
    return child


async def test_capture_process_ring_wraps_around_and_loses_nothing(tmp_path):
    """Frames travel through the shared-memory ring many times round (uneven sizes,
    so frames and the sent copy of a response straddle the ring's end); the capture
    is exactly what the in-process writer writes."""
    sizes = [1, 1000, 70_000, 5, 33_333, 65_536, 12_345, 0, 99_999] * 12
    child = await _ring_case(tmp_path, "wrap", 1 << 17, sizes)
    if child.ring_bytes == 0:
        if sys.platform != "linux":
            pytest.skip("the shared-memory ring needs Linux's memfd_create")
        pytest.fail("no shared-memory ring on Linux (memfd_create or mmap failed)")
    assert child.ring_frames > 0
    ring_total = sum(sizes) + sum(2 * (s // 3) + 9 for s in sizes)
    assert ring_total > 10 * child.ring_bytes  # round many times


async def test_capture_process_without_room_in_the_ring_uses_the_pipe(tmp_path):
    """A frame larger than the room left in the ring (the child behind, or the
    ring too small for it) goes through the pipe instead, in its place in the
    order; with no yield the child never catches up, so later frames find the ring
    full."""
    sizes = [40_000] * 30
    child = await _ring_case(tmp_path, "full", 1 << 16, sizes, yield_every=10 ** 9)
    assert 0 < child.ring_frames < 2 * len(sizes)
    big = await _ring_case(tmp_path, "big", 1 << 12, [10_000] * 4)
    assert big.ring_frames == 0


async def test_capture_process_without_a_ring(tmp_path, monkeypatch, caplog):
    """``ring_bytes=0``: every frame goes through the pipe, the file is the same. So
    too when the child cannot map the ring (here it is handed a pipe, which has no
    memory to map): it says so when it starts and the proxy side uses the pipe only,
    instead of losing the capture."""
    import mmap

    from kinspect import capture_process

    child = await _ring_case(tmp_path, "none", 0, [1, 70_000, 0, 5_000])
    assert child.ring_bytes == 0 and child.ring_frames == 0

    def unmappable(size):
        r, w = os.pipe()
        os.close(w)
        return r, mmap.mmap(-1, capture_process._RING_DATA + size)

    monkeypatch.setattr(capture_process, "_open_ring", unmappable)
    with caplog.at_level("WARNING", logger="kinspect.capture"):
        child = await _ring_case(tmp_path, "unmapped", 1 << 16, [1, 70_000, 0, 5_000])
    assert child.ring_bytes == 0 and child.ring_frames == 0
    assert any("cannot map the ring" in r.getMessage() for r in caplog.records)


def test_capture_process_ring_size_is_checked(tmp_path):
    with pytest.raises(ValueError, match="ring_bytes"):
        CaptureProcess(tmp_path / "c.jsonl", CODEC, ring_bytes=16e6)


async def test_capture_process_ring_counts_in_the_backlog(tmp_path):
    """Bytes in the ring that the child has not taken count in ``backlog_bytes``
    (the pipeline pauses the proxy on it): with the child stopped, what was handed on
    stays counted, whether it went into the ring or is queued for the pipe; once
    the child runs again it falls to 0 with no further frame handed on."""
    import signal as _signal

    from proxyutil import freeze

    from kinspect.flows import Flow

    child = CaptureProcess(tmp_path / "child.jsonl", CODEC, ring_bytes=1 << 20)
    try:
        freeze(child._proc.pid)
        sent = 0
        for i in range(40):
            body = bytes([i]) * 50_000
            child.on_request(Flow(i + 1, 1, "c:1", "u:1", 0, 9, i, "Produce", body, i))
            sent += len(body)
            await asyncio.sleep(0.002)
        assert 0 < child.ring_frames < 40  # the ring filled up; the rest took the pipe
        # (what the pipe holds counts as taken, as it always has: at most its 1 MiB)
        assert child.backlog_bytes >= child.ring_frames * 50_000 > 0
        assert child.backlog_bytes >= sent - (1 << 20) - 40 * 200
        os.kill(child._proc.pid, _signal.SIGCONT)
        deadline = time.monotonic() + 20
        while child.backlog_bytes:
            assert time.monotonic() < deadline, f"{child.backlog_bytes} bytes never taken"
            await asyncio.sleep(0.01)
    finally:
        os.kill(child._proc.pid, _signal.SIGCONT)
        await child.aclose()
    assert child.frames == 40 and child.lines == 41


async def test_capture_process_that_dies_stops_the_capture_not_the_proxy(tmp_path, caplog):
    """If the child is killed, handing frames on neither raises nor blocks: the
    capture stops with one logged error and closing still works."""
    import signal as _signal

    from kinspect.flows import Flow

    child = CaptureProcess(tmp_path / "child.jsonl", CODEC)
    child._proc.send_signal(_signal.SIGKILL)
    child._proc.wait()
    with caplog.at_level("ERROR", logger="kinspect.capture"):
        for i in range(20):
            flow = Flow(i + 1, 1, "c:1", "u:1", 18, 3, i, "ApiVersions", b"x" * 100_000, 0)
            child.on_request(flow)
            await asyncio.sleep(0)
        await child.aclose()
    errors = [r for r in caplog.records if "stopped taking frames" in r.getMessage()]
    assert len(errors) == 1 and child.backlog_bytes == 0


async def test_capture_process_on_a_full_disk_reports_and_stops(tmp_path, caplog, capfd):
    """A child that cannot write (ENOSPC: /dev/full) exits with one line on stderr;
    the proxy side logs it and goes on."""
    from kinspect.flows import Flow

    child = CaptureProcess("/dev/full", CODEC)
    with caplog.at_level("ERROR", logger="kinspect.capture"):
        for i in range(200):
            child.on_request(Flow(i + 1, 1, "c:1", "u:1", 18, 3, i, "ApiVersions",
                                  b"x" * 50_000, 0))
            await asyncio.sleep(0)
        await child.aclose()
    assert child._proc.returncode == 1
    assert any("exited with status 1" in r.getMessage() for r in caplog.records)
    err = capfd.readouterr().err
    assert "kinspect capture process:" in err and "Traceback" not in err


async def test_capture_process_closed_right_after_a_burst_writes_it_whole(tmp_path):
    """Closing at once after handing frames on (the write callback still pending)
    leaves the same file as the in-process writer: the rest is written once, by
    close, never by two writers at the same time."""
    from kinspect.flows import Flow

    for attempt in range(3):
        start = time.time_ns()
        child = CaptureProcess(tmp_path / f"c{attempt}.jsonl", CODEC, start_ns=start)
        mine = CaptureWriter(tmp_path / f"m{attempt}.jsonl", CODEC, start_ns=start)
        for i in range(24):
            flow = Flow(i + 1, 1, "c:1", "u:1", 0, 9, i, "Produce",
                        bytes([i]) * (1 << 20) + b"tail", start + i)
            for w in (child, mine):
                w.on_request(flow)
        await child.aclose()  # no yield before: the hand-off is still queued
        mine.close()
        assert child.backlog_bytes == 0 and child.lines == 25
        assert (tmp_path / f"c{attempt}.jsonl").read_bytes() == \
            (tmp_path / f"m{attempt}.jsonl").read_bytes()


def test_writev_all_passes_over_empty_pieces(tmp_path):
    """Runs of empty pieces (the base64 of an empty frame) longer than IOV_MAX are
    passed over, not written forever."""
    from kinspect import capture as cap

    pieces = [b""] * (cap._IOV_MAX * 2 + 3) + [b"x"] + [b""] * 5 + [b"yz"]
    path = tmp_path / "out"
    with open(path, "wb", buffering=0) as fh:
        cap._writev_all(fh.fileno(), list(pieces))
    assert path.read_bytes() == b"xyz"


async def test_capture_process_hands_small_frames_on_after_the_batch_delay(tmp_path):
    """A few small frames are not written to the pipe at once: they go together
    after BATCH_DELAY (one wake-up of the child), and nothing is left waiting."""
    from kinspect import capture_process
    from kinspect.flows import Flow

    child = CaptureProcess(tmp_path / "child.jsonl", CODEC, upstream="u:1")
    try:
        for i in range(5):
            flow = Flow(i + 1, 1, "c:1", "u:1", 18, 3, i, "ApiVersions", b"\x00" * 40, i)
            child.on_request(flow)
        assert child.backlog_bytes > 0 and child._timer is not None
        await asyncio.sleep(0)  # a turn of the loop (a timed wait could outlast the delay)
        assert child.backlog_bytes > 0 and child._queued > 0  # still batching
        await asyncio.sleep(capture_process.BATCH_DELAY * 3)
        assert child._queued == 0 and child._timer is None  # all in the pipe
        deadline = time.monotonic() + 10
        while child.backlog_bytes:  # and the child copies what is in the ring out
            assert time.monotonic() < deadline, "the child did not take the frames"
            await asyncio.sleep(0.005)
    finally:
        await child.aclose()
    assert child.frames == 5 and child.lines == 6


def test_capture_process_used_on_a_second_event_loop_keeps_handing_on(tmp_path):
    """The loop a batch timer was armed on ends before it fires (asyncio.run twice):
    frames handed on under the next loop still reach the child without waiting for
    close()."""
    from kinspect.flows import Flow

    child = CaptureProcess(tmp_path / "child.jsonl", CODEC, upstream="u:1")

    def flow(i):
        return Flow(i, 1, "c:1", "u:1", 18, 3, i, "ApiVersions", b"\x00" * 40, i)

    async def first():
        child.on_request(flow(1))  # arms the timer; the loop ends at once

    async def second():
        for i in range(2, 6):
            child.on_request(flow(i))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if child.backlog_bytes == 0:
                break
        return child.backlog_bytes

    try:
        asyncio.run(first())
        assert child.backlog_bytes > 0
        assert asyncio.run(second()) == 0
    finally:
        child.close()
    assert child.frames == 5 and child.lines == 6


def test_response_without_its_request_is_unpaired(tmp_path):
    """A later rotated part read alone starts with answers to requests of the part
    before: those flows are flagged unpaired (and keep the api their line names)."""
    path = tmp_path / "cap.jsonl"
    write_flows(path, metadata_flows(3))
    lines = [x for x in lines_of(path) if not (x.get("flow") == 2 and x.get("dir") == "req")]
    part = tmp_path / "part.jsonl"
    part.write_text("".join(json.dumps(x) + "\n" for x in lines))
    flows = load_capture(part, CODEC).flows
    assert [(f.id, f.api_name, "unpaired" in f.flags) for f in flows] == [
        (1, "Metadata", False), (2, "Metadata", True), (3, "Metadata", False)]
    assert flows[1].request == b"" and flows[1].response_decoded.body.ClusterId == "c"
    assert flows[1].latency_ns is None  # nothing to measure from
    assert parse("~unpaired").matches(flows[1]) and not parse("~unpaired").matches(flows[0])


def _edited_example(tmp_path: Path, edit) -> Path:
    """The example capture with ``edit(record)`` applied to every frame line."""
    out = tmp_path / "edited.jsonl"
    lines = []
    for r in lines_of(EXAMPLE):
        if r.get("type") == "frame":
            edit(r)
        lines.append(json.dumps(r) + "\n")
    out.write_text("".join(lines))
    return out


@pytest.mark.parametrize("key,value", [("conn", "c1"), ("conn", None), ("conn", 1.5),
                                       ("ts_ns", "yesterday"), ("flow", "7"),
                                       ("api_key", True), ("client", 5), ("upstream", ["a"]),
                                       ("dir", 1), ("flags", [1, None]), ("flags", "mutated"),
                                       ("notes", "a note"), ("notes", [{"n": 1}]),
                                       # past what Spark reads (analyze): 64 bits, 32 bits
                                       ("ts_ns", 2**70), ("ts_ns", -10**400), ("conn", 2**63),
                                       ("api_key", 2**31), ("correlation_id", -2**31 - 1)])
def test_a_frame_line_with_a_value_of_the_wrong_type_is_an_error_naming_its_line(
        tmp_path, key, value, capsys):
    """Capture ids are JSON integers (as ``decode --jsonl`` also requires) of 64 bits
    (32 for the api key, version and correlation id), addresses and the direction
    strings, flags a list of strings: another value is a CaptureError naming the file
    and line, for every reader (not a TypeError out of show's sorting or an export's
    packet comment, nor an OverflowError out of show's clock or replay's pacing)."""
    path = _edited_example(tmp_path, lambda r: r.__setitem__(key, value))
    with pytest.raises(CaptureError) as e:
        load_capture(path, CODEC)
    # line 3: the first frame line, after the session and conn lines
    assert e.value.line == 3 and e.value.path == str(path) and key in str(e.value)
    with pytest.raises(CaptureError, match="record 1"):  # records not from a file
        flows_from_records([{"type": "frame", "dir": "req", "frame": "", "conn": 1, key: value}],
                           CODEC)
    pcap = str(tmp_path / "x.pcapng")
    for argv in (["show", str(path)], ["export", str(path), "--pcapng", pcap],
                 ["replay", str(path), "--upstream", "127.0.0.1:1"]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert f"{path}:3:" in err and f"{key!r} must be " in err, err


def _frame_line_edited(lines: list[bytes], index: int, edit) -> list[bytes]:
    """``lines`` with ``edit(record)`` applied to the frame line at ``index``."""
    rec = json.loads(lines[index])
    assert rec["type"] == "frame"
    edit(rec)
    return lines[:index] + [json.dumps(rec).encode() + b"\n"] + lines[index + 1:]


_BAD_FRAME_LINES = [
    (lambda r: r.__setitem__("frame", "!!not base64"), "frame is not base64"),
    (lambda r: r.__setitem__("frame", None), "frame is not base64"),  # not an empty frame
    (lambda r: r.pop("dir"), "a frame line lacks conn, dir or frame"),
    (lambda r: r.__setitem__("dir", "sideways"), "'dir' is 'sideways' (expected req or resp)"),
]


@pytest.mark.parametrize("edit,why", _BAD_FRAME_LINES)
def test_a_bad_frame_line_is_an_error_naming_its_file_and_line(tmp_path, edit, why, capsys):
    """A frame line that rebuilding flows rejects (bad base64, a null frame, no
    ``dir``, a ``dir`` that is neither req nor resp) is a CaptureError naming the
    file and line, as the reader's own errors do, for show, export and replay: blank
    lines count as lines, and in a rotated part it is that part's file and line (not
    ``<capture>: record N``, a count of records across the parts)."""
    plain = tmp_path / "cap.jsonl"
    lines = EXAMPLE.read_bytes().splitlines(keepends=True)
    # two blank lines after the session line: the 6th line of the example is line 8
    plain.write_bytes(b"".join(_frame_line_edited(lines[:1] + [b"\n", b"  \n"] + lines[1:],
                                                  7, edit)))
    rotated = tmp_path / "rot.jsonl"
    w = write_flows(rotated, metadata_flows(20), max_bytes=2000)
    part = w.paths[2]
    part.write_bytes(b"".join(_frame_line_edited(part.read_bytes().splitlines(keepends=True),
                                                 2, edit)))
    for path, bad, line in ((plain, plain, 8), (rotated, part, 3)):
        with pytest.raises(CaptureError) as e:
            load_capture(path, CODEC)
        assert (e.value.path, e.value.line, e.value.reason) == (str(bad), line, why)
        pcap = tmp_path / "x.pcapng"
        for argv in (["show", str(path)], ["export", str(path), "--pcapng", str(pcap)],
                     ["replay", str(path), "--upstream", "127.0.0.1:1"]):
            assert cli.main(argv) == 1
            err = capsys.readouterr().err
            assert f"kinspect: error: {bad}:{line}: {why}" in err, err
            assert "<capture>" not in err and "record" not in err and "Traceback" not in err
        assert not pcap.exists()  # (no export of a 0-length frame never on the wire)
    records = [json.loads(x) for x in _frame_line_edited(lines[:3], 2, edit)[::2]]
    with pytest.raises(CaptureError) as e:  # records of no file: named by their number
        flows_from_records(records, CODEC)
    assert str(e.value) == f"<capture>: record 2: {why}"


def test_a_null_frame_sent_means_not_changed(tmp_path):
    """``frame_sent`` is optional (kinspect writes it when it changed the frame): null
    is read as absent, unlike a null ``frame``."""
    path = _edited_example(tmp_path, lambda r: r.__setitem__("frame_sent", None))
    flows = load_capture(path, CODEC).flows
    assert len(flows) == len(load_capture(EXAMPLE, CODEC).flows)
    assert all(f.request_sent is None and f.response_sent is None for f in flows)


@pytest.mark.parametrize("damage", ["crc", "deflate"])
def test_a_corrupt_gzip_capture_is_an_error_not_a_cut(tmp_path, damage, capsys):
    """A gzip capture whose data is damaged (a CRC that does not match, bad deflate
    data) is an error naming the file, not the warning of a capture cut short (whose
    lines before the cut are all there: truncated ones keep warning)."""
    path = tmp_path / "cap.jsonl.gz"
    write_flows(path, metadata_flows(3))
    data = bytearray(path.read_bytes())
    if damage == "crc":
        data[-6] ^= 0xFF  # the trailer's CRC-32
    else:
        data[10] = 0xFF  # the first deflate block: reserved block type 3
    path.write_bytes(bytes(data))
    with pytest.raises(CaptureError, match="compressed data is corrupt") as e:
        list(read_capture(path))
    assert e.value.path == str(path)
    assert ("CRC check failed" if damage == "crc" else "invalid block type") in e.value.reason
    assert cli.main(["show", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"kinspect: error: {path}: compressed data is corrupt" in err, err
    assert "ends early" not in err and "lost" not in err


@pytest.mark.parametrize("line_dir", ["req", "resp"])
@pytest.mark.parametrize("missing", ["absent", "null"])
def test_a_frame_line_without_a_time_leaves_its_flow_without_a_latency(
        tmp_path, line_dir, missing):
    """``ts_ns`` absent or null is "not known", as the Spark job reads it: the flow
    is flagged ``untimed`` and has no latency, where it got the other line's time
    since the epoch (some 1.8e12 ms). The other flows keep theirs."""
    lines = EXAMPLE.read_bytes().splitlines(keepends=True)
    recs = [json.loads(x) for x in lines]
    at = next(i for i, r in enumerate(recs) if r.get("type") == "frame"
              and r["dir"] == line_dir and r["api_key"] == 3)  # a Metadata flow's line
    fid = recs[at]["flow"]

    def drop(r):
        if missing == "absent":
            del r["ts_ns"]
        else:
            r["ts_ns"] = None

    path = tmp_path / "cap.jsonl"
    path.write_bytes(b"".join(_frame_line_edited(lines, at, drop)))
    flows = load_capture(path, CODEC).flows
    flow = next(f for f in flows if f.id == fid)
    assert "untimed" in flow.flags and flow.latency_ns is None
    assert flow_summary(flow)["latency_ns"] is None and flow_row(flow)["latency"] == ""
    others = [f for f in flows if f.id != fid and f.response is not None]
    assert others and all(f.latency_ns is not None and 0 <= f.latency_ns < 10**10
                          and "untimed" not in f.flags for f in others)


def test_a_gzip_capture_inflating_to_garbage_is_said_to_be_corrupt(tmp_path, capsys):
    """Damaged compressed data can inflate to garbage before the CRC, checked at the
    end of the stream, says so: the line it spoils is named with the corruption (a
    CRC that does not match), not as a line that was written wrong ("not a JSON
    line" was all kinspect show said)."""
    import gzip as gz

    text = EXAMPLE.read_bytes()
    data = bytearray(gz.compress(text, compresslevel=0))  # (stored blocks: bytes as they are)
    second = text.index(b"\n") + 1  # the second line's first byte, "{"
    at = data.index(text[second:second + 64])
    data[at] = ord("x")  # not a JSON line any more; the deflate data still inflates
    path = tmp_path / "cap.jsonl.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(CaptureError) as e:
        list(read_capture(path))
    assert e.value.path == str(path)
    assert "compressed data is corrupt (CRC check failed" in e.value.reason, e.value.reason
    assert "line 2, inflated from it, does not read: not a JSON line" in e.value.reason
    assert cli.main(["show", str(path)]) == 1
    assert "compressed data is corrupt" in capsys.readouterr().err
    # the same line in a file that is not compressed is the line's own fault
    plain = tmp_path / "cap.jsonl"
    plain.write_bytes(text[:second] + b"x" + text[second + 1:])
    with pytest.raises(CaptureError, match="not a JSON line") as e:
        list(read_capture(plain))
    assert e.value.line == 2 and "compressed" not in e.value.reason


def test_a_bad_line_of_a_gzip_capture_is_checked_for_corruption_only_so_far(tmp_path,
                                                                          monkeypatch):
    """The look for corrupt compressed data behind a line that does not read stops
    after ``CORRUPT_CHECK_BYTES`` inflated bytes (the line's own error then stands),
    and a line too long (a gzip bomb, stopped early on purpose) is not followed by
    any inflating: it read the whole rest of the stream, minutes for a large one."""
    import gzip as gz

    import kinspect.capture as capture_mod

    text = EXAMPLE.read_bytes()
    second = text.index(b"\n") + 1
    bad = text[:second] + b"x" + text[second + 1:]
    data = bytearray(gz.compress(bad + b"\n" * (4 << 20), compresslevel=0))
    data[-8] ^= 0xFF  # the CRC: corrupt, but only found at the very end
    path = tmp_path / "cap.jsonl.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(CaptureError, match="compressed data is corrupt"):
        list(read_capture(path))
    monkeypatch.setattr(capture_mod, "CORRUPT_CHECK_BYTES", 1 << 20)  # short of the end
    with pytest.raises(CaptureError) as e:
        list(read_capture(path))
    assert e.value.line == 2 and e.value.reason.startswith("not a JSON line"), e.value
    reads = []
    real_read = gz.GzipFile.read
    monkeypatch.setattr(gz.GzipFile, "read", lambda self, n=-1: reads.append(n) or
                        real_read(self, n))
    long_line = tmp_path / "long.jsonl.gz"
    long_line.write_bytes(gz.compress(text[:second] + b"x" * (3 << 20) + b"\n" + text
                                      + b"\n" * (4 << 20)))
    with pytest.raises(CaptureError, match="a line longer than"):
        list(read_capture(long_line, max_line_bytes=1 << 20))
    assert sum(n for n in reads if n and n > 0) < 2 << 20, reads


def test_a_file_where_the_capture_directory_should_be_says_not_a_directory(tmp_path):
    """A capture path under a regular file is refused as "Not a directory", naming
    that file, not with ``mkdir``'s "File exists"."""
    blocker = tmp_path / "notes.jsonl"
    blocker.write_text("x")
    with pytest.raises(NotADirectoryError) as e:
        CaptureWriter(blocker / "cap.jsonl", CODEC)
    assert e.value.filename == str(blocker) and "Not a directory" in str(e.value)


def test_a_null_ts_ns_means_not_known(tmp_path, capsys):
    """``"ts_ns": null`` is read as an absent time stamp (other tools' captures need
    only conn, dir and frame): show and export work."""
    path = _edited_example(tmp_path, lambda r: r.__setitem__("ts_ns", None))
    flows = load_capture(path, CODEC).flows
    assert len(flows) == len(load_capture(EXAMPLE, CODEC).flows)
    assert all(f.request_ns == 0 for f in flows)
    assert cli.main(["show", str(path)]) == 0
    assert cli.main(["export", str(path), "--pcapng", str(tmp_path / "x.pcapng")]) == 0
    assert "Traceback" not in capsys.readouterr().err


def _flow_view(f: Flow) -> tuple:
    return (f.id, f.conn, f.api_key, f.api_version, f.correlation_id, f.api_name,
            sorted(f.flags), f.request, f.response, f.request_ns, f.response_ns)


def _readers_work(path: Path, tmp_path: Path, capsys) -> None:
    """show (table, json, one flow, a filter) and export (plain, filtered) read
    ``path`` without a traceback."""
    pcap = str(tmp_path / "x.pcapng")
    for argv in (["show", str(path)], ["show", str(path), "--format", "json"],
                 ["show", str(path), "--flow", "1"], ["show", str(path), "-f", "~v 1"],
                 ["export", str(path), "--pcapng", pcap],
                 ["export", str(path), "-f", "~all", "--pcapng", pcap]):
        assert cli.main(argv) == 0, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and "error" not in err, (argv, err)
    assert b"vNone" not in Path(pcap).read_bytes()


@pytest.mark.parametrize("key", ["api_key", "api_version", "correlation_id", "flow"])
def test_a_null_id_on_a_frame_line_means_absent(tmp_path, key, capsys):
    """A null api key, api version, correlation id or flow id reads as an absent one
    (not known: from the frame header, by correlation id), for every reader."""
    absent = tmp_path / "absent.jsonl"
    _edited_example(tmp_path, lambda r: r.pop(key, None)).rename(absent)
    null = _edited_example(tmp_path, lambda r: r.__setitem__(key, None))
    flows = load_capture(null, CODEC).flows
    assert [_flow_view(f) for f in flows] == [_flow_view(f) for f in
                                              load_capture(absent, CODEC).flows]
    if key != "flow":  # read from the headers: as recorded
        assert [_flow_view(f) for f in flows] == [_flow_view(f) for f in
                                                  load_capture(EXAMPLE, CODEC).flows]
    records = [r for r in lines_of(null)]
    assert len(flows_from_records(records, CODEC).flows) == len(flows)
    _readers_work(null, tmp_path, capsys)


def _unpaired_example(tmp_path: Path, name: str, **edit) -> Path:
    """The example capture without the request of flow 1 and ``edit`` on its response,
    as ``tmp_path / name``."""
    out = tmp_path / name
    lines = []
    for r in lines_of(EXAMPLE):
        if r.get("type") == "frame" and r.get("flow") == 1:
            if r["dir"] == "req":
                continue
            r.update(edit)
        lines.append(json.dumps(r) + "\n")
    out.write_text("".join(lines))
    return out


@pytest.mark.parametrize("key", ["api_key", "api_version"])
def test_a_null_id_on_an_unpaired_response_means_not_known(tmp_path, key, capsys):
    """A response whose request is not in the capture, with a null api key or api
    version: read as not known (-1, like an absent one), not a TypeError in show,
    export, replay or serve's loading (nor "vNone" in an export)."""
    path = _unpaired_example(tmp_path, "null.jsonl", **{key: None})
    flows = load_capture(path, CODEC).flows
    f = flows[0]
    assert f.id == 1 and "unpaired" in f.flags and f.request == b"" and f.correlation_id == 1
    assert getattr(f, key) == -1
    if key == "api_key":
        assert f.api_name == "Unpaired" and f.api_version == 4
    else:
        assert f.api_name == "ApiVersions" and "undecoded" in f.flags
    absent = _unpaired_example(tmp_path, "absent.jsonl")
    lines = [r for r in lines_of(absent)]
    for r in lines:
        if r.get("flow") == 1:
            del r[key]
    absent.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert _flow_view(load_capture(absent, CODEC).flows[0]) == _flow_view(f)
    _readers_work(path, tmp_path, capsys)
    # 1: the other flows fail (nothing listens there), not an error reading the capture
    assert cli.main(["replay", str(path), "--upstream", "127.0.0.1:1", "--timeout", "2",
                     "--as-fast-as-possible"]) in (0, 1)
    err = capsys.readouterr().err
    # (an error naming the capture would be one reading it; "cannot connect" is not)
    assert "Traceback" not in err and str(path) not in err, err


def test_captures_appended_to_each_other_keep_all_their_flows(tmp_path):
    """``cat a.jsonl b.jsonl``: the second capture numbers its flows and connections
    from 1 again; its flows must not overwrite the first capture's."""
    one = load_capture(EXAMPLE, CODEC).flows
    both = tmp_path / "both.jsonl"
    both.write_bytes(EXAMPLE.read_bytes() * 2)
    flows = load_capture(both, CODEC).flows
    assert len(flows) == 2 * len(one)
    assert len({f.id for f in flows}) == len(flows)
    first, second = flows[:len(one)], flows[len(one):]
    assert {f.conn for f in first}.isdisjoint({f.conn for f in second})
    for a, b, c in zip(one, first, second):
        assert a.request == b.request == c.request and a.response == b.response == c.response
        assert a.flags == b.flags == c.flags


@pytest.mark.parametrize("compressed", [False, True])
def test_a_capture_read_from_a_fifo_is_read_whole(tmp_path, compressed):
    """``kinspect show <(zcat a.jsonl.gz)`` or a named pipe: the first bytes are
    peeked at to tell gzip, not read and the file opened again (which lost them, or
    waited forever for a writer that had gone)."""
    import threading

    data = EXAMPLE.read_bytes()
    if compressed:
        data = gzip.compress(data)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "wb") as fh:
            fh.write(data)
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    got = list(read_capture(fifo, parts=False))
    writer.join(10)
    assert not writer.is_alive()
    assert got == list(read_capture(EXAMPLE, parts=False))


def test_a_gzip_capture_closes_its_file(tmp_path):
    """The gzip reader over the peeked file closes that file with itself."""
    from kinspect import capture as capture_mod

    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    fh = capture_mod._open_read(path)
    raw = fh.fileobj
    assert fh.readline().startswith(b'{"type":"session"')
    fh.close()
    assert raw.closed
