"""The tolerance matrix (kinspect.tolerate, ``kinspect tolerate``) against real brokers,
plus its pure helpers (request building, nested places, answer comparison).

Findings pinned here (they fail the day a broker changes, so the notes can be updated):

* Tansu 0.6 closes the connection when an unknown tagged field carries more than
  128 bytes of data (log: ``maximum tagged fields exceeded N``), wherever it is.
* Tansu 0.6 answers DescribeUserScramCredentials v0 with a null ``Results`` array,
  which the spec does not allow (our codec, like Kafka's, cannot decode it).
* noida-db 0.2.3 disconnects a Fetch v12 request carrying top-level tag 1 or
  partition-level tag 0: it reads them as ``ReplicaState`` / ``ReplicaDirectoryId``,
  tagged fields only from v15 / v17, whatever the version.
"""

from __future__ import annotations

import json

import pytest

from kinspect.brokers import free_port
from kinspect.cli import main
from kinspect.codec import Codec
from kinspect.proxy.server import parse_hostport
from kinspect.tolerate import (
    LARGE_TAG,
    OUTCOMES,
    TAG_KINDS,
    BaselineContext,
    MatrixConfig,
    answer_tree,
    build_request,
    classify,
    diff_paths,
    nested_places,
    normalize,
    run_matrix,
)

MAX_TAG = 2**31 - 1


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


def ctx() -> BaselineContext:
    return BaselineContext("t", "g", bytes(16), "kinspect-test", b"")


# -- pure helpers ----------------------------------------------------------------------


def test_build_request_populates_every_nested_level(codec):
    req = build_request(codec, 9, 8, ctx())  # OffsetFetch v8: Groups[].Topics[]
    places = [p for p, _ in nested_places(codec.registry.request(9).struct, req.body, 8)]
    assert places == ["Groups[0]", "Groups[0].Topics[0]"]
    assert req.body.Groups[0].GroupId == "g"
    assert req.body.Groups[0].Topics[0].PartitionIndexes == [0]
    # the request encodes and decodes as itself
    frame = codec.encode_request(req)
    assert codec.decode_request(frame).body == req.body
    assert codec.decode_request(frame).header_version == 2


def test_build_request_leaves_forgotten_topics_empty(codec):
    req = build_request(codec, 1, 12, ctx())
    assert req.body.ForgottenTopicsData == []
    assert [p for p, _ in nested_places(codec.registry.request(1).struct, req.body, 12)] == [
        "Topics[0]", "Topics[0].Partitions[0]"]


def test_normalize_and_diff_ignore_volatile_fields():
    a = {"ThrottleTimeMs": 5, "Topics": [{"ErrorCode": 0, "Offset": 1}]}
    b = {"ThrottleTimeMs": 9, "Topics": [{"ErrorCode": 0, "Offset": 2}]}
    volatile = diff_paths(normalize(a), normalize(b))
    assert volatile == {("Topics", 0, "Offset")}
    assert normalize(a, volatile) == normalize(b, volatile)
    assert diff_paths({"x": [1, 2]}, {"x": [1]}) == {("x",)}


def _metadata_v12_answer(codec):
    """``frame(body dict)``: a Metadata v12 response frame (header v1, correlation
    id 1) with that body."""
    from kinspect.codec import Response

    cls = codec.response_codec(3).cls
    hcls = codec.registry.header("ResponseHeader").cls

    def frame(body, correlation_id=1):
        return codec.encode_response(Response(3, 12, correlation_id, 1,
                                              hcls(CorrelationId=correlation_id),
                                              cls.from_dict(body), 0, "Metadata", 12))

    return frame


