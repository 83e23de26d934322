"""The disk cache of generated code (kinspect/codec/codecache.py): a hit runs exactly
what compiling would, a unit whose source differs never runs a stale entry, damaged
or foreign entries are recompiled, the directory stays bounded, and the generated
source is the same from one process to the next (else nothing would ever hit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from codec_util import CORPUS, inline

from kinspect.codec import SpecRegistry
from kinspect.codec import codecache
from kinspect.codec.scan import compile_scanner


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory; ``compiles`` counts the real ``compile()`` calls."""
    monkeypatch.setenv("KINSPECT_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []

    def counting(source, filename, mode):
        calls.append(filename)
        return compile(source, filename, mode)

    monkeypatch.setattr(codecache, "compile", counting, raising=False)
    return tmp_path / "cache" / "code", calls


def _corpus() -> SpecRegistry:  # fresh spec objects each time: nothing cached in memory
    return SpecRegistry.load([str(CORPUS / "test-message")], use_env=False, use_project=False,
                             use_default=False)


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("*.marshal")) if root.is_dir() else []


def _round_trip(reg: SpecRegistry) -> tuple:
    c = reg.codec("SimpleExampleMessage")
    value = c.cls(myInt16=7, myString="abc", myUint16=65535, myTaggedIntArray=[1, 2])
    wire = c.encode(value, 2)
    return wire, c.decode(wire, 2).to_dict()


def test_second_compile_loads_from_cache(cache):
    root, compiles = cache
    first = _round_trip(_corpus())
    n = len(compiles)
    assert n >= 1 and len(_entries(root)) == n
    assert not list(root.glob(".tmp-*"))
    second = _round_trip(_corpus())
    assert len(compiles) == n  # nothing compiled again
    assert second == first


def test_scanners_are_cached(cache):
    root, compiles = cache
    spec = _corpus().messages["SimpleExampleMessage"]
    scan = compile_scanner(spec, 2)
    n = len(compiles)
    assert n == 1 and "scan" in compiles[0]
    again = compile_scanner(_corpus().messages["SimpleExampleMessage"], 2)
    assert len(compiles) == n
    c = _corpus().codec("SimpleExampleMessage")
    wire = c.encode(c.cls(myInt16=3), 2)
    assert again(wire, 0, len(wire)) == scan(wire, 0, len(wire))


def _spec(field_type: str) -> dict:
    return {"name": "CacheProbe", "type": "data", "validVersions": "0",
            "flexibleVersions": "none",
            "fields": [{"name": "A", "type": field_type, "versions": "0+"}]}


def test_same_unit_name_other_source_never_runs_the_stale_entry(cache):
    root, compiles = cache
    c8 = inline(_spec("int8"))
    assert c8.decode(b"\x05", 0).A == 5
    c32 = inline(_spec("int32"))  # same message name and version, other source
    assert c32.decode(b"\x00\x00\x01\x00", 0).A == 256
    unit = "<kinspect CacheProbe v0>"
    assert compiles.count(unit) == 2
    assert len([p for p in _entries(root) if p.name.startswith("CacheProbe_v0-")]) == 2
    # and both entries now serve their own source
    n = len(compiles)
    assert inline(_spec("int8")).decode(b"\x07", 0).A == 7
    assert inline(_spec("int32")).decode(b"\x00\x00\x00\x09", 0).A == 9
    assert len(compiles) == n


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "other interpreter",
                                    "not code"])
