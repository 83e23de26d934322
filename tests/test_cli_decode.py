"""`kinspect decode` / `kinspect encode`: single frames (raw, hex, base64, with or
without the size prefix, json or tree) and JSON Lines batches, both ways."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kinspect.cli import main
from kinspect.codec import Codec, Request, Response
from kinspect.codec.errors import EncodeError

CODEC = Codec()
REG = CODEC.registry


def _request(api_key, version, body, corr, client_id="cli-test"):
    hv = CODEC.request_header_version(api_key, version)
    return CODEC.encode_request(Request(api_key, version, corr, client_id, hv, None, body, 0, ""))


def _response(api_key, version, body, corr):
    hv = CODEC.response_header_version(api_key, version)
    return CODEC.encode_response(Response(api_key, version, corr, hv, None, body, 0, "", version))


def _metadata_pair(corr=11):
    rq = REG.codec("MetadataRequest")
    topic = rq.spec.struct.field("Topics").struct.cls
    req = _request(3, 12, rq.cls(Topics=[topic(Name="orders", TopicId=bytes(16))],
                                 AllowAutoTopicCreation=False), corr)
    rs = REG.codec("MetadataResponse")
    T = rs.spec.struct.field("Topics").struct
    P = T.field("Partitions").struct
    B = rs.spec.struct.field("Brokers").struct
    body = rs.cls(Brokers=[B.cls(NodeId=1, Host="127.0.0.1", Port=9092)], ClusterId="c1",
                  ControllerId=1, Topics=[T.cls(Name="orders", TopicId=b"\x01" * 16, Partitions=[
                      P.cls(PartitionIndex=0, LeaderId=1, ReplicaNodes=[1], IsrNodes=[1])])])
    return req, _response(3, 12, body, corr)


def _api_versions_pair(corr):
    rq = REG.codec("ApiVersionsRequest")
    req = _request(18, 3, rq.cls(ClientSoftwareName="kinspect", ClientSoftwareVersion="0"), corr)
    rs = REG.codec("ApiVersionsResponse")
    av = rs.spec.struct.field("ApiKeys").struct.cls
    resp = _response(18, 3, rs.cls(ApiKeys=[av(ApiKey=3, MinVersion=0, MaxVersion=12)]), corr)
    return req, resp


def run_cli(*args, stdin: bytes = b""):
    return subprocess.run([sys.executable, "-m", "kinspect", *args], input=stdin,
                          capture_output=True, timeout=120)


# ---------------------------------------------------------------------------
# single frames


def test_raw_frame_on_stdin_with_size_prefix_round_trips():
    req, _ = _metadata_pair()
    proc = run_cli("decode", stdin=struct.pack(">i", len(req)) + req)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["type"] == "request" and doc["api"] == "Metadata" and doc["api_version"] == 12
    assert doc["correlation_id"] == 11 and doc["header"]["ClientId"] == "cli-test"
    assert doc["body"]["Topics"][0]["Name"] == "orders"
    back = run_cli("encode", stdin=proc.stdout)
    assert back.returncode == 0, back.stderr
    assert back.stdout == req
    prefixed = run_cli("encode", "--size-prefix", stdin=proc.stdout)
    assert prefixed.stdout == struct.pack(">i", len(req)) + req


def test_hex_and_base64_input(tmp_path, capsys):
    req, _ = _metadata_pair()
    (tmp_path / "f.hex").write_text(" ".join(f"{b:02x}" for b in req) + "\n")
    (tmp_path / "f.b64").write_text(base64.b64encode(req).decode())
    assert main(["decode", "--hex", str(tmp_path / "f.hex")]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["decode", "--base64", str(tmp_path / "f.b64"), "--size-prefix", "no"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert a == b and a["body"]["AllowAutoTopicCreation"] is False
    (tmp_path / "f.json").write_text(json.dumps(a))
    assert main(["encode", "--hex", str(tmp_path / "f.json")]) == 0
    assert capsys.readouterr().out.strip() == req.hex()
    assert main(["encode", "--base64", str(tmp_path / "f.json")]) == 0
    assert base64.b64decode(capsys.readouterr().out) == req


def test_size_prefix_yes_requires_a_matching_prefix(tmp_path, capsys):
    req, _ = _metadata_pair()
    (tmp_path / "f.bin").write_bytes(req)
    assert main(["decode", str(tmp_path / "f.bin"), "--size-prefix", "yes"]) == 1
    assert "size prefix" in capsys.readouterr().err
    (tmp_path / "g.bin").write_bytes(struct.pack(">i", len(req)) + req)
    assert main(["decode", str(tmp_path / "g.bin"), "--size-prefix", "yes"]) == 0


def test_response_typed_by_api_key_or_by_request_file(tmp_path, capsys):
    req, resp = _metadata_pair()
    (tmp_path / "req.bin").write_bytes(req)
    (tmp_path / "resp.bin").write_bytes(resp)
    assert main(["decode", str(tmp_path / "resp.bin"), "--api-key", "Metadata",
                 "--api-version", "12"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["decode", str(tmp_path / "resp.bin"), "--request", str(tmp_path / "req.bin")]) == 0
    b = json.loads(capsys.readouterr().out)
    assert main(["decode", str(tmp_path / "resp.bin"), "--api-key", "3",
                 "--api-version", "12"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert a == b == c
    assert a["type"] == "response" and a["header_version"] == 1
    assert a["body"]["Brokers"][0]["Host"] == "127.0.0.1"
    (tmp_path / "resp.json").write_text(json.dumps(a))
    out = tmp_path / "again.bin"
    assert main(["encode", str(tmp_path / "resp.json"), "-o", str(out)]) == 0
    assert out.read_bytes() == resp


def test_response_without_its_type_is_an_error(tmp_path, capsys):
    _, resp = _metadata_pair()
    (tmp_path / "resp.bin").write_bytes(resp)
    assert main(["decode", str(tmp_path / "resp.bin"), "--response"]) == 1
    assert "--api-key" in capsys.readouterr().err


def test_tree_format(tmp_path, capsys):
    _, resp = _metadata_pair()
    (tmp_path / "resp.bin").write_bytes(resp)
    assert main(["decode", str(tmp_path / "resp.bin"), "--api-key", "Metadata",
                 "--api-version", "12", "--format", "tree"]) == 0
    out = capsys.readouterr().out
    assert "Response Metadata v12" in out and "correlation id 11" in out
    assert "Topics [1]" in out and "Name: 'orders'" in out and "Port: 9092" in out
    assert "TopicId: AQEBAQEBAQEBAQEBAQEBAQ" in out  # Kafka's text form of the uuid
    # only the fields of v12: ClusterAuthorizedOperations is in v8-v10 only, the
    # top-level ErrorCode from v13 on (the tree walked every field of the spec)
    assert "ClusterAuthorizedOperations" not in out
    assert "\n    ├── ErrorCode" not in out and "TopicAuthorizedOperations" in out
    req, _ = _metadata_pair()
    (tmp_path / "req.bin").write_bytes(req)
    assert main(["decode", str(tmp_path / "req.bin"), "--format", "tree"]) == 0
    out = capsys.readouterr().out
    assert "Request Metadata v12" in out and "ClientId: 'cli-test'" in out
    assert "IncludeClusterAuthorizedOperations" not in out  # (v8-v10)
    assert "IncludeTopicAuthorizedOperations: false" in out


def test_decode_error_prints_path_and_offset(tmp_path):
    req, _ = _metadata_pair()
    (tmp_path / "cut.bin").write_bytes(req[:-5])
    proc = run_cli("decode", str(tmp_path / "cut.bin"))
    assert proc.returncode != 0
    err = proc.stderr.decode()
    assert "Metadata v12" in err and "path Topics[0]" in err and "offset" in err
    assert proc.stdout == b""


def test_encode_error_is_reported(tmp_path, capsys):
    req, _ = _metadata_pair()
    assert main(["decode", "--size-prefix", "no", "-o", str(tmp_path / "d.json"),
                 _write(tmp_path / "f.bin", req)]) == 0
    doc = json.loads((tmp_path / "d.json").read_text())
    doc["body"]["Topics"][0]["Name"] = 5
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    assert main(["encode", str(tmp_path / "bad.json")]) == 1
    assert "Name" in capsys.readouterr().err


@pytest.mark.parametrize("key,value", [("header_version", "x"), ("header_version", []),
                                       ("header_version", 3), ("header_version", True),
                                       ("body_version", None), ("body_version", {})])
def test_encode_bad_header_or_body_version_is_an_encode_error(tmp_path, capsys, key, value):
    """A header or body version that is not one there is: ``encode error`` naming the
    key (it was a TypeError traceback)."""
    _, resp = _metadata_pair()
    assert main(["decode", "--size-prefix", "no", "--api-key", "3", "--api-version", "12",
                 "-o", str(tmp_path / "d.json"), _write(tmp_path / "f.bin", resp)]) == 0
    doc = json.loads((tmp_path / "d.json").read_text())
    doc[key] = value
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["encode", str(tmp_path / "bad.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kinspect: encode error: ") and key in err, err


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


# ---------------------------------------------------------------------------
# JSON Lines batches


def _batch_lines() -> list[dict]:
    md_req, md_resp = _metadata_pair(corr=5)
    av_req, av_resp = _api_versions_pair(corr=5)  # same correlation id, other connection
    b64 = lambda b: base64.b64encode(b).decode()
    return [
        {"type": "session", "kinspect": "test", "start_ns": 1},
        {"type": "frame", "conn": 1, "dir": "req", "frame": b64(md_req), "ts_ns": 10},
        {"type": "frame", "conn": 2, "dir": "req", "frame": b64(av_req), "ts_ns": 11},
        {"type": "frame", "conn": 2, "dir": "resp", "frame": b64(av_resp), "ts_ns": 12},
        {"type": "frame", "conn": 1, "dir": "resp", "frame": b64(md_resp), "ts_ns": 13,
         "flags": ["x"]},
        # a response whose request is not in the file, typed by its own keys
        {"type": "frame", "conn": 3, "dir": "resp", "frame": b64(md_resp), "api_key": 3,
         "api_version": 12},
        # a response nobody can type, and a truncated request
        {"conn": 4, "dir": "resp", "frame": b64(md_resp)},
        {"conn": 4, "dir": "req", "frame": b64(md_req[:-3]), "note": "cut"},
        {"type": "conn", "event": "close", "conn": 1},
    ]


@pytest.mark.parametrize("gz", [False, True])
def test_jsonl_decode_then_encode_reproduces_the_lines(tmp_path, capsys, gz):
    lines = _batch_lines()
    text = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)  # as captured
    src = tmp_path / ("in.jsonl.gz" if gz else "in.jsonl")
    if gz:
        src.write_bytes(gzip.compress(text.encode()))
    else:
        src.write_text(text)
    dec = tmp_path / "dec.jsonl"
    assert main(["decode", "--jsonl", str(src), "-o", str(dec)]) == 1  # (2 lines failed)
    assert "7 frames, 2 errors" in capsys.readouterr().err
    out = [json.loads(x) for x in dec.read_text().splitlines()]
    assert len(out) == len(lines)
    assert out[0] == lines[0] and out[-1] == lines[-1]       # non-frame lines pass through
    assert out[1]["decoded"]["api"] == "Metadata" and "frame" not in out[1]
    assert list(out[1]) == ["type", "conn", "dir", "decoded", "ts_ns"]  # in frame's place
    assert out[3]["decoded"]["api"] == "ApiVersions"          # typed by conn 2's request
    assert out[3]["decoded"]["header_version"] == 0
    assert out[4]["decoded"]["api"] == "Metadata" and out[4]["flags"] == ["x"]
    assert out[4]["decoded"]["body"]["Topics"][0]["Name"] == "orders"
    assert out[5]["decoded"]["type"] == "response"
    assert "correlation id 5" in out[6]["error"]["error"] and out[6]["frame"] == lines[6]["frame"]
    assert out[7]["error"]["api"] == "Metadata" and out[7]["error"]["path"]
    assert out[7]["note"] == "cut"
    enc = tmp_path / "enc.jsonl"
    assert main(["encode", "--jsonl", str(dec), "-o", str(enc)]) == 0
    assert "5 frames, 0 errors" in capsys.readouterr().err
    assert enc.read_text() == text


def test_jsonl_decode_then_encode_reproduces_a_real_capture(tmp_path, capsys):
    # captures/example.jsonl was recorded by kinspect between librdkafka and Tansu: its
    # ApiVersions v4 answers carry known tagged fields at their default values
    # (FinalizedFeaturesEpoch -1 ...), which the encoder leaves out unless told
    # they were on the wire
    src = Path(__file__).resolve().parents[1] / "captures" / "example.jsonl"
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    dec, enc = tmp_path / "dec.jsonl", tmp_path / "enc.jsonl"
    assert main(["decode", "--jsonl", str(src), "-o", str(dec)]) == 0
    assert main(["encode", "--jsonl", str(dec), "-o", str(enc)]) == 0
    assert "0 errors" in capsys.readouterr().err
    assert [json.loads(x) for x in enc.read_text().splitlines()] == lines
    assert enc.read_bytes() == src.read_bytes()  # the very same lines
    decoded = [json.loads(x) for x in dec.read_text().splitlines()]
    present = [d["decoded"]["body"]["_present_tags"] for d in decoded
               if d.get("decoded", {}).get("api") == "ApiVersions"
               and d["dir"] == "resp" and d["decoded"]["api_version"] >= 3]
    assert present and all(p == [0, 1, 2, 3] for p in present), present


def test_present_tags_in_a_dict_are_checked():
    rs = REG.codec("ApiVersionsResponse")
    assert rs.cls.from_dict({"_present_tags": [1]})._present == frozenset({1})
    for bad in ([7], ["1"], 1):
        with pytest.raises(EncodeError, match="_present_tags"):
            rs.cls.from_dict({"_present_tags": bad})


def test_jsonl_on_stdin_and_stdout():
    lines = _batch_lines()[1:5]
    text = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines).encode()
    proc = run_cli("decode", "--jsonl", "-", stdin=text)
    assert proc.returncode == 0, proc.stderr
    decoded = proc.stdout.decode().splitlines()
    assert [json.loads(x)["decoded"]["api"] for x in decoded] == \
        ["Metadata", "ApiVersions", "ApiVersions", "Metadata"]
    back = run_cli("encode", "--jsonl", "-", stdin=proc.stdout)
    assert back.returncode == 0 and back.stdout == text


def test_jsonl_bad_lines_do_not_stop_the_run(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    req, _ = _metadata_pair()
    src.write_text("not json\n" + json.dumps({"conn": 1, "dir": "sideways",
                                               "frame": base64.b64encode(req).decode()}) + "\n"
                   + json.dumps({"conn": 1, "dir": "req", "frame": "!!"}) + "\n"
                   + json.dumps({"conn": 1, "dir": "req",
                                 "frame": base64.b64encode(req).decode()}) + "\n")
    assert main(["decode", "--jsonl", str(src)]) == 1  # every line written, 3 failed
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "not JSON" in out[0]["error"]["error"] and out[0]["line"] == 1
    assert "dir" in out[1]["error"]["error"]
    assert "error" in out[2]
    assert out[3]["decoded"]["api"] == "Metadata"


def test_deeply_nested_json_is_an_error_not_a_traceback(tmp_path, capsys):
    """Valid JSON nested deeper than json.loads follows (RecursionError): an error
    line in batch mode (the run goes on), an encode error for a single document."""
    req, _ = _metadata_pair()
    deep = "[" * 100_000 + "]" * 100_000
    good = json.dumps({"conn": 1, "dir": "req", "frame": base64.b64encode(req).decode()})
    src = tmp_path / "in.jsonl"
    src.write_text(deep + "\n" + good + "\n")
    assert main(["decode", "--jsonl", str(src)]) == 1
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert out[0] == {"line": 1, "error": {"error": "not JSON: values nested too deeply"}}
    assert out[1]["decoded"]["api"] == "Metadata"
    assert main(["encode", "--jsonl", str(src)]) == 1
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "nested too deeply" in out[0]["error"]["error"] and len(out) == 2
    (tmp_path / "deep.json").write_text(deep)
    assert main(["encode", str(tmp_path / "deep.json")]) == 1
    assert "nested too deeply" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "not json", "{\"api_key\": 3,"])
def test_encode_of_what_is_not_json_says_so(text, tmp_path, capsys):
    """``kinspect encode`` of a file that is not JSON says it is not, and what it
    expected, rather than json's bare "Expecting value: line 1 column 1"."""
    (tmp_path / "in.json").write_text(text)
    assert main(["encode", str(tmp_path / "in.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kinspect: encode error: not JSON (") and "kinspect decode" in err, err


def test_jsonl_encode_reports_bad_values_per_line(tmp_path, capsys):
    req, _ = _metadata_pair()
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"conn": 1, "dir": "req", "frame": base64.b64encode(req).decode()}))
    dec = tmp_path / "dec.jsonl"
    assert main(["decode", "--jsonl", str(src), "-o", str(dec)]) == 0
    rec = json.loads(dec.read_text())
    bad = json.loads(json.dumps(rec))
    bad["decoded"]["body"]["Topics"] = "oops"
    dec.write_text(json.dumps(bad) + "\n" + json.dumps(rec) + "\n")
    capsys.readouterr()
    assert main(["encode", "--jsonl", str(dec)]) == 1  # (a line failed; both written)
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "error" in out[0] and "decoded" in out[0]
    assert base64.b64decode(out[1]["frame"]) == req


