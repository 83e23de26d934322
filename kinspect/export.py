"""Export a capture as pcapng for Wireshark and tshark.

Each proxied connection becomes one synthesised TCP connection between the
client's address and the broker's (``client`` and ``upstream`` of the capture, so
the broker's real port): a three-way handshake before its first frame, the Kafka
frames (4-byte size prefix + frame) as data segments with consistent sequence and
acknowledgement numbers per direction, and a FIN exchange after its last frame
when the capture saw the connection close. Packets are Ethernet II / IPv4 (IPv6
when an address is IPv6) / TCP with correct checksums; segments carry at most
:data:`MSS` bytes. Timestamps are the capture's nanosecond ``ts_ns`` (interface
``if_tsresol`` = 9). The pcapng blocks are written with the python-pcapng library.

Every kinspect connection is one TCP stream: a connection whose address and port
pair an earlier one of the export already used (a client port reused, captures
appended to each other) gets a free client port; one whose client address has no
free port left (more than 65535 connections from it to one broker) gets a stand-in
client address, named ``HOST#2``, ``HOST#3``... A connection's packets
keep the capture's order even where its timestamps do not (``ts_ns`` null or going
back): such a frame takes the time of the connection's previous one.

Host names that are not IP literals (e.g. an upstream ``localhost:9092``) get
addresses from 198.18.0.0/15 (the benchmarking range), recorded in a Name
Resolution Block so Wireshark shows the name.

By default the bytes are the frames as received (``frame``); with ``sent=True``
the bytes actually forwarded (``frame_sent`` where present: rewritten or mutated
frames). The first packet of a frame whose flow kinspect flagged (``redacted``,
``unpaired``, ``rewritten``, ``mutated``, ``sasl``...) carries a packet comment
naming the flow and its flags (the flow's: ``rewritten`` is the response's,
``redacted-request`` the request's) (``frame.comment`` in Wireshark). Wireshark dissects Kafka on port 9092 by default; for other ports use
``tshark -d tcp.port==PORT,kafka`` ("Decode As").
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import struct
import warnings
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from pcapng import FileWriter, blocks

from . import __version__
from .capture import Capture, make_parent
from .filters import Filter, TopicIds

__all__ = ["MSS", "ExportStats", "export_pcapng", "write_pcapng"]

#: Largest TCP payload per synthesised segment (fits one IPv4 packet).
MSS = 65000
#: Largest TCP payload one packet can carry: IPv4's 16-bit total length covers the
#: 20-byte IP and 20-byte TCP headers; IPv6's payload length covers the TCP header.
_MAX_PAYLOAD = {4: 65535 - 40, 6: 65535 - 20}

_ETH_CLIENT = bytes.fromhex("020000000001")
_ETH_BROKER = bytes.fromhex("020000000002")
_ETH_IPV4 = 0x0800
_ETH_IPV6 = 0x86DD
_FIN, _SYN, _PSH, _ACK = 0x01, 0x02, 0x08, 0x10
_SIZE = struct.Struct(">i").pack


@dataclass
class ExportStats:
    """What :func:`export_pcapng` wrote: ``packets``, ``frames`` (Kafka frames),
    ``connections``, ``ports`` (broker ports, for ``-d tcp.port==P,kafka``)."""

    packets: int = 0
    frames: int = 0
    connections: int = 0
    ports: set[int] = field(default_factory=set)


def _checksum(data: bytes) -> int:
    """Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data += b"\x00"
    total = int.from_bytes(data, "big")
    s = total % 0xFFFF
    if s == 0 and total:
        s = 0xFFFF
    return ~s & 0xFFFF


def _split_hostport(text: str | None) -> tuple[str, int]:
    """``(host, port)`` of a capture's ``"host:port"`` (``"[v6]:port"``); port 0 (not
    known: the export picks one) when it is missing, not a number or not a TCP port
    (0-65535), the whole text the host when it does not split."""
    text = (text or "").strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        return text, 0
    return host, number if 0 <= number <= 65535 else 0


