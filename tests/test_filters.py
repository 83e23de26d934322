"""The filter language over the flows of the committed example capture (recorded from
kafka-python through the real proxy into Tansu) and a few flows built with the codec."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinspect import filters
from kinspect.capture import load_capture
from kinspect.codec import Codec, KinspectError
from kinspect.filters import FilterError, TopicIds, error_codes, flow_topics, parse
from kinspect.flows import MUTATED, UNDECODED, Flow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "captures" / "example.jsonl"
CODEC = Codec()
API_NAMES = [n for n in map(CODEC.api_name, range(100)) if not n.startswith("ApiKey(")]


@pytest.fixture(scope="module")
def flows() -> list[Flow]:
    return load_capture(EXAMPLE, CODEC).flows


def select(expr: str, flows: list[Flow]) -> list[int]:
    f = parse(expr)
    return [fl.id for fl in flows if f.matches(fl)]


def ids(flows, pred) -> list[int]:
    return [f.id for f in flows if pred(f)]


# ---------------------------------------------------------------------------
# terms
# ---------------------------------------------------------------------------

def test_api_by_name_any_case_and_by_key(flows):
    produce = ids(flows, lambda f: f.api_key == 0)
    assert produce
    assert select("~api Produce", flows) == produce
    assert select("~api produce", flows) == produce
    assert select("~api ProduceRequest", flows) == produce
    assert select("~api 0", flows) == produce
    assert select("~api NoSuchApi", flows) == []


def test_an_api_name_no_spec_defines_is_refused_when_names_are_given(flows):
    """With the codec's api names (as the commands pass them), a misspelt ``~api``
    is an error at its position, with the close names, not a filter matching
    nothing; names, keys, request/response suffixes and the pseudo apis pass."""
    from kinspect.commands import api_names

    names = api_names(CODEC)
    with pytest.raises(FilterError) as ei:
        parse("~v 9 & ~api Produc", names)
    assert ei.value.position == len("~v 9 & ~api ")
    assert "Produc" in ei.value.reason and "Produce" in ei.value.reason, ei.value
    with pytest.raises(FilterError):
        parse("~api NoSuchApi", names)
    produce = ids(flows, lambda f: f.api_key == 0)
    for expr in ("~api produce", "~api ProduceRequest", "~api 0"):
        f = parse(expr, names)
        assert [fl.id for fl in flows if f.matches(fl)] == produce
    for expr in ("~api SaslToken", "~api Unpaired", "~api Malformed", '~api "ApiKey(99)"'):
        parse(expr, names)


@pytest.mark.parametrize("arg,pred", [
    ("4", lambda v: v == 4),
    ("7-9", lambda v: 7 <= v <= 9),
    ("9-", lambda v: v >= 9),
    ("0-4", lambda v: v <= 4),
    ("4,12", lambda v: v in (4, 12)),
])
def test_version_ranges(flows, arg, pred):
    want = ids(flows, lambda f: pred(f.api_version))
    assert want and select(f"~v {arg}", flows) == want


def test_conn_and_correlation_id(flows):
    assert select("~conn 2", flows) == ids(flows, lambda f: f.conn == 2)
    assert select("~conn 1-3", flows) == ids(flows, lambda f: 1 <= f.conn <= 3)
    assert select("~corr 1", flows) == ids(flows, lambda f: f.correlation_id == 1)


def _id_flow(conn: int, corr: int) -> Flow:
    return Flow(conn * 100 + corr, conn, "c:1", "u:2", 3, 12, corr, "Metadata", b"", 0)


@pytest.mark.parametrize("expr,want", [
    ("~corr -1", [-1]),               # the id -1, not "up to 1"
    ("~corr -5--2", [-5, -2]),
    ("~corr -2-0", [-2, -1, 0]),
    ("~corr 1-", [1, 2]),
    ("~corr -5,2", [-5, 2]),
    ("~corr 1", [1]),
])
def test_correlation_ids_may_be_negative(expr, want):
    corrs = [-5, -2, -1, 0, 1, 2]
    f = parse(expr)
    assert [c for c in corrs if f.matches(_id_flow(1, c))] == want


def test_corr_never_matches_flows_without_a_correlation_id():
    """Raw SASL tokens and malformed requests hold -1 for "no correlation id"; an
    unpaired response's id comes from its frame and counts."""
    from kinspect.flows import SASL_TOKEN, UNPAIRED

    token = Flow(1, 1, "c:1", "u:2", -1, -1, -1, "SaslToken", b"tok", 0)
    token.flags.add(SASL_TOKEN)
    malformed = Flow(2, 1, "c:1", "u:2", -1, -1, -1, "Malformed", b"\x00", 0)
    unpaired = Flow(3, 1, "c:1", "u:2", -1, -1, -1, "Unpaired", b"", 0)
    unpaired.flags.add(UNPAIRED)
    real = _id_flow(1, -1)
    for expr in ("~corr -1", "~corr -1-", "~corr -10-10"):
        f = parse(expr)
        assert [x.api_name for x in (token, malformed, unpaired, real) if f.matches(x)] == \
            ["Unpaired", "Metadata"]


