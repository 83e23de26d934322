"""Tagged-field rules (kinspect.proxy.rules) on codec-built frames: every place
(request/response header, top level, struct paths with every element / an index)
and every action (inject, strip given / unknown / all, set), plus validation,
matching, counters, the flag syntax and the json5 rules file."""

from __future__ import annotations

import argparse

import pytest

from kinspect.codec import Codec, DecodeError, EncodeError, Request, Response
from kinspect.codec.compiler import write_uvarint
from kinspect.flows import Flow
from kinspect.proxy.rules import (
    FLAG_SYNTAX,
    RuleError,
    RuleSet,
    add_rules_options,
    encode_payload,
    generated_payload,
    install_rules,
    load_rules_file,
    parse_flag,
    parse_size,
    rule_from_dict,
    rules_from_args,
)
from kinspect.proxy.server import Proxy, ProxyConfig

METADATA, FETCH, API_VERSIONS = 3, 1, 18


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


# -- frame builders (codec-built) -------------------------------------------------


def response_frame(codec: Codec, api_key: int, version: int, body: dict,
                   header_tags: dict[int, bytes] | None = None, corr: int = 41) -> bytes:
    cls = codec.response_codec(api_key).cls
    hcls = codec.registry.header("ResponseHeader").cls
    header = hcls(CorrelationId=corr, unknown_tags=header_tags)
    resp = Response(api_key, version, corr, codec.response_header_version(api_key, version),
                    header, cls.from_dict(body), 0, codec.api_name(api_key), version)
    return codec.encode_response(resp)


def request_frame(codec: Codec, api_key: int, version: int, body: dict, corr: int = 41) -> bytes:
    cls = codec.request_codec(api_key).cls
    hcls = codec.registry.header("RequestHeader").cls
    hv = codec.request_header_version(api_key, version)
    header = hcls(RequestApiKey=api_key, RequestApiVersion=version, CorrelationId=corr,
                  ClientId="test-client")
    req = Request(api_key, version, corr, "test-client", hv, header, cls.from_dict(body), 0,
                  codec.api_name(api_key))
    return codec.encode_request(req)


def flow_for(codec: Codec, api_key: int, version: int, corr: int = 41) -> Flow:
    return Flow(1, 1, "127.0.0.1:1", "127.0.0.1:2", api_key, version, corr,
                codec.api_name(api_key), b"", 0)


METADATA_BODY = {
    "Brokers": [{"NodeId": 1, "Host": "127.0.0.1", "Port": 9092}],
    "Topics": [
        {"Name": "a", "Partitions": [{"PartitionIndex": 0}, {"PartitionIndex": 1}]},
        {"Name": "b", "Partitions": [{"PartitionIndex": 0}]},
        {"Name": "c", "Partitions": []},
    ],
}


def rules(codec: Codec, *flags: str) -> RuleSet:
    parsed = []
    for f in flags:
        action, _, text = f.partition(" ")
        parsed.append(parse_flag(action, text))
    return RuleSet(parsed, codec)


