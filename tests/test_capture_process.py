"""CaptureProcess in front of a real broker: the real proxy, raw client sockets and
the capture child process, under faults of the child (stopped, killed)."""

from __future__ import annotations

import logging
import os
import signal

from proxyutil import codec
from test_resilience import Raw, corr_of, create_topic, produce, record_batch, req_corr, wait_for

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
        os.kill(child._proc.pid, signal.SIGSTOP)
        raw = await Raw.open(*proxy.address)
        batch = record_batch([os.urandom(256 << 10)])
        reqs = [produce(k + 1, topic, batch) for k in range(120)]  # 30 MiB
        raw.send(*reqs)
        await wait_for(lambda: proxy.overloaded, timeout=30,
                       what="the proxy to stop reading behind the stopped child")
        await pipeline.drained()
        await wait_for(lambda: not child._out, timeout=30,
                       what="every header handed on to be in the pipe")
        assert proxy.overloaded and child.backlog_bytes > child.pause_bytes
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
