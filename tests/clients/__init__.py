"""Real Kafka clients, each run as a subprocess with a hard timeout.

Every client does the same round trip against a bootstrap address: create the
topic (kcat relies on the broker creating it), produce ``values`` to it, then
consume them back in consumer group ``group`` and print what it consumed.
:func:`roundtrip` returns those values so tests can assert exactly what came
back; :func:`roundtrip_async` does the same without blocking the event loop
(for tests whose proxy runs in that loop).

Defaults that the brokers need: ``session_timeout_ms=6000`` and
``heartbeat_interval_ms=500`` (a Tansu group join takes about half the session
timeout; noida-db rejects session timeouts under 6 s). ``idempotent`` is each
client's own default unless given (kafka-python: on; the others: off).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLIENTS = ("kafka-python", "aiokafka", "confluent-kafka", "kafkajs", "kcat")
_SCRIPTS = {
    "kafka-python": "kafka_python_client.py",
    "aiokafka": "aiokafka_client.py",
    "confluent-kafka": "confluent_client.py",
    "kafkajs": "kafkajs_client.js",
    "kcat": "kcat_client.py",
}
_KILL_GRACE = 10.0  # seconds past the client's own deadline before it is killed


class ClientFailed(RuntimeError):
    """A client exited non-zero, timed out or printed no result; holds its output."""

    def __init__(self, client: str, command: list[str], reason: str, stdout: str, stderr: str):
        self.client, self.command, self.reason = client, command, reason
        self.stdout, self.stderr = stdout, stderr
        self.output = stderr + stdout
        tail = "\n".join(self.output.splitlines()[-60:])
        super().__init__(
            f"{client} {reason}\ncommand: {shlex.join(command)}\noutput (tail):\n{tail}"
        )


def ensure_kafkajs() -> None:
    """Install tests/clients/node_modules (kafkajs, pinned by the lock file) if missing."""
    if (HERE / "node_modules" / "kafkajs").is_dir():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("kafkajs needs Node.js and npm, and npm is not on PATH")
    proc = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        check=False,
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode:
        raise RuntimeError(f"npm ci in {HERE} failed:\n{proc.stdout}\n{proc.stderr}")


def _command(client: str, config: dict) -> list[str]:
    if client not in _SCRIPTS:
        raise ValueError(f"unknown client {client!r}; known: {', '.join(CLIENTS)}")
    script = str(HERE / _SCRIPTS[client])
    if client == "kafkajs":
        ensure_kafkajs()
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("kafkajs needs Node.js, and node is not on PATH")
        return [node, script, json.dumps(config)]
    return [sys.executable, script, json.dumps(config)]


def _prepare(client, bootstrap, values, topic, group, timeout, options) -> list[str]:
    config = {
        "bootstrap": bootstrap,
        "topic": topic,
        "group": group,
        "values": list(values),
        "timeout": timeout,
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 500,
        **options,
    }
    return _command(client, config)


def _result(client, command, returncode, stdout, stderr, timed_out) -> list[str]:
    if timed_out:
        raise ClientFailed(client, command, "timed out and was killed", stdout, stderr)
    if returncode:
        raise ClientFailed(client, command, f"exited with code {returncode}", stdout, stderr)
    lines = stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])["consumed"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise ClientFailed(client, command, "printed no result", stdout, stderr) from None


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def roundtrip(
    client: str,
    bootstrap: str,
    values: list[str],
    *,
    topic: str = "kinspect-test",
    group: str = "kinspect-test-group",
    timeout: float = 30.0,
    **options,
) -> list[str]:
    """Run ``client`` through one produce-then-consume round trip; return the consumed values.

    ``options`` go into the client's config (``idempotent``, ``session_timeout_ms``,
    ``heartbeat_interval_ms``, kafka-python's ``stay_s``: seconds it goes on polling
    after consuming, before its commit; kcat's ``debug``). Raises :class:`ClientFailed`.
    """
    command = _prepare(client, bootstrap, values, topic, group, timeout, options)
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=_env(),
        start_new_session=True,
    )
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout + _KILL_GRACE)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
    except BaseException:
        _kill_group(proc.pid)
        proc.wait()
        raise
    return _result(client, command, proc.returncode, stdout, stderr, timed_out)


async def roundtrip_async(
    client: str,
    bootstrap: str,
    values: list[str],
    *,
    topic: str = "kinspect-test",
    group: str = "kinspect-test-group",
    timeout: float = 30.0,
    **options,
) -> list[str]:
    """:func:`roundtrip` for async tests: awaits the client without blocking the loop."""
    command = _prepare(client, bootstrap, values, topic, group, timeout, options)
    proc = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env=_env(),
        start_new_session=True,
    )
    reads = asyncio.gather(proc.stdout.read(), proc.stderr.read())
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout + _KILL_GRACE)
    except asyncio.TimeoutError:
        timed_out = True
        _kill_group(proc.pid)
        await proc.wait()
    except BaseException:
        _kill_group(proc.pid)
        await proc.wait()
        await reads  # the pipes close once the process group is dead
        raise
    stdout, stderr = (data.decode(errors="replace") for data in await reads)
    return _result(client, command, proc.returncode, stdout, stderr, timed_out)
