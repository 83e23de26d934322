"""A capture whose file cannot grow any more (a full disk): it ends at its last
whole line, says so once, naming the file, and the proxy goes on forwarding.

The full disk is a file size limit (``RLIMIT_FSIZE``) set in a child process: past
it, ``write`` fails with ``EFBIG`` as it fails with ``ENOSPC`` on a full disk, at a
size the test chooses, with no file system to mount (Python ignores SIGXFSZ, the
signal that would otherwise end the process)."""

from __future__ import annotations

import base64
import errno
import json
import os
import random
import resource
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from test_resilience import (
    ProxyProcess,
    Raw,
    capture_frames,
    create_topic,
    kill_capture_proxy,
    produce,
    record_batch,
    roundtrip,
    stop_capture_proxy,
)

from kinspect.capture import CaptureWarning, read_capture

LIMIT = 1 << 20  # bytes a file may grow to


def _limit_file_size() -> None:
    """(In the child, before exec) files grow to LIMIT bytes at most."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _read_all(path: Path) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureWarning)  # a torn line fails the test
        return list(read_capture(path))


def _frame(i: int) -> bytes:
    return b"\x00\x12\x00\x03" + i.to_bytes(4, "big") + random.Random(i).randbytes(7000)


_WRITER = textwrap.dedent("""
    import json, random, sys
    from kinspect.capture import CaptureWriter
    from kinspect.flows import Flow

    path, kwargs = sys.argv[1], json.loads(sys.argv[2])
    w = CaptureWriter(path, flush_lines=3, **kwargs)
    errors = []
    for i in range(1, 400):
        frame = b"\\x00\\x12\\x00\\x03" + i.to_bytes(4, "big") + random.Random(i).randbytes(7000)
        try:
            w.write_frame(Flow(i, 1, "c:1", "u:2", 18, 3, i, "ApiVersions", b"", i),
                          "req", frame, None, i)
        except OSError as e:
            errors.append([e.errno, e.filename])
    try:
        w.close()  # (O_DIRECT: the lines wait in the writer's buffer up to here)
    except OSError as e:
        errors.append([e.errno, e.filename])
    w.close()  # again: does not raise again
    print(json.dumps({"errors": errors, "error": w.error and w.error.errno,
                      "paths": [str(p) for p in w.paths]}))
""")


@pytest.mark.parametrize("name,kwargs", [
    ("direct.jsonl", {}),                          # O_DIRECT where the file system takes it
    ("cache.jsonl", {"direct": False}),            # through the page cache
    ("zipped.jsonl.gz", {}),
    ("rotated.jsonl", {"max_bytes": 3 * LIMIT}),  # (a part is cut: the limit is per file)
])
def test_a_full_disk_ends_the_capture_at_its_last_whole_line(tmp_path, name, kwargs):
    """Frames of 7 KB each until the file cannot grow, then as many again: one
    OSError (naming the file), later frames are not written, closing does not fail
    again, and the capture reads back without a torn line, holding the first frames
    written, in order."""
    path = tmp_path / name
    done = subprocess.run([sys.executable, "-c", _WRITER, str(path), json.dumps(kwargs)],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=_limit_file_size)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["errors"]) == 1, out
    assert out["errors"][0] == [errno.EFBIG, out["paths"][-1]] and out["error"] == errno.EFBIG
    got = [base64.b64decode(r["frame"]) for r in _read_all(path) if r["type"] == "frame"]
    assert 0 < len(got) < 399
    assert got == [_frame(i) for i in range(1, len(got) + 1)]


async def test_the_proxy_forwards_on_past_a_full_capture_disk(tansu, unique, tmp_path):
    """``kinspect proxy --capture`` whose capture cannot grow past 1 MiB, 2.5 MiB of
    Produce through it: every request is answered, the proxy stops cleanly, the
    error is told once (the file and why) and the capture holds whole lines: the
    first requests and responses, as sent and received."""
    topic = unique("capfull")
    create_topic(tansu.bootstrap, topic)
    cap = tmp_path / "cap.jsonl"
    proxy = ProxyProcess(tansu.bootstrap, tmp_path, "--capture", str(cap), "--capture-secrets",
                         preexec_fn=_limit_file_size)
    raw = None
    try:
        raw = await Raw.open(*proxy.address)
        batch = record_batch([os.urandom(64 << 10)])
        sent, received = [], []
        for corr in range(1, 41):
            q = produce(corr, topic, batch)
            sent.append(q)
            received.append(await roundtrip(raw, q, timeout=30))
        raw.close()
        raw = None
        await stop_capture_proxy(proxy, cap)
    finally:
        if raw is not None:
            raw.close()
        kill_capture_proxy(proxy, cap)
    err = proxy.stderr()
    assert err.count(os.strerror(errno.EFBIG)) == 1, err
    assert str(cap) in err and "Broken pipe" not in err, err
    assert err.count("the capture ends") <= 2, err  # the child's reason, the proxy's note
    reqs, resps = capture_frames(cap)
    assert 0 < len(reqs) < len(sent)
    assert reqs == sent[:len(reqs)]
    assert resps == received[:len(resps)]