@pytest.mark.parametrize("expr,want", [
    ("~conn -1", [-1]),
    ("~conn -1-1", [-1, 0, 1]),
    ("~conn 1-2", [1, 2]),
    ("~conn 2-", [2, 3]),
])
def test_connection_ids_minus_is_a_sign(expr, want):
    conns = [-1, 0, 1, 2, 3]
    f = parse(expr)
    assert [c for c in conns if f.matches(_id_flow(c, 7))] == want


@pytest.mark.parametrize("arg", ["-3", "-1-3", "1,-2"])
def test_negative_versions_are_refused_naming_the_position(arg):
    with pytest.raises(FilterError) as e:
        parse(f"~api Produce & ~v {arg}")
    assert e.value.position == len("~api Produce & ~v ")
    assert "never negative" in e.value.reason


def test_negative_version_error_suggests_the_range():
    with pytest.raises(FilterError) as e:
        parse("~v -3")
    assert "0-3" in e.value.reason


def test_client_id_regex_and_addresses(flows):
    everyone = [f.id for f in flows]
    assert select("~client ^kinspect-", flows) == everyone
    assert select("~client 'nobody|none'", flows) == []
    client = flows[0].client
    assert select(f"~addr {re.escape(client)}", flows) == ids(flows, lambda f: f.client == client)
    assert select(f"~addr {re.escape(flows[0].upstream)}", flows) == everyone


def test_topic_from_spec_entity_type(flows):
    hits = select("~topic example", flows)
    names = {f.api_name for f in flows if f.id in hits}
    assert {"Produce", "Fetch", "CreateTopics", "Metadata"} <= names
    assert all("example" in flow_topics(f) for f in flows if f.id in hits)
    assert select("~topic no-such-topic", flows) == []


def test_errors_anywhere_in_the_response(flows):
    def nonzero(f):
        body = f.response_decoded.body.to_dict() if f.response_decoded else {}
        found = []

        def walk(x):
            if isinstance(x, dict):
                for k, v in x.items():
                    if k == "ErrorCode" and v:
                        found.append(v)
                    walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)
        walk(body)
        return found

    errs = select("~err", flows)
    assert errs == ids(flows, lambda f: bool(nonzero(f)))
    # record_example.py creates its topic twice: the second CreateTopics fails with 36
    assert select("~err 36", flows) == ids(flows, lambda f: 36 in nonzero(f))
    assert {f.api_name for f in flows if f.id in select("~err 36", flows)} == {"CreateTopics"}
    assert select("!~err", flows) == ids(flows, lambda f: not nonzero(f))
    assert all(error_codes(f) for f in flows if f.id in errs)


def _error_flow(fid: int, code: int) -> Flow:
    from kinspect.codec.protocol import Response

    md = CODEC.response_codec(3).cls
    topic_cls = md._spec.field("Topics").struct.cls
    f = Flow(fid, 1, "c:1", "u:2", 3, 12, fid, "Metadata", b"", 0)
    f.response_decoded = Response(3, 12, fid, 1, None,
                                  md(Topics=[topic_cls(Name="t", ErrorCode=code)]), 0,
                                  "Metadata", 12)
    return f