def test_api_versions_error_body_decoded_as_v0_round_trips(tmp_path, capsys):
    rs = REG.codec("ApiVersionsResponse")
    av = rs.spec.struct.field("ApiKeys").struct.cls
    body = rs.encode(rs.cls(ErrorCode=35, ApiKeys=[av(ApiKey=18, MinVersion=0, MaxVersion=3)]), 0)
    frame = struct.pack(">i", 99) + body
    src = _write(tmp_path / "resp.bin", frame)
    assert main(["decode", src, "--api-key", "ApiVersions", "--api-version", "4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["api_version"] == 4 and doc["body_version"] == 0
    assert doc["body"]["ErrorCode"] == 35
    (tmp_path / "resp.json").write_text(json.dumps(doc))
    assert main(["encode", str(tmp_path / "resp.json"), "--hex"]) == 0
    assert capsys.readouterr().out.strip() == frame.hex()


def test_jsonl_decode_of_a_truncated_gzip_capture_warns_and_keeps_what_it_read(tmp_path,
                                                                             capsys):
    """A gzip capture cut short (its writer killed): the lines before the cut are
    decoded, then a warning, as ``kinspect show`` does; no traceback."""
    import warnings

    from kinspect.capture import CaptureWarning, read_capture

    src = Path(__file__).resolve().parents[1] / "captures" / "example.jsonl"
    whole = gzip.compress(src.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always", CaptureWarning)
        readable = len(list(read_capture(cut)))
    assert main(["decode", "--jsonl", str(cut)]) == 0
    captured = capsys.readouterr()
    out = [json.loads(x) for x in captured.out.splitlines()]
    assert 0 < len(out) == readable
    assert all("error" not in x for x in out)
    assert "compressed data ends early" in captured.err
    assert f"the lines after {readable} are lost" in captured.err


def test_jsonl_gzip_line_longer_than_the_limit_is_an_error(tmp_path, capsys, monkeypatch):
    """decode --jsonl reads a gzip file's lines in bounds, as kinspect show does: a
    line longer than the limit once decompressed ends the run with an error, after
    the lines before it."""
    import kinspect.capture

    monkeypatch.setattr(kinspect.capture, "MAX_LINE_BYTES", 1 << 20)
    req, _ = _metadata_pair()
    line = json.dumps({"conn": 1, "dir": "req", "frame": base64.b64encode(req).decode()})
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(gzip.compress(line.encode() + b"\n" + b"y" * (8 << 20) + b"\n"))
    assert main(["decode", "--jsonl", str(src)]) == 1
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 1 and "error" not in json.loads(captured.out)
    assert f"{src}:2: a line longer than {1 << 20} bytes" in captured.err


@pytest.mark.parametrize("conn", ["c1", None, 1.0])
def test_jsonl_conn_must_be_an_integer_as_in_captures(tmp_path, capsys, conn):
    """``conn`` is an integer, as for every capture reader: another value makes that
    line an error line (the run goes on); lines without ``conn`` are one connection."""
    req, resp = _metadata_pair()
    src = tmp_path / "in.jsonl"
    b64 = base64.b64encode
    src.write_text("".join(json.dumps(x) + "\n" for x in [
        {"conn": conn, "dir": "req", "frame": b64(req).decode()},
        {"dir": "req", "frame": b64(req).decode()},
        {"dir": "resp", "frame": b64(resp).decode()}]))
    assert main(["decode", "--jsonl", str(src)]) == 1  # (the first line failed)
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "'conn' must be an integer" in out[0]["error"]["error"]
    assert [x["decoded"]["api"] for x in out[1:]] == ["Metadata", "Metadata"]


def test_input_errors_are_plain_messages_without_python_class_names(tmp_path, capsys):
    """A missing file, a directory, bad hex: ``kinspect: error: WHAT`` naming the file,
    not a Python exception class (FileNotFoundError, IsADirectoryError, InputError)."""
    (tmp_path / "bad.hex").write_text("zz\n")
    cases = [[str(tmp_path / "missing.bin")], [str(tmp_path)],
             [str(tmp_path / "bad.hex"), "--hex"]]
    for argv in cases:
        assert main(["decode", *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("kinspect: error: ") and argv[0] in err, err
        assert not any(name in err for name in ("FileNotFoundError", "IsADirectoryError",
                                                "InputError", "Errno")), err


def test_encode_input_errors_are_plain_messages_like_decode(tmp_path, capsys):
    """``kinspect encode missing.json`` (or a directory) says ``kinspect: error:``
    with the file and the reason, as decode does, not ``[Errno 2] ...``."""
    for path in (tmp_path / "missing.json", tmp_path):
        assert main(["encode", str(path)]) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("kinspect: error: ") and str(path) in err, err
        assert "Errno" not in err and "IsADirectoryError" not in err, err


def test_api_version_without_api_key_is_refused_not_ignored(tmp_path, capsys):
    """``--api-version`` types a response together with ``--api-key``; given alone it
    would silently decode the frame as a request, so it is an error."""
    req, _ = _metadata_pair()
    f = tmp_path / "req.bin"
    f.write_bytes(req)
    assert main(["decode", str(f), "--api-version", "12"]) == 1
    captured = capsys.readouterr()
    assert "--api-key" in captured.err and not captured.out


# ---------------------------------------------------------------------------
# batches: input that is not a clean capture


def _frame_line(frame: bytes, **extra) -> bytes:
    rec = {"type": "frame", "conn": 1, "dir": "req", **extra,
           "frame": base64.b64encode(frame).decode()}
    return json.dumps(rec, ensure_ascii=False).encode() + b"\n"


@pytest.mark.parametrize("verb", ["decode", "encode"])
def test_jsonl_line_that_is_not_utf8_is_an_error_line_not_a_traceback(tmp_path, capsys, verb):
    """A line that is not UTF-8 (a binary file given by mistake) becomes an error line
    naming its line, as a line that is not JSON does; the run goes on, exit 1."""
    req, _ = _metadata_pair()
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\xd0\xcf\x11\xe0 binary\n" + _frame_line(req))
    assert main([verb, "--jsonl", str(src)]) == 1
    captured = capsys.readouterr()
    out = [json.loads(x) for x in captured.out.splitlines()]
    assert out[0]["line"] == 1 and out[0]["error"]["error"].startswith("not UTF-8 text")
    assert len(out) == 2 and "error" not in out[1]
    assert "1 error" in captured.err and "Traceback" not in captured.err


@pytest.mark.parametrize("gz", [False, True])
def test_jsonl_torn_last_line_is_skipped_with_a_warning_as_show_does(tmp_path, capsys, gz):
    """The torn last line of a capture still being written (here cut inside a
    multi-byte character of its client address) is skipped with a warning naming
    its file and line, as ``kinspect show`` skips it: no traceback, no error line."""
    req, _ = _metadata_pair()
    torn = _frame_line(req, client="caf\u00e9:1")
    torn = torn[:torn.index("\u00e9".encode()) + 1]  # the first byte of the two of é
    text = b'{"type":"session"}\n' + _frame_line(req) + torn
    src = tmp_path / ("in.jsonl.gz" if gz else "in.jsonl")
    src.write_bytes(gzip.compress(text) if gz else text)
    assert main(["decode", "--jsonl", str(src)]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2 and '"error"' not in captured.out
    assert f"warning: {src}:3: torn last line skipped ({len(torn)} bytes)" in captured.err
    assert "1 frame, 0 errors" in captured.err and "Traceback" not in captured.err


@pytest.mark.parametrize("frame", [None, 5, [1], {"a": 1}])
def test_jsonl_frame_that_is_not_a_string_is_an_error_line(tmp_path, capsys, frame):
    """``"frame"`` null, a number, a list...: that line's error object says it is not
    base64 (as ``kinspect show`` does), the run goes on and exits 1."""
    req, _ = _metadata_pair()
    src = tmp_path / "in.jsonl"
    src.write_bytes(json.dumps({"conn": 1, "dir": "req", "frame": frame}).encode() + b"\n"
                    + _frame_line(req))
    assert main(["decode", "--jsonl", str(src)]) == 1
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert out[0] == {"conn": 1, "dir": "req", "frame": frame,
                      "error": {"error": "frame is not base64"}}
    assert out[1]["decoded"]["api"] == "Metadata"


def test_jsonl_exit_status_says_whether_a_line_failed(tmp_path, capsys):
    """Exit 0 when every line decoded, 1 when one failed (every line still written),
    so that a script can tell; the status is in --help."""
    req, _ = _metadata_pair()
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_bytes(_frame_line(req) * 2)
    bad.write_bytes(_frame_line(req) + _frame_line(req[:-3]) + _frame_line(req))
    assert main(["decode", "--jsonl", str(good)]) == 0
    capsys.readouterr()
    assert main(["decode", "--jsonl", str(bad)]) == 1
    captured = capsys.readouterr()
    out = [json.loads(x) for x in captured.out.splitlines()]
    assert ["error" in x for x in out] == [False, True, False]
    assert "2 frames, 1 error" not in captured.err and "3 frames, 1 error" in captured.err
    for verb in ("decode", "encode"):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        assert "1 when any line failed" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("damage", ["crc", "deflate"])
def test_jsonl_corrupt_gzip_is_an_error_not_a_cut(tmp_path, capsys, damage):
    """A gzip file whose data is damaged (CRC mismatch, bad deflate data) ends the run
    with an error naming the file and exit 1, not the warning of a file cut short."""
    req, _ = _metadata_pair()
    data = bytearray(gzip.compress(_frame_line(req) * 3))
    if damage == "crc":
        data[-6] ^= 0xFF  # the trailer's CRC-32
    else:
        data[10] = 0xFF  # the first deflate block: reserved block type 3
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(bytes(data))
    assert main(["decode", "--jsonl", str(src)]) == 1
    err = capsys.readouterr().err
    assert f"kinspect decode: error: {src}: compressed data is corrupt" in err, err
    assert "ends early" not in err and "Traceback" not in err


def test_jsonl_follows_the_rotated_parts_of_a_capture(tmp_path, capsys):
    """``decode --jsonl cap.jsonl`` reads ``cap.1.jsonl``, ``cap.2.jsonl``... after it,
    as show and export do (a part of the same capture: same session start_ns), and
    stops at a stale part of another capture; an error line in a part names it."""
    req, resp = _metadata_pair()
    session = {"type": "session", "start_ns": 7, "part": 0}
    src = tmp_path / "cap.jsonl"
    src.write_bytes(json.dumps(session).encode() + b"\n" + _frame_line(req))
    (tmp_path / "cap.1.jsonl").write_bytes(
        json.dumps({**session, "part": 1}).encode() + b"\n" + b"not json\n"
        + _frame_line(resp, dir="resp"))
    (tmp_path / "cap.2.jsonl").write_bytes(  # left by an older capture
        json.dumps({**session, "start_ns": 1, "part": 2}).encode() + b"\n" + _frame_line(req))
    assert main(["decode", "--jsonl", str(src)]) == 1  # (the line that is not JSON)
    captured = capsys.readouterr()
    out = [json.loads(x) for x in captured.out.splitlines()]
    assert len(out) == 5 and "2 frames, 1 error" in captured.err
    assert out[1]["decoded"]["api"] == "Metadata" and out[2]["part"] == 1
    assert out[3]["file"] == str(tmp_path / "cap.1.jsonl") and out[3]["line"] == 2
    assert out[4]["decoded"]["type"] == "response"  # paired with part 0's request


@pytest.mark.parametrize("argv, option", [
    (["decode", "{frame}", "--jsonl", "{cap}"], "a frame file"),
    (["decode", "--jsonl", "{cap}", "--format", "tree"], "argument --format"),
    (["decode", "--jsonl", "{cap}", "--api-key", "Metadata"], "argument --api-key"),
    (["decode", "--jsonl", "{cap}", "--api-version", "12"], "argument --api-version"),
    (["decode", "--jsonl", "{cap}", "--request", "{frame}"], "argument --request"),
    (["decode", "--jsonl", "{cap}", "--response"], "argument --response"),
    (["decode", "--jsonl", "{cap}", "--hex"], "argument --hex"),
    (["decode", "--jsonl", "{cap}", "--size-prefix", "no"], "argument --size-prefix"),
    (["encode", "{frame}", "--jsonl", "{cap}"], "a frame file"),
    (["encode", "--jsonl", "{cap}", "--base64"], "argument --base64"),
    (["encode", "--jsonl", "{cap}", "--size-prefix"], "argument --size-prefix"),
])
def test_options_of_one_frame_are_refused_with_a_batch(argv, option, tmp_path, capsys):
    """``--jsonl`` decodes (encodes) a batch whose lines say what their frames are:
    an option about one frame given with it is a usage error naming it, not silently
    ignored (``decode FILE --format tree --jsonl CAP`` ran the batch and exited 0)."""
    req, _ = _metadata_pair()
    frame = _write(tmp_path / "f.bin", req)
    cap = Path(__file__).resolve().parents[1] / "captures" / "example.jsonl"
    with pytest.raises(SystemExit) as e:
        main([a.format(frame=frame, cap=cap) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{option}: not allowed with argument --jsonl" in err, err
