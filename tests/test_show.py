"""Rendering flows: table rows, the decoded tree with record batches, JSON, diffs of
changed frames, and the ``kinspect show`` command, over the committed example capture
(kafka-python through the real proxy into Tansu, made by scripts/record_example.py)."""

from __future__ import annotations

import base64
import gc
import io
import json
import os
import re
import struct
import types
from pathlib import Path

import pytest
from rich.console import Console

from kinspect import cli
from kinspect.capture import load_capture
from kinspect.codec import Codec
from kinspect.codec.records import decode_records
from kinspect.flows import MUTATED, Flow
from kinspect.proxy.pipeline import decode_flow
from kinspect.show import (
    COLUMNS,
    error_name,
    flow_json,
    flow_row,
    flow_summary,
    flow_table,
    flow_tree,
    frame_diff,
    print_flow_table,
    records_fields,
    records_summary,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "captures" / "example.jsonl"
CODEC = Codec()
# what scripts/record_example.py sends (its inputs)
GZIP_VALUES = [b"hello", b"kafka", b"records"]
PLAIN_VALUES = [b"plain-1", b"plain-2"]


@pytest.fixture(scope="module")
def cap():
    return load_capture(EXAMPLE, CODEC)


def text_of(renderable) -> str:
    buf = io.StringIO()
    Console(file=buf, width=250, color_system=None).print(renderable)
    return buf.getvalue()


def produce_flows(cap):
    return [f for f in cap.flows if f.api_key == 0]


def copy_flow(f: Flow, request: bytes | None = None, response: bytes | None = None) -> Flow:
    g = Flow(f.id, f.conn, f.client, f.upstream, f.api_key, f.api_version, f.correlation_id,
             f.api_name, request if request is not None else f.request, f.request_ns)
    g.response = response if response is not None else f.response
    g.response_ns = f.response_ns
    decode_flow(CODEC, g)
    return g


# ---------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------

def test_rows_have_every_column_and_match_the_flow(cap):
    for f in cap.flows:
        row = flow_row(f)
        assert list(row) == [k for k, _, _ in COLUMNS]
        assert row["api"] == f"{f.api_name} v{f.api_version}"
        assert row["corr"] == str(f.correlation_id) and row["conn"] == str(f.conn)
        assert row["req_bytes"] == str(len(f.request))
        assert row["resp_bytes"] == str(len(f.response))
        assert row["client_id"] == f.client_id == "kinspect-example"
        assert float(row["latency"]) == pytest.approx(f.latency_ns / 1e6, abs=0.01)
        assert row["flags"] == " ".join(sorted(f.flags))
        if f.error_code:
            assert row["error"] == f"{f.error_code} {error_name(f.error_code)}"
        else:
            assert row["error"] == ""
    assert error_name(36) == "TOPIC_ALREADY_EXISTS"


def test_records_summary_of_produce_and_fetch(cap):
    produced = [s for f in produce_flows(cap) for s in records_summary(f)]
    assert sum(s["records"] for s in produced) == len(GZIP_VALUES) + len(PLAIN_VALUES)
    assert {s["topic"] for s in produced} == {"example"} and {s["partition"] for s in produced} == {0}
    assert sorted(tuple(s["compression"]) for s in produced) == [("gzip",), ("none",), ("none",)]
    fetched = [s for f in cap.flows if f.api_key == 1 for s in records_summary(f)]
    assert sum(s["records"] for s in fetched) == 5 and all(s["dir"] == "resp" for s in fetched)
    gz = next(f for f in produce_flows(cap) if records_summary(f)[0]["compression"] == ["gzip"])
    assert flow_row(gz)["records"] == "example[0] 3 rec gzip"
    assert flow_summary(gz)["records"][0]["error"] is None


def test_records_fields_are_found_through_the_spec(cap):
    f = produce_flows(cap)[0]
    fields = records_fields(f.request_decoded.body)
    assert [rf.path for rf in fields] == ["TopicData[0].PartitionData[0].Records"]
    assert fields[0].data == bytes(f.request_decoded.body.TopicData[0].PartitionData[0].Records)
    fetch = next(fl for fl in cap.flows if fl.api_key == 1)
    assert [rf.path for rf in records_fields(fetch.response_decoded.body)] == [
        "Responses[0].Partitions[0].Records"]
    assert records_fields(fetch.request_decoded.body) == []


def test_rows_of_every_flow_leave_no_cyclic_garbage(cap):
    """flow_row runs for every flow the live view shows: what it builds must be freed
    by reference counting once dropped. Cyclic garbage waits for the cyclic GC, and
    with it whatever it refers to: a self-calling closure in records_fields kept every
    Produce request's records bytes alive that way (the live view's proxy touched
    ~100 MB more memory per 100 MB of 1 MB Produce requests)."""
    flows = [copy_flow(f) for f in cap.flows]
    assert any(records_fields(f.request_decoded.body) for f in flows)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collection finds stays in gc.garbage
    try:
        for f in flows:
            flow_row(f, quick=True)
            flow_row(f)
            records_summary(f)
        gc.collect()
        ours = [o for o in gc.garbage  # (pytest's own plugins may leave some too)
                if type(o).__module__.startswith("kinspect")
                or (isinstance(o, types.FunctionType) and o.__module__.startswith("kinspect"))]
        assert not ours, ours[:5]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_table_renders_every_flow(cap):
    out = text_of(flow_table(cap.flows, title="example"))
    for f in cap.flows:
        assert f" {f.api_name} v{f.api_version} " in out
    assert "TOPIC_ALREADY_EXISTS" in out


# ---------------------------------------------------------------------------
# tree and JSON
# ---------------------------------------------------------------------------

def test_tree_shows_records_with_keys_values_headers_and_crc(cap):
    gz = next(f for f in produce_flows(cap) if records_summary(f)[0]["compression"] == ["gzip"])
    out = text_of(flow_tree(gz, CODEC))
    assert "gzip" in out and "CRC ok" in out
    for i, v in enumerate(GZIP_VALUES):
        assert f"key 'k{i + 1}' · value '{v.decode()}'" in out
    assert out.count("header 'source' = 'record_example'") == 3
    assert "ClientId: 'kinspect-example'" in out
    assert "TopicId" not in out.split("response")[0]  # not a field of Produce v9
    fetch = next(fl for fl in cap.flows if fl.api_key == 1)
    out = text_of(flow_tree(fetch, CODEC))
    for v in GZIP_VALUES + PLAIN_VALUES:
        assert f"value '{v.decode()}'" in out


def test_json_of_a_flow_decodes_records_and_keeps_their_bytes(cap):
    gz = next(f for f in produce_flows(cap) if records_summary(f)[0]["compression"] == ["gzip"])
    doc = json.loads(json.dumps(flow_json(gz, CODEC)))
    rec = doc["request"]["body"]["TopicData"][0]["PartitionData"][0]["Records"]
    raw = bytes(gz.request_decoded.body.TopicData[0].PartitionData[0].Records)
    assert base64.b64decode(rec["base64"]) == raw and rec["size"] == len(raw)
    rs = rec["record_set"]
    assert rs["record_count"] == 3 and rs["batches"][0]["compression"] == "gzip"
    assert rs["batches"][0]["crc_valid"] is True
    assert [r["value"] for r in rs["batches"][0]["records"]] == [f"'{v.decode()}'"
                                                                 for v in GZIP_VALUES]
    assert doc["api_name"] == "Produce" and doc["correlation_id"] == gz.correlation_id
    assert doc["response"]["body"]["Responses"][0]["Name"] == "example"


def _with_records(f: Flow, new_records: bytes) -> Flow:
    req = CODEC.decode_request(f.request)
    req.body.TopicData[0].PartitionData[0].Records = new_records
    return copy_flow(f, request=CODEC.encode_request(req))


def test_bad_crc_is_shown_not_raised(cap):
    f = produce_flows(cap)[0]
    raw = bytearray(f.request_decoded.body.TopicData[0].PartitionData[0].Records)
    raw[17] ^= 0xFF  # first byte of the batch CRC (baseOffset 8, length 4, epoch 4, magic 1)
    g = _with_records(f, bytes(raw))
    assert "CRC INVALID" in text_of(flow_tree(g, CODEC))
    assert records_summary(g)[0]["error"] is None


def test_partial_batch_at_the_end_is_reported(cap):
    fetch = next(fl for fl in cap.flows if fl.api_key == 1)
    resp = CODEC.decode_response(fetch.response, 1, fetch.api_version)
    part = resp.body.Responses[0].Partitions[0]
    whole = bytes(part.Records)
    n_batches = len(decode_records(whole).batches)
    part.Records = whole[:-10]  # the last batch cut short, as brokers may send it
    g = copy_flow(fetch, response=CODEC.encode_response(resp))
    (s,) = records_summary(g)
    assert s["partial"] is True and s["error"] is None and s["batches"] == n_batches - 1
    assert "partial batch" in text_of(flow_tree(g, CODEC))
    assert "+partial" in flow_row(g)["records"]


def test_undecodable_records_are_an_error_in_the_summary(cap):
    f = produce_flows(cap)[0]
    raw = bytearray(f.request_decoded.body.TopicData[0].PartitionData[0].Records)
    raw[16] = 7  # magic 7 does not exist
    g = _with_records(f, bytes(raw))
    (s,) = records_summary(g)
    assert s["error"] and "magic" in s["error"].lower()
    assert "undecodable records" in text_of(flow_tree(g, CODEC))


# ---------------------------------------------------------------------------
# diffs of changed frames
# ---------------------------------------------------------------------------

def test_mutated_request_diff_lists_the_changed_field(cap):
    md = next(f for f in cap.flows if f.api_key == 3)
    req = CODEC.decode_request(md.request)
    before = req.body.AllowAutoTopicCreation
    req.body.AllowAutoTopicCreation = not before
    g = copy_flow(md)
    g.request_sent = CODEC.encode_request(req)
    g.flags.add(MUTATED)
    d = frame_diff(CODEC, g, "req")
    assert d["fields"] == [{"path": "body.AllowAutoTopicCreation", "before": before,
                            "after": not before}]
    first = d["bytes"]["first_difference"]
    assert g.request[first] != g.request_sent[first] and g.request[:first] == g.request_sent[:first]
    assert frame_diff(CODEC, g, "resp") is None
    out = text_of(flow_tree(g, CODEC))
    assert "request as sent (mutated)" in out and "body.AllowAutoTopicCreation" in out
    doc = flow_json(g, CODEC)
    assert doc["diff"]["req"]["fields"][0]["path"] == "body.AllowAutoTopicCreation"
    assert doc["diff"]["resp"] is None


def test_a_tagged_field_set_away_from_its_default_diffs_as_that_field_alone(cap):
    """A rule setting a tagged field that was on the wire at its default (Tansu's
    ApiVersions answers carry all four at theirs) changes that field: the diff says
    so and nothing else, not the to_dict bookkeeping of default-valued tags
    (``_present_tags[2]: 2 → 3``). A default-valued tag stripped from the wire is
    that field gone."""
    av = next(f for f in cap.flows if f.api_key == 18)
    resp = CODEC.decode_response(av.response, av.api_key, av.api_version)
    assert resp.to_dict()["body"]["_present_tags"] == [0, 1, 2, 3]
    resp.body.FinalizedFeaturesEpoch = 7
    g = copy_flow(av)
    g.response_sent = CODEC.encode_response(resp)
    d = frame_diff(CODEC, g, "resp")
    assert d["fields"] == [{"path": "body.FinalizedFeaturesEpoch", "before": -1, "after": 7}]
    stripped = CODEC.decode_response(av.response, av.api_key, av.api_version)
    stripped.body._present = frozenset({0, 1, 2})  # ZkMigrationReady (tag 3) left out
    g.response_sent = CODEC.encode_response(stripped)
    assert len(g.response_sent) < len(g.response)
    d = frame_diff(CODEC, g, "resp")
    assert d["fields"] == [{"path": "body.ZkMigrationReady", "before": False,
                            "after": "(absent)"}]


def test_rewritten_responses_diff_only_in_broker_addresses(cap):
    rewritten = [f for f in cap.flows if "rewritten" in f.flags]
    assert rewritten
    for f in rewritten:
        d = frame_diff(CODEC, f, "resp")
        assert d["fields"], f
        assert all(ch["path"].rsplit(".", 1)[-1] in ("Host", "Port") for ch in d["fields"])
        assert any(ch["path"].endswith("Port") and ch["before"] != ch["after"]
                   for ch in d["fields"])


# ---------------------------------------------------------------------------
# print_flow_table: what rich prints for flow_table, without its cell-by-cell layout
# ---------------------------------------------------------------------------

_SGR = re.compile("\x1b\\[([0-9;]*)m")


def _styled_chars(ansi: str) -> list[tuple[str, str]]:
    """Each character printed, with the SGR parameters in force for it (rich closes
    every styled run with a reset); spaces carry none, whatever their colour: a
    foreground colour does not show on them, and rich and a table laid out here
    may cut the runs differently."""
    out, sgr, pos = [], "", 0
    for m in _SGR.finditer(ansi + "\x1b[m"):
        out += [(ch, sgr if ch not in " \n" else "") for ch in ansi[pos:m.start()]]
        sgr = "" if m.group(1) in ("", "0") else m.group(1)
        pos = m.end()
    return out


@pytest.fixture(scope="module")
def odd_flows(cap):
    """The example's flows, and rows that wrap or are coloured: a client id of wide
    characters, one too long for its column at 150 columns, an undecodable response
    (yellow), a five-digit flow id; the example has error rows (red)."""
    wide, long_id, cut = (copy_flow(f) for f in cap.flows[:2] + [cap.flows[1]])
    wide.client_id, wide.id = "客户端 " * 12, 1000
    long_id.client_id, long_id.id = "a-very-long-client-id-" * 6, 100_000
    cut = copy_flow(cap.flows[1], response=cap.flows[1].response[:-3])
    cut.id = 1001
    assert "undecoded" in cut.flags and any(f.error_code for f in cap.flows)
    return list(cap.flows) + [wide, long_id, cut]


@pytest.mark.parametrize("console", [
    {"width": 100_000, "soft_wrap": True},  # what show prints to a pipe or a file
    {"width": 150, "force_terminal": True, "color_system": "truecolor"},
    {"width": 220, "force_terminal": True, "color_system": "256"},
    {"width": 120},  # the wrapping columns squeezed
    {"width": 90},  # squeezed below their headers, some to nothing: left to rich
    {"width": 60},  # too narrow for any layout: left to rich
    {"width": 150, "encoding": "ascii"},  # ASCII box characters
], ids=["pipe", "150-truecolor", "220-256", "120", "90", "60", "ascii"])
@pytest.mark.parametrize("title", [None, "capture · upstream h:1", "a long title " * 20])
def test_print_flow_table_prints_what_rich_prints(odd_flows, console, title):
    def printed(render) -> str:
        kw = dict(console)
        encoding = kw.pop("encoding", "utf-8")
        raw = io.BytesIO()
        buf = io.TextIOWrapper(raw, encoding=encoding, errors="backslashreplace",
                               write_through=True)
        render(Console(file=buf, **kw))
        return raw.getvalue().decode(encoding)

    want = printed(lambda c: c.print(flow_table(odd_flows, title=title)))
    got = printed(lambda c: print_flow_table(c, iter(odd_flows), title=title))
    assert _SGR.sub("", got) == _SGR.sub("", want)
    assert _styled_chars(got) == _styled_chars(want)
    if "color_system" in console:  # the colours were there to compare
        assert {sgr for _, sgr in _styled_chars(want)} >= {"1", "31", "33"}


def test_print_flow_table_title_may_count_the_rows(cap):
    buf = io.StringIO()
    n = print_flow_table(Console(file=buf, width=200), (f for f in cap.flows if f.api_key == 0),
                         title=lambda rows: f"{rows} produce flows")
    assert n == len(produce_flows(cap)) > 0
    assert buf.getvalue().split("\n", 1)[0].strip() == f"{n} produce flows"


def test_show_lets_each_flow_go_once_its_row_is_made(tmp_path, capsys):
    """Decoded values take many times a frame's size (an ApiVersions answer of 283
    bytes decodes into some 60 structs): show decodes each flow for its row and
    lets it go. What the command's peak memory grows by per flow (tracemalloc,
    1,000 flows against 4,000, the table written to /dev/null) is less than what
    one flow held decoded takes (its frames, its row and the table's text take
    some 2.6 KB a flow, the decoded values 4.2 KB more, rich's table cells more
    again)."""
    import contextlib
    import tracemalloc

    lines = EXAMPLE.read_text().splitlines()
    session, recs = lines[0], [json.loads(x) for x in lines[1:]]
    api = [r for r in recs if r.get("type") == "frame" and r.get("flow") == 1]

    def capture(n: int) -> Path:
        path = tmp_path / f"many-{n}.jsonl"
        with path.open("w") as fh:
            fh.write(session + "\n")
            for i in range(1, n + 1):
                for r in api:
                    fh.write(json.dumps({**r, "flow": i, "conn": i}) + "\n")
        return path

    small, large = capture(1000), capture(4000)
    held = load_capture(small, CODEC, decode=False).flows
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for f in held:
            decode_flow(CODEC, f)
        per_flow_decoded = (tracemalloc.get_traced_memory()[0] - base) / len(held)
        del held, f
        peaks = []
        for path in (small, large, small, large):  # (the first run also fills caches)
            gc.collect()
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                assert cli.main(["show", str(path)]) == 0
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()
    per_flow = (peaks[3] - peaks[2]) / 3000
    assert per_flow < per_flow_decoded, (per_flow, per_flow_decoded, peaks)
    assert cli.main(["show", str(large)]) == 0
    out = capsys.readouterr().out
    assert "4000 of 4000 flows" in out and out.count("ApiVersions v4") == 4000


# ---------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------

def test_show_command_table_filter_and_errors(cap, capsys):
    assert cli.main(["show", str(EXAMPLE), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [f.id for f in cap.flows]
    assert cli.main(["show", str(EXAMPLE), "--errors", "--format", "json"]) == 0
    errs = json.loads(capsys.readouterr().out)
    assert errs and all(any(c for c in _codes(cap.flow(r["id"]))) for r in errs)
    assert cli.main(["show", str(EXAMPLE), "--errors", "--filter", "~api CreateTopics",
                     "--format", "json"]) == 0
    assert {r["error_code"] for r in json.loads(capsys.readouterr().out)} == {36}
    assert cli.main(["show", str(EXAMPLE), "--filter", "~api Produce"]) == 0
    out = capsys.readouterr().out
    assert out.count("Produce v") == len(produce_flows(cap))
    assert "Metadata" not in out


def test_show_json_is_written_summary_by_summary_as_one_document(cap, capsys):
    """``--format json`` writes each flow's summary as it comes (a large capture's
    list is never built whole): the text is json.dumps of the whole list, indent 2,
    and an empty list is ``[]``."""
    from kinspect.filters import TopicIds

    ids = TopicIds().learn_all(cap.flows)
    for extra, flows in ((), cap.flows), (("--filter", "~api Produce"), produce_flows(cap)), \
            (("--filter", "~api SaslHandshake"), []):
        assert cli.main(["show", str(EXAMPLE), "--format", "json", *extra]) == 0
        want = json.dumps([flow_summary(f, ids) for f in flows], indent=2) + "\n"
        assert capsys.readouterr().out == want


def _codes(f):
    from kinspect.filters import error_codes
    return error_codes(f)


def test_show_command_one_flow(cap, capsys):
    fetch = next(fl for fl in cap.flows if fl.api_key == 1)
    assert cli.main(["show", str(EXAMPLE), "--flow", str(fetch.id)]) == 0
    out = capsys.readouterr().out
    assert f"#{fetch.id} Fetch v{fetch.api_version}" in out and "value 'plain-2'" in out
    assert cli.main(["show", str(EXAMPLE), "--flow", str(fetch.id), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["id"] == fetch.id and doc["records"][0]["records"] == 5


def test_show_command_errors(capsys, tmp_path):
    assert cli.main(["show", str(EXAMPLE), "--flow", "99999"]) == 1
    assert "no flow 99999" in capsys.readouterr().err
    assert cli.main(["show", str(EXAMPLE), "--filter", "~api"]) == 1
    assert "needs an argument" in capsys.readouterr().err
    assert cli.main(["show", str(tmp_path / "missing.jsonl")]) == 1
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("select", [["--filter", "~api Fetch"], ["--errors"]])
def test_show_flow_refuses_a_filter_it_would_ignore(capsys, select):
    """``--flow N`` prints flow N whatever it is: with ``--filter`` or ``--errors`` it is
    a usage error naming both options, not flow N printed as if it matched."""
    with pytest.raises(SystemExit) as e:
        cli.main(["show", str(EXAMPLE), "--flow", "11", *select])
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"argument --flow: not allowed with argument {select[0]}" in captured.err


def test_commands_reading_a_capture_point_a_bare_name_to_captures(capsys, tmp_path,
                                                                  monkeypatch):
    """``--capture NAME`` writes ``captures/NAME``; ``show NAME`` (or replay, serve,
    export) run where that directory is says so, not only "no such file"."""
    (tmp_path / "captures").mkdir()
    (tmp_path / "captures" / "run.jsonl").write_bytes(EXAMPLE.read_bytes())
    monkeypatch.chdir(tmp_path)
    for argv in (["show", "run.jsonl"], ["replay", "run.jsonl", "--upstream", "127.0.0.1:1"],
                 ["serve", "run.jsonl", "--listen", "127.0.0.1:0"],
                 ["export", "run.jsonl", "--pcapng", "run.pcapng"]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert "run.jsonl: no such file (did you mean captures/run.jsonl?)" in err, err
    assert cli.main(["show", "other.jsonl"]) == 1  # nothing under captures/ either
    err = capsys.readouterr().err
    assert "no such file" in err and "did you mean" not in err, err


@pytest.mark.parametrize("errors", [[], ["--errors"]])
def test_show_filter_is_parsed_on_its_own(capsys, errors):
    """The --filter text is the whole expression: it cannot close a parenthesis the
    command put around it, and its errors name positions in it as written."""
    assert cli.main(["show", str(EXAMPLE), "--filter", "~api Produce) | (~api Fetch",
                     *errors]) == 1
    err = capsys.readouterr().err
    assert "position 12" in err and "unbalanced ')'" in err
    assert "\n  ~api Produce) | (~api Fetch\n" in err
    assert cli.main(["show", str(EXAMPLE), "--filter", "~api", *errors]) == 1
    assert "position 4: ~api needs an argument" in capsys.readouterr().err


def test_bytes_limit_truncates_long_values(cap):
    f = produce_flows(cap)[0]
    long_value = b"x" * 500
    raw = bytes(f.request_decoded.body.TopicData[0].PartitionData[0].Records)
    from kafka.record.memory_records import MemoryRecordsBuilder
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=10_000)
    b.append(0, None, long_value, [])
    b.close()
    g = _with_records(f, b.buffer())
    assert raw != b.buffer()
    short = text_of(flow_tree(g, CODEC, limit=16))
    assert "… (500 B)" in short and "x" * 17 not in short
    full = text_of(flow_tree(g, CODEC, limit=None))
    assert "x" * 500 in full.replace("\n", "").replace(" ", "").replace("│", "")


def test_show_command_cuts_long_values_in_trees_but_not_in_json(cap, capsys, tmp_path):
    """``--bytes-limit`` defaults to 64 characters where people read (trees) and to
    everything where programs do (``--format json``); given, it applies to both."""
    import base64

    from kafka.record.memory_records import MemoryRecordsBuilder

    f = produce_flows(cap)[0]
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=10_000)
    b.append(0, None, b"x" * 500, [])
    b.close()
    long = base64.b64encode(_with_records(f, b.buffer()).request).decode()
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("flow") == f.id and rec.get("dir") == "req":
            rec["frame"] = long
        lines.append(json.dumps(rec))
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(lines) + "\n")

    def value(*opts: str) -> str:
        assert cli.main(["show", str(path), "--flow", str(f.id), *opts]) == 0
        return capsys.readouterr().out

    assert "x" * 500 in json.dumps(json.loads(value("--format", "json")))
    assert "x" * 500 not in value() and "… (500 B)" in value()
    assert "x" * 500 not in value("--format", "json", "--bytes-limit", "16")


def test_unpaired_and_token_flows_render(cap):
    f = Flow(1, 1, "c:1", "u:2", -1, -1, 7, "Unpaired", b"", 0)
    f.response = struct.pack(">i", 7) + b"\x00\x01"
    f.response_ns = 5
    row = flow_row(f)
    assert row["api"] == "Unpaired" and row["req_bytes"] == ""
    assert "raw: 0x" in text_of(flow_tree(f, CODEC))


def _response_flow(api_key: int, version: int, body) -> Flow:
    from kinspect.codec.protocol import Response

    name = CODEC.api_name(api_key)
    hv = CODEC.response_header_version(api_key, version)
    f = Flow(1, 1, "c:1", "u:2", api_key, version, 1, name, b"", 0)
    f.response = CODEC.encode_response(Response(api_key, version, 1, hv, None, body, 0, name,
                                                version))
    decode_flow(CODEC, f)
    assert f.response_decoded is not None and not f.error
    return f


def test_error_column_ignores_error_code_fields_absent_at_the_version():
    """Metadata's top-level ErrorCode exists from v13, FindCoordinator's up to v3: at
    other versions the codes in the topics / coordinators are the ones to show."""
    md = CODEC.response_codec(3).cls
    topic = md._spec.field("Topics").struct.cls
    f = _response_flow(3, 12, md(Topics=[topic(Name="t", ErrorCode=3)]))
    assert f.error_code == 3
    assert flow_row(f)["error"] == f"3 {error_name(3)}"
    fc = CODEC.response_codec(10).cls
    coord = fc._spec.field("Coordinators").struct.cls
    g = _response_flow(10, 4, fc(Coordinators=[coord(Key="g", ErrorCode=15)]))
    assert g.error_code == 15 and flow_row(g)["error"].startswith("15 ")
    # where the top-level field exists it is still the one shown
    h = _response_flow(3, 13, md(ErrorCode=0, Topics=[topic(Name="t", ErrorCode=3)]))
    assert h.error_code == 0


def test_negative_correlation_ids_are_shown_and_missing_ones_are_not():
    """A correlation id is an int32 a client may send negative; only a flow without
    one (a raw SASL token, whose -1 means "none") leaves the column empty."""
    from kinspect.flows import SASL_TOKEN

    f = Flow(1, 1, "c:1", "u:2", 3, 12, -5, "Metadata", b"", 0)
    assert flow_row(f)["corr"] == "-5"
    assert "corr -5" in text_of(flow_tree(f, CODEC))
    token = Flow(2, 1, "c:1", "u:2", -1, -1, -1, "SaslToken", b"tok", 0)
    token.flags.add(SASL_TOKEN)
    assert flow_row(token)["corr"] == ""
    assert "corr -1" not in text_of(flow_tree(token, CODEC))


def test_empty_sasl_token_shows_its_request():
    from kinspect.flows import SASL_TOKEN, UNPAIRED

    token = Flow(1, 1, "c:1", "u:2", -1, -1, -1, "SaslToken", b"", 0)
    token.flags.add(SASL_TOKEN)
    token.response = b"\x00\x00\x00\x00"
    assert "request (0 B)" in text_of(flow_tree(token, CODEC))
    unpaired = Flow(2, 1, "c:1", "u:2", -1, -1, 7, "Unpaired", b"", 0)
    unpaired.flags.add(UNPAIRED)
    unpaired.response = b"\x00\x00\x00\x07"
    assert "request" not in text_of(flow_tree(unpaired, CODEC))


def test_names_from_the_wire_are_neither_markup_nor_terminal_control(tmp_path):
    """A client id or topic name holding rich markup (``[/]``, ``[link=...]``) or
    terminal control (ESC, BEL) is shown as text, escaped where not printable, by
    ``kinspect show``'s table and tree, ``kinspect analyze``'s summary and ``kinspect
    replay``'s: nothing raises, nothing reaches the terminal raw."""
    from kafka.record.memory_records import MemoryRecordsBuilder
    from proxyutil import request_bytes

    from kinspect.analysis.summary import AnalysisResult
    from kinspect.analysis.summary import print_summary as analysis_summary
    from kinspect.commands.replay import print_summary as replay_summary

    client, topic = "c[/]x[link=https://evil.example]l[/link]\x1b[2J", "t[/]\x1b]0;x\x07"
    td = CODEC.request_codec(0).spec.struct.field("TopicData").struct
    pd = td.field("PartitionData").struct
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    b.append(timestamp=1, key=None, value=b"v", headers=[])
    b.close()
    req = request_bytes(0, 9, 5, client_id=client, Acks=1, TimeoutMs=1000, TopicData=[
        td.cls(Name=topic, PartitionData=[pd.cls(Index=0, Records=bytes(b.buffer()))])])
    flow = Flow(1, 1, "127.0.0.1:1", "127.0.0.1:2", 0, 9, 5, "Produce", req, 1)
    decode_flow(CODEC, flow)
    assert flow.client_id == client

    def shown(render) -> str:
        buf = io.StringIO()
        render(Console(file=buf, width=250, force_terminal=True, color_system="standard"))
        out = buf.getvalue()
        assert "\x07" not in out and "\x1b[2J" not in out and "\x1b]0;" not in out
        assert "\x1b]8;" not in out  # no hyperlink
        return re.sub("\x1b\\[[0-9;]*m", "", out)  # the text, without rich's colours

    out = shown(lambda c: c.print(flow_table([flow])))
    assert "c[/]x[link=https://evil.example]l[/link]\\x1b[2J" in out.replace("\n", "")
    assert "t[/]\\x1b]0;x\\x07[0]" in out.replace("\n", "")
    out = shown(lambda c: c.print(flow_tree(flow, CODEC)))
    assert "of t[/]\\x1b]0;x\\x07[0]" in out
    result = AnalysisResult(engine="local", out=tmp_path, tables={}, api_stats=[], clients=[
        {"client_id": client, "client_software_name": "s[/]", "client_software_version": "1",
         "connections": 1, "flows": 1}], topics=[{
             "topic": topic, "partition": 0, "codec": "none", "produced_records": 1,
             "produced_bytes": 1, "fetched_records": 0, "fetched_bytes": 0,
             "compression_ratio": None}], tagged=[], what_if_summary=[], latency_hist=[])
    out = shown(lambda c: analysis_summary(c, result))
    assert "c[/]x[link=https://evil.example]l[/link]\\x1b[2J" in out
    assert "t[/]\\x1b]0;x\\x07" in out and "s[/] 1" in out
    report = types.SimpleNamespace(
        results=[types.SimpleNamespace(flow=flow, status="differing",
                                       explanation=f"topic {topic!r} [/] differs")],
        counts=lambda: {"matched": 0, "differing": 1, "failed": 0, "skipped": 0},
        upstream="127.0.0.1:2", elapsed_s=0.1, notes=["note [/] here"], mappings=[])
    out = shown(lambda c: replay_summary(c, report, "cap[/].jsonl"))
    assert "cap[/].jsonl" in out and "note [/] here" in out and "[/] differs" in out


def test_show_title_is_plain_text_not_markup(tmp_path, capsys, monkeypatch):
    """A file name or an upstream address with brackets is printed as it is."""
    monkeypatch.setenv("COLUMNS", "250")
    lines = EXAMPLE.read_text().splitlines(keepends=True)
    session = json.loads(lines[0])
    session["upstream"] = "[fd12:3456::1]:9092"
    path = tmp_path / "run[red].jsonl"
    path.write_text(json.dumps(session) + "\n" + "".join(lines[1:]))
    assert cli.main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: " in out and "upstream [fd12:3456::1]:9092" in out, out[:400]


def test_a_crafted_capture_cannot_drive_the_terminal(capsys, tmp_path):
    """A capture file is shared like a pcap: its addresses, session upstream and flags
    reach the table and the tree escaped, as client ids from the wire do (rich keeps
    ESC in a ``Text``, so they would start escape sequences in the user's terminal)."""
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "session":
            rec["upstream"] = "evil\x1b]0;title\x07:1"
        elif rec.get("type") == "frame":
            rec["client"] = "c\x1b[2J:1"
            rec["upstream"] = "u\x1b[5m:2"
            rec["flags"] = ["f\x1b[31m"]
        lines.append(json.dumps(rec))
    evil = tmp_path / "evil.jsonl"
    evil.write_text("\n".join(lines) + "\n")
    first = load_capture(evil, CODEC).flows[0].id
    for argv in (["show", str(evil)], ["show", str(evil), "--flow", str(first)]):
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out, argv
        assert "\\x1b[" in out, argv  # shown, escaped
    assert "c\\x1b[2J:1 → u\\x1b[5m:2" in out and "f\\x1b[31m" in out


def test_show_writes_to_a_stdout_that_is_not_utf8():
    """``PYTHONIOENCODING=ascii`` (or a latin-1 locale): the table and the tree are
    written with what the encoding cannot show escaped, not a UnicodeEncodeError."""
    import os
    import subprocess
    import sys

    fetch = next(f for f in load_capture(EXAMPLE, CODEC).flows if f.api_key == 1)
    for extra in ([], ["--flow", str(fetch.id)]):
        proc = subprocess.run([sys.executable, "-m", "kinspect", "show", str(EXAMPLE), *extra],
                              capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONIOENCODING": "ascii"})
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        out = proc.stdout.decode("ascii")
        assert "Fetch v" in out and ("\\xb7" in out or "\\u2192" in out), out[:500]


def test_a_byte_that_is_not_utf8_is_shown_as_that_byte():
    """A client id with bytes that are not UTF-8 decodes losslessly into surrogate
    escapes (U+DC80-U+DCFF); the terminal views show each such byte as ``\\xNN``, the
    byte on the wire, and other characters that are not printable by code point
    (``\\u009b`` for the C1 control CSI), so ``\\xNN`` always means a byte."""
    from kinspect.show import printable

    raw = b"k\xff\x9bs"
    name = raw.decode("utf-8", "surrogateescape")  # as the codec reads it
    assert printable(name) == "k\\xff\\x9bs"
    assert printable("a\x9b[2Jb\x1b\u2028") == "a\\u009b[2Jb\\x1b\\u2028"
    assert printable("\U000e0001") == "\\U000e0001"  # a tag character: not printable


def test_format_time_of_the_second_before_the_epoch(tmp_path):
    """``ts_ns: -1`` is 23:59:59.999 (UTC) of the last day of 1969, not "999": the cache
    of the last second formatted must not mistake -1 for its empty start (a fresh
    process, so the cache is as it starts)."""
    import subprocess
    import sys

    env = {**os.environ, "TZ": "UTC"}
    code = ("from kinspect.show import format_time; "
            "print(format_time(-1), format_time(-1_000_000_000), format_time(1_000_000_000))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out == ["23:59:59.999", "23:59:59.000", "00:00:01.000"]
    lines = [json.loads(x) for x in EXAMPLE.read_text().splitlines()]
    for r in lines:
        if r.get("type") == "frame":
            r["ts_ns"] = -1
    path = tmp_path / "neg.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    res = subprocess.run([sys.executable, "-m", "kinspect", "show", str(path)],
                         env={**env, "COLUMNS": "250"}, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    rows = [x for x in res.stdout.splitlines() if x.startswith("│")]
    assert rows and all("23:59:59.999" in x for x in rows), res.stdout


def test_hexdump_lays_out_a_frame_as_hexdump_c_does():
    from kinspect.show import hexdump

    # ApiVersions v4 request header (v2): api key 18, version 4, correlation id 1,
    # client id "kinspect-example" (int16 length 16), then the tag section (0)
    frame = bytes.fromhex("0012 0004 00000001 0010") + b"kinspect-example" + b"\x00"
    assert hexdump(frame).splitlines() == [
        "00000000  00 12 00 04 00 00 00 01  00 10 6b 69 6e 73 70 65  |..........kinspe|",
        "00000010  63 74 2d 65 78 61 6d 70  6c 65 00                 |ct-example.|",
    ]
    assert hexdump(b"") == ""


def test_show_flow_hex_prints_each_frame_and_refuses_without_flow(capsys):
    frame = next(f for f in load_capture(EXAMPLE).flows if f.id == 1).request
    assert cli.main(["show", str(EXAMPLE), "--flow", "1", "--hex"]) == 0
    out = capsys.readouterr().out
    assert f"request bytes ({len(frame)} B" in out and "response bytes (" in out
    # the first line of the request's dump: its first 16 bytes, as the capture has them
    assert "00000000  " + frame[:8].hex(" ") + "  " + frame[8:16].hex(" ") in out
    with pytest.raises(SystemExit) as e:
        cli.main(["show", str(EXAMPLE), "--hex"])
    assert e.value.code == 2
    assert "--hex: only with --flow" in capsys.readouterr().err


def test_the_tree_shows_the_tagged_fields_on_the_wire_only():
    """A tagged field (KIP-482) not on the wire is not in the tree, as ``to_dict`` and
    Kafka's JSON converters leave it out: the tree shows what the broker sent, a
    Produce v10 answer without KIP-951's ``NodeEndpoints`` apart from one with it;
    one written at its default value is shown (it was on the wire)."""
    import io

    from rich.console import Console
    from rich.tree import Tree

    from kinspect.codec import Codec, Response
    from kinspect.show import message_nodes

    c = Codec()
    cls = c.response_codec(0).cls
    ep = c.registry.response(0).struct.field("NodeEndpoints").struct.cls

    def tree(body) -> str:
        frame = c.encode_response(Response(0, 10, 1, 1, None, body, 0, "", 10))
        t = Tree("answer")
        message_nodes(t, c.decode_response(frame, 0, 10), 64, None, 10)
        out = io.StringIO()
        Console(file=out, width=200).print(t)
        return out.getvalue()

    bare = tree(cls())
    assert "ThrottleTimeMs: 0" in bare
    assert "NodeEndpoints" not in bare and "CurrentLeader" not in bare
    named = tree(cls(NodeEndpoints=[ep(NodeId=1, Host="h", Port=9, Rack=None)]))
    assert "NodeEndpoints [1]" in named and "Host: 'h'" in named
    # the tag of an empty NodeEndpoints array, written: on the wire, so shown
    frame = c.encode_response(Response(0, 10, 1, 1, None, cls(), 0, "", 10))
    written = frame[:-1] + bytes([1, 0, 1, 1])  # tag 0, 1 byte: compact array of 0
    t = Tree("answer")
    message_nodes(t, c.decode_response(written, 0, 10), 64, None, 10)
    out = io.StringIO()
    Console(file=out, width=200).print(t)
    assert "NodeEndpoints [0]" in out.getvalue()


@pytest.mark.parametrize("code,name", [(-1, "UNKNOWN_SERVER_ERROR"), (6, "NOT_LEADER_OR_FOLLOWER"),
                                       (10, "MESSAGE_TOO_LARGE"), (17, "INVALID_TOPIC_EXCEPTION"),
                                       (39, "INVALID_REPLICA_ASSIGNMENT"),
                                       (128, "INVALID_REGULAR_EXPRESSION"),
                                       (129, "REBOOTSTRAP_REQUIRED"), (9999, "ERROR_9999")])
def test_error_codes_are_named_as_kafka_names_them(code, name):
    """Kafka's names (the protocol guide's error table), not kafka-python's older ones
    (NOT_LEADER_FOR_PARTITION, UNKNOWN...), nor ERROR_128 for codes it lacks."""
    from kinspect.show import error_name

    assert error_name(code) == name