def test_classify(codec):
    frame = _metadata_v12_answer(codec)

    ok = {"Topics": [{"Name": "t", "ErrorCode": 0}]}
    base = normalize(codec.decode_response(frame(ok), 3, 12).body.to_dict())
    assert classify(codec, 3, 12, "ok", frame(ok), None, base, set())[0] == "tolerated"
    assert classify(codec, 3, 12, "ok", frame({"Topics": [{"Name": "t", "ErrorCode": 3}]}),
                    None, base, set())[:2] == ("error", 3)
    outcome, code, detail = classify(codec, 3, 12, "ok", frame({"Topics": [{"Name": "u"}]}),
                                     None, base, set())
    assert (outcome, code) == ("different", None) and "Topics[0].Name" in detail
    assert classify(codec, 3, 12, "ok", b"\x00\x00\x00\x01\x00", None, base, set())[0] == \
        "undecodable"
    assert classify(codec, 3, 12, "disconnect", None, "closed", base, set()) == \
        ("disconnect", None, "closed")
    # bytes after the body: a client would not read them, but the broker wrote them
    outcome, code, detail = classify(codec, 3, 12, "ok", frame(ok) + b"\x00\x07", None, base,
                                     set())
    assert (outcome, code) == ("different", None)
    assert detail == "differs at (bytes after the body)"
    with_them = normalize(answer_tree(codec.decode_response(frame(ok) + b"\x07", 3, 12)))
    assert classify(codec, 3, 12, "ok", frame(ok) + b"\x07", None, with_them, set())[0] == \
        "tolerated"


def test_classify_an_answer_to_another_request_is_undecodable(codec):
    # a broker that answers with another correlation id: a client cannot match the
    # answer to its request and drops the connection
    frame = _metadata_v12_answer(codec)
    ok = {"Topics": [{"Name": "t", "ErrorCode": 0}]}
    base = normalize(codec.decode_response(frame(ok), 3, 12).body.to_dict())
    assert classify(codec, 3, 12, "ok", frame(ok), None, base, set(),
                    correlation_id=1)[0] == "tolerated"
    outcome, code, detail = classify(codec, 3, 12, "ok", frame(ok, correlation_id=2), None,
                                     base, set(), correlation_id=1)
    assert (outcome, code) == ("undecodable", None)
    assert "correlation id 2" in detail and "request's 1" in detail
    # the baseline too
    assert classify(codec, 3, 12, "ok", frame(ok, correlation_id=2), None, None, set(),
                    correlation_id=1)[0] == "undecodable"


# -- against Tansu ----------------------------------------------------------------------