@pytest.mark.parametrize("expr,codes", [
    ("~err -1", [-1]),             # UNKNOWN_SERVER_ERROR, not "up to 1"
    ("~err 3", [3]),
    ("~err -1,36", [-1, 36]),
    ("~err 1-10", [1, 3]),
    ("~err 30-", [36]),
    ("~err -1,1-3", [-1, 1, 3]),
    ("~err", [-1, 1, 3, 36]),
])
def test_err_codes_negative_and_ranges(expr, codes):
    all_codes = [-1, 0, 1, 3, 36]
    flows = [_error_flow(i, c) for i, c in enumerate(all_codes)]
    f = parse(expr)
    assert [all_codes[fl.id] for fl in flows if f.matches(fl)] == codes


def test_err_on_the_example_capture_minus_one_matches_nothing(flows):
    """The example holds no UNKNOWN_SERVER_ERROR: ``~err -1`` selects no flow."""
    assert select("~err -1", flows) == []


def _decoded_response_flow(fid: int, api_key: int, version: int, body) -> Flow:
    """A flow whose response is ``body`` encoded at ``version`` and decoded back, as
    the proxy decodes it."""
    from kinspect.codec.protocol import Response
    from kinspect.proxy.pipeline import decode_flow

    name = CODEC.api_name(api_key)
    hv = CODEC.response_header_version(api_key, version)
    f = Flow(fid, 1, "c:1", "u:2", api_key, version, fid, name, b"", 0)
    f.response = CODEC.encode_response(Response(api_key, version, fid, hv, None, body, 0,
                                                name, version))
    decode_flow(CODEC, f)
    assert f.response_decoded is not None and not f.error
    return f


def test_err_ignores_error_code_fields_absent_at_the_flow_version():
    """A decoded struct holds every field of its spec; a field that does not exist at
    the response's version is not an error code the broker sent."""
    fc = CODEC.response_codec(10).cls  # FindCoordinator: top-level ErrorCode v0-3 only
    coord = fc._spec.field("Coordinators").struct.cls
    v4 = _decoded_response_flow(1, 10, 4, fc(Coordinators=[coord(Key="g", ErrorCode=15)]))
    assert error_codes(v4) == [15]
    assert not parse("~err 0").matches(v4)
    assert parse("~err 15").matches(v4) and parse("~err").matches(v4)
    v3 = _decoded_response_flow(2, 10, 3, fc(ErrorCode=0))
    assert error_codes(v3) == [0] and parse("~err 0").matches(v3)
    md = CODEC.response_codec(3).cls  # Metadata: top-level ErrorCode v13+
    v12 = _decoded_response_flow(3, 3, 12, md())
    assert error_codes(v12) == []
    assert not parse("~err 0").matches(v12) and not parse("~err").matches(v12)
    v13 = _decoded_response_flow(4, 3, 13, md())
    assert error_codes(v13) == [0] and parse("~err 0").matches(v13)


def test_topics_ignore_name_fields_absent_at_the_flow_version():
    """Fetch v13+ names topics only by id: its ``Topic`` name field (v0-12) is absent,
    not an empty topic name."""
    from kinspect.codec.protocol import Request

    fetch_cls = CODEC.request_codec(1).cls
    ft = fetch_cls._spec.field("Topics").struct.cls
    f = Flow(1, 1, "c:1", "u:2", 1, 13, 1, "Fetch", b"", 0)
    f.request_decoded = Request(1, 13, 1, "c", 2, None,
                                fetch_cls(Topics=[ft(TopicId=bytes(range(1, 17)))]), 0, "Fetch")
    assert flow_topics(f) == set()
    assert not parse("~topic ''").matches(f)
    old = Flow(2, 1, "c:1", "u:2", 1, 12, 2, "Fetch", b"", 0)
    old.request_decoded = Request(1, 12, 2, "c", 2, None, fetch_cls(Topics=[ft(Topic="t")]), 0,
                                  "Fetch")
    assert flow_topics(old) == {"t"}


