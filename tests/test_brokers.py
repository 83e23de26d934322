"""The broker harness itself: start, readiness probe, failure reports, stop."""

import os
import socket
import struct
import sys

import pytest

from kinspect.brokers import Broker, BrokerStartError, TansuBroker, probe_api_versions


def metadata_brokers(host: str, port: int) -> list[tuple[int, str, int]]:
    """(node id, host, port) of each broker in a hand-built Metadata v0 answer."""
    client_id = b"kinspect-test"
    payload = struct.pack(">hhih", 3, 0, 7, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        reader = sock.makefile("rb")
        (size,) = struct.unpack(">i", reader.read(4))
        body = reader.read(size)
    correlation_id, count = struct.unpack_from(">ii", body)
    assert correlation_id == 7
    offset, brokers = 8, []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", body, offset)
        offset += 6
        name = body[offset : offset + host_len].decode()
        offset += host_len
        (broker_port,) = struct.unpack_from(">i", body, offset)
        offset += 4
        brokers.append((node_id, name, broker_port))
    return brokers


def test_tansu_answers_api_versions(tansu):
    assert tansu.bootstrap == f"127.0.0.1:{tansu.port}"
    versions = probe_api_versions(tansu.host, tansu.port)
    assert versions == tansu.api_versions
    assert len(versions) == 36
    assert versions[0] == (0, 11) and versions[1] == (0, 17) and versions[3] == (0, 12)
    assert "tansu broker 0.6.0" in tansu.log_text()


def test_noida_answers_api_versions(noida):
    assert noida.api_versions[18] == (0, 3)
    assert "noida-db 0.2.3" in noida.log_text()


def test_tansu_advertises_the_override():
    with TansuBroker(advertised="proxy.kinspect.test:19999") as broker:
        assert metadata_brokers(broker.host, broker.port) == [(111, "proxy.kinspect.test", 19999)]


def test_noida_advertises_its_listener(noida):
    assert metadata_brokers(noida.host, noida.port) == [(1, "127.0.0.1", noida.port)]


def test_stop_ends_the_process_and_keeps_the_log():
    broker = TansuBroker().start()
    pid = broker.pid
    broker.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((broker.host, broker.port), timeout=2)
    assert "ready in" in broker.log_text()
    broker.stop()  # idempotent


def test_port_in_use_raises_with_the_log(free_port):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", free_port))
        squatter.listen()
        with pytest.raises(BrokerStartError) as info:
            TansuBroker(port=free_port, startup_timeout=5).start()
    message = str(info.value)
    assert "process exited" in message
    assert f"--listener-url tcp://127.0.0.1:{free_port}" in message
    assert "AddrInUse" in message


class Silent(Broker):
    """A process that runs but never speaks Kafka."""

    name = "silent"

    def command(self):
        return [sys.executable, "-c", "print('starting', flush=True); import time; time.sleep(60)"]


def test_no_answer_times_out_and_kills_the_process():
    broker = Silent(startup_timeout=0.5)
    with pytest.raises(BrokerStartError) as info:
        broker.start()
    assert "no ApiVersions answer within 0.5 s" in str(info.value)
    assert "starting" in str(info.value)
    with pytest.raises(ProcessLookupError):
        os.kill(broker.pid, 0)