def test_matrix_against_tansu(tansu, tmp_path, capsys):
    out = tmp_path / "matrix.json"
    code = main(["tolerate", "--bootstrap", tansu.bootstrap, "--include-writes",
                 "--json", str(out)])
    assert code == 0
    # (Tansu's DescribeUserScramCredentials answer does not decode: see below)
    printed = capsys.readouterr().out
    assert "untested, the baseline got no usable answer: DescribeUserScramCredentials v0 " \
        "(undecodable)" in " ".join(printed.split())
    report = json.loads(out.read_text())
    assert report["type"] == "tolerance-matrix"
    assert report["truncated"] is None
    topic, group = report["topic"], report["group"]
    assert report["notes"] == [f"created scratch topic {topic}", f"deleted scratch topic {topic}",
                               f"deleted scratch group {group}"]
    topics, groups = _topics_and_groups(tansu.bootstrap)
    assert topic not in topics and group not in groups, (topics, groups)
    cells = report["cells"]
    tested = {t["api"]: t["versions"] for t in report["tested"]}
    # the broker's flexible versions of the safe apis and the writes are all there
    for api in ("ApiVersions", "Metadata", "FindCoordinator", "ListOffsets", "OffsetFetch",
                "Fetch", "Produce", "OffsetCommit"):
        assert api in tested, api
    advertised = {int(k): v for k, v in report["broker_apis"].items()}
    assert tested["Metadata"] == [v for v in range(9, advertised[3][1] + 1)]

    baselines = {(c["api"], c["version"]): c for c in cells if c["place"] == "baseline"}
    assert set(baselines) == {(a, v) for a, vs in tested.items() for v in vs}
    for (api, version), cell in baselines.items():
        if api == "DescribeUserScramCredentials":
            # finding: Tansu answers with a null Results array, which the spec forbids
            assert cell["outcome"] == "undecodable" and "Results" in cell["detail"]
        else:
            assert cell["outcome"] == "tolerated", cell

    variants = [c for c in cells if c["place"] != "baseline"]
    assert {c["outcome"] for c in variants} <= set(OUTCOMES)
    assert sum(report["summary"].values()) == len(variants)
    # every (api, version) with a decodable baseline has header, top and nested places,
    # each with three tag numbers and four payload sizes
    meta12 = [c for c in variants if c["api"] == "Metadata" and c["version"] == 12]
    assert {c["place"] for c in meta12} == {"header", "top", "Topics[0]"}
    assert {c["tag_kind"] for c in meta12} == set(TAG_KINDS)
    assert {c["payload"] for c in meta12} == {0, 1, 1024, 1 << 20}
    assert len(meta12) == 3 * 3 * 4
    produce = {c["place"] for c in variants if c["api"] == "Produce"}
    assert produce == {"header", "top", "TopicData[0]", "TopicData[0].PartitionData[0]"}
    tags = {(c["place"], c["tag_kind"]): c["tag"] for c in meta12}
    assert tags[("top", "large")] == LARGE_TAG and tags[("top", "max")] == MAX_TAG
    assert tags[("header", "above")] == 0  # the request header defines no tagged field
    fetch_top = {c["tag"] for c in variants if c["api"] == "Fetch" and c["version"] == 12
                 and c["place"] == "top" and c["tag_kind"] == "above"}
    assert fetch_top == {1}  # FetchRequest v12 defines tag 0 (ClusterId)
    # Tansu tolerates the small payloads everywhere and drops larger ones (finding below)
    for c in variants:
        if c["payload"] <= 1:
            assert c["outcome"] == "tolerated", c
        else:
            assert c["outcome"] == "disconnect", c
    rows = report["rows"]
    assert any(r["api"] == "Metadata" and r["place"] == "Topics[0]" for r in rows)
    assert all(len(r["cells"]["max"]) == 4 for r in rows)


def _topics_and_groups(bootstrap: str) -> tuple[set[str], set[str]]:
    """The broker's topic names (Metadata, all topics) and group ids (ListGroups)."""
    from proxyutil import exchange_sync, request_bytes

    codec = Codec()
    host, port = parse_hostport(bootstrap)
    md, lg = exchange_sync(host, port, [request_bytes(3, 12, 1, Topics=None),
                                        request_bytes(16, 4, 2)])
    topics = {t.Name for t in codec.decode_response(md, 3, 12).body.Topics}
    groups = {g.GroupId for g in codec.decode_response(lg, 16, 4).body.Groups}
    return topics, groups