def test_flags(flows):
    rewritten = ids(flows, lambda f: "rewritten" in f.flags)
    assert rewritten  # Metadata and FindCoordinator answers carry broker addresses
    assert select("~rewritten", flows) == rewritten
    assert select("~flag rewritten", flows) == rewritten
    assert select("~undecoded", flows) == [] and select("~mutated", flows) == []
    garbage = Flow(900, 1, "c:1", "u:2", 3, 12, 5, "Metadata", b"\x00\x03\x00\x0c\x00\x00\x00\x05"
                   b"\xff", 0)
    from kinspect.proxy.pipeline import decode_flow
    decode_flow(CODEC, garbage)
    assert UNDECODED in garbage.flags and parse("~undecoded").matches(garbage)
    garbage.flags.add(MUTATED)
    assert parse("~mutated & ~undecoded & ~api Metadata").matches(garbage)


def test_direction_at_flow_and_frame_level(flows):
    f = next(fl for fl in flows if fl.api_key == 0)
    assert parse("~dir req").matches(f) and parse("~dir resp").matches(f)
    assert parse("~dir req|resp").matches_frame(f, "resp")
    assert parse("~dir req").matches_frame(f, "req")
    assert not parse("~dir req").matches_frame(f, "resp")
    assert not parse("~dir resp & ~api Produce").matches_frame(f, "req")


def test_direction_of_an_empty_request_frame():
    """An empty raw SASL token is a request frame; an unpaired response has none."""
    from kinspect.flows import SASL_TOKEN, UNPAIRED

    token = Flow(1, 1, "c:1", "u:2", -1, -1, -1, "SaslToken", b"", 0)
    token.flags.add(SASL_TOKEN)
    token.response = b"\x00\x00\x00\x00"
    assert parse("~dir req").matches(token) and parse("~dir resp").matches(token)
    unpaired = Flow(2, 1, "c:1", "u:2", -1, -1, 7, "Unpaired", b"", 0)
    unpaired.flags.add(UNPAIRED)
    unpaired.response = b"\x00\x00\x00\x07"
    assert not parse("~dir req").matches(unpaired) and parse("~dir resp").matches(unpaired)


def test_topic_ids_are_resolved_through_metadata():
    from kinspect.codec.protocol import Request, Response

    tid = bytes(range(1, 17))
    md = CODEC.response_codec(3).cls
    topic_cls = md._spec.field("Topics").struct.cls
    body = md(Topics=[topic_cls(Name="orders", TopicId=tid, ErrorCode=0)])
    mflow = Flow(1, 1, "c:1", "u:2", 3, 12, 1, "Metadata", b"", 0)
    mflow.response_decoded = Response(3, 12, 1, 1, None, body, 0, "Metadata", 12)
    fetch_cls = CODEC.request_codec(1).cls
    ft = fetch_cls._spec.field("Topics").struct.cls
    fflow = Flow(2, 1, "c:1", "u:2", 1, 13, 2, "Fetch", b"", 0)
    fflow.request_decoded = Request(1, 13, 2, "c", 2, None, fetch_cls(Topics=[ft(TopicId=tid)]),
                                    0, "Fetch")
    f = parse("~topic orders")
    assert not f.matches(fflow)
    index = TopicIds().learn_all([mflow, fflow])
    assert f.matches(fflow, topic_ids=index)
    f.topic_ids = index
    assert f.matches(fflow)


# ---------------------------------------------------------------------------
# combinations
# ---------------------------------------------------------------------------

def test_precedence_not_and_or(flows):
    produce = set(ids(flows, lambda f: f.api_key == 0))
    fetch = set(ids(flows, lambda f: f.api_key == 1))
    err = set(select("~err", flows))
    conn2 = set(ids(flows, lambda f: f.conn == 2))
    assert set(select("~api Produce | ~api Fetch & ~err", flows)) == produce | (fetch & err)
    assert set(select("(~api Produce | ~api Fetch) & ~err", flows)) == (produce | fetch) & err
    assert set(select("!~api Produce & ~conn 2", flows)) == conn2 - produce
    assert set(select("!(~api Produce | ~conn 2)", flows)) == \
        {f.id for f in flows} - produce - conn2
    assert select("!!~api Produce", flows) == sorted(produce)


