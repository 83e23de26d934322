"""A disk cache of the code objects the codec generates, as Python's ``__pycache__``
is for modules.

The compiler (:mod:`kinspect.codec.compiler`) and the scanners
(:mod:`kinspect.codec.scan`) generate Python source for each message version they
meet, then compile it. Python's ``compile()`` is most of that work: 10–25 ms for one
version of a large message (FetchResponse v13: some 37 KB of source), against
0.2–0.4 ms to load the same code object back with :mod:`marshal`. A proxy meets each
new (api key, api version) on its event loop, so every first sight used to stall all
its connections for that long; every short-lived command (``kinspect show``, a
replay, a test's subprocess) paid it again for every version it met.

Entries live under :func:`kinspect.codec.registry.cache_dir` (``code/``), one file
per generated unit, named after the unit (``FetchResponse v13``, its traced variant,
each scanner) and the SHA-256 of its name and source: the same unit generated from
another spec file, or by another kinspect, is another entry, so two spec sets in use
side by side do not evict each other. The directory is bounded: when a count of
its entries (at a process's first write, then every :data:`PRUNE_EVERY` writes)
finds more than :data:`MAX_ENTRIES`, the oldest written go until a quarter of that
is free. An entry holds the interpreter's bytecode magic number, the digest
again and the zlib-compressed :mod:`marshal` data; it is used only when both match,
so a foreign or damaged entry is never run (zlib's checksum catches damaged data)
and is simply rewritten. Writes are atomic (a temporary file, then
``os.replace``); an unwritable directory means entries are read but not written.
Entries are code this process runs: a ``code/`` directory that is not the user's
own, or that others may write to, is not used at all (it is created with mode
0700).
The cache is off with the spec cache (``KINSPECT_CACHE=off``);
``PYTHONDONTWRITEBYTECODE``, which is about modules' ``.pyc`` files, does not turn
it off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import re
import tempfile
import zlib
from pathlib import Path
from types import CodeType

#: first bytes of an entry: format, then the bytecode magic number of the interpreter
_HEAD = b"KCC1" + importlib.util.MAGIC_NUMBER
_DIGEST = 32  # SHA-256 of the unit's name and source
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


#: entries kept in the cache directory (some 7 KiB each on average, 17 KiB for
#: ProduceResponse v10: at most about 30 MiB; Kafka's whole corpus, every version
#: with its scanner and address locator, is under 2,000 entries)
MAX_ENTRIES = 4096
#: writes in one process between two counts of the directory's entries
PRUNE_EVERY = 128
_writes = 0


#: code directories checked in this process: path -> usable
_checked: dict[Path, bool] = {}


def _code_dir() -> Path | None:
    """``code/`` under the cache directory, created private (mode 0700) when missing;
    ``None`` when the cache is off, or when the directory is not this user's own or
    others may write to it: entries are code that this process will run, and
    anyone who can write one can make it run theirs."""
    from .registry import cache_dir  # (registry imports the compiler)

    root = cache_dir()
    if root is None:
        return None
    code = root / "code"
    ok = _checked.get(code)
    if ok is None:
        try:
            code.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(code)
            ok = (not hasattr(os, "getuid") or st.st_uid == os.getuid()) and \
                not st.st_mode & 0o022
        except OSError:
            ok = False
        _checked[code] = ok
    return code if ok else None


def _entry(filename: str, digest: bytes) -> Path | None:
    code = _code_dir()
    if code is None:
        return None
    readable = _UNSAFE.sub("_", filename.strip("<>").removeprefix("kinspect "))[:80]
    return code / f"{readable}-{digest.hex()[:24]}.marshal"


def compile_cached(source: str, filename: str) -> CodeType:
    """``compile(source, filename, "exec")``, through the disk cache.

    Args:
        source: the generated module text.
        filename: the unit's name as tracebacks show it (``"<kinspect FetchResponse
            v13>"``); also names the entry.

    Returns:
        The code object: loaded from the entry when it was compiled from exactly
        this source by this interpreter's bytecode version, else compiled now (and
        the entry written).

    Raises:
        SyntaxError: as ``compile()`` does (a generator bug; never from the cache).
    """
    digest = hashlib.sha256(b"%s\0%s" % (filename.encode("utf-8", "surrogatepass"),
                                          source.encode("utf-8", "surrogatepass"))).digest()
    path = _entry(filename, digest)
    if path is not None:
        code = _load(path, digest)
        if code is not None:
            return code
    code = compile(source, filename, "exec")
    if path is not None:
        _store(path, digest, code)
    return code


def _load(path: Path, digest: bytes) -> CodeType | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    n = len(_HEAD)
    if data[:n] != _HEAD or data[n:n + _DIGEST] != digest:
        return None  # another interpreter's, another source's, or not ours
    try:
        code = marshal.loads(zlib.decompress(data[n + _DIGEST:]))
    except (zlib.error, ValueError, EOFError, TypeError):
        return None  # damaged
    return code if isinstance(code, CodeType) else None


def _store(path: Path, digest: bytes, code: CodeType) -> None:
    global _writes
    if atomic_write(path, _HEAD + digest + zlib.compress(marshal.dumps(code), 1)):
        # counting thousands of entries takes milliseconds: at a process's first
        # write, then every PRUNE_EVERY writes (so the bound can be passed by that
        # many entries per process writing at the time, until the next count)
        if _writes % PRUNE_EVERY == 0:
            _prune(path.parent, MAX_ENTRIES)
        _writes += 1


def _prune(root: Path, most: int) -> None:
    """Keep ``root`` to ``most`` entries: past that, delete the oldest written until
    a quarter of ``most`` is free (another process pruning at the same time only
    makes some deletions fail)."""
    try:
        with os.scandir(root) as it:
            entries = [e for e in it if e.name.endswith(".marshal")]
        if len(entries) <= most:
            return
        aged = []
        for e in entries:
            try:
                aged.append((e.stat().st_mtime_ns, e.path))
            except OSError:
                pass
    except OSError:
        return
    aged.sort()
    for _, path in aged[:len(aged) - most * 3 // 4]:
        try:
            os.unlink(path)
        except OSError:
            pass


def atomic_write(path: Path, data: bytes) -> bool:
    """Write a cache entry whole or not at all: a temporary file in the same
    directory (created as needed), then ``os.replace``, so that a concurrent reader
    never sees a torn entry. Returns whether it was written (``False`` on any
    ``OSError``: an unwritable cache is no cache)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