def test_the_scratch_topic_and_group_can_be_kept(tansu, capsys):
    code = main(["tolerate", "--bootstrap", tansu.bootstrap, "--include-writes",
                 "--keep-scratch", "--json", "-", "--apis", "OffsetCommit",
                 "--payloads", "0", "--tags", "large"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    topic, group = report["topic"], report["group"]
    assert report["notes"][-1] == f"kept scratch topic {topic} and group {group} (--keep-scratch)"
    topics, groups = _topics_and_groups(tansu.bootstrap)
    assert topic in topics and group in groups, (topics, groups)
    assert main(["tolerate", "--bootstrap", tansu.bootstrap, "--keep-scratch"]) == 1
    assert "--keep-scratch goes with --include-writes" in capsys.readouterr().err


def test_tansu_drops_unknown_tags_over_128_bytes(tansu):
    """Finding: Tansu 0.6 closes the connection when an unknown tagged field's data is
    longer than 128 bytes, logging ``maximum tagged fields exceeded N``."""
    cfg = MatrixConfig(parse_hostport(tansu.bootstrap), apis=("ApiVersions",),
                       payload_sizes=(128, 129), tag_kinds=("large",))
    report = run_matrix(cfg)
    by_size = {}
    for c in report.cells:
        if c.place != "baseline":
            by_size.setdefault(c.payload, set()).add(c.outcome)
    assert by_size == {128: {"tolerated"}, 129: {"disconnect"}}
    assert "maximum tagged fields exceeded 129" in tansu.log_text()


def test_matrix_is_bounded(tansu):
    cfg = MatrixConfig(parse_hostport(tansu.bootstrap), max_cells=10)
    report = run_matrix(cfg)
    assert len(report.cells) <= 10
    assert "max-cells" in report.truncated


async def test_the_summary_counts_every_request_sent(tansu, capsys):
    """The summary's request count is what crossed the wire (counted here by the real
    proxy in between): the cells', each baseline sent twice, and the set-up's and
    clean-up's (ApiVersions, Metadata, CreateTopics, DeleteTopics, DeleteGroups). It
    said the number of cells: 4 where 7 requests were sent."""
    import asyncio

    from proxyutil import bootstrap_of, running_proxy

    runs = [["--apis", "Metadata", "--max-cells", "5"],
            ["--apis", "OffsetCommit", "--include-writes", "--payloads", "0", "--tags", "large"]]
    got = []
    async with running_proxy(tansu.bootstrap) as (proxy, rec):
        for extra in runs:
            before = len(rec.requests)
            code = await asyncio.to_thread(
                main, ["tolerate", "--bootstrap", bootstrap_of(proxy), *extra, "--json", "-"])
            printed = capsys.readouterr()  # (the JSON on stdout, the table on stderr)
            await asyncio.sleep(0.2)  # (the pipeline's last flows)
            got.append((code, printed, len(rec.requests) - before))
    for (code, printed, sent), extra in zip(got, runs):
        assert code == 0, printed
        report = json.loads(printed.out)
        assert report["requests"] == sent, (extra, report["requests"], sent)
        summary = printed.err.strip().splitlines()[-1]
        assert f"{len(report['cells'])} cells, {sent} requests in" in summary, summary
    # Metadata, at most 5 cells: ApiVersions, Metadata for a topic, the v9 baseline
    # twice, three variants (the count said 4)
    assert got[0][2] == 7
    deletes = [f.api_name for f in rec.requests[-2:]]
    assert deletes == ["DeleteTopics", "DeleteGroups"], deletes


def test_unreachable_broker_is_an_error(capsys):
    code = main(["tolerate", "--bootstrap", f"127.0.0.1:{free_port()}", "--timeout", "1"])
    assert code == 1
    assert "cannot connect" in capsys.readouterr().err


# -- against noida-db -------------------------------------------------------------------


def test_noida_reads_tag_of_a_later_fetch_version(noida):
    """Finding: noida-db disconnects a Fetch v12 request with top-level tag 1 (which is
    ReplicaState only from v15) or partition-level tag 0 (ReplicaDirectoryId from v17),
    and tolerates tag 10000 at the same places."""
    cfg = MatrixConfig(parse_hostport(noida.bootstrap), apis=("Fetch",), payload_sizes=(0,),
                       tag_kinds=("above", "large"))
    report = run_matrix(cfg)
    top12 = {c.tag: c.outcome for c in report.cells
             if c.version == 12 and c.place == "top"}
    assert top12 == {1: "disconnect", LARGE_TAG: "tolerated"}
    part12 = {c.tag: c.outcome for c in report.cells
              if c.version == 12 and c.place == "Topics[0].Partitions[0]"}
    assert part12 == {0: "disconnect", LARGE_TAG: "tolerated"}
    header12 = {c.outcome for c in report.cells if c.version == 12 and c.place == "header"}
    assert header12 == {"tolerated"}


def test_matrix_table_keeps_the_baseline_column_on_an_80_column_terminal():
    """The table's ``base`` column (the baseline answer) is shown on an 80-column
    terminal, or in a pipe (rich's default width), not squeezed to nothing."""
    import io

    from rich.console import Console

    from kinspect.tolerate import Cell, MatrixConfig, MatrixReport

    cfg = MatrixConfig(bootstrap=("127.0.0.1", 9092), payload_sizes=(0, 1))
    cells = [Cell("ApiVersions", 18, 3, "baseline", None, None, 0, "tolerated")]
    cells += [Cell("ApiVersions", 18, 3, place, kind, 99, n, "tolerated")
              for place in ("header", "top") for kind in cfg.tag_kinds for n in (0, 1)]
    report = MatrixReport(cfg, {}, cells=cells)
    console = Console(file=io.StringIO(), width=80, force_terminal=False)
    console.print(report.table())
    screen = console.file.getvalue()
    assert "base" in screen.splitlines()[3] or any("base" in x for x in screen.splitlines()[:5])
    row = next(x for x in screen.splitlines() if "ApiVersions" in x and "header" in x)
    # the baseline's ✓ plus 3 tag kinds x 2 payloads
    assert row.count("✓") == 1 + 3 * 2, screen


def test_unknown_api_names_are_an_error_before_anything_is_sent(capsys):
    """``--apis Bogus``: no spec defines it, so nothing would be tested; that is an
    error naming it (exit 1), not a run of 0 requests that exits 0."""
    code = main(["tolerate", "--bootstrap", f"127.0.0.1:{free_port()}", "--apis",
                 "Metadata,Bogus"])
    assert code == 1
    err = capsys.readouterr().err
    assert "Bogus" in err and "cannot connect" not in err, err


def test_classify_counts_only_an_error_code_the_baseline_did_not_carry(codec):
    """A baseline answered with an error (the topic does not exist: 3,
    UNKNOWN_TOPIC_OR_PARTITION) and a variant answered with the same error but
    otherwise different: the tag did not cause that error, so the cell is
    ``different``; a code the baseline lacked is an ``error`` with that code."""
    frame = _metadata_v12_answer(codec)

    missing = {"Topics": [{"Name": "t", "ErrorCode": 3}]}
    base = normalize(codec.decode_response(frame(missing), 3, 12).body.to_dict())
    assert classify(codec, 3, 12, "ok", frame(missing), None, base, set())[:2] == \
        ("tolerated", 3)
    outcome, code, detail = classify(
        codec, 3, 12, "ok", frame({"Topics": [{"Name": "t", "ErrorCode": 3, "IsInternal": True}]}),
        None, base, set())
    assert outcome == "different" and "Topics[0].IsInternal" in detail
    assert code == 3  # the answer's code, the baseline's too
    assert classify(codec, 3, 12, "ok", frame({"Topics": [{"Name": "t", "ErrorCode": 3},
                                                         {"Name": "u", "ErrorCode": 87}]}),
                    None, base, set())[:2] == ("error", 87)


def test_an_unwritable_json_path_is_an_error_before_anything_is_sent(capsys, tmp_path):
    """``--json`` into a missing directory (or onto a directory) fails at once, naming
    the path, not after the whole matrix has been sent and its report lost."""
    for out in (tmp_path / "missing" / "m.json", tmp_path):
        code = main(["tolerate", "--bootstrap", f"127.0.0.1:{free_port()}", "--json",
                     str(out), "--timeout", "1"])
        assert code == 1
        err = capsys.readouterr().err
        assert str(out) in err and "cannot connect" not in err, err


def test_an_existing_writable_report_file_needs_no_writable_directory(tmp_path, monkeypatch):
    """A report file that exists is written in place: only its own permission counts
    (``--json /dev/null`` as a user who cannot write /dev). Permissions as a non-root
    user sees them (the suite may run as root, to whom everything is writable)."""
    import os

    from kinspect.commands import check_writable

    d = tmp_path / "ro"
    d.mkdir()
    (d / "report.json").write_text("{}")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(d) else real(p, mode))
    check_writable(str(d / "report.json"))  # the file is writable: fine
    with pytest.raises(PermissionError, match="cannot write the report"):
        check_writable(str(d / "new.json"))  # a new file in a directory it cannot write