def test_implicit_and(flows):
    assert select("~api Produce ~v 9", flows) == select("~api Produce & ~v 9", flows)
    assert select("~err ~api CreateTopics", flows) == select("~err & ~api CreateTopics", flows)
    assert select("~all", flows) == [f.id for f in flows]


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("expr,position,fragment", [
    ("", 0, "empty filter"),
    ("~api", 4, "needs an argument"),
    ("~nope 3", 0, "unknown term ~nope"),
    ("~api Produce &", 14, "ends too early"),
    ("(~api Produce", 13, "missing ')'"),
    ("~api Produce )", 13, "unbalanced ')'"),
    ("Produce", 0, "starting with '~'"),
    ("~v x", 3, "expected a number or range"),
    ("~v 9-7", 3, "empty range"),
    ("~err x", 5, "expected an error code"),
    ("~err 9-7", 5, "empty range"),
    ("~dir sideways", 5, "~dir takes req, resp"),
    ("~client '(' ", 8, "bad regular expression"),
    ("~client 'open", 8, "unterminated"),
    ("~api Produce | | ~v 1", 15, "before '|'"),
    ("~", 1, "term name"),
    ("~topic my topic", 10, "unexpected 't'"),
    ("(~topic my topic)", 11, "unexpected 't'"),
    ("~api Produce ^ ~v 1", 13, "unexpected '^'"),
    ("~api Produce or ~v 1", 13, "expected '&', '|', ')' or the end"),
    ("~sasl foo", 6, "~sasl takes no argument"),
    ("(~api Produce ) )", 16, "unbalanced ')'"),
])
def test_bad_expressions_name_the_position(expr, position, fragment):
    with pytest.raises(FilterError) as e:
        parse(expr)
    assert e.value.position == position
    assert fragment in e.value.reason
    assert isinstance(e.value, KinspectError)
    assert str(e.value).splitlines()[-1] == "  " + " " * position + "^"


@pytest.mark.parametrize("expr,position,fragment", [
    # the parser and the compiled filter recurse once per '!' or '(': RecursionError
    pytest.param("!" * 3000 + "~all", filters.MAX_NESTING, "nested too deeply", id="3000 !"),
    pytest.param("(" * 3000 + "~all" + ")" * 3000, filters.MAX_NESTING, "nested too deeply",
                 id="3000 ("),
    pytest.param("(!" * 1500 + "~all" + ")" * 1500, filters.MAX_NESTING, "nested too deeply",
                 id="1500 (!"),
    # int() refuses more than 4300 digits: ValueError
    pytest.param("~conn " + "9" * 5000, 6, "number too large: 5000 digits", id="~conn"),
    pytest.param("~v 1-" + "9" * 5000, 3, "number too large", id="~v"),
    pytest.param("~corr -" + "1" * 5000, 6, "number too large", id="~corr"),
    pytest.param("~err " + "0" * 5000, 5, "number too large", id="~err"),
    pytest.param("~api " + "9" * 5000, 5, "number too large", id="~api"),
    # re.compile: OverflowError and RecursionError besides re.error
    pytest.param('~client "a{4294967296}"', 8, "repetition number is too large",
                 id="~client repeat"),
    pytest.param(f'~addr "{"(" * 2000}a{")" * 2000}"', 6, "nested too deeply",
                 id="~addr groups"),
])
def test_oversized_expressions_are_filter_errors(expr, position, fragment):
    for names in (None, API_NAMES):
        with pytest.raises(FilterError) as e:
            parse(expr, names)
        assert e.value.position == position
        assert fragment in e.value.reason, e.value.reason


