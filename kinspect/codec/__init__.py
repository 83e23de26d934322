"""kinspect's sans-io Kafka codec, driven by Apache Kafka's JSON message specs.

Bytes in, values out; values in, bytes out. Never touches sockets or event loops.

Typical use::

    from kinspect.codec import Codec
    codec = Codec()                      # default spec search path
    req = codec.decode_request(frame)    # frame without its 4-byte size prefix
    req.body.Topics[0].Name
    assert codec.encode_request(req) == frame

Errors: :class:`DecodeError` (malformed bytes, with api, version, field path and
offset), :class:`EncodeError`, :class:`SpecError`, all :class:`KinspectError`.
"""

from .errors import DecodeError, EncodeError, KinspectError, SpecError
from .frames import DEFAULT_MAX_FRAME, FrameSizeError, FrameSplitter, frame
from .protocol import Codec, Request, Response
from .registry import (
    MessageCodec,
    SpecRegistry,
    SpecSource,
    default_registry,
    search_path,
)
from .spec import FieldSpec, MessageSpec, StructSpec
from .values import Struct
from .versions import Versions

__all__ = [
    "Codec", "Request", "Response", "MessageCodec", "SpecRegistry", "SpecSource",
    "default_registry", "search_path", "Struct", "MessageSpec", "StructSpec", "FieldSpec",
    "Versions", "FrameSplitter", "FrameSizeError", "frame", "DEFAULT_MAX_FRAME",
    "DecodeError", "EncodeError", "SpecError", "KinspectError",
]
