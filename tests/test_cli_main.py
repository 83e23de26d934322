"""The main job's commands as a newcomer runs them: `kinspect demo`, `kinspect specs`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kinspect", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def stderr_lines_until(proc: subprocess.Popen, done, what: str,
                       timeout: float = 60) -> list[str]:
    """The lines ``proc`` writes to stderr (a text pipe) up to and including the
    first for which ``done(line)`` is true, or all of them if it ends first. A
    process that does neither within ``timeout`` seconds is killed, and the test
    fails saying what it waited for (a plain read would wait for ever)."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()

    def reader() -> None:
        for line in iter(proc.stderr.readline, ""):
            lines.put(line)
            if done(line):
                break
        lines.put(None)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()  # (its stderr ends: the reader ends too)
            proc.wait()
            thread.join(10)
            while not lines.empty():
                got.append(lines.get() or "")
            raise AssertionError(f"no {what} on stderr within {timeout} s "
                                 f"(killed); it wrote:\n{''.join(got)}") from None
        if line is None:
            thread.join()
            return got
        got.append(line)


def test_demo_runs_real_flows_and_stops_everything():
    proc = run("demo", "--rounds", "1", "--messages", "3", "--no-tui")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    apis = {m.group(1) for line in lines if (m := re.search(r" (\w+) v\d+ corr=", line))}
    assert {"ApiVersions", "Metadata", "CreateTopics", "Produce", "JoinGroup", "SyncGroup",
            "Fetch"} <= apis, proc.stdout
    assert "3 messages produced, 3 consumed, in 1 round" in proc.stderr
    assert not any("undecoded" in line for line in lines), proc.stdout
    # everything it started is gone: neither the proxy nor the broker accepts connections
    m = re.search(r"listening on ([\d.]+):(\d+), forwarding to ([\d.]+):(\d+)", proc.stderr)
    assert m, proc.stderr
    for host, port in ((m.group(1), m.group(2)), (m.group(3), m.group(4))):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=2).close()


def test_demo_rounds_add_up():
    """``--rounds N`` reports the totals of all N rounds."""
    proc = run("demo", "--rounds", "2", "--messages", "2", "--no-tui", "--interval", "0")
    assert proc.returncode == 0, proc.stderr
    assert "4 messages produced, 4 consumed, in 2 rounds" in proc.stderr, proc.stderr


def test_demo_rounds_are_paced_by_the_interval_on_one_session(tmp_path):
    """``--rounds N --interval S``: the rounds are ``S`` seconds apart (from the first
    round's commit to the second round's first Produce, as the proxy saw them) and
    share one session, as without ``--rounds``: the topic is created once, the group
    joined once (each round used to open new clients, back to back)."""
    from kinspect.capture import load_capture

    interval = 2.5
    capture = tmp_path / "rounds.jsonl"
    proc = run("demo", "--rounds", "2", "--messages", "2", "--no-tui", "--interval",
               str(interval), "--capture", str(capture))
    assert proc.returncode == 0, proc.stderr
    assert "4 messages produced, 4 consumed, in 2 rounds" in proc.stderr, proc.stderr
    flows = sorted(load_capture(capture).flows, key=lambda f: f.request_ns)
    apis = [f.api_name for f in flows]
    assert apis.count("CreateTopics") == 1 and apis.count("JoinGroup") >= 1, apis
    assert apis.count("LeaveGroup") == 1, apis  # the consumer left the group once, at the end
    # round 1 produces before it commits; round 2's first Produce comes after a commit
    first_commit = next(f for f in flows if f.api_name == "OffsetCommit")
    second = next(f for f in flows
                  if f.api_name == "Produce" and f.request_ns > first_commit.request_ns)
    commit = max((f for f in flows if f.api_name == "OffsetCommit"
                  and f.response_ns is not None and f.response_ns < second.request_ns),
                 key=lambda f: f.response_ns)
    assert second.request_ns - commit.response_ns >= interval * 1e9, \
        (second.request_ns - commit.response_ns) / 1e9