def test_nesting_and_numbers_at_the_limits_still_parse(flows):
    depth = filters.MAX_NESTING
    every = [f.id for f in flows]
    assert select("(" * depth + "~all" + ")" * depth, flows) == every
    assert select("!" * depth + "~all", flows) == every  # an even number of '!'
    assert select("(!" * (depth // 2) + "~all" + ")" * (depth // 2), flows) == every
    big = "9" * filters.MAX_DIGITS
    assert select(f"~conn {big} | ~corr -{big} | ~api {big} | ~v {big}", flows) == []


_TOKENS = [*"~!&|()\"'\\ -,0123456789az\t{}", "~api", "~v", "~dir", "~err", "~corr", "~conn",
           "~topic", "~client", "~flag", "~all", "~sasl", "req|resp", "Produce", "Fech", "[",
           "*", "(?P<", "é"]
#: a few tokens, each repeated up to thousands of times: deep nesting, long numbers
_RUNS = st.lists(st.tuples(st.sampled_from(_TOKENS), st.integers(1, 5000)), max_size=4).map(
    lambda runs: "".join(tok * n for tok, n in runs))


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(*[st.lists(st.sampled_from(_TOKENS), max_size=12).map("".join)] * 3,
                 st.text(max_size=20), _RUNS))
def test_any_text_parses_or_is_a_filter_error_inside_it(text):
    # fuzz: whatever the text, the parser raises only FilterError, pointing into it.
    # Short texts alone never reach the failures of size (thousands of '!' or '(',
    # numbers of more than 4300 digits): the runs do, and the tests above pin them.
    for names in (None, API_NAMES):
        try:
            parse(text, names)
        except FilterError as e:
            assert 0 <= e.position <= len(text)


def test_needs_decoded_says_which_filters_read_the_decoded_messages(flows):
    """``needs_decoded`` lets a view holding flows without their decoded values
    (``show --browse``) decode only for the filters that read them: a term without
    it matches a flow whose decoded values were let go as it matches the flow
    decoded; a term with it does not always (else it is set for nothing)."""
    from kinspect.proxy.pipeline import decode_flow

    ids = TopicIds().learn_all(flows)
    bare = load_capture(EXAMPLE, CODEC, decode=False).flows
    for f in bare:
        decode_flow(CODEC, f)
        f.request_decoded = f.response_decoded = None
    flags = sorted({fl for f in flows for fl in f.flags})
    args = {"api": "Produce", "v": "0-3", "dir": "resp", "client": "example", "addr": "127",
            "conn": "1-2", "corr": "1-3", "topic": "example", "err": None,
            "flag": flags[0] if flags else "rewritten"}
    for name, spec in filters.TERMS.items():
        text = f"~{name}" if spec.arg is None or args.get(name) is None else f"~{name} {args[name]}"
        f = parse(text)
        got = [f.matches(b, topic_ids=ids) for b in bare]
        want = [f.matches(d, topic_ids=ids) for d in flows]
        assert f.needs_decoded == spec.needs_decoded, text
        if spec.needs_decoded:
            assert got != want, f"{text}: matches as well without decoded values"
        else:
            assert got == want, f"{text}: needs the decoded values"
    for text, needs in (("~api Fetch | ~topic x", True), ("!~err", True),
                        ("~api Fetch & (~conn 1 | ~flag x)", False)):
        assert parse(text).needs_decoded is needs, text


@pytest.mark.parametrize("text", [
    "~api Fetch & ~topic example", "~topic example & ~api Fetch", "~conn 2 & ~err",
    "~api Produce & (~topic example | ~conn 1)", "~api Fetch & !~err", "~topic example",
    "!(~api Fetch & ~topic example)", "~api Metadata | ~topic example"])
def test_a_filter_rejects_without_decoded_values_only_what_it_would_reject(flows, text):
    """``rejects_undecoded``: a part of an ``&`` that reads no decoded message
    rejects a flow without decoding it; whatever it rejects, the filter does not
    match with the decoded messages either."""
    ids = TopicIds().learn_all(flows)
    f = parse(text)
    bare = load_capture(EXAMPLE, CODEC, decode=False).flows
    rejected = [b.id for b in bare if f.rejects_undecoded(b, topic_ids=ids)]
    assert not [d.id for d in flows if d.id in rejected and f.matches(d, topic_ids=ids)]
    if text.startswith("~api Fetch &"):
        assert sorted(rejected) == [d.id for d in flows if d.api_name != "Fetch"]
