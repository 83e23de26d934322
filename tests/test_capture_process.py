"""CaptureProcess in front of a real broker: the real proxy, raw client sockets and
the capture child process, under faults of the child (stopped, killed)."""

from __future__ import annotations

import logging
import os
import signal

from proxyutil import codec, freeze
from test_resilience import (
    ProxyProcess,
    PauseWatch,
    Raw,
    _capture_children,
    capture_frames,
    corr_of,
    create_topic,
    kill_capture_proxy,
    produce,
    record_batch,
    req_corr,
    roundtrip,
    stop_capture_proxy,
    wait_for,
)

from kinspect.capture_process import CaptureProcess
from kinspect.proxy.pipeline import Pipeline
from kinspect.proxy.server import Proxy, ProxyConfig


def _kill(proc) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


async def test_a_capture_child_dying_while_the_proxy_waits_for_it_lets_the_proxy_go_on(
        tansu, unique, tmp_path, caplog):
    """The child falls behind (stopped) until more than its ``pause_bytes`` wait in
    the ring, and the proxy stops reading; every frame was handed on and every
    header is in the pipe. Then the child dies: the capture stops with one logged
    error, the backlog it held no longer counts, and the proxy reads again and
    answers every request."""
    topic = unique("capdies")
    create_topic(tansu.bootstrap, topic)
    host, port = tansu.bootstrap.rsplit(":", 1)
    pipeline = Pipeline(codec())
    child = CaptureProcess(tmp_path / "cap.jsonl", codec())
    pipeline.add(child)
    proxy = Proxy(ProxyConfig(upstream=(host, int(port))), codec(), pipeline)
    await proxy.start()
    raw = None
    try:
        assert child.ring_bytes > child.pause_bytes, "needs the shared-memory ring (Linux)"
        freeze(child._proc.pid)
        raw = await Raw.open(*proxy.address)
        batch = record_batch([os.urandom(256 << 10)])
        reqs = [produce(k + 1, topic, batch) for k in range(120)]  # 30 MiB
        async with PauseWatch(proxy) as watch:
            raw.send(*reqs)
            await wait_for(lambda: proxy.overloaded, timeout=30,
                           what="the proxy to stop reading behind the stopped child")
            read = (proxy.stats.overloads, proxy.stats.bytes_from_clients,
                    proxy.stats.bytes_from_brokers)
            await pipeline.drained()
            await wait_for(lambda: not child._out, timeout=30,
                           what="every header handed on to be in the pipe")
            assert proxy.overloaded and child.backlog_bytes > child.pause_bytes
            # the proxy stopped reading: neither side of the connection reads, and
            # not a byte more came in since the pause began (30 MiB were written)
            [conn] = proxy.connections
            assert not conn.client_tr.is_reading() and not conn.up_tr.is_reading()
            assert (proxy.stats.overloads, proxy.stats.bytes_from_clients,
                    proxy.stats.bytes_from_brokers) == read
            assert proxy.stats.bytes_from_clients < sum(4 + len(q) for q in reqs)
        watch.check()
        with caplog.at_level(logging.ERROR, logger="kinspect.capture"):
            _kill(child._proc)
            # nothing is left to write to the pipe, so no write can fail: the
            # backlog itself must tell that nobody will ever take it
            assert not pipeline.behind(0.5), child.backlog_bytes
            answers = []
            for q in reqs:
                resp = await raw.read(timeout=30)
                assert resp is not None and corr_of(resp) == req_corr(q)
                answers.append(resp)
        assert len(answers) == len(reqs)
        assert not proxy.overloaded and child.backlog_bytes == 0
        errors = [r for r in caplog.records if "stopped taking frames" in r.getMessage()]
        assert len(errors) == 1
    finally:
        _kill(child._proc)
        if raw is not None:
            raw.close()
        await proxy.close()


async def test_a_stop_signal_to_every_process_of_the_proxy_leaves_the_whole_capture(
        tansu, unique, tmp_path):
    """``kinspect proxy --capture`` stopped the way a service manager stops a unit:
    SIGTERM to every process of it, the capture child included. The proxy shuts
    down cleanly and hands its last frames on; the child must not die of the signal
    with them unwritten: every request the client sent and every response it got
    are in the capture, in order, in whole lines. (The child is held stopped over
    the last requests, so that they are still waiting for it when the signal
    comes.)"""
    topic = unique("capterm")
    create_topic(tansu.bootstrap, topic)
    cap = tmp_path / "cap.jsonl"
    proxy = ProxyProcess(tansu.bootstrap, tmp_path, "--capture", str(cap), "--capture-secrets")
    children = _capture_children(cap)
    raw = None
    try:
        assert len(children) == 1, children
        child = children[0]
        raw = await Raw.open(*proxy.address)
        batch = record_batch([os.urandom(10 * 1024)])
        sent, received = [], []
        for corr in range(1, 41):
            if corr == 21:
                freeze(child)
            q = produce(corr, topic, batch)
            sent.append(q)
            received.append(await roundtrip(raw, q))
        raw.close()
        raw = None
        os.kill(child, signal.SIGTERM)
        os.kill(proxy.proc.pid, signal.SIGTERM)
        os.kill(child, signal.SIGCONT)
        await stop_capture_proxy(proxy, cap)
    finally:
        if raw is not None:
            raw.close()
        kill_capture_proxy(proxy, cap)
    reqs, resps = capture_frames(cap)
    assert reqs == sent
    assert resps == received