class _Addresses:
    def __init__(self) -> None:
        self.synthetic: dict[str, ipaddress.IPv4Address] = {}

    def resolve(self, host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        try:
            return ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            a = self.synthetic.get(host)
            if a is None:
                a = self.synthetic[host] = ipaddress.IPv4Address(
                    int(ipaddress.IPv4Address("198.18.0.1")) + len(self.synthetic))
            return a


class _Tcp:
    """One synthesised TCP connection: packet builders and sequence numbers."""

    def __init__(self, conn: int, client: tuple[Any, int], broker: tuple[Any, int]):
        (ca, cp), (ba, bp) = client, broker
        if ca.version != ba.version:  # mixed families: map IPv4 into IPv6
            ca = ca if ca.version == 6 else ipaddress.IPv6Address(f"::ffff:{ca}")
            ba = ba if ba.version == 6 else ipaddress.IPv6Address(f"::ffff:{ba}")
        self.v6 = ca.version == 6
        self.addr = {"c": ca.packed, "b": ba.packed}
        self.port = {"c": cp or (40000 + conn % 20000), "b": bp or 9092}
        # deterministic initial sequence numbers per connection
        self.seq = {"c": (conn * 0x01000193) & 0xFFFFFFFF, "b": (conn * 0x9E3779B1) & 0xFFFFFFFF}
        self.ip_id = {"c": 0, "b": 0}

    def packet(self, side: str, flags: int, payload: bytes = b"") -> bytes:
        other = "b" if side == "c" else "c"
        src, dst = self.addr[side], self.addr[other]
        seq = self.seq[side]
        ack = self.seq[other] if flags & _ACK else 0
        tcp = struct.pack(">HHIIBBHHH", self.port[side], self.port[other], seq, ack, 5 << 4,
                          flags, 65535, 0, 0)
        seg_len = len(tcp) + len(payload)
        if self.v6:
            pseudo = src + dst + struct.pack(">IxxxB", seg_len, 6)
        else:
            pseudo = src + dst + struct.pack(">xBH", 6, seg_len)
        csum = _checksum(pseudo + tcp + payload)
        tcp = tcp[:16] + struct.pack(">H", csum) + tcp[18:]
        if self.v6:
            ip = struct.pack(">IHBB", 6 << 28, seg_len, 6, 64) + src + dst
            eth_type = _ETH_IPV6
        else:
            self.ip_id[side] = (self.ip_id[side] + 1) & 0xFFFF
            hdr = struct.pack(">BBHHHBBH", 0x45, 0, 20 + seg_len, self.ip_id[side], 0x4000, 64,
                              6, 0) + src + dst
            ip = hdr[:10] + struct.pack(">H", _checksum(hdr)) + hdr[12:]
            eth_type = _ETH_IPV4
        macs = (_ETH_BROKER + _ETH_CLIENT) if side == "c" else (_ETH_CLIENT + _ETH_BROKER)
        advance = len(payload) + (1 if flags & (_SYN | _FIN) else 0)
        self.seq[side] = (seq + advance) & 0xFFFFFFFF
        return macs + struct.pack(">H", eth_type) + ip + tcp + payload

    def data(self, side: str, payload: bytes, mss: int) -> list[bytes]:
        mss = min(mss, _MAX_PAYLOAD[6 if self.v6 else 4])
        out = []
        for i in range(0, len(payload), mss):
            chunk = payload[i:i + mss]
            last = i + mss >= len(payload)
            out.append(self.packet(side, _ACK | (_PSH if last else 0), chunk))
        return out


def _free_port(used: set[int], cursor: dict[tuple, int], pair: tuple, port: int) -> int | None:
    """``port`` when ``used`` (the client ports taken between one client address and a
    broker ``pair``) lacks it, else the next free port (1-65535) from where the last
    search for ``pair`` stopped (``cursor``, updated), so that n connections cost
    O(n + 65535), not O(n²); ``None`` when all 65535 are taken."""
    if port not in used:
        return port
    if len(used) >= 65535:
        return None
    port = cursor.get(pair, port)
    while port in used:
        port = port % 65535 + 1
    cursor[pair] = port % 65535 + 1
    return port


def _comment(flow: Any, direction: str) -> str | None:
    """The packet comment of a frame whose flow kinspect flagged (redacted, unpaired,
    rewritten, mutated, a raw SASL token...): Wireshark shows it with the packet
    (``frame.comment``), so marker bytes or an undecodable answer are explained."""
    if not flow.flags:
        return None
    what = "request" if direction == "req" else "response"
    return (f"kinspect flow {flow.id} {what} ({flow.api_name} v{flow.api_version}, "
            f"correlation id {flow.correlation_id}); flow flags: {', '.join(sorted(flow.flags))}")


def write_pcapng(fh: BinaryIO, events: list[tuple],
                 names: dict[str, Any] | None = None) -> None:
    """Write Ethernet packets ``(ts_ns, bytes)`` or ``(ts_ns, bytes, comment)`` as a
    pcapng section (one interface, nanosecond timestamps; a comment, when not
    ``None``, is the packet's ``opt_comment``), with a Name Resolution Block for
    ``names`` (``{host name: IP address}``) when given."""
    shb = blocks.SectionHeader(options={"shb_userappl": f"kinspect {__version__}"})
    shb.new_member(blocks.InterfaceDescription, link_type=1, snaplen=262144,
                   options={"if_name": "kinspect", "if_tsresol": b"\x09"})
    with warnings.catch_warnings():
        # python-pcapng's own schema declares if_tsresol without a type and warns on it
        warnings.simplefilter("ignore", DeprecationWarning)
        writer = FileWriter(fh, shb)
    if names:
        recs = []
        for name, addr in names.items():
            recs.append({"type": 1 if addr.version == 4 else 2, "address": str(addr),
                         "names": [_utf8(name)]})
        writer.write_block(shb.new_member(blocks.NameResolution, records=recs))
    # a packet without a comment reuses one block, its fields set anew: building a
    # block object per packet took about a fifth of the writing (python-pcapng
    # encodes a block from its fields when written, so each packet is written whole)
    plain = shb.new_member(blocks.EnhancedPacket, interface_id=0, options={})
    for ts, pkt, *rest in events:
        comment = _utf8(rest[0]) if rest and rest[0] else None
        ts = max(ts, 0)  # pcapng counts from the epoch, unsigned: earlier is the epoch
        high, low = (ts >> 32) & 0xFFFFFFFF, ts & 0xFFFFFFFF
        if comment:
            block = shb.new_member(
                blocks.EnhancedPacket, interface_id=0, timestamp_high=high,
                timestamp_low=low, packet_data=pkt, packet_len=len(pkt),
                options={"opt_comment": [comment]})
        else:
            block = plain
            block.timestamp_high, block.timestamp_low = high, low
            block.packet_data, block.packet_len = pkt, len(pkt)
        writer.write_block(block)


def _utf8(text: str) -> str:
    """``text`` as pcapng options hold it, UTF-8: a lone surrogate (a JSON escape
    such as ``"\\ud800"`` in a capture's client id) written as its escape."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def export_pcapng(capture: Capture, out: str | os.PathLike | BinaryIO, *,
                  flt: Filter | None = None, sent: bool = False, mss: int = MSS) -> ExportStats:
    """Write ``capture`` (from :func:`kinspect.capture.load_capture`) as pcapng.

    Args:
        out: path or binary file object.
        flt: keep only the frames it matches (``flt.matches_frame(flow, dir)``, so
            ``~dir`` selects directions); TCP sequence numbers stay contiguous over
            the frames kept.
        sent: use the bytes forwarded (``frame_sent``) instead of those received.
        mss: largest TCP payload per packet (at most what one IP packet holds:
            65495 bytes over IPv4, 65515 over IPv6).

    Returns:
        :class:`ExportStats`.

    Raises:
        OSError: ``out`` cannot be written.
        ValueError: ``mss`` is less than 1.
    """
    if mss < 1:
        raise ValueError(f"mss must be at least 1 byte, not {mss}")
    ids = TopicIds().learn_all(capture.flows) if flt is not None else None
    selected = []
    for ref in capture.frames:
        flow = ref.flow
        data = flow.request if ref.dir == "req" else flow.response
        if sent:
            alt = flow.request_sent if ref.dir == "req" else flow.response_sent
            data = alt if alt is not None else data
        if data is None:
            continue
        if flt is not None and not flt.matches_frame(flow, ref.dir, topic_ids=ids):
            continue
        selected.append((ref, data))
    last_index: dict[int, int] = {}
    for i, (ref, _) in enumerate(selected):
        last_index[ref.flow.conn] = i

    addrs = _Addresses()
    stats = ExportStats()
    conns: dict[int, _Tcp] = {}
    last_ts: dict[int, int] = {}     # conn -> timestamp of its latest packet
    used: dict[tuple, set[int]] = {}  # (client addr, broker addr, broker port) -> client ports
    cursor: dict[tuple, int] = {}     # where the last search for a free client port stopped
    events: list[tuple[int, bytes]] = []
    prev_ts = 0
    for i, (ref, data) in enumerate(selected):
        flow = ref.flow
        cid = flow.conn
        tcp = conns.get(cid)
        info = capture.conns.get(cid, {})
        # a connection's packets keep their file order: a timestamp that is not known
        # (ts_ns null) or earlier than the connection's previous one is moved up to it,
        # else the time sort below would put a response before its request, or data
        # before the handshake (TCP out-of-order, port reuse in Wireshark)
        ts = ref.ts_ns or last_ts.get(cid) or info.get("open_ns") or prev_ts
        if tcp is None:
            ch, cp = _split_hostport(info.get("client") or flow.client)
            bh, bp = _split_hostport(info.get("upstream") or flow.upstream)
            # a capture of another tool may name neither end: two distinct hosts still
            ch, broker = ch or "kinspect-client", (addrs.resolve(bh or "kinspect-broker"), bp)
            tcp = conns[cid] = _Tcp(cid, (addrs.resolve(ch), cp), broker)
            # one TCP stream per kinspect connection: a 4-tuple an earlier connection
            # of the export used (a client port reused, captures appended to each
            # other) gets a free client port, else Wireshark merges the two; when
            # every port of the client address is used, a stand-in address
            for n in itertools.count(2):
                pair = (tcp.addr["c"], tcp.addr["b"], tcp.port["b"])
                if pair not in used:  # a client on the broker's host never has its port
                    used[pair] = {tcp.port["b"]} if tcp.addr["c"] == tcp.addr["b"] else set()
                port = _free_port(used[pair], cursor, pair, tcp.port["c"])
                if port is not None:
                    break
                tcp = conns[cid] = _Tcp(cid, (addrs.resolve(f"{ch}#{n}"), cp), broker)
            tcp.port["c"] = port
            used[pair].add(port)
            stats.connections += 1
            stats.ports.add(tcp.port["b"])
            t0 = min(info.get("open_ns") or ts, ts)
            events.append((t0, tcp.packet("c", _SYN)))
            events.append((t0, tcp.packet("b", _SYN | _ACK)))
            events.append((t0, tcp.packet("c", _ACK)))
        ts = max(ts, last_ts.get(cid, 0))
        last_ts[cid] = prev_ts = ts
        side = "c" if ref.dir == "req" else "b"
        for n, pkt in enumerate(tcp.data(side, _SIZE(len(data)) + data, mss)):
            events.append((ts, pkt, _comment(flow, ref.dir) if n == 0 else None))
        stats.frames += 1
        if last_index[cid] == i and info.get("close_ns") is not None:
            t1 = max(info["close_ns"], ts)
            events.append((t1, tcp.packet("c", _FIN | _ACK)))
            events.append((t1, tcp.packet("b", _FIN | _ACK)))
            events.append((t1, tcp.packet("c", _ACK)))
    stats.packets = len(events)
    # time order across connections (a FIN at close time may follow later frames of
    # other connections); stable, so each connection keeps its own packet order
    events.sort(key=lambda e: e[0])
    if isinstance(out, (str, os.PathLike)):
        make_parent(out)  # (a file where its directory should be: "Not a directory")
        with open(out, "wb") as fh:
            write_pcapng(fh, events, addrs.synthetic)
    else:
        write_pcapng(out, events, addrs.synthetic)
    return stats
