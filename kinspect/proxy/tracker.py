"""Pairing responses with requests on one connection (sans-io).

Kafka responses carry only the correlation id, so the api key and version of a
response come from the request it answers (protocol guide, "Requests and
Responses"); responses come back in request order. Special cases handled here:

* Produce with ``acks=0`` gets no response (GUIDE §2.7): such a request is
  returned with the ``no-response`` flag and not remembered;
* after a successful SaslHandshake v0, SASL tokens travel as raw size-prefixed
  frames with no Kafka header (KIP-43; v1 wraps them in SaslAuthenticate). Raw
  tokens are paired with the next response frame in order; raw mode ends with
  the first client frame that is a well-formed request header for a known api
  key and version.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Callable

from ..codec import Codec, DecodeError
from ..flows import CLOSED, NO_RESPONSE, SASL_TOKEN, UNDECODED, UNPAIRED, Flow

PRODUCE = 0
SASL_HANDSHAKE = 17
_HHI = struct.Struct(">hhi").unpack_from
_I = struct.Struct(">i").unpack_from
_H = struct.Struct(">h").unpack_from


class FlowTracker:
    """Turns the frames of one connection into :class:`~kinspect.flows.Flow` objects.

    Args:
        codec: used for header versions and the Produce ``Acks`` field.
        conn: connection id; client, upstream: ``"host:port"`` strings.
        next_flow_id: callable returning a fresh flow id.
    """

    __slots__ = ("codec", "conn", "client", "upstream", "next_flow_id", "pending", "inflight",
                 "sasl_raw", "acks0")

    def __init__(self, codec: Codec, conn: int, client: str, upstream: str,
                 next_flow_id: Callable[[], int]):
        self.codec = codec
        self.conn = conn
        self.client = client
        self.upstream = upstream
        self.next_flow_id = next_flow_id
        #: correlation id -> flow awaiting its response
        self.pending: dict[int, Flow] = {}
        #: flows awaiting a response, in request order (raw SASL tokens included)
        self.inflight: deque[Flow] = deque()
        self.sasl_raw = False
        #: recent acks=0 Produce requests by correlation id, to explain a stray answer
        self.acks0: dict[int, Flow] = {}

    def _flow(self, api_key: int, api_version: int, corr: int, name: str, frame: bytes,
              now: int) -> Flow:
        return Flow(self.next_flow_id(), self.conn, self.client, self.upstream, api_key,
                    api_version, corr, name, frame, now)

    def request(self, frame: bytes, now: int) -> Flow:
        """Note a request frame. The returned flow has the ``no-response`` flag when
        no response will come (the caller then treats it as complete)."""
        if len(frame) < 8:
            flow = self._flow(-1, -1, -1, "Malformed", frame, now)
            flow.flags.update((UNDECODED, NO_RESPONSE))
            flow.error = f"request frame of {len(frame)} bytes is shorter than a header"
            return flow
        api_key, api_version, corr = _HHI(frame, 0)
        if self.sasl_raw:
            if self.codec.request_header_version(api_key, api_version) is not None:
                self.sasl_raw = False
            else:
                flow = self._flow(-1, -1, -1, "SaslToken", frame, now)
                flow.flags.add(SASL_TOKEN)
                self.inflight.append(flow)
                return flow
        flow = self._flow(api_key, api_version, corr, self.codec.api_name(api_key), frame, now)
        if api_key == PRODUCE and self.produce_acks(frame, api_version) == 0:
            flow.flags.add(NO_RESPONSE)
            if len(self.acks0) >= 64:
                self.acks0.pop(next(iter(self.acks0)))
            self.acks0[corr] = flow
            return flow
        self.pending[corr] = flow
        self.inflight.append(flow)
        return flow

    def produce_acks(self, frame: bytes, api_version: int) -> int | None:
        """The ``Acks`` of a Produce request frame (found through the spec), or
        ``None`` when the frame or the spec does not tell."""
        try:
            req = self.codec.decode_request(frame, body=False)
            return self.codec.request_codec(PRODUCE).peek_field(frame, api_version,
                                                                req.body_offset, "Acks")
        except (DecodeError, KeyError, LookupError, ValueError):
            return None
        except Exception:  # noqa: BLE001 - e.g. no Produce spec loaded: forward regardless
            return None

    def response(self, frame: bytes, now: int) -> Flow:
        """Pair a response frame with its request; an unmatched one gets a flow of
        its own flagged ``unpaired``."""
        inflight = self.inflight
        if inflight and SASL_TOKEN in inflight[0].flags:
            flow = inflight.popleft()
        else:
            corr = _I(frame, 0)[0] if len(frame) >= 4 else None
            flow = self.pending.pop(corr, None) if corr is not None else None
            if flow is None:
                flow = self._unpaired(corr, now)
                flow.response = frame
                flow.response_ns = now
                return flow
            if inflight and inflight[0] is flow:
                inflight.popleft()
            else:
                try:
                    inflight.remove(flow)
                except ValueError:
                    pass
        flow.response = frame
        flow.response_ns = now
        if (flow.api_key == SASL_HANDSHAKE and flow.api_version == 0 and len(frame) >= 6
                and _H(frame, 4)[0] == 0):
            self.sasl_raw = True
        return flow

    def _unpaired(self, corr: int | None, now: int) -> Flow:
        acks0 = self.acks0.pop(corr, None) if corr is not None else None
        if acks0 is not None:
            # A broker answered an acks=0 Produce (Kafka brokers do not). Keep the
            # api so the stray response decodes, and say what happened.
            flow = self._flow(acks0.api_key, acks0.api_version, corr, acks0.api_name, b"", now)
            flow.notes.append(f"response to acks=0 Produce flow #{acks0.id}, which expects none")
        else:
            flow = self._flow(-1, -1, corr if corr is not None else -1, "Unpaired", b"", now)
        flow.flags.add(UNPAIRED)
        return flow

    def close(self) -> list[Flow]:
        """End of connection: the flows still waiting, flagged ``closed``."""
        left = list(self.inflight)
        for flow in left:
            flow.flags.add(CLOSED)
        self.inflight.clear()
        self.pending.clear()
        return left