def read_uv(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint, read independently of the codec."""
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def tag_section(buf: bytes, pos: int) -> tuple[list[tuple[int, bytes]], int]:
    """``[(tag, data), ...]`` of the tag section at ``pos``, in wire order."""
    n, pos = read_uv(buf, pos)
    out = []
    for _ in range(n):
        tag, pos = read_uv(buf, pos)
        size, pos = read_uv(buf, pos)
        out.append((tag, buf[pos:pos + size]))
        pos += size
    return out, pos


def uv(n: int) -> bytes:
    out = bytearray()
    write_uvarint(out, n)
    return bytes(out)


# -- payloads and syntax ------------------------------------------------------------


@pytest.mark.parametrize(("kind", "value", "expected"), [
    ("hex", "cafe", b"\xca\xfe"),
    ("hex", "0xCA FE", b"\xca\xfe"),
    ("int8", "-1", b"\xff"),
    ("int16", "258", b"\x01\x02"),
    ("int32", "5", b"\x00\x00\x00\x05"),
    ("int64", "-2", b"\xff" * 7 + b"\xfe"),
    ("uint16", "65535", b"\xff\xff"),
    ("uint32", "0x01020304", b"\x01\x02\x03\x04"),
    ("bool", "true", b"\x01"),
    ("uvarint", "300", b"\xac\x02"),
    ("varint", "-1", b"\x01"),
    ("varlong", "1", b"\x02"),
    ("string", "abc", b"\x04abc"),
    ("bytes", "0102", b"\x03\x01\x02"),
    ("uuid", "00000000-0000-0000-0000-000000000001", bytes(15) + b"\x01"),
    ("size", "10", b"kinspectki"),
])
def test_encode_payload(kind, value, expected):
    assert encode_payload(kind, value) == expected


@pytest.mark.parametrize(("kind", "value"), [
    ("int8", "128"), ("int32", "x"), ("uvarint", "-1"), ("hex", "abc"), ("bool", "maybe"),
    ("uuid", "nope"), ("float", "1.0"),
])
def test_encode_payload_rejects_bad_values(kind, value):
    with pytest.raises(RuleError):
        encode_payload(kind, value)


def test_sizes_and_generated_payload():
    assert parse_size("1KiB") == 1024
    assert parse_size("1 MiB") == 1 << 20
    assert parse_size(7) == 7
    assert len(generated_payload(1 << 20)) == 1 << 20
    with pytest.raises(RuleError):
        parse_size("1 GiB")


def test_parse_inject_flag():
    r = parse_flag("inject", "Metadata@9-12:resp:Topics[].Partitions[0]:tag=99:string=a:b")
    assert (r.action, r.api, str(r.versions), r.direction) == ("inject", "Metadata", "9-12",
                                                               "response")
    assert [str(s) for s in r.steps] == ["Topics[]", "Partitions[0]"]
    assert r.tag == 99
    assert r.payload == b"\x04a:b"  # colons after the tag belong to the payload


def test_parse_strip_flag():
    assert parse_flag("strip", "Fetch:request:top:tags=3,1").strip == (1, 3)
    assert parse_flag("strip", "3:response:header:unknown").strip == "unknown"
    assert parse_flag("strip", "*:response:top:all").strip == "all"


@pytest.mark.parametrize(("action", "text"), [
    ("inject", "Metadata:response:top"),                 # no tag
    ("inject", "Metadata:response:top:99"),              # not tag=N
    ("inject", "Metadata:sideways:top:tag=1"),           # direction
    ("inject", "Metadata@9-x:response:top:tag=1"),       # versions
    ("inject", "Metadata:response:Topics[x]:tag=1"),     # path
    ("inject", "Metadata:response:top:tag=2147483648"),  # tag range
    ("inject", "Metadata:response:top:tag=1:int32"),     # payload without value
    ("strip", "Metadata:response:top"),                  # no WHAT
    ("strip", "Metadata:response:top:some"),
])
def test_bad_flags_raise_rule_error(action, text):
    with pytest.raises(RuleError) as info:
        parse_flag(action, text, "--x #1")
    assert "--x #1" in str(info.value)


# -- places -----------------------------------------------------------------------


def test_inject_response_header(codec):
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    flow = flow_for(codec, METADATA, 12)
    rs = rules(codec, "inject Metadata:response:header:tag=5:int32=5")
    new = rs.mutate_response(flow, frame)
    resp = codec.decode_response(new, METADATA, 12)
    assert resp.header.unknown_tags == {5: b"\x00\x00\x00\x05"}
    assert resp.correlation_id == 41
    assert resp.body == codec.decode_response(frame, METADATA, 12).body
    # the header's tag section follows the correlation id directly
    assert tag_section(new, 4)[0] == [(5, b"\x00\x00\x00\x05")]
    assert rs.rules[0].stats.applied == 1
    assert any("inject Metadata:response:header:tag=5" in n for n in flow.notes)


def test_inject_request_header_and_body(codec):
    frame = request_frame(codec, METADATA, 12, {"Topics": [{"Name": "a"}, {"Name": "b"}]})
    rs = rules(codec, "inject Metadata:request:header:tag=0:hex=01",
               "inject Metadata:request:Topics[1]:tag=3:hex=02")
    new = rs.mutate_request(flow_for(codec, METADATA, 12), frame)
    req = codec.decode_request(new)
    assert req.header.unknown_tags == {0: b"\x01"}
    assert (req.correlation_id, req.client_id) == (41, "test-client")
    assert [t.unknown_tags for t in req.body.Topics] == [{}, {3: b"\x02"}]


def test_inject_top_level_into_empty_tag_section(codec):
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    assert frame.endswith(b"\x00")  # the top-level tag section is empty and last
    rs = rules(codec, "inject Metadata:response:top:tag=7:hex=cafe")
    new = rs.mutate_response(flow_for(codec, METADATA, 12), frame)
    # the frame is the old one with its empty tag section replaced by a one-tag section
    assert new == frame[:-1] + b"\x01" + uv(7) + uv(2) + b"\xca\xfe"
    assert codec.decode_response(new, METADATA, 12).body.unknown_tags == {7: b"\xca\xfe"}


def test_inject_every_element_of_nested_path(codec):
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    rs = rules(codec, "inject Metadata:response:Topics[].Partitions[]:tag=10000:size=3")
    body = codec.decode_response(rs.mutate_response(flow_for(codec, METADATA, 12), frame),
                                 METADATA, 12).body
    assert [[p.unknown_tags for p in t.Partitions] for t in body.Topics] == [
        [{10000: b"kin"}, {10000: b"kin"}], [{10000: b"kin"}], []]
    assert [t.unknown_tags for t in body.Topics] == [{}, {}, {}]
    assert body.unknown_tags == {}


@pytest.mark.parametrize(("place", "expected"), [
    ("Topics[0]", [True, False, False]),
    ("Topics[2]", [False, False, True]),
    ("Topics[-1]", [False, False, True]),
    ("Topics[]", [True, True, True]),
])
def test_inject_by_index(codec, place, expected):
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    rs = rules(codec, f"inject Metadata:response:{place}:tag=9")
    body = codec.decode_response(rs.mutate_response(flow_for(codec, METADATA, 12), frame),
                                 METADATA, 12).body
    assert [9 in t.unknown_tags for t in body.Topics] == expected


def test_index_out_of_range_leaves_frame_alone(codec):
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    rs = rules(codec, "inject Metadata:response:Topics[3]:tag=9")
    assert rs.mutate_response(flow_for(codec, METADATA, 12), frame) is None
    s = rs.rules[0].stats
    assert (s.matched, s.applied, s.no_target) == (1, 0, 1)


def test_struct_field_path_without_brackets(codec):
    # FetchResponse PartitionData.CurrentLeader is a (tagged) struct field
    body = {"Responses": [{"Topic": "t", "Partitions": [{"PartitionIndex": 0,
                                                        "CurrentLeader": {"LeaderId": 3,
                                                                          "LeaderEpoch": 4}}]}]}
    frame = response_frame(codec, FETCH, 12, body)
    rs = rules(codec, "inject Fetch:response:Responses[].Partitions[].CurrentLeader:tag=5:hex=aa")
    out = codec.decode_response(rs.mutate_response(flow_for(codec, FETCH, 12), frame), FETCH, 12)
    leader = out.body.Responses[0].Partitions[0].CurrentLeader
    assert (leader.LeaderId, leader.unknown_tags) == (3, {5: b"\xaa"})


# -- ascending order ---------------------------------------------------------------


def test_inject_between_existing_tags_keeps_ascending_order(codec):
    """FetchRequest v12 top level: known tag 0 (ClusterId) and unknown tags 3 and 20
    on the wire; inject 7 and 2 → 0, 2, 3, 7, 20. (Tag 1, ReplicaState from v15,
    would not be valid at v12: Kafka's reader and kinspect's refuse it.)"""
    cls = codec.request_codec(FETCH).cls
    body = cls.from_dict({"ClusterId": "c1", "Topics": [],
                          "_unknown_tags": {"3": "01", "20": "14"}})
    hcls = codec.registry.header("RequestHeader").cls
    req = Request(FETCH, 12, 5, "x", 2, hcls(RequestApiKey=FETCH, RequestApiVersion=12,
                                               CorrelationId=5, ClientId="x"), body, 0, "Fetch")
    frame = codec.encode_request(req)
    rs = rules(codec, "inject Fetch@12:request:top:tag=7:hex=07",
               "inject Fetch@12:request:top:tag=2:hex=02")
    new = rs.mutate_request(flow_for(codec, FETCH, 12, 5), frame)
    # locate the top-level tag section: the same message without tags ends in a 0 byte there
    bare = body.copy()
    bare.unknown_tags = None
    bare.ClusterId = None
    req.body = bare
    start = len(codec.encode_request(req)) - 1
    tags, end = tag_section(new, start)
    assert end == len(new)
    assert [t for t, _ in tags] == [0, 2, 3, 7, 20]
    assert dict(tags)[0] == b"\x03c1"
    assert codec.decode_request(new).body.unknown_tags == {2: b"\x02", 3: b"\x01", 7: b"\x07",
                                                          20: b"\x14"}


def test_inject_existing_unknown_tag_replaces_it(codec):
    body = dict(METADATA_BODY, _unknown_tags={"9": "00"})
    frame = response_frame(codec, METADATA, 12, body)
    rs = rules(codec, "inject Metadata:response:top:tag=9:hex=ff")
    out = codec.decode_response(rs.mutate_response(flow_for(codec, METADATA, 12), frame),
                                METADATA, 12)
    assert out.body.unknown_tags == {9: b"\xff"}


# -- strip --------------------------------------------------------------------------


DEFAULT_TAGS = [(0, b"\x01"), (1, b"\xff" * 8), (2, b"\x01"), (3, b"\x00"), (50, b"\xbe\xef")]
DEFAULT_SECTION = uv(len(DEFAULT_TAGS)) + b"".join(uv(t) + uv(len(d)) + d for t, d in DEFAULT_TAGS)
API_VERSIONS_BODY = {"ApiKeys": [{"ApiKey": 3, "MinVersion": 0, "MaxVersion": 12}]}


def api_versions_v3_with_default_tags(codec: Codec) -> bytes:
    """An ApiVersions v3 response whose top level carries all four known tagged fields
    at their default values (as Tansu writes them) plus unknown tag 50."""
    base = response_frame(codec, API_VERSIONS, 3, API_VERSIONS_BODY)
    assert base.endswith(b"\x00")
    return base[:-1] + DEFAULT_SECTION


def test_frame_with_default_tags_round_trips(codec):
    frame = api_versions_v3_with_default_tags(codec)
    resp = codec.decode_response(frame, API_VERSIONS, 3)
    assert codec.encode_response(resp) == frame


def test_strip_all_resets_known_fields_and_drops_unknown(codec):
    frame = api_versions_v3_with_default_tags(codec)
    rs = rules(codec, "strip ApiVersions:response:top:all")
    new = rs.mutate_response(flow_for(codec, API_VERSIONS, 3), frame)
    assert new == response_frame(codec, API_VERSIONS, 3, API_VERSIONS_BODY)
    assert new.endswith(b"\x00")


@pytest.mark.parametrize(("what", "kept"), [
    ("unknown", [0, 1, 2, 3]),
    ("tags=1,50,77", [0, 2, 3]),
    ("tags=3", [0, 1, 2, 50]),
])
def test_strip_some_tags(codec, what, kept):
    frame = api_versions_v3_with_default_tags(codec)
    rs = rules(codec, f"strip ApiVersions:response:top:{what}")
    new = rs.mutate_response(flow_for(codec, API_VERSIONS, 3), frame)
    start = len(frame) - len(DEFAULT_SECTION)
    assert new[:start] == frame[:start]
    tags, end = tag_section(new, start)
    assert end == len(new)
    assert tags == [(t, d) for t, d in DEFAULT_TAGS if t in kept]


def test_strip_nested_known_tagged_fields(codec):
    body = {"Responses": [{"Topic": "t", "Partitions": [
        {"PartitionIndex": 0, "CurrentLeader": {"LeaderId": 3, "LeaderEpoch": 4},
         "SnapshotId": {"EndOffset": 9, "Epoch": 1}, "_unknown_tags": {"40": "00"}},
        {"PartitionIndex": 1}]}]}
    frame = response_frame(codec, FETCH, 12, body)
    rs = rules(codec, "strip Fetch:response:Responses[].Partitions[]:all")
    out = codec.decode_response(rs.mutate_response(flow_for(codec, FETCH, 12), frame), FETCH, 12)
    p0, p1 = out.body.Responses[0].Partitions
    assert p0.CurrentLeader == p1.CurrentLeader  # back to the default
    assert p0.SnapshotId == p1.SnapshotId
    assert p0.unknown_tags == {}


def test_strip_with_nothing_to_strip_forwards_unchanged(codec):
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    rs = rules(codec, "strip Metadata:response:Topics[]:all")
    assert rs.mutate_response(flow_for(codec, METADATA, 12), frame) is None
    s = rs.rules[0].stats
    assert (s.matched, s.applied, s.no_target) == (1, 0, 1)


# -- set ----------------------------------------------------------------------------


def test_set_known_tagged_field(codec):
    frame = response_frame(codec, API_VERSIONS, 3, {"ApiKeys": []})
    rs = RuleSet([rule_from_dict({"api": "ApiVersions", "direction": "response",
                                  "set": {"field": "FinalizedFeaturesEpoch", "value": 7}}, "t")],
                 codec)
    out = codec.decode_response(rs.mutate_response(flow_for(codec, API_VERSIONS, 3), frame),
                                API_VERSIONS, 3)
    assert out.body.FinalizedFeaturesEpoch == 7


def test_set_to_default_still_writes_the_tag(codec):
    frame = response_frame(codec, API_VERSIONS, 3, {"ApiKeys": []})
    assert frame.endswith(b"\x00")
    rs = RuleSet([rule_from_dict({"api": "ApiVersions", "direction": "response",
                                  "set": {"field": "ZkMigrationReady", "value": False}}, "t")],
                 codec)
    new = rs.mutate_response(flow_for(codec, API_VERSIONS, 3), frame)
    assert new == frame[:-1] + b"\x01" + uv(3) + uv(1) + b"\x00"


def test_set_nested_struct_value(codec):
    body = {"Responses": [{"Topic": "t", "Partitions": [{"PartitionIndex": 0}]}]}
    frame = response_frame(codec, FETCH, 12, body)
    rs = RuleSet([rule_from_dict({
        "api": "Fetch", "direction": "response", "place": "Responses[].Partitions[]",
        "set": {"field": "SnapshotId", "value": {"EndOffset": 42, "Epoch": 2}}}, "t")], codec)
    out = codec.decode_response(rs.mutate_response(flow_for(codec, FETCH, 12), frame), FETCH, 12)
    snap = out.body.Responses[0].Partitions[0].SnapshotId
    assert (snap.EndOffset, snap.Epoch) == (42, 2)


# -- matching and counters -----------------------------------------------------------


def test_non_flexible_frame_is_counted_and_untouched(codec):
    frame = response_frame(codec, METADATA, 8, METADATA_BODY)
    rs = rules(codec, "inject Metadata:response:top:tag=9")
    assert rs.mutate_response(flow_for(codec, METADATA, 8), frame) is None
    s = rs.rules[0].stats
    assert (s.matched, s.non_flexible, s.applied) == (1, 1, 0)


def test_frames_no_rule_matches_are_not_decoded(codec):
    garbage = b"\x00\x00\x00\x29" + b"\xff" * 3  # correlation id then nonsense
    rs = rules(codec, "inject Fetch:response:top:tag=9",
               "inject Metadata@10:response:top:tag=9")
    assert rs.mutate_response(flow_for(codec, METADATA, 12), garbage) is None
    assert rs.errors == 0
    assert all(r.stats.matched == 0 for r in rs.rules)


def test_undecodable_matched_frame_is_forwarded_and_counted(codec):
    garbage = b"\x00\x00\x00\x29\x00" + b"\xff" * 3
    flow = flow_for(codec, METADATA, 12)
    rs = rules(codec, "inject Metadata:response:top:tag=9")
    assert rs.mutate_response(flow, garbage) is None
    assert rs.rules[0].stats.errors == 1
    assert any("cannot decode" in n for n in flow.notes)


def test_star_api_applies_to_every_flexible_api(codec):
    rs = rules(codec, "inject *:response:top:tag=10000:hex=01")
    meta = response_frame(codec, METADATA, 12, METADATA_BODY)
    fetch = response_frame(codec, FETCH, 12, {"Responses": []})
    old = response_frame(codec, METADATA, 7, METADATA_BODY)
    assert rs.mutate_response(flow_for(codec, METADATA, 12), meta) is not None
    assert rs.mutate_response(flow_for(codec, FETCH, 12), fetch) is not None
    assert rs.mutate_response(flow_for(codec, METADATA, 7), old) is None
    s = rs.rules[0].stats
    assert (s.matched, s.applied, s.non_flexible) == (3, 2, 1)


def test_rules_apply_in_order_on_one_decode(codec):
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    rs = rules(codec, "inject Metadata:response:top:tag=9:hex=01",
               "inject Metadata:response:Topics[0]:tag=9:hex=01",
               "strip Metadata:response:top:tags=9")
    new = rs.mutate_response(flow_for(codec, METADATA, 12), frame)
    body = codec.decode_response(new, METADATA, 12).body
    assert body.unknown_tags == {}
    assert body.Topics[0].unknown_tags == {9: b"\x01"}
    assert [r.stats.applied for r in rs.rules] == [1, 1, 1]


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "reason"), [
    ("inject Nope:response:top:tag=1", "unknown api 'Nope'"),
    ("inject Metadata@0-8:response:top:tag=1", "not flexible"),
    ("inject Metadata:response:Topic[]:tag=1", "no field 'Topic'"),
    ("inject Metadata:response:Topics:tag=1", "is an array"),
    ("inject Metadata:response:Topics[].Name:tag=1", "not a struct"),
    ("inject ApiVersions:response:top:tag=2", "known tagged field"),
    ("inject Fetch:response:Responses[].Partitions[]:tag=1", "CurrentLeader"),
    ("inject ApiVersions:response:header:tag=1", "header v0"),
    ("inject *:response:Topics[]:tag=1", "only takes PLACE header or top"),
    ("inject Metadata@14+:response:top:tag=1", "no version in 14+"),
])
def test_rules_that_can_never_apply_are_rejected(codec, flag, reason):
    action, _, text = flag.partition(" ")
    with pytest.raises(RuleError) as info:
        RuleSet([parse_flag(action, text, "--x #1")], codec)
    assert reason in str(info.value)
    assert "--x #1" in str(info.value)


def test_every_problem_is_reported(codec):
    with pytest.raises(RuleError) as info:
        RuleSet([parse_flag("inject", "Nope:response:top:tag=1", "#1"),
                 parse_flag("inject", "Metadata:response:top:tag=1", "#2"),
                 parse_flag("strip", "Metadata@0-3:response:top:all", "#3")], codec)
    assert len(info.value.problems) == 2


def test_known_tag_of_a_later_version_is_allowed_below_it(codec):
    # Fetch request ReplicaState (tag 1) exists from v15: tag 1 in v12-14 is unknown there
    RuleSet([parse_flag("inject", "Fetch@12-14:request:top:tag=1")], codec)
    with pytest.raises(RuleError):
        RuleSet([parse_flag("inject", "Fetch@12-15:request:top:tag=1")], codec)


@pytest.mark.parametrize("spec", [
    {"api": "Metadata", "direction": "response", "set": {"field": "Topics", "value": []}},
    {"api": "ApiVersions", "direction": "response",
     "set": {"field": "FinalizedFeaturesEpoch", "value": "x"}},
    {"api": "ApiVersions", "direction": "response", "set": {"field": "Nope", "value": 1}},
])
def test_bad_set_rules_are_rejected(codec, spec):
    with pytest.raises(RuleError):
        RuleSet([rule_from_dict(spec, "t")], codec)


# -- rules file and CLI glue -------------------------------------------------------------


def test_rules_file_matches_flags(codec, tmp_path):
    path = tmp_path / "rules.json5"
    path.write_text("""
    // unknown tags for every Metadata topic, and the known ApiVersions tags removed
    {
      rules: [
        {api: "Metadata", versions: "9+", direction: "response", place: "Topics[]",
         inject: {tag: 99, hex: "cafe"}, name: "topics"},
        {api: "ApiVersions", direction: "response", strip: "all"},
        {api: "Fetch", direction: "response", place: "Responses[].Partitions[]",
         strip: {tags: [0, 2]}},
      ],
    }
    """)
    loaded = load_rules_file(path)
    assert [r.label for r in loaded] == ["rules.json5 #1", "rules.json5 #2", "rules.json5 #3"]
    assert loaded[0].name == "topics"
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    from_file = RuleSet(loaded[:1], codec).mutate_response(flow_for(codec, METADATA, 12), frame)
    from_flag = rules(codec, "inject Metadata@9+:response:Topics[]:tag=99:hex=cafe") \
        .mutate_response(flow_for(codec, METADATA, 12), frame)
    assert from_file == from_flag
    assert loaded[2].strip == (0, 2)


@pytest.mark.parametrize("text", [
    "{rules: [{api: 'Metadata', direction: 'response'}]}",           # no action
    "[{api: 'Metadata', direction: 'response', strip: 'all', x: 1}]",  # unknown key
    "[{api: 'Metadata', direction: 'response', inject: {tag: 1, hex: '00', int8: 1}}]",
    "{rules: [}",
    # nested deeper than json5's parser recurses (a RecursionError traceback before)
    pytest.param("[" * 200 + "]" * 200, id="nested-too-deep"),
])
def test_bad_rules_files(tmp_path, text):
    path = tmp_path / "bad.json5"
    path.write_text(text)
    with pytest.raises(RuleError):
        load_rules_file(path)


def test_payloads_together_are_bounded(tmp_path):
    """Five lines of ``size=64MiB`` would hold 320 MiB at start-up (thirty, 2 GB): the
    rule that takes the payloads past 256 MiB together is refused, by name, across a
    rules file and the flags after it."""
    rule = "{api: 'Metadata', direction: 'response', inject: {tag: %d, size: '64MiB'}},"
    path = tmp_path / "big.json5"
    path.write_text("[" + "".join(rule % (100 + i) for i in range(5)) + "]")
    with pytest.raises(RuleError) as ei:
        load_rules_file(path)
    assert "big.json5 #5" in str(ei.value) and "256 MiB" in str(ei.value)
    path.write_text("[" + "".join(rule % (100 + i) for i in range(4)) + "]")
    assert len(load_rules_file(path)) == 4  # 256 MiB exactly
    with pytest.raises(RuleError) as ei:
        rules_from_args(parse_args("--rules", str(path), "--inject",
                                   "Metadata:response:top:tag=1:size=1"))
    assert "--inject #1" in str(ei.value)


def test_injection_past_the_largest_frame_leaves_the_frame_alone(codec):
    """A payload injected into every element of an array multiplies: a frame the rules
    would grow past the largest frame is forwarded unchanged and counted under
    errors, with a note on the flow, before anything is encoded."""
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    parsed = [parse_flag("inject", "Metadata:response:Topics[].Partitions[]:tag=99:size=1KiB")]
    rs = RuleSet(parsed, codec, max_frame=len(frame) + 3 * (1024 + 10) - 1)
    flow = flow_for(codec, METADATA, 12)
    assert rs.mutate_response(flow, frame) is None
    s = rs.rules[0].stats
    assert (s.matched, s.applied, s.errors, rs.errors) == (1, 0, 1, 1)
    assert any("more than the largest frame" in n for n in flow.notes), flow.notes
    rs = RuleSet(parsed, codec, max_frame=len(frame) + 3 * (1024 + 10))
    out = rs.mutate_response(flow_for(codec, METADATA, 12), frame)
    assert out is not None and len(out) <= rs.max_frame
    assert rs.rules[0].stats.applied == 1


async def test_install_takes_the_proxys_largest_frame(codec):
    proxy = Proxy(ProxyConfig(upstream=("127.0.0.1", 9), listen=("127.0.0.1", 0),
                              max_frame=1 << 20), codec=codec)
    rs = install_rules(parse_args("--inject", "Metadata:response:top:tag=1000"), proxy, codec,
                       None)
    assert rs.max_frame == 1 << 20


def parse_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kinspect proxy")
    add_rules_options(p)
    return p.parse_args(argv)


def test_add_rules_options_documents_the_syntax():
    p = argparse.ArgumentParser(prog="kinspect proxy")
    add_rules_options(p)
    help_text = p.format_help()
    assert "--inject SPEC" in help_text and "--strip SPEC" in help_text
    assert FLAG_SYNTAX.splitlines()[2].strip() in help_text
    args = p.parse_args(["--inject", "Metadata:response:top:tag=1", "--inject",
                         "Fetch:response:top:tag=5", "--strip", "ApiVersions:response:top:all"])
    assert len(args.inject) == 2 and args.rules == []


async def test_install_rules_sets_only_needed_mutators(codec):
    proxy = Proxy(ProxyConfig(upstream=("127.0.0.1", 9)), codec=codec)
    rs = install_rules(parse_args("--inject", "Metadata:response:top:tag=1000"), proxy, codec,
                       None)
    assert proxy.response_mutator == rs.mutate_response
    assert proxy.request_mutator is None  # requests keep the fast path

    proxy2 = Proxy(ProxyConfig(upstream=("127.0.0.1", 9)), codec=codec)
    rs2 = install_rules(parse_args(), proxy2, codec, None)
    assert len(rs2) == 0
    assert proxy2.request_mutator is None and proxy2.response_mutator is None

    proxy3 = Proxy(ProxyConfig(upstream=("127.0.0.1", 9)), codec=codec)
    with pytest.raises(RuleError):
        install_rules(parse_args("--strip", "Metadata@0-8:request:top:all"), proxy3, codec, None)
    assert proxy3.request_mutator is None


def test_install_rules_reports_to_a_rich_console(codec):
    from rich.console import Console

    console = Console(record=True, width=200)
    proxy = Proxy(ProxyConfig(upstream=("127.0.0.1", 9)), codec=codec)
    install_rules(parse_args("--strip", "Metadata:request:Topics[]:unknown"), proxy, codec,
                  console)
    text = console.export_text()
    assert "strip Metadata:request:Topics[]:unknown" in text
    hi = codec.registry.request(METADATA).valid_versions.highest
    assert f"[acts on Metadata v9-{hi}]" in text
    assert proxy.request_mutator is not None and proxy.response_mutator is None


def test_stats_and_table(codec):
    rs = rules(codec, "inject Metadata:response:top:tag=9")
    rs.mutate_response(flow_for(codec, METADATA, 12), response_frame(codec, METADATA, 12,
                                                                     METADATA_BODY))
    (row,) = rs.stats()
    assert row["applied"] == 1 and row["rule"].startswith("inject Metadata:response:top")
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(rs.table())
    assert "inject Metadata:response:top:tag=9" in console.export_text()


def test_the_client_side_recipe_in_the_help_is_one_shell_command_of_valid_rules():
    import shlex

    lines = FLAG_SYNTAX.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("kinspect proxy"))
    end = start
    while lines[end].rstrip().endswith("\\"):
        end += 1
    # as a shell reads it: a backslash at the end of a line continues the command
    argv = shlex.split("\n".join(lines[start:end + 1]).replace("\\\n", " "))
    injects = [argv[i + 1] for i, a in enumerate(argv) if a == "--inject"]
    assert argv[:4] == ["kinspect", "proxy", "--upstream", "BROKER:9092"]
    assert len(injects) == 4 and len(argv) == 4 + 2 * len(injects)
    assert end - start == len(injects)  # one --inject per line, as printed
    for text in injects:
        assert parse_flag("inject", text).action == "inject"


# -- found in review (session 13) --------------------------------------------------


def test_inject_a_tag_a_later_version_defines_is_sent(codec):
    """A tag number that a field has only in later versions (Fetch request ReplicaState,
    top-level tag 1 from v15; FetchPartition ReplicaDirectoryId, tag 0 from v17) is
    accepted for the versions below, and the frame really carries it: the encoder
    refused it ("has the tag of a field of this struct"), so every such frame went out
    unchanged, counted both applied and errors."""
    frame = request_frame(codec, FETCH, 12, {
        "Topics": [{"Topic": "t", "Partitions": [{"Partition": 0}]}]})
    rs = rules(codec, "inject Fetch@12-14:request:top:tag=1:hex=07",
               "inject Fetch@12-16:request:Topics[].Partitions[]:tag=0:hex=08")
    flow = flow_for(codec, FETCH, 12)
    new = rs.mutate_request(flow, frame)
    assert new is not None, flow.notes
    assert [(r.stats.applied, r.stats.errors) for r in rs.rules] == [(1, 0), (1, 0)]
    # the top-level tag section is last: the old (empty) one, now holding tag 1
    assert frame.endswith(b"\x00")
    assert new.endswith(b"\x01" + uv(1) + uv(1) + b"\x07")
    assert len(new) == len(frame) + 3 + 3
    # kinspect's reader, like Kafka's, refuses such a frame: that is what is tested
    with pytest.raises(DecodeError, match="not valid for version 12"):
        codec.decode_request(new)


def test_inject_into_an_absent_tagged_struct_is_no_target(codec):
    """A path through a tagged struct field (Fetch response CurrentLeader, tag 1) that
    the frame does not carry has no target: injecting into the default struct wrote
    the whole CurrentLeader field into the frame as well. Where the frame carries it,
    the tag lands in its tag section and the enclosing tagged field's size grows."""
    place = "Responses[].Partitions[].CurrentLeader"
    absent = response_frame(codec, FETCH, 12, {"Responses": [{"Topic": "t", "Partitions": [
        {"PartitionIndex": 0, "Records": None}]}]})
    rs = rules(codec, f"inject Fetch:response:{place}:tag=99:hex=cafe")
    assert rs.mutate_response(flow_for(codec, FETCH, 12), absent) is None
    s = rs.rules[0].stats
    assert (s.matched, s.applied, s.no_target) == (1, 0, 1)

    present = response_frame(codec, FETCH, 12, {"Responses": [{"Topic": "t", "Partitions": [
        {"PartitionIndex": 0, "Records": None, "CurrentLeader": {"LeaderId": 3,
                                                                "LeaderEpoch": 4}}]}]})
    new = rs.mutate_response(flow_for(codec, FETCH, 12), present)
    assert rs.rules[0].stats.applied == 1
    # the partition's tag section (before the empty top-level one): CurrentLeader
    # (tag 1) holding LeaderId, LeaderEpoch and now a one-tag section
    leader = (b"\x00\x00\x00\x03" + b"\x00\x00\x00\x04")
    assert present.endswith(b"\x01" + uv(1) + uv(9) + leader + b"\x00" + b"\x00" + b"\x00")
    assert new == present[:-14] + (b"\x01" + uv(1) + uv(13) + leader + b"\x01" + uv(99)
                                   + uv(2) + b"\xca\xfe" + b"\x00" + b"\x00")


def test_a_frame_that_fails_to_re_encode_is_not_counted_as_applied(codec):
    """A frame the rules changed but the codec could not re-encode goes on unchanged:
    it counts under errors, not applied, and its notes name the error only."""
    class Refusing(Codec):
        def encode_response(self, resp):
            raise EncodeError("refused for the test")

    refusing = Refusing(codec.registry)
    frame = response_frame(codec, METADATA, 12, METADATA_BODY)
    flow = flow_for(codec, METADATA, 12)
    rs = RuleSet([parse_flag("inject", "Metadata:response:top:tag=9")], refusing)
    assert rs.mutate_response(flow, frame) is None
    s = rs.rules[0].stats
    assert (s.matched, s.applied, s.errors) == (1, 0, 1)
    assert len(flow.notes) == 1 and "refused for the test" in flow.notes[0]


def test_rules_table_names_each_rule_on_an_80_column_console(codec):
    """At exit the proxy prints the table on stderr, often 80 columns or a file: the
    rule column was cut to "inject Fetch:re…" and the counters' titles to "non-fle…"."""
    from rich.console import Console

    flags = ("inject Fetch:response:Responses[].Partitions[]:tag=11:hex=ff",
             "strip Metadata@9-12:response:top:tags=1,2,3",
             "inject *:response:header:tag=2147483647:size=1MiB")
    rs = rules(codec, *flags)
    console = Console(record=True, width=80)
    console.print(rs.table())
    text = console.export_text()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    cells = "".join(line.split("│")[2].strip() for line in text.splitlines()
                    if line.count("│") > 2)
    for r in rs.rules:
        assert r.describe().replace(" ", "") in cells.replace(" ", "")
    for title in ("matched", "applied", "non-", "flexible", "target", "errors"):
        assert title in text


def test_rule_errors_are_all_counted_and_noted_but_logged_sparingly(codec, caplog):
    """A client sending frames that do not decode, with a request rule active: each
    is counted and noted on its flow, the log gets the first LOG_FIRST and then one
    in LOG_EVERY (one line per frame filled the log at line rate)."""
    import logging

    from kinspect.proxy.rules import LOG_EVERY, LOG_FIRST

    rs = rules(codec, "inject Metadata:request:top:tag=1000")
    bad = request_frame(codec, METADATA, 12, {"Topics": None})[:-2] + b"\xff\xff\xff"
    flows = []
    with caplog.at_level(logging.WARNING, logger="kinspect.rules"):
        for _ in range(LOG_EVERY + 5):
            flows.append(flow_for(codec, METADATA, 12))
            assert rs.mutate_request(flows[-1], bad) is None
    assert rs.errors == LOG_EVERY + 5 and rs.rules[0].stats.errors == LOG_EVERY + 5
    assert all(any("rules not applied" in n for n in f.notes) for f in flows)
    logged = [r for r in caplog.records if r.name == "kinspect.rules"]
    assert len(logged) == LOG_FIRST + 1 + 1  # the first ones, the notice, the 1000th
    assert "1 in 1000" in logged[LOG_FIRST].getMessage()


# -- found in review (session 20b) --------------------------------------------------
#
# Frames built by hand, byte by byte, from the Kafka message specs (MetadataRequest /
# MetadataResponse v12, flexible: KIP-482 compact lengths and tag sections), so that
# the expected bytes do not come from the codec under test.


def metadata_v12_request(topics_length: bytes) -> bytes:
    """A Metadata v12 request asking for topic "a", with the Topics compact-array
    length written as ``topics_length`` (``02`` minimal; ``82 00`` is the same
    value, 2 = 1 element + 1, in two bytes, which Kafka's varint reader accepts)."""
    return (b"\x00\x03" + b"\x00\x0c"      # RequestApiKey 3 (Metadata), RequestApiVersion 12
            + b"\x00\x00\x00\x29"           # CorrelationId 41
            + b"\x00\x03abc"                # ClientId: int16 length + text, non-compact in v2
            + b"\x00"                       # header tag section: no tags
            + topics_length                 # Topics: 1 element
            + bytes(16)                     #   TopicId: the zero uuid
            + b"\x02a"                      #   Name: compact string "a"
            + b"\x00"                       #   topic tag section: no tags
            + b"\x01"                       # AllowAutoTopicCreation: true
            + b"\x00"                       # IncludeTopicAuthorizedOperations: false
            + b"\x00")                      # top-level tag section: no tags


METADATA_V12_REQUEST_HEADER_TAGS_AT = 13  # 2 + 2 + 4 + (2 + 3) header bytes before it


def metadata_v12_response(topic_tags: bytes = b"\x00", is_internal: int = 1) -> bytes:
    """A Metadata v12 response with one topic "a", its IsInternal byte and tag section
    as given, and an empty top-level tag section as its last byte."""
    return (b"\x00\x00\x00\x29" + b"\x00"  # response header v1: CorrelationId 41, no tags
            + b"\x00\x00\x00\x00"           # ThrottleTimeMs 0
            + b"\x01"                       # Brokers: compact array of 0 elements
            + b"\x00"                       # ClusterId: null compact string
            + b"\xff\xff\xff\xff"           # ControllerId -1
            + b"\x02"                       # Topics: 1 element
            + b"\x00\x00"                   #   ErrorCode 0
            + b"\x02a"                      #   Name "a"
            + bytes(16)                     #   TopicId: the zero uuid
            + bytes([is_internal])          #   IsInternal (Kafka reads any non-zero as true)
            + b"\x01"                       #   Partitions: 0 elements
            + b"\x80\x00\x00\x00"           #   TopicAuthorizedOperations -2^31 (its default)
            + topic_tags                    #   topic tag section
            + b"\x00")                      # top-level tag section: no tags


#: a topic tag section holding unknown tags 10 (data bb) and 20 (data aa): count 2,
#: then (tag, size, data) each, ascending as Kafka writes them, or descending
TAGS_10_20 = b"\x02" + b"\x0a\x01\xbb" + b"\x14\x01\xaa"
TAGS_20_10 = b"\x02" + b"\x14\x01\xaa" + b"\x0a\x01\xbb"
#: the top-level tag section after injecting tag 99 (0x63) with data ca fe
TOP_99 = b"\x01" + b"\x63\x02\xca\xfe"


def test_a_header_inject_changes_only_the_header_tag_section(codec):
    """The canonical twin of the frame below: the rule's bytes land in the header's
    tag section, every other byte as sent."""
    frame = metadata_v12_request(b"\x02")
    rs = rules(codec, "inject Metadata:request:header:tag=5:hex=aa")
    new = rs.mutate_request(flow_for(codec, METADATA, 12), frame)
    at = METADATA_V12_REQUEST_HEADER_TAGS_AT
    assert new == frame[:at] + b"\x01" + b"\x05\x01\xaa" + frame[at + 1:]
    assert rs.rules[0].stats.applied == 1


def test_a_frame_re_encoding_would_change_is_forwarded_as_sent(codec):
    """Losslessness: a rule re-encoded the whole frame, so a length the client wrote
    as a non-minimal varint (82 00) came out as 02 although the rule only touched the
    header's tag section. Such a frame is now left alone, counted under errors (not
    applied) and noted on its flow."""
    frame = metadata_v12_request(b"\x82\x00")
    assert codec.decode_request(frame).body.Topics[0].Name == "a"  # a valid frame
    rs = rules(codec, "inject Metadata:request:header:tag=5:hex=aa")
    flow = flow_for(codec, METADATA, 12)
    assert rs.mutate_request(flow, frame) is None
    s = rs.rules[0].stats
    assert (s.matched, s.applied, s.no_target, s.errors, rs.errors) == (1, 0, 0, 1, 1)
    assert len(flow.notes) == 1
    assert "not in the encoding kinspect writes" in flow.notes[0]
    assert "offset 14" in flow.notes[0]  # the Topics length, after the header's tags


@pytest.mark.parametrize(("topic_tags", "is_internal"), [
    pytest.param(TAGS_20_10, 1, id="unknown-tags-out-of-order"),
    pytest.param(TAGS_10_20, 2, id="boolean-byte-2"),
])
def test_a_response_re_encoding_would_change_is_forwarded_as_sent(codec, topic_tags,
                                                                   is_internal):
    """A top-level inject must not sort the unknown tags of a topic it never targeted
    nor turn an IsInternal byte 02 into 01."""
    rs = rules(codec, "inject Metadata:response:top:tag=99:hex=cafe")
    twin = metadata_v12_response(TAGS_10_20, 1)
    new = rs.mutate_response(flow_for(codec, METADATA, 12), twin)
    assert new == twin[:-1] + TOP_99  # the canonical twin: only the last section changes

    odd = metadata_v12_response(topic_tags, is_internal)
    codec.decode_response(odd, METADATA, 12)  # a valid frame
    flow = flow_for(codec, METADATA, 12)
    assert rs.mutate_response(flow, odd) is None
    s = rs.rules[0].stats
    assert (s.matched, s.applied, s.errors) == (2, 1, 1)
    assert any("not in the encoding kinspect writes" in n for n in flow.notes), flow.notes

    # a rule with nothing to do there is no error: the frame is not its business
    idle = rules(codec, "inject Metadata:response:Topics[3]:tag=99")
    flow = flow_for(codec, METADATA, 12)
    assert idle.mutate_response(flow, odd) is None
    s = idle.rules[0].stats
    assert (s.matched, s.applied, s.no_target, s.errors) == (1, 0, 1, 0)
    assert flow.notes == []


def test_rules_apply_in_command_line_order(codec):
    """--strip ... --inject ...: the strip runs first (it always ran after every
    --inject, and removed the injected tag again)."""
    args = parse_args("--strip", "Metadata:response:Topics[]:unknown",
                      "--inject", "Metadata:response:Topics[]:tag=99:hex=cafe")
    rs = RuleSet(rules_from_args(args), codec)
    assert [r.label for r in rs.rules] == ["--strip #1", "--inject #1"]
    frame = metadata_v12_response(b"\x01" + b"\x05\x01\xee")  # unknown tag 5 in the topic
    new = rs.mutate_response(flow_for(codec, METADATA, 12), frame)
    assert new == metadata_v12_response(TOP_99)  # tag 5 gone, tag 99 (ca fe) there
    assert [r.stats.applied for r in rs.rules] == [1, 1]


def test_rules_files_and_flags_interleave_in_command_line_order(tmp_path):
    path = tmp_path / "r.json5"
    path.write_text("[{api: 'Metadata', direction: 'response', strip: 'unknown'},"
                    " {api: 'Metadata', direction: 'response', inject: {tag: 7}}]")
    args = parse_args("--inject", "Metadata:response:top:tag=1", "--rules", str(path),
                      "--strip", "Metadata:response:top:all", "--inject",
                      "Metadata:response:top:tag=2")
    assert [r.label for r in rules_from_args(args)] == [
        "--inject #1", "r.json5 #1", "r.json5 #2", "--strip #1", "--inject #2"]
    # a namespace built without add_rules_options: files, injects, strips
    bare = argparse.Namespace(rules=[str(path)], inject=["Metadata:response:top:tag=1"],
                              strip=["Metadata:response:top:all"])
    assert [r.label for r in rules_from_args(bare)] == [
        "r.json5 #1", "r.json5 #2", "--inject #1", "--strip #1"]


def test_changes_that_cancel_out_are_not_applied(codec):
    """An inject undone by a later strip sends the frame as received: the frame is
    not replaced (the proxy would flag the flow 'mutated'), and no rule counts as
    applied; the note says why."""
    args = parse_args("--inject", "Metadata:response:Topics[]:tag=99:hex=cafe",
                      "--strip", "Metadata:response:Topics[]:unknown")
    rs = RuleSet(rules_from_args(args), codec)
    flow = flow_for(codec, METADATA, 12)
    assert rs.mutate_response(flow, metadata_v12_response()) is None
    assert [(r.stats.matched, r.stats.applied, r.stats.no_target, r.stats.errors)
            for r in rs.rules] == [(1, 0, 1, 0), (1, 0, 1, 0)]
    assert flow.notes == ["rules --inject #1, --strip #1: their changes cancel out; "
                          "forwarded unchanged"]


def test_a_rule_with_nothing_to_change_encodes_nothing(codec, monkeypatch):
    """A strip with nothing to strip forwards the frame as received without encoding
    anything: the check that re-encoding gives back the frame's bytes runs only
    when a rule changed something (a 1 MiB Fetch answer costs an encode of 1 MiB)."""
    args = parse_args("--strip", "Metadata:response:Topics[]:unknown")
    rs = RuleSet(rules_from_args(args), codec)
    encodes = []
    real = codec.encode_response
    monkeypatch.setattr(codec, "encode_response",
                        lambda *a, **k: encodes.append(1) or real(*a, **k))
    flow = flow_for(codec, METADATA, 12)
    assert rs.mutate_response(flow, metadata_v12_response()) is None
    assert encodes == [] and rs.rules[0].stats.no_target == 1
    # (a rule that changes something checks, and encodes the changed answer)
    rs = RuleSet(rules_from_args(parse_args("--inject",
                                            "Metadata:response:Topics[]:tag=99:hex=cafe")), codec)
    assert rs.mutate_response(flow_for(codec, METADATA, 12), metadata_v12_response())
    assert len(encodes) == 2


async def test_rule_order_through_the_proxy(tansu):
    """End to end, kafka-python through the proxy to Tansu: with --strip before
    --inject the client gets tag 99 in every topic of the Metadata answers; with the
    inject first, the strip undoes it and no flow is flagged 'mutated'."""
    from clients import roundtrip_async
    from proxyutil import Recorder

    from kinspect.flows import MUTATED
    from kinspect.proxy.server import parse_hostport

    inject = "Metadata:response:Topics[]:tag=99:hex=cafe"
    strip = "Metadata:response:Topics[]:unknown"
    for argv, reaches in (
            (("--strip", strip, "--inject", inject), True),
            (("--inject", inject, "--strip", strip), False)):
        codec = Codec()
        proxy = Proxy(ProxyConfig(upstream=parse_hostport(tansu.bootstrap)), codec=codec)
        recorder = Recorder()
        proxy.pipeline.add(recorder)
        rs = install_rules(parse_args(*argv), proxy, codec, None)
        await proxy.start()
        topic = f"order-{int(reaches)}"
        try:
            got = await roundtrip_async("kafka-python", "{}:{}".format(*proxy.address),
                                        ["v"], topic=topic, group=f"{topic}-g", timeout=40)
        finally:
            await proxy.close()
        assert got == ["v"]
        answers = [f for f in recorder.flows if f.api_name == "Metadata"
                   and f.api_version >= 9 and f.response_decoded.body.Topics]
        assert answers
        mutated = [f for f in answers if MUTATED in f.flags]
        if reaches:
            assert mutated == answers
            for f in answers:
                sent = codec.decode_response(f.response_sent, METADATA, f.api_version)
                assert all(t.unknown_tags == {99: b"\xca\xfe"} for t in sent.body.Topics)
            assert rs.rules[1].stats.applied == len(answers)
        else:
            assert mutated == []
            for f in answers:  # (response_sent: the frame with its addresses rewritten)
                sent = codec.decode_response(f.response_sent or f.response, METADATA,
                                             f.api_version)
                assert all(t.unknown_tags == {} for t in sent.body.Topics)
            assert [r.stats.applied for r in rs.rules] == [0, 0]
            assert all(r.stats.errors == 0 for r in rs.rules)


@pytest.mark.parametrize(("set_", "field", "reason"), [
    ({"field": "FinalizedFeaturesEpoch", "value": 2 ** 70}, "FinalizedFeaturesEpoch",
     "not a valid int64"),
    ({"field": "FinalizedFeaturesEpoch", "value": None}, "FinalizedFeaturesEpoch",
     "not a valid int64"),
])
def test_set_values_the_codec_cannot_write_are_rejected_at_start_up(codec, set_, field, reason):
    """Accepted at start-up, they failed on every frame (counted under errors)."""
    with pytest.raises(RuleError) as info:
        RuleSet([rule_from_dict({"api": "ApiVersions", "direction": "response",
                                 "set": set_}, "r.json5 #4")], codec)
    text = str(info.value)
    assert "r.json5 #4" in text and field in text and reason in text


def test_a_nested_set_value_out_of_range_is_rejected_at_start_up(codec):
    with pytest.raises(RuleError) as info:
        RuleSet([rule_from_dict({
            "api": "Fetch", "direction": "response", "place": "Responses[].Partitions[]",
            "set": {"field": "CurrentLeader", "value": {"LeaderId": 99999999999}}},
            "r.json5 #2")], codec)
    text = str(info.value)
    assert "r.json5 #2" in text and "CurrentLeader.LeaderId" in text
    assert "not a valid int32" in text
    # in range, it is written
    RuleSet([rule_from_dict({
        "api": "Fetch", "direction": "response", "place": "Responses[].Partitions[]",
        "set": {"field": "CurrentLeader", "value": {"LeaderId": 2 ** 31 - 1}}}, "ok")], codec)


@pytest.mark.parametrize(("rule", "said"), [
    pytest.param("inject: {tag: 100, string: null}", "null", id="string-null"),
    pytest.param("inject: {tag: 100, hex: 12}", "expected text", id="hex-number"),
    pytest.param("inject: {tag: 100, bytes: 12}", "expected text", id="bytes-number"),
    pytest.param("inject: {tag: 100, string: 12}", "expected text", id="string-number"),
    pytest.param("inject: {tag: 100, hex: null}", "null", id="hex-null"),
    pytest.param("inject: {tag: 100, int32: null}", "null", id="int32-null"),
    pytest.param("inject: {tag: 100, int32: true}", "boolean", id="int32-bool"),
    pytest.param("inject: {tag: 100, uuid: 7}", "expected text", id="uuid-number"),
    pytest.param("place: null, inject: {tag: 100}", "'place' must be text", id="place-null"),
    pytest.param("set: {field: null, value: 1}", "'field' must be text", id="field-null"),
])
def test_null_and_numbers_are_not_turned_into_text(tmp_path, rule, said):
    """{string: null} injected the text "None", {hex: 12} the byte 0x12."""
    path = tmp_path / "r.json5"
    path.write_text("[{api: 'Metadata', direction: 'response', %s}]" % rule)
    with pytest.raises(RuleError) as info:
        load_rules_file(path)
    assert "r.json5 #1" in str(info.value) and said in str(info.value)


def test_api_null_is_refused_by_name(tmp_path):
    path = tmp_path / "r.json5"
    path.write_text("[{api: null, direction: 'response', strip: 'all'}]")
    with pytest.raises(RuleError, match="'api' must be text or an api key, got null"):
        load_rules_file(path)
    path.write_text("[{api: 3, direction: 'response', inject: {tag: 100, int32: 5,}}]")
    (r,) = load_rules_file(path)  # an api key and a number for int32 are fine
    assert (r.api, r.payload) == ("3", b"\x00\x00\x00\x05")
