"""Each real client round-trips messages through a direct connection to a real broker.

Also pins the known client/broker incompatibilities as findings: these tests
fail the day a pair starts working, so the notes can be updated.
"""

import pytest
from clients import ClientFailed, roundtrip

GROUP_CLIENTS = ["kafka-python", "aiokafka", "confluent-kafka", "kafkajs"]


def values_for(client: str) -> list[str]:
    return [f"{client} message {i} ✓" for i in range(10)]


@pytest.mark.parametrize("client", GROUP_CLIENTS)
def test_client_roundtrip_tansu(client, tansu):
    values = values_for(client)
    assert roundtrip(client, tansu.bootstrap, values, topic="peers", group="peers-g") == values


@pytest.mark.parametrize("client", [*GROUP_CLIENTS, "kcat"])
def test_client_roundtrip_noida(client, noida_session, unique):
    values = values_for(client)
    consumed = roundtrip(
        client, noida_session.bootstrap, values, topic=unique("peers"), group=unique("peers-g")
    )
    assert consumed == values


def test_kcat_cannot_parse_tansu_api_versions_v3(tansu):
    """Finding: Debian's kcat 1.7.1 (librdkafka 2.0.2) rejects Tansu's ApiVersions v3 answer.

    Tansu writes all four top-level tagged fields of ApiVersionsResponse v3, the
    defaults included. librdkafka before 2.2 skips a tagged field as if its size
    were a compact length (size + 1), so it skips one byte short, loses sync, and
    reads the 8 bytes of FinalizedFeaturesEpoch (-1) plus the next tag as a varint:
    0x02ffffffffffffff - 1 = 216172782113783806.
    """
    with pytest.raises(ClientFailed) as info:
        roundtrip("kcat", tansu.bootstrap, ["x"], topic="kcat", group="kcat-g", debug="protocol")
    output = info.value.output
    assert "ApiVersionRequest failed: Local: Read underflow" in output
    assert "Protocol read buffer underflow for ApiVersion v3" in output
    assert "expected 216172782113783806 bytes" in output


@pytest.mark.parametrize(
    ("client", "evidence"),
    [
        pytest.param("aiokafka", "Unexpected error during InitProducerIdRequest", id="aiokafka"),
        pytest.param("kafkajs", "Response InitProducerId(key: 22, version: 1)", id="kafkajs"),
    ],
)
def test_idempotent_producer_fails_on_tansu(client, evidence, tansu):
    """Finding: Tansu answers InitProducerId v0-v2 with error -1 (v3+ works).

    aiokafka and kafkajs use those versions, so their idempotent producers cannot
    start. kafka-python 3 (idempotent by default, so the plain round trip covers
    it) and librdkafka 2.16 use v3+ and succeed.
    """
    with pytest.raises(ClientFailed) as info:
        roundtrip(client, tansu.bootstrap, ["x"], topic="idem", group="idem-g", idempotent=True)
    assert evidence in info.value.output


def test_librdkafka_idempotent_producer_works_on_tansu(tansu):
    values = values_for("confluent-kafka")
    consumed = roundtrip(
        "confluent-kafka", tansu.bootstrap, values, topic="idem", group="idem-g", idempotent=True
    )
    assert consumed == values
