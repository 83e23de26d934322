"""Where specs come from, and the codec of each message.

A :class:`SpecRegistry` is built from a search path; the first source that
defines a message wins. The default path is, in order:

1. paths given by the caller (``--specs``), directories or jar/zip archives such
   as Kafka's ``kafka-clients-*.jar`` (its ``common/message/*.json``);
2. the ``KINSPECT_SPECS`` environment variable (``os.pathsep``-separated);
3. the project's ``specs/`` directory (installed from a wheel: ``kinspect/_specs``);
4. the spec files kafka-python (>= 3) ships as package data (the default set).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from gc import disable as _gc_disable
from gc import enable as _gc_enable
from gc import isenabled as _gc_isenabled
from pathlib import Path
from typing import Any

import json5

from .codecache import atomic_write
from .compiler import CompiledVersion
from .compiler import _native as _NATIVE
from .errors import DecodeError, EncodeError, KinspectError, SpecError
from .spec import MessageSpec, parse_message_spec
from .values import Struct, struct_class

_native_decode = getattr(_NATIVE, "decode", None)
_native_scan = getattr(_NATIVE, "scan", None)
_native_scan_clear = getattr(_NATIVE, "scan_clear", None)

#: the project's own spec files: the copy a wheel installs as ``kinspect/_specs``
#: (setup.py), else ``specs/`` of the checkout kinspect runs from
_PACKAGED_SPECS = Path(__file__).resolve().parents[1] / "_specs"
PROJECT_SPECS = (_PACKAGED_SPECS if _PACKAGED_SPECS.is_dir()
                 else Path(__file__).resolve().parents[2] / "specs")
ENV_VAR = "KINSPECT_SPECS"
CACHE_ENV_VAR = "KINSPECT_CACHE"
#: bump when the cached document format changes
_CACHE_FORMAT = 1


def cache_dir() -> Path | None:
    """Where parsed spec documents are cached, or ``None`` when caching is off.

    ``$KINSPECT_CACHE`` if set (``""``, ``"0"``, ``"off"`` or ``"none"`` turn the
    cache off), else ``$XDG_CACHE_HOME/kinspect``, else ``~/.cache/kinspect``.
    """
    env = os.environ.get(CACHE_ENV_VAR)
    if env is not None:
        if env.strip().lower() in ("", "0", "off", "none", "false"):
            return None
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "kinspect"


def _cache_path(text: str) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    key = hashlib.sha256(
        f"{_CACHE_FORMAT}\0json5-{json5.__version__}\0".encode() + text.encode("utf-8")
    ).hexdigest()
    return root / "specs" / key[:2] / f"{key}.json"


def load_spec_document(text: str, source: str) -> Any:
    """Parse one spec file's text with json5 (comments allowed), through a cache.

    json5 is slow (about 3 s for kafka-python's 108 files), so parsed documents
    are cached as plain JSON under :func:`cache_dir`, keyed by the SHA-256 of the
    file text (and the json5 version). Cache writes are atomic (a temporary file in
    the same directory, then ``os.replace``), so concurrent processes never read a
    torn entry; an unreadable or corrupt entry is ignored and rewritten; an
    unwritable cache directory just means no caching.

    Raises:
        SpecError: the text is not valid JSON5 (or nests values deeper than the
            parser can follow).
    """
    path = _cache_path(text)
    if path is not None:
        try:
            with open(path, "r", encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError, RecursionError):
            pass
    try:
        doc = json5.loads(text)
    except ValueError as e:
        raise SpecError(f"not valid JSON: {e}", source) from None
    except RecursionError:  # json5's parser recurses for every nested value
        raise SpecError("not valid JSON: values nested too deeply", source) from None
    if path is not None:
        _cache_store(path, doc)
    return doc


def _cache_store(path: Path, doc: Any) -> None:
    try:
        data = json.dumps(doc, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        return
    atomic_write(path, data.encode("utf-8"))


def kafka_python_specs() -> Path | None:
    """The directory of spec files shipped by kafka-python >= 3, or ``None``.

    Found without importing the ``kafka`` package (which would pull in sockets and
    threads: the codec stays sans-io).
    """
    try:
        import importlib.util

        spec = importlib.util.find_spec("kafka")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / "protocol" / "schemas" / "resources"
        if path.is_dir():
            return path
    return None


@dataclass
class SpecSource:
    """One entry of the search path: ``kind`` is ``"dir"`` or ``"archive"``;
    ``origin`` says why it is on the path (``"--specs"``, ``"KINSPECT_SPECS"``,
    ``"project"``, ``"kafka-python"``)."""

    path: str
    kind: str
    origin: str


#: the largest spec file read from a jar/zip archive, bytes once decompressed
#: (Kafka's largest is some 30 KiB): a small archive cannot make the loader hold
#: gigabytes for one member
MAX_ARCHIVE_SPEC_BYTES = 4 << 20


#: compression methods of archive members: those jar tools write
_ARCHIVE_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
#: general purpose flag bit 0 of a zip entry: the member is encrypted
_ZIP_ENCRYPTED = 0x1
#: what :mod:`zipfile` raises for a damaged archive: bad records or CRCs
#: (``BadZipFile``), corrupt deflate data (``zlib.error``), data cut short
#: (``EOFError``), seeks outside the file (``OSError``, ``ValueError``), names that are
#: not UTF-8 (``UnicodeDecodeError``), flags it does not implement
#: (``NotImplementedError``)
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError,
                   NotImplementedError)


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"not UTF-8 text: byte {e.start}: {e.reason}", name) from None


def _iter_spec_files(source: SpecSource) -> Iterator[tuple[str, str]]:
    """Yield ``(display name, text)`` for every ``*.json`` spec in a source.

    Raises:
        SpecError: a file that is not UTF-8 text; an archive that cannot be read
            (naming it), or a member that cannot (naming ``archive!member``):
            damaged, encrypted, compressed other than stored or deflated, or of more
            than :data:`MAX_ARCHIVE_SPEC_BYTES` bytes.
    """
    if source.kind == "dir":
        for p in sorted(Path(source.path).glob("*.json")):
            yield str(p), _text(p.read_bytes(), str(p))
        return
    try:
        zf = zipfile.ZipFile(source.path)
    except _ARCHIVE_ERRORS as e:
        raise SpecError(f"not a readable jar/zip archive: {e}", source.path) from None
    with zf:
        names = sorted(n for n in zf.namelist() if n.endswith(".json"))
        # Kafka's jars hold the specs under common/message/; prefer that folder.
        preferred = [n for n in names if "common/message/" in n]
        for n in preferred or names:
            name = f"{source.path}!{n}"
            yield name, _text(_read_member(zf, zf.getinfo(n), name), name)


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> bytes:
    """The bytes of one archive member, ``name`` being ``archive!member``.

    Raises:
        SpecError: the member is encrypted, compressed other than stored or
            deflated, larger than :data:`MAX_ARCHIVE_SPEC_BYTES` once
            decompressed, or damaged (a bad CRC, corrupt deflate data, ...).
    """
    if info.flag_bits & _ZIP_ENCRYPTED:
        raise SpecError("encrypted archive member (kinspect reads unencrypted ones only)",
                        name)
    if info.compress_type not in _ARCHIVE_METHODS:
        raise SpecError(f"archive member compressed with method {info.compress_type} "
                        f"(kinspect reads {' or '.join(_ARCHIVE_METHODS.values())} members)",
                        name)
    if info.file_size > MAX_ARCHIVE_SPEC_BYTES:  # what zf.read returns at most
        raise SpecError(f"{info.file_size} bytes once decompressed: larger than a spec file "
                        f"(at most {MAX_ARCHIVE_SPEC_BYTES})", name)
    try:
        return zf.read(info)
    except _ARCHIVE_ERRORS as e:
        raise SpecError(f"damaged archive member: {e}", name) from None


def _source_for(path: str, origin: str) -> SpecSource:
    p = Path(path)
    if p.is_dir():
        return SpecSource(str(p), "dir", origin)
    if p.is_file() and zipfile.is_zipfile(p):
        return SpecSource(str(p), "archive", origin)
    raise SpecError(f"{origin} path {path!r} is neither a directory nor a jar/zip archive",
                    source=path)


def search_path(paths: Iterable[str] = (), *, use_env: bool = True, use_project: bool = True,
                use_default: bool = True) -> list[SpecSource]:
    """The spec search path in priority order (see the module docstring).

    Raises:
        SpecError: a given path that is neither a directory nor an archive.
    """
    out = [_source_for(p, "--specs") for p in paths]
    if use_env:
        for p in filter(None, os.environ.get(ENV_VAR, "").split(os.pathsep)):
            out.append(_source_for(p, ENV_VAR))
    if use_project and PROJECT_SPECS.is_dir() and any(PROJECT_SPECS.glob("*.json")):
        out.append(SpecSource(str(PROJECT_SPECS), "dir", "project"))
    if use_default:
        kp = kafka_python_specs()
        if kp is not None:
            out.append(SpecSource(str(kp), "dir", "kafka-python"))
    return out


class MessageCodec:
    """Decode and encode one message spec at any of its valid versions.

    Code is generated and compiled per version on first use
    (:mod:`kinspect.codec.compiler`).
    """

    __slots__ = ("_compiled", "_scanners", "api", "cls", "spec")

    def __init__(self, spec: MessageSpec):
        self.spec = spec
        self.cls = struct_class(spec.struct)
        self._compiled: dict[int, CompiledVersion] = {}
        self._scanners: dict[int, Any] = {}
        self.api = spec.name

    def compiled(self, version: int) -> CompiledVersion:
        cv = self._compiled.get(version)
        if cv is None:
            if not self.spec.valid_versions.contains(version):
                raise KinspectError(f"{self.spec.name} has no version {version} "
                                    f"(valid: {self.spec.valid_versions})")
            cv = self._compiled[version] = CompiledVersion(self.spec, version)
        return cv

    def decode(self, buf: bytes, version: int, pos: int = 0, end: int | None = None) -> Struct:
        """Decode exactly ``buf[pos:end]`` as this message at ``version``.

        Args:
            buf: the frame (or any buffer); offsets in errors are relative to it.
        Returns:
            an instance of the message's value class.
        Raises:
            DecodeError: malformed or truncated input, trailing bytes, or a version
                the spec does not define.
        """
        obj, p = self.decode_from(buf, version, pos, end)
        if end is None:
            end = len(buf)
        if p != end:
            if p > end:
                raise DecodeError(f"message runs {p - end} bytes past the end", offset=end,
                                  expected="end of message", api=self.api, version=version)
            raise DecodeError(f"{end - p} trailing bytes after the message", offset=p,
                              expected="end of message", api=self.api, version=version)
        return obj

    def decode_from(self, buf: bytes, version: int, pos: int = 0,
                    end: int | None = None) -> tuple[Struct, int]:
        """Decode a message starting at ``pos`` that ends at or before ``end``
        (default: the end of ``buf``); return it and the offset after it.

        Nothing at or after ``end`` is read: a message that would need those bytes
        is a truncated one.

        Raises:
            DecodeError: malformed or truncated input (offsets relative to ``buf``),
                ``pos``/``end`` not a range of ``buf``, or a version the spec does
                not define.
        """
        if type(buf) is not bytes:
            buf = bytes(buf)
        if end is None:
            end = len(buf)
        if not 0 <= pos <= end <= len(buf):
            raise DecodeError(f"[{pos}:{end}] is not a range of the {len(buf)}-byte buffer",
                              offset=pos, api=self.api, version=version)
        try:
            cv = self.compiled(version)
        except KinspectError as e:
            raise DecodeError(str(e), offset=pos, api=self.api, version=version) from None
        # The decoded tree has no reference cycles, so the cyclic garbage collector
        # has nothing to find in it: pausing it while thousands of structs and lists
        # are allocated saves its repeated scans (about a third of the decode time
        # of a large frame). It is re-enabled at once, even on errors.
        paused = _gc_isenabled()
        if paused:
            _gc_disable()
        try:
            native = cv.native
            if native is not None:
                # the C fast path; None (or an error raised by a generated tag-section
                # function it called) means "not accepted": the generated decoder
                # below then decodes it the same way or raises the precise error
                try:
                    got = _native_decode(native, buf, pos, end)
                except _DECODE_FAILURES:  # from a tag-section function: told precisely below
                    got = None
                except Exception as ex:  # noqa: BLE001 - a bug: say so, decode in Python
                    _native_failed(self.api, version, ex)
                    got = None
                if got is not None:
                    return got
            if end < len(buf):
                # the generated decoders bound lengths and counts by `end` but read
                # fixed-width fields and tag bytes up to the end of `buf`: give them a
                # buffer that ends at `end` (same offsets; a copy only in this case)
                buf = buf[:end]
            return cv.decode(buf, pos, end)
        except _DECODE_FAILURES as ex:
            raise self._diagnose(cv, buf, pos, end, version, ex) from None
        finally:
            if paused:
                _gc_enable()

    def _diagnose(self, cv: CompiledVersion, buf: bytes, pos: int, end: int, version: int,
                  first: BaseException) -> DecodeError:
        cv.traced(self.spec, version)
        trace: list[tuple[str, int, str]] = []
        if end < len(buf):
            buf = buf[:end]  # as in decode_from
        try:
            cv.decode_traced(buf, pos, end, trace)
        except _DECODE_FAILURES as ex:
            return _decode_error(ex, trace, self.api, version, end)
        return DecodeError(f"{type(first).__name__}: {first}", api=self.api, version=version)

    def encode(self, value: Struct, version: int) -> bytes:
        """Encode ``value`` at ``version``.

        Raises:
            EncodeError: a value of the wrong type or range, a null in a non-nullable
                field, a non-default value in a version without the field (unless
                the field is ``ignorable``), or unknown tagged fields set on a struct
                in a version that is not flexible (no tag sections; Kafka's writers
                throw UnsupportedVersionException there rather than drop them).
        """
        out = bytearray()
        self.encode_into(value, version, out)
        return bytes(out)

    def encode_into(self, value: Struct, version: int, out: bytearray) -> None:
        """Append the encoding of ``value`` at ``version`` to ``out``."""
        try:
            cv = self.compiled(version)
        except KinspectError as e:
            raise EncodeError(str(e)) from None
        if not isinstance(value, self.cls):
            raise EncodeError(f"expected a {self.spec.name}, got {type(value).__name__}")
        start = len(out)
        paused = _gc_isenabled()  # see decode_from
        if paused:
            _gc_disable()
        try:
            cv.encode(value, out)
            return
        except Exception:  # noqa: BLE001 - the traced encoder judges the value below
            if paused:
                _gc_enable()
                paused = False
            del out[start:]
            # The fast encoder takes values of exactly the expected types and declines
            # the rest (an int subclass, a tuple for a list...); the traced one applies
            # the rules (check_value and the like) and either encodes the value, the
            # same bytes the fast one writes for the same values, or says precisely why
            # it cannot.
            cv.traced(self.spec, version)
            trace: list[tuple[str, int, str]] = []
            scratch = bytearray()
            try:
                cv.encode_traced(value, scratch, trace)
            except Exception as ex2:  # noqa: BLE001
                path = _path(trace)
                reason = ex2.reason if isinstance(ex2, EncodeError) else f"{type(ex2).__name__}: {ex2}"
                raise EncodeError(reason, f"{self.spec.name}.{path}" if path else self.spec.name) \
                    from None
            out += scratch
        finally:
            if paused:
                _gc_enable()

    def top_level_tags(self, buf: bytes, version: int, pos: int = 0,
                       end: int | None = None, *, trailing: bool = False) -> frozenset[int]:
        """The tag numbers in the top-level tag section (KIP-482) of the message in
        ``buf[pos:end]``, known and unknown, found by walking the message without
        building it (the C fast path's ``scan``, else :mod:`kinspect.codec.scan`);
        empty for non-flexible versions. With ``trailing``, the message may end
        before ``end`` (as :meth:`decode_from`'s), else it must end there.

        Raises:
            DecodeError: malformed input (with the path and offset a full decode
                gives), or a version the spec does not define.
        """
        if end is None:
            end = len(buf)
        if (_native_scan is not None and type(buf) is bytes
                and self.spec.valid_versions.contains(version)):
            cv = self.compiled(version)
            if cv.native is not None:
                got = _native_scan(cv.native, buf, pos, end)  # None: not accepted
                if got is not None and (got[0] == end or trailing):
                    return frozenset(got[1])
        scan = self._scanners.get(version)
        if scan is None:
            if not self.spec.valid_versions.contains(version):
                raise DecodeError(f"{self.spec.name} has no version {version} "
                                  f"(valid: {self.spec.valid_versions})", offset=pos,
                                  api=self.api, version=version)
            from .scan import compile_scanner

            scan = self._scanners[version] = compile_scanner(self.spec, version)
        try:
            p, tags = scan(buf, pos, end)
            if p == end or (trailing and p < end):
                return frozenset(tags)
        except _DECODE_FAILURES:
            pass
        # raises the precise DecodeError
        (self.decode_from if trailing else self.decode)(buf, version, pos, end)
        raise DecodeError("the message decodes but its scan failed (a kinspect bug)",
                          offset=pos, api=self.api, version=version)

    def peek_field(self, buf: bytes, version: int, pos: int, name: str) -> Any:
        """Read one top-level field without decoding the whole message: only the
        fields before it are skipped, which must be fixed-width, strings or bytes.

        Used on the forwarding path (e.g. Produce ``Acks``). Fields before it are
        checked as far as skipping needs (lengths, nulls), not decoded.

        Returns:
            the field's value, typed as a decode gives it (``None`` for a null).
        Raises:
            DecodeError: truncated or malformed input on the way to the field or in
                it (a null in a non-nullable field, a string longer than 32767 bytes),
                with its offset and path; KeyError: no such field in ``version``.
                Invalid UTF-8 is not an error (it is kept as lone surrogates, as
                :meth:`decode` keeps it).
        """
        flexible = self.spec.is_flexible(version)
        for f in self.spec.fields:
            if not f.versions.contains(version) or f.tagged_in(version):
                continue
            compact = (f.flexible_versions.contains(version) if f.flexible_versions is not None
                       else flexible)
            if f.name == name:
                obj, _ = _peek_one(buf, pos, f, compact, version, True)
                return obj
            _, pos = _peek_one(buf, pos, f, compact, version, False)
        raise KeyError(f"{self.spec.name} v{version} has no top-level field {name}")

    def __repr__(self) -> str:
        return f"MessageCodec({self.spec.name})"


def _peek_one(buf: bytes, pos: int, f: Any, compact: bool, version: int,
              want: bool) -> tuple[Any, int]:
    """The value of field ``f`` at ``pos`` (only when ``want``: a string skipped over
    is not decoded) and the offset after it."""
    import struct as _st

    from .compiler import FIXED, read_compact_prefix

    start = pos
    try:
        if f.type in FIXED and not f.is_array and f.encoding_in(version) == "fixed":
            code, size = FIXED[f.type]
            return _st.unpack_from(">" + code, buf, pos)[0], pos + size
        if f.type in ("string", "bytes", "records") and not f.is_array:
            if compact:
                n, pos = read_compact_prefix(buf, pos)
                n -= 1
            elif f.type == "string":
                n = _st.unpack_from(">h", buf, pos)[0]
                pos += 2
            else:
                n = _st.unpack_from(">i", buf, pos)[0]
                pos += 4
            if n < 0:
                if f.nullable_in(version):
                    return None, pos
                raise DecodeError(f"null or negative length {n} for a non-nullable {f.type}",
                                  offset=start, expected=f"non-null {f.type}", path=f.name)
            if pos + n > len(buf):
                raise DecodeError(f"{f.type} length {n} exceeds the bytes left", offset=start,
                                  expected=f.type, path=f.name)
            if f.type == "string" and n > 0x7FFF:
                raise DecodeError(f"string length {n} is longer than 32767", offset=start,
                                  expected="string of at most 32767 bytes", path=f.name)
            if not want:
                return None, pos + n
            raw = buf[pos:pos + n]
            if f.type == "string":  # invalid UTF-8 kept as lone surrogates, as decode does
                return str(raw, "utf-8", "surrogateescape"), pos + n
            return bytes(raw), pos + n
    except _struct_error:
        raise DecodeError("truncated", offset=start, expected=f.type, path=f.name) from None
    except DecodeError as e:
        if e.path is None:  # from read_uvarint
            raise DecodeError(e.reason, offset=e.offset, expected=e.expected,
                              path=f.name) from None
        raise
    raise DecodeError(f"cannot peek past field {f.name} of type {f.type}", offset=pos,
                      path=f.name)


from struct import error as _struct_error

# what generated decoders may raise on malformed input; all become DecodeError
_DECODE_FAILURES = (DecodeError, IndexError, ValueError, OverflowError, MemoryError,
                    RecursionError, _struct_error, TypeError, KeyError, AttributeError)


_NATIVE_WARNED: set[str] = set()


def _native_failed(api: str, version: int, ex: BaseException) -> None:
    """An unexpected error from the C fast path: logged once per kind, the Python
    decoder takes over."""
    key = f"{type(ex).__name__}: {ex}"
    if key not in _NATIVE_WARNED and len(_NATIVE_WARNED) < 100:
        _NATIVE_WARNED.add(key)
        logging.getLogger("kinspect.codec").warning(
            "C fast path failed on %s v%d (%s); decoding in Python", api, version, key)


def _path(trace: list[tuple[str, int, str]]) -> str:
    out = ""
    for name, _, _ in trace:
        if name.startswith("["):
            out += name
        else:
            out += ("." if out else "") + name
    return out


def _decode_error(ex: BaseException, trace: list, api: str, version: int, end: int) -> DecodeError:
    path = _path(trace) or None
    offset = trace[-1][1] if trace else None
    expected = trace[-1][2] if trace else None
    if isinstance(ex, DecodeError):
        if ex.offset is not None:
            offset = ex.offset
        reason = ex.reason
        expected = ex.expected or expected
    elif isinstance(ex, UnicodeDecodeError):
        reason = f"invalid UTF-8: {ex.reason}"
    elif isinstance(ex, (IndexError, _struct_error)):
        left = end - offset if offset is not None else None
        reason = "truncated" + (f": {max(left, 0)} bytes left" if left is not None else "")
    else:
        reason = f"{type(ex).__name__}: {ex}"
    return DecodeError(reason, offset=offset, expected=expected, path=path, api=api,
                       version=version)


class SpecRegistry:
    """All loaded message specs, indexed by name and api key.

    Attributes:
        sources: the search path it was loaded from.
        messages: name → :class:`MessageSpec`.

    A source that holds no spec file (an empty directory, a jar without ``*.json``
    members) is logged as a warning naming it, and skipped.
    """

    def __init__(self, sources: list[SpecSource] | None = None):
        self.sources: list[SpecSource] = list(sources or [])
        self.messages: dict[str, MessageSpec] = {}
        self._requests: dict[int, MessageSpec] = {}
        self._responses: dict[int, MessageSpec] = {}
        self._codecs: dict[str, MessageCodec] = {}
        self.shadowed: list[tuple[str, str]] = []
        for src in self.sources:
            found = 0
            for name, text in _iter_spec_files(src):
                self.add_text(text, name)
                found += 1
            if not found:  # (a typo, or the wrong jar: it would go unnoticed otherwise)
                logging.getLogger("kinspect.codec").warning(
                    "%s %s: no message specs found (no *.json %s); the other sources are "
                    "used", src.origin, src.path,
                    "file in it" if src.kind == "dir" else "member in the archive")

    @classmethod
    def load(cls, paths: Iterable[str] = (), **kw: Any) -> SpecRegistry:
        """Load the search path (see :func:`search_path` for keyword arguments).

        Raises:
            SpecError: an invalid spec (naming the file and the field), or a bad path.
        """
        return cls(search_path(paths, **kw))

    def add_text(self, text: str, source: str) -> MessageSpec | None:
        """Parse one spec file's text and add it unless a message of that name is
        already loaded (earlier sources win). Returns the spec added, or ``None``."""
        doc = load_spec_document(text, source)
        spec = parse_message_spec(doc, source)
        return self.add(spec)

    def add(self, spec: MessageSpec) -> MessageSpec | None:
        """Add a parsed spec unless a message of its name is already loaded (earlier
        sources win; the loser is noted in :attr:`shadowed`). Returns the spec
        added, or ``None``."""
        if spec.name in self.messages:
            self.shadowed.append((spec.name, spec.source))
            return None
        self.messages[spec.name] = spec
        if spec.type == "request":
            self._requests.setdefault(spec.api_key, spec)
        elif spec.type == "response":
            self._responses.setdefault(spec.api_key, spec)
        return spec

    # -- lookups -----------------------------------------------------------------
    def request(self, api_key: int) -> MessageSpec | None:
        """The request spec of an api key, ``None`` when no loaded spec defines it."""
        return self._requests.get(api_key)

    def response(self, api_key: int) -> MessageSpec | None:
        """The response spec of an api key, ``None`` when no loaded spec defines it."""
        return self._responses.get(api_key)

    def api_keys(self) -> list[int]:
        """Every api key a request or response spec defines, ascending."""
        return sorted(set(self._requests) | set(self._responses))

    def api_name(self, api_key: int) -> str:
        """``"Metadata"`` for 3; ``"ApiKey(99)"`` when no spec defines the key."""
        spec = self._requests.get(api_key) or self._responses.get(api_key)
        if spec is None:
            return f"ApiKey({api_key})"
        name = spec.name
        for suffix in ("Request", "Response"):
            if name.endswith(suffix):
                return name[: -len(suffix)]
        return name

    def api_key(self, name: str) -> int:
        """The api key of an api name (``"Metadata"``, ``"MetadataRequest"``, or a number).

        Raises:
            KeyError: unknown name.
        """
        if isinstance(name, int) or str(name).isdigit():
            return int(name)
        lname = str(name).lower()
        for key, spec in self._requests.items():
            n = spec.name.lower()
            if lname in (n, n.removesuffix("request")):
                return key
        raise KeyError(name)

    def codec(self, name_or_spec: str | MessageSpec) -> MessageCodec:
        """The :class:`MessageCodec` of a message (its spec, or its name such as
        ``"MetadataRequest"``), made once and kept.

        Raises:
            KeyError: no loaded message has that name.
        """
        spec = self.messages[name_or_spec] if isinstance(name_or_spec, str) else name_or_spec
        c = self._codecs.get(spec.name)
        if c is None:
            c = self._codecs[spec.name] = MessageCodec(spec)
        return c

    def header(self, name: str) -> MessageCodec:
        """The codec of ``"RequestHeader"`` or ``"ResponseHeader"``.

        Raises:
            KinspectError: no loaded source defines it.
        """
        if name not in self.messages:
            raise KinspectError(f"no spec defines {name}; sources: "
                                f"{', '.join(s.path for s in self.sources) or 'none'}")
        return self.codec(name)

    def __repr__(self) -> str:
        return f"SpecRegistry({len(self.messages)} messages from {len(self.sources)} sources)"


_DEFAULT: dict[tuple, SpecRegistry] = {}


def default_registry(paths: Iterable[str] = ()) -> SpecRegistry:
    """A cached registry for the default search path plus ``paths``."""
    key = (tuple(paths), os.environ.get(ENV_VAR, ""))
    reg = _DEFAULT.get(key)
    if reg is None:
        reg = _DEFAULT[key] = SpecRegistry.load(key[0])
    return reg