def test_specs_lists_apis_with_sources():
    proc = run("specs", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by_key = {a["api_key"]: a for a in data["apis"]}
    assert by_key[3]["api"] == "Metadata" and "kafka" in by_key[3]["request_source"]
    # kinspect's own specs/ fill what kafka-python's set lacks (librdkafka sends 71)
    assert by_key[71]["api"] == "GetTelemetrySubscriptions"
    assert by_key[71]["request_source"].endswith("specs/GetTelemetrySubscriptionsRequest.json")
    assert [s["origin"] for s in data["sources"]][-2:] == ["project", "kafka-python"]


def test_specs_rejects_an_invalid_spec_naming_file_and_field(tmp_path):
    (tmp_path / "BadRequest.json").write_text(
        '{"apiKey": 500, "type": "request", "name": "BadRequest", "validVersions": "0",'
        ' "flexibleVersions": "none", "fields": [{"name": "Oops", "type": "int33",'
        ' "versions": "0+"}]}')
    proc = run("specs", "--specs", str(tmp_path))
    assert proc.returncode == 1
    assert "BadRequest.json" in proc.stderr and "Oops" in proc.stderr


def test_a_specs_path_without_specs_is_warned_about(tmp_path):
    """``--specs`` naming an empty directory, or a jar holding no ``*.json`` (the wrong
    jar), is one warning naming it: the default specs are used, as they would be
    without the option, and a typo would otherwise go unnoticed."""
    import zipfile

    empty = tmp_path / "empty"
    empty.mkdir()
    jar = tmp_path / "wrong.jar"
    with zipfile.ZipFile(jar, "w") as zf:
        zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    for path in (empty, jar):
        proc = run("specs", "--specs", str(path))
        assert proc.returncode == 0, proc.stderr
        warnings = [line for line in proc.stderr.splitlines() if "no message specs" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0], proc.stderr
        assert f"--specs {path}: no message specs found" in warnings[0], proc.stderr
        assert "ProduceRequest.json" in proc.stdout  # (the other sources)
    proc = run("specs")
    assert "no message specs found" not in proc.stderr, proc.stderr


def _proxy_until_ctrl_c(tansu, *options: str, env: dict | None = None
                        ) -> tuple[int, bytes, str, str]:
    """``kinspect proxy --no-tui`` in front of ``tansu`` with ``options``: one Metadata
    v12 request (correlation id 5) through it once it listens, then SIGINT. Returns
    the port, the answer, stdout and stderr; the process is ended whatever happens."""
    import os
    import signal
    import time

    from proxyutil import exchange_sync, request_bytes

    from kinspect.brokers import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kinspect", "proxy", "--upstream",
                             tansu.bootstrap, "--listen", f"127.0.0.1:{port}", "--no-tui",
                             *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                [resp] = exchange_sync("127.0.0.1", port, [request_bytes(3, 12, 5, Topics=None)])
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    proc.kill()  # (a read of a running proxy's stderr never ends)
                    _, err = proc.communicate(timeout=10)
                    raise AssertionError(f"proxy did not come up: {err}")
                time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    return port, resp, out, err


def test_proxy_command_exits_cleanly_on_ctrl_c(tansu):
    _, resp, out, _ = _proxy_until_ctrl_c(tansu)
    assert resp[:4] == b"\x00\x00\x00\x05"
    assert "Metadata v12 corr=5" in out


def test_proxy_logs_to_a_file_its_whole_address_and_rules_table(tansu):
    """Stderr to a file or pipe (a service's log): the start-up line names the
    address bound and the one clients bootstrap from (--advertise-host), and the
    rules' table on exit keeps every column for every rule, as wide as it needs
    (rich took 80 columns for a console that is not a terminal: with four long
    rules the errors column came out empty)."""
    import os

    rules = [f"Fetch:response:Responses[].Partitions[]:tag={n}:hex=ff" for n in range(11, 15)]
    port, _, _, err = _proxy_until_ctrl_c(
        tansu, "--advertise-host", "kafka.example", "--no-rewrite",
        *[a for r in rules for a in ("--inject", r)], env={**os.environ, "COLUMNS": "80"})
    assert (f"listening on 127.0.0.1:{port} (clients bootstrap from kafka.example:{port}), "
            f"forwarding to {tansu.bootstrap}") in err, err
    rows = [line for line in err.splitlines() if line.startswith("│ --inject #")]
    assert len(rows) == 4, err
    for row in rows:
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert len(cells) == 7 and cells[-1] == "0", row  # ... errors: 0
        assert cells[1].startswith("inject Fetch:response:") and "…" not in row, row


@pytest.mark.parametrize("why", ["filter", "rules", "port"])
def test_proxy_start_up_failure_leaves_an_existing_capture_alone(tmp_path, why):
    """A start-up that fails before any traffic (bad filter, bad rules, listen port
    in use) neither truncates the capture named by --capture nor leaves its writer
    behind (the child would report a broken pipe once the proxy is gone)."""
    from pathlib import Path

    capture = tmp_path / "keep.jsonl"
    example = Path(__file__).resolve().parents[1] / "captures" / "example.jsonl"
    capture.write_bytes(example.read_bytes())
    before = capture.read_bytes()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        listen = f"127.0.0.1:{busy.getsockname()[1]}" if why == "port" else "127.0.0.1:0"
        extra = {"filter": ["--filter", "~bogus"], "rules": ["--inject", "bogus"],
                 "port": []}[why]
        proc = run("proxy", "--upstream", "127.0.0.1:1", "--listen", listen, "--capture",
                   str(capture), "--no-tui", *extra)
    finally:
        busy.close()
    assert proc.returncode == 1, proc.stderr
    assert "kinspect: error:" in proc.stderr
    assert "Broken pipe" not in proc.stderr and "capture process" not in proc.stderr, proc.stderr
    assert capture.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl"]


def test_proxy_killed_outright_leaves_a_whole_capture_and_a_quiet_child(tansu, tmp_path):
    """SIGKILL of the proxy: its capture child writes what it was handed, closes the
    file and exits without complaining (it used to report a broken pipe while telling
    its counts to the dead proxy)."""
    import os
    import signal
    import time

    from proxyutil import exchange_sync, request_bytes

    from kinspect.brokers import free_port
    from kinspect.capture import load_capture

    port = free_port()
    capture = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "kinspect", "proxy", "--upstream",
                             tansu.bootstrap, "--listen", f"127.0.0.1:{port}", "--no-tui",
                             "--capture", str(capture)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                exchange_sync("127.0.0.1", port, [request_bytes(3, 12, 5, Topics=None)])
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("proxy did not come up")
                time.sleep(0.1)
        # the answer handed on to the child and written (flush_interval): not a fixed
        # wait, which a busy machine can outlast
        while b'"dir":"resp"' not in (capture.read_bytes() if capture.exists() else b""):
            assert time.monotonic() < deadline + 30 and proc.poll() is None, \
                "the capture child never wrote the answer"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # the child shares the proxy's stderr: end of file once it has exited too
    try:
        err = "".join(stderr_lines_until(proc, lambda line: False,
                                         "end of stderr (the capture child's exit)"))
    except AssertionError:  # the child lives on: it is in the proxy's process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    proc.stderr.close()
    assert "Broken pipe" not in err and "capture process" not in err, err
    flows = load_capture(capture).flows
    assert [(f.api_name, f.correlation_id, f.response is not None) for f in flows] == [
        ("Metadata", 5, True)]


EXAMPLE = __import__("pathlib").Path(__file__).resolve().parents[1] / "captures" / "example.jsonl"


def test_output_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path):
    """``kinspect decode --jsonl big.jsonl | head -1``: once the reader is gone, the
    command stops without a traceback or a "Broken pipe" error message."""
    lines = EXAMPLE.read_text().splitlines()
    big = tmp_path / "big.jsonl"
    big.write_text("\n".join(lines[:1] + lines[1:] * 40) + "\n")  # well over a pipe buffer
    proc = subprocess.Popen([sys.executable, "-m", "kinspect", "decode", "--jsonl", str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.read(100)
        proc.stdout.close()
        err = "".join(stderr_lines_until(proc, lambda line: False, "end of stderr"))
        assert proc.wait(timeout=60) != 0  # it did not finish its job
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert "Traceback" not in err and "Broken pipe" not in err and "Errno 32" not in err, err


def test_a_torn_last_line_is_one_warning_line_not_a_python_warning(tmp_path):
    """A capture cut in the middle of its last line (its writer killed) is shown
    with one ``kinspect: warning:`` line, not Python's warning format with the
    source file, line number and code line of kinspect's reader."""
    torn = tmp_path / "torn.jsonl"
    text = EXAMPLE.read_text()
    torn.write_text(text[:len(text) - 40])
    proc = run("show", str(torn))
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kinspect: warning: "), proc.stderr
    assert "torn last line" in err[0] and ".py:" not in proc.stderr


@pytest.mark.parametrize("argv", [
    ["show", str(EXAMPLE), "--bytes-limit", "-5"],
    ["proxy", "--upstream", "127.0.0.1:1", "--max-frame", "-1"],
    ["proxy", "--upstream", "127.0.0.1:1", "--max-frame", "0"],
    ["demo", "--rounds", "0"],
    ["demo", "--messages", "-3"],
    ["demo", "--interval", "-1"],
    ["demo", "--duration", "-2"],
    ["replay", str(EXAMPLE), "--upstream", "127.0.0.1:1", "--timeout", "-1"],
    ["replay", str(EXAMPLE), "--upstream", "127.0.0.1:1", "--timeout", "nan"],
    ["replay", str(EXAMPLE), "--upstream", "127.0.0.1:1", "--speed", "nan"],
    ["replay", str(EXAMPLE), "--upstream", "127.0.0.1:1", "--speed", "inf"],
    ["replay", str(EXAMPLE), "--upstream", "127.0.0.1:1", "--speed", "0"],
    ["tolerate", "--bootstrap", "127.0.0.1:1", "--timeout", "-1"],
    ["tolerate", "--bootstrap", "127.0.0.1:1", "--max-cells", "0"],
    ["tolerate", "--bootstrap", "127.0.0.1:1", "--budget", "-5"],
])
def test_out_of_range_numbers_are_usage_errors(argv, capsys):
    """A negative size, timeout or count is refused by the parser (status 2, naming
    the option) before anything starts, instead of being taken (a proxy refusing
    every frame, a demo that never stops, every replayed flow failing) or ending in
    a traceback (tolerate's socket timeout)."""
    from kinspect.cli import build_parser

    with pytest.raises(SystemExit) as exc:  # (parsing only: nothing is started)
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    option = next(a for a in argv if a.startswith("--") and a not in ("--upstream",
                                                                      "--bootstrap"))
    assert f"argument {option}" in err and "Traceback" not in err, err


@pytest.mark.parametrize("pattern, said", [
    ("", "an empty pattern"),
    ("  ", "an empty pattern"),
    ("Bogus:ThrottleTimeMs", "no api is named 'Bogus'"),
    ("Fetch:", "nothing after 'Fetch:'"),
    ("entity:", "nothing after 'entity:'"),
    ("Fetch:entity:", "nothing after 'Fetch:entity:'"),
])
def test_an_ignore_pattern_that_cannot_match_is_a_usage_error(pattern, said):
    """``replay --ignore`` refuses a pattern that could never match anything, as
    ``--filter`` refuses an unknown api, before connecting to anything: an empty
    one, or ``API:`` naming an api the specs lack (both were taken, silently)."""
    proc = run("replay", str(EXAMPLE), "--upstream", "127.0.0.1:1", "--ignore", pattern)
    assert proc.returncode == 2, proc.stderr
    assert f"argument --ignore: {said}" in proc.stderr, proc.stderr
    assert "cannot connect" not in proc.stderr
    proc = run("serve", str(EXAMPLE), "--listen", "127.0.0.1:1", "--ignore", pattern)
    assert proc.returncode == 2 and f"argument --ignore: {said}" in proc.stderr, proc.stderr
    # the api's name in any case, and entity: types, are taken (and the replay goes
    # on to connect: nothing listens there)
    for taken in ("fetch:HighWatermark", "Fetch:entity:brokerId", "entity:brokerId"):
        proc = run("replay", str(EXAMPLE), "--upstream", "127.0.0.1:1", "--ignore", taken)
        assert proc.returncode == 1 and "cannot connect" in proc.stderr, proc.stderr


@pytest.mark.parametrize("argv, level", [
    (["serve", "captures/run.jsonl", "--listen", "127.0.0.1:19092", "-v"], 1),  # (its help's)
    (["-v", "serve", "captures/run.jsonl"], 1),
    (["serve", "captures/run.jsonl", "-vv"], 2),
    (["-vv", "show", "captures/example.jsonl"], 2),
    (["show", "captures/example.jsonl"], 0),
    (["proxy", "--upstream", "127.0.0.1:1", "--verbose"], 1),
    (["-v", "specs", "-v"], 2),
])
def test_verbose_goes_before_or_after_the_command(argv, level):
    """``-v`` is taken after the command as well as before it, and counted with
    those before it (``kinspect serve --help``'s own example put it after, and was
    refused)."""
    from kinspect.cli import build_parser, parse_args

    assert parse_args(build_parser(), argv).verbose == level


def test_max_frame_takes_a_size_with_a_suffix():
    from kinspect.cli import build_parser

    args = build_parser().parse_args(["proxy", "--upstream", "127.0.0.1:1", "--max-frame", "1MiB"])
    assert args.max_frame == 1 << 20


def test_replay_checks_its_report_path_before_replaying(tmp_path):
    """``--report DIR`` (or a file in a missing directory) fails before any request
    is sent, not after the whole replay has run against the broker."""
    for report in (tmp_path, tmp_path / "missing" / "r.json"):
        proc = run("replay", str(EXAMPLE), "--upstream", "127.0.0.1:1", "--as-fast-as-possible",
                   "--report", str(report))
        assert proc.returncode == 1
        assert str(report) in proc.stderr and "cannot connect" not in proc.stdout + proc.stderr
        assert "Errno" not in proc.stderr, proc.stderr


_READ_CAPTURES = [  # (commands that read a capture, rotated parts and all)
    ["decode", "--jsonl", "{cap}", "-o", "{out}"],
    ["encode", "--jsonl", "{cap}", "-o", "{out}"],
    ["export", "{cap}", "--pcapng", "{out}"],
    ["replay", "{cap}", "--upstream", "127.0.0.1:1", "--report", "{out}"],
    ["analyze", "--engine", "python", "{cap}", "--out", "{tables}", "--report", "{out}"],
    ["analyze", "--engine", "python", "{dir}", "--out", "{tables}", "--report", "{out}"],
]
_OUTPUTS = ["same", "dotted", "hard link", "symbolic link"]


@pytest.mark.parametrize("argv, out", [
    *[(argv, out) for argv in _READ_CAPTURES for out in [*_OUTPUTS, "rotated part"]],
    *[(["decode", "{cap}", "-o", "{out}"], out) for out in _OUTPUTS],  # (one frame's file)
])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(argv, out, tmp_path):
    """An output file naming the command's input (by another spelling, a link, or a
    rotated part the reader follows) is refused before anything is read or written,
    as tshark refuses ``-w`` naming its ``-r`` file: the input stays as it was.
    (``decode --jsonl X -o X`` used to empty X and report success.)"""
    cap = tmp_path / "cap.jsonl"
    cap.write_bytes(EXAMPLE.read_bytes())
    part = tmp_path / "cap.1.jsonl"
    if out == "rotated part":  # (a part of its own capture: the readers follow it)
        part.write_bytes(EXAMPLE.read_bytes())
    target = {"same": cap, "dotted": tmp_path / "." / "cap.jsonl",
              "hard link": tmp_path / "hard.jsonl", "symbolic link": tmp_path / "soft.jsonl",
              "rotated part": part}[out]
    if out == "hard link":
        (tmp_path / "hard.jsonl").hardlink_to(cap)
    elif out == "symbolic link":
        (tmp_path / "soft.jsonl").symlink_to(cap)
    before = {p: p.read_bytes() for p in (cap, part) if p.exists()}
    args = [a.format(cap=cap, out=target, tables=tmp_path / "tables", dir=tmp_path)
            for a in argv]
    proc = run(*args)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"{target}: is an input of this command" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert {p: p.read_bytes() for p in before} == before
    assert not (tmp_path / "tables").exists()  # (refused before the job ran)


def test_only_an_existing_regular_file_is_refused_as_an_output_that_is_an_input(tmp_path):
    """The check refuses what writing would destroy, nothing else: an output that is
    no regular file (a terminal both sides name, ``/dev/null``, a pipe) is let
    through. A missing input named as the output is refused still: opening the
    output first would create the input, empty, and the batch would read nothing."""
    from kinspect.commands import check_not_input

    check_not_input("/dev/null", ["/dev/null"])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    check_not_input(str(fifo), [str(fifo)])
    missing = str(tmp_path / "missing.jsonl")
    proc = run("decode", "--jsonl", missing, "-o", missing)
    assert proc.returncode == 1 and "is an input of this command" in proc.stderr, proc.stderr
    assert not os.path.exists(missing)
    real = tmp_path / "cap.jsonl"
    real.write_bytes(EXAMPLE.read_bytes())
    with pytest.raises(OSError, match="is an input of this command"):
        check_not_input(str(real), [str(real)], parts=True)


def test_an_output_beside_its_input_is_written(tmp_path):
    """The check above refuses the input only: an output next to it, in the same
    directory and named like it, is written as before."""
    cap = tmp_path / "cap.jsonl"
    cap.write_bytes(EXAMPLE.read_bytes())
    proc = run("decode", "--jsonl", str(cap), "-o", str(tmp_path / "cap.decoded.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert cap.read_bytes() == EXAMPLE.read_bytes()
    lines = (tmp_path / "cap.decoded.jsonl").read_text().splitlines()
    assert len(lines) == len(EXAMPLE.read_text().splitlines())


@pytest.mark.parametrize("command", [["proxy", "--upstream", "127.0.0.1:1", "--no-tui"],
                                     ["serve", str(EXAMPLE)]])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_listen_address_in_use_is_named_in_the_error(command, host):
    """Both commands that listen say it alike: ``cannot listen on HOST:PORT: Address
    already in use``, an IPv6 host in brackets as --listen takes it (serve gave
    asyncio's "error while attempting to bind on address ('127.0.0.1', PORT)")."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as held:
        held.bind((host, 0))
        held.listen()
        port = held.getsockname()[1]
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        proc = run(*command, "--listen", where, timeout=60)
    assert proc.returncode == 1
    assert f"kinspect: error: cannot listen on {where}: Address already in use" \
        in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_specs_in_a_pipe_keeps_paths_whole():
    """Piped (grep, less, a file), ``kinspect specs`` writes each spec source path on
    its line, whole: not broken across lines or cut with an ellipsis at 80 columns."""
    proc = run("specs")
    assert proc.returncode == 0, proc.stderr
    sources = json.loads(run("specs", "--format", "json").stdout)["sources"]
    lines = proc.stdout.splitlines()
    for s in sources:
        assert any(line.rstrip().endswith(s["path"]) and s["origin"] in line for line in lines), \
            proc.stdout[:2000]
    assert any("ProduceRequest.json" in line for line in lines)


@pytest.mark.parametrize("command", [["show"], ["replay", "--upstream", "127.0.0.1:1"]])
def test_a_capture_on_stdin_is_refused_with_the_reason(command):
    """``zcat cap.jsonl.gz | kinspect show -``: refused as a usage error saying a
    capture is read from a file, not "-: no such file"."""
    proc = subprocess.run([sys.executable, "-m", "kinspect", command[0], "-", *command[1:]],
                          input=EXAMPLE.read_text(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "stdin" in proc.stderr and "no such file" not in proc.stderr, proc.stderr


def test_the_capture_names_the_port_the_proxy_listens_on(tansu, tmp_path):
    """--listen HOST:0: the session line of the capture gives the port the system
    chose (the one clients connect to), not 0."""
    import json
    import signal

    capture = tmp_path / "port.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "kinspect", "proxy", "--upstream",
                             tansu.bootstrap, "--listen", "127.0.0.1:0", "--no-tui",
                             "--capture", str(capture)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        # "kinspect: capturing to ...", then "listening on ..."
        err = stderr_lines_until(proc, lambda line: "listening on" in line,
                                 what='"listening on"')
        line = err[-1] if err else ""
        assert "listening on" in line and len(err) <= 2, "".join(err)
        address = line.split("listening on ", 1)[1].split(",", 1)[0]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:  # ignored SIGINT: still stopped, and the test fails
                proc.kill()
                proc.wait()
            proc.stderr.close()
    session = json.loads(capture.read_text().splitlines()[0])
    assert session["type"] == "session"
    assert not address.endswith(":0")
    assert session["listen"] == address


def test_a_bare_capture_name_is_said_to_go_under_captures(tmp_path):
    """``--capture NAME`` writes ``captures/NAME``: the proxy says so on stderr when
    it starts, so that ``show NAME`` is not the first time the user looks for it."""
    import os
    import signal
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "kinspect", "proxy", "--upstream",
                             "127.0.0.1:1", "--listen", "127.0.0.1:0", "--no-tui",
                             "--capture", "bare.jsonl"], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(repo)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        err = stderr_lines_until(proc, lambda line: "listening on" in line,
                                 what='"listening on"')
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
    assert "kinspect: capturing to captures/bare.jsonl\n" in err, err
    assert (tmp_path / "captures" / "bare.jsonl").is_file()

@pytest.mark.parametrize("command", ["show", "decode", "encode", "export", "replay", "serve",
                                     "proxy", "demo", "tolerate", "specs", "analyze"])
def test_help_texts_carry_no_rest_markup(command, capsys):
    """--help is read in a terminal: no reST literals (``x``) or block markers (::)."""
    from kinspect.cli import main

    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and not any(line.rstrip().endswith("::") for line in out.splitlines())


@pytest.mark.parametrize("argv", [
    ["proxy", "--upstream", "broker:abc"],
    ["proxy", "--upstream", "127.0.0.1:1", "--listen", "[::1]"],
    ["replay", str(EXAMPLE), "--upstream", "broker:"],
    ["serve", str(EXAMPLE), "--listen", "127.0.0.1:9o92"],
    ["tolerate", "--bootstrap", "localhost:port"],
])
def test_a_port_that_is_not_a_number_is_a_usage_error_naming_the_address(argv, capsys):
    """``--upstream broker:abc`` (or ``[::1]`` with no port) is refused by the parser
    with the address as typed, not with Python's "invalid literal for int()"."""
    from kinspect.cli import build_parser

    with pytest.raises(SystemExit) as exc:  # (parsing only: nothing is started)
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert repr(argv[-1]) in err and "HOST:PORT" in err, err
    assert "invalid literal" not in err, err


@pytest.mark.parametrize("command", [["show"], ["export", "--pcapng", "unused.pcapng"]])
def test_a_misspelt_api_in_a_filter_is_an_error_not_an_empty_result(command, tmp_path):
    """``--filter '~api Fech'`` names the problem and the close api name instead of
    printing an empty table (or writing an empty pcapng)."""
    argv = [command[0], str(EXAMPLE), *[a if a != "unused.pcapng" else str(tmp_path / a)
                                        for a in command[1:]], "--filter", "~api Fech"]
    proc = run(*argv)
    assert proc.returncode == 1, proc.stdout
    assert "'Fech'" in proc.stderr and "Fetch" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "unused.pcapng").exists()


@pytest.mark.parametrize("term, view", [("dumb", "LinePrinter"), ("xterm-256color", "LiveView")])
def test_a_dumb_terminal_gets_the_line_printer(monkeypatch, term, view):
    """rich's Live cannot move the cursor of a dumb terminal (``TERM=dumb``: Emacs
    shell buffers, some CI consoles) and drew nothing until the proxy stopped: there
    the flows are printed as lines, as in a pipe."""
    import argparse
    import io

    from proxyutil import codec

    from kinspect.commands.proxy import _view
    from kinspect.proxy.server import Proxy, ProxyConfig

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", term)
    monkeypatch.setattr(sys, "stdout", Terminal())
    proxy = Proxy(ProxyConfig(upstream=("127.0.0.1", 9092)), codec())
    got = _view(argparse.Namespace(no_tui=False, filter=None), proxy, "kinspect proxy")
    assert type(got).__name__ == view


def _stderr_until_listening(proc: subprocess.Popen) -> list[str]:
    """The lines ``kinspect demo`` wrote to stderr up to "listening on" (printed once
    broker and proxy are up), or all of them if it ended first."""
    return stderr_lines_until(proc, lambda line: "listening on" in line,
                              what='"listening on" (broker and proxy up)', timeout=120)


def _children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    from pathlib import Path

    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_demo_stops_its_broker_when_its_terminal_hangs_up():
    """SIGHUP (the terminal window closed) stops ``kinspect demo`` as Ctrl-C does: by
    default it killed the demo at once, and the broker, in a process session of its
    own, went on running."""
    import os
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "kinspect", "demo", "--no-tui",
                             "--interval", "0.2"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    brokers: list[int] = []
    try:
        err = _stderr_until_listening(proc)
        m = re.search(r"forwarding to ([\d.]+):(\d+)", "".join(err))
        assert m, "".join(err)
        brokers += _children_of(proc.pid)  # the demo's broker process
        assert brokers
        proc.send_signal(signal.SIGHUP)
        err.append(proc.communicate(timeout=60)[1])
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((m.group(1), int(m.group(2))), timeout=2).close()
        assert "broker stopped" in "".join(err)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in brokers:  # left running (the failure this test is about): stopped here
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_demo_killed_outright_takes_its_broker_with_it():
    """SIGKILL of ``kinspect demo`` (the OOM killer, a CI timeout): it cannot stop its
    broker, in a process session of its own, so the broker's watchdog does: the broker
    ends and its temp dir is removed (both used to stay, the broker adopted by init)."""
    import os
    import shutil
    import signal
    from pathlib import Path

    proc = subprocess.Popen([sys.executable, "-m", "kinspect", "demo", "--no-tui",
                             "--duration", "60"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    children: list[int] = []
    workdir = None
    try:
        err = _stderr_until_listening(proc)
        assert proc.poll() is None, "".join(err)
        children += _children_of(proc.pid)  # the broker and its watchdog
        broker = next(pid for pid in children
                      if "tansu" in Path(f"/proc/{pid}/cmdline").read_text())
        workdir = Path(os.readlink(f"/proc/{broker}/cwd"))
        assert workdir.name.startswith("kinspect-tansu-"), workdir
        proc.kill()
        proc.wait()

        def gone(pid: int) -> bool:
            try:
                return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return True

        deadline = time.monotonic() + 30  # (the broker's stop timeout is 5 s)
        while not (gone(broker) and not workdir.exists()):
            assert time.monotonic() < deadline, \
                f"broker {broker} left running ({gone(broker)=}) or {workdir} left behind"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        for pid in children:  # left running (the failure this test is about): stopped here
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def test_demo_stops_on_ctrl_c_while_its_broker_is_frozen(tmp_path):
    """Ctrl-C, twice, while the demo's broker is frozen (SIGSTOP) under its workload:
    the demo ends (whether the workload's step ended by itself or was abandoned at the
    second Ctrl-C, see the next test), with status 0 and no traceback, and its
    broker is stopped (no process left behind)."""
    import os
    import signal
    from pathlib import Path

    from proxyutil import freeze

    out = tmp_path / "flows.txt"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "kinspect", "demo", "--no-tui",
                                 "--interval", "0.2"], stdout=fh,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    brokers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while b" Produce v" not in out.read_bytes():  # a flow line: the workload runs
            assert proc.poll() is None and time.monotonic() < deadline, \
                f"the demo printed no Produce flow:\n{out.read_text()}"
            time.sleep(0.05)
        brokers += _children_of(proc.pid)  # the demo's broker process
        assert brokers
        for pid in brokers:
            freeze(pid)
        proc.send_signal(signal.SIGINT)
        # stopping: said at once, or after a second of waiting
        err = stderr_lines_until(
            proc, lambda line: "Ctrl-C again" in line or "produced" in line
            or "broker stopped" in line, what="word of stopping after Ctrl-C")
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        err.append(proc.communicate(timeout=60)[1])
        text = "".join(err)
        assert "broker stopped" in text, text
        assert proc.returncode == 0 and "Traceback" not in text, text
        for pid in brokers:
            assert not Path(f"/proc/{pid}").exists() or \
                Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in brokers:
            try:
                os.kill(pid, signal.SIGCONT)
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


async def test_a_second_ctrl_c_abandons_a_workload_step_that_does_not_end(capsys):
    """The demo's stop, with a workload step that does not end in time (a future set
    only after the Ctrl-C again):
    after the grace period it says it is waiting; Ctrl-C again (``now``) ends the wait
    at once, long before the timeout, and the workload is abandoned (no result). Its
    kafka-python clients' logging is silenced: they fail as the proxy closes their
    connections, tracebacks of their own shutdown among what they log (seen once in
    CI: ``RuntimeError: NetworkSelector closed!`` from an errback)."""
    import asyncio
    import logging

    from kinspect.commands.proxy import _workload_outcome

    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    loop = asyncio.get_running_loop()
    worker, now = loop.create_future(), asyncio.Event()
    loop.call_later(0.05, now.set)
    late = loop.call_later(5, worker.set_result, "late")  # were Ctrl-C again not heard
    try:
        assert await _workload_outcome(worker, now, grace=0.0, timeout=3600) is None
        assert not logging.getLogger("kafka.net.connection").isEnabledFor(logging.CRITICAL)
    finally:
        late.cancel()
        kafka_log.setLevel(level)
    err = capsys.readouterr().err
    assert "Ctrl-C again" in err and "workload abandoned" in err, err
    assert not worker.done()


async def test_a_workload_step_that_ends_gives_its_result_without_a_word(capsys):
    """A workload that ends within the grace period: its result, nothing said; one
    that fails: said, no result."""
    import asyncio

    from kinspect.commands.proxy import _workload_outcome

    loop = asyncio.get_running_loop()
    worker = loop.create_future()
    loop.call_soon(worker.set_result, "done")
    assert await _workload_outcome(worker, asyncio.Event(), grace=3600) == "done"
    assert capsys.readouterr().err == ""
    failed = loop.create_future()
    failed.set_exception(RuntimeError("no broker"))
    assert await _workload_outcome(failed, asyncio.Event()) is None
    assert "workload failed: no broker" in capsys.readouterr().err