def test_damaged_or_foreign_entries_are_recompiled_and_rewritten(cache, damage):
    root, compiles = cache
    expected = _round_trip(_corpus())
    n = len(compiles)
    for p in _entries(root):
        data = p.read_bytes()
        head = len(codecache._HEAD) + codecache._DIGEST
        if damage == "truncated":
            data = data[:len(data) // 2]
        elif damage == "flipped":
            data = data[:-10] + bytes([data[-10] ^ 0x55]) + data[-9:]
        elif damage == "garbage":
            data = os.urandom(len(data))
        elif damage == "other interpreter":
            data = b"KCC1\xff\xff\r\n" + data[8:]
        else:  # a valid entry whose data is not a code object
            import marshal
            import zlib
            data = data[:head] + zlib.compress(marshal.dumps((1, 2)))
        p.write_bytes(data)
    assert _round_trip(_corpus()) == expected
    assert len(compiles) == 2 * n  # every unit compiled again
    compiles.clear()
    assert _round_trip(_corpus()) == expected
    assert compiles == []  # and the rewritten entries serve


def test_cache_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KINSPECT_CACHE", "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    calls = []
    monkeypatch.setattr(codecache, "compile",
                        lambda *a: calls.append(a[1]) or compile(*a), raising=False)
    first = _round_trip(_corpus())
    n = len(calls)
    assert _round_trip(_corpus()) == first
    assert n >= 1 and len(calls) == 2 * n  # compiled again: nothing was kept
    assert not any(tmp_path.rglob("*.marshal"))


def test_unwritable_cache_still_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KINSPECT_CACHE", str(blocker / "cache"))
    wire, decoded = _round_trip(_corpus())
    assert decoded["myInt16"] == 7


def test_directory_is_bounded(cache, monkeypatch):
    root, compiles = cache
    monkeypatch.setattr(codecache, "MAX_ENTRIES", 8)
    monkeypatch.setattr(codecache, "PRUNE_EVERY", 1)
    written: dict[str, int] = {}  # entry -> the time the test gave it
    for i in range(20):
        inline(_spec("int8") | {"name": f"Bounded{i:02d}"}).decode(b"\x01", 0)
        for p in _entries(root):
            if p.name not in written:  # this write's entries: i seconds after the first
                written[p.name] = (1_000_000 + i) * 10**9
                os.utime(p, ns=(0, written[p.name]))
        assert len(_entries(root)) <= 8
    kept = {p.name for p in _entries(root)}
    gone = set(written) - kept
    assert len(written) == 20 and len(gone) >= 12
    # what was deleted is older than what was kept
    assert max(written[n] for n in gone) <= min(written[n] for n in kept)
    assert any(n.startswith("Bounded19") for n in kept)


def test_directory_is_counted_every_prune_every_writes(cache, monkeypatch):
    root, _ = cache
    monkeypatch.setattr(codecache, "MAX_ENTRIES", 4)
    monkeypatch.setattr(codecache, "PRUNE_EVERY", 5)
    monkeypatch.setattr(codecache, "_writes", 0)
    counts = []
    for i in range(11):
        inline(_spec("int8") | {"name": f"Every{i:02d}"}).decode(b"\x01", 0)
        counts.append(len(_entries(root)))
    # counted at the 1st, 6th and 11th write: 6 entries became 3, then 8 became 3
    assert counts == [1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 3]


def test_generated_source_is_the_same_in_every_process():
    """The code cache is keyed by the generated source: a name made of ``id()`` (as
    the struct functions' once were) would make every process miss."""
    script = (
        "import hashlib, sys\n"
        "from kinspect.codec import SpecRegistry\n"
        "from kinspect.codec.scan import compile_scanner\n"
        "import kinspect.codec.codecache as cc\n"
        "h = hashlib.sha256()\n"
        "orig = cc.compile_cached\n"
        "def spy(src, name):\n"
        "    h.update(name.encode() + src.encode())\n"
        "    return orig(src, name)\n"
        "cc.compile_cached = spy\n"
        "import kinspect.codec.compiler as comp, kinspect.codec.scan as sc\n"
        "comp.compile_cached = sc.compile_cached = spy\n"
        "reg = SpecRegistry.load([sys.argv[1]], use_env=False, use_project=False,"
        " use_default=False)\n"
        "n = 0\n"
        "for name in sorted(reg.messages):\n"
        "    spec = reg.messages[name]\n"
        "    for v in range(spec.valid_versions.lowest, spec.valid_versions.highest + 1):\n"
        "        reg.codec(spec).compiled(v); compile_scanner(spec, v); n += 1\n"
        "print(n, h.hexdigest())\n")
    env = {**os.environ, "KINSPECT_CACHE": "off"}
    outs = [subprocess.run([sys.executable, "-c", script, str(CORPUS / "message")], env=env,
                           capture_output=True, text=True, timeout=300) for _ in range(2)]
    for out in outs:
        assert out.returncode == 0, out.stderr[-2000:]
    counts = [int(o.stdout.split()[0]) for o in outs]
    assert counts[0] > 600  # every version of every message of Kafka's corpus
    assert outs[0].stdout == outs[1].stdout


def test_cached_code_keeps_its_file_name_for_tracebacks(cache):
    _, compiles = cache
    _round_trip(_corpus())
    n = len(compiles)
    c = _corpus().codec("SimpleExampleMessage")
    fn = c.compiled(2).decode
    assert len(compiles) == n  # loaded from the cache
    assert fn.__code__.co_filename == "<kinspect SimpleExampleMessage v2>"


def test_a_code_directory_others_may_write_to_is_not_used(cache):
    """Entries are code kinspect runs: a planted one must not be."""
    root, compiles = cache
    root.mkdir(parents=True)
    os.chmod(root, 0o777)
    first = _round_trip(_corpus())
    n = len(compiles)
    assert n >= 1 and _entries(root) == []
    assert _round_trip(_corpus()) == first
    assert len(compiles) == 2 * n


def test_the_code_directory_is_created_private(cache):
    root, _ = cache
    _round_trip(_corpus())
    assert root.is_dir() and not root.stat().st_mode & 0o077
