"""Edge cases where kinspect reads and writes as Kafka's Java code does, checked
against Kafka's sources (not against kinspect's own output):

* strings: ``Readable.readString`` is ``new String(bytes, UTF_8)``, which replaces
  invalid UTF-8 with U+FFFD instead of failing, so brokers accept such frames;
* compact lengths: generated readers compute ``readUnsignedVarint() - 1`` in Java
  ``int`` arithmetic (``ByteUtils.readUnsignedVarint`` returns an ``int``);
* tagged strings and bytes: generated writers always write them compact
  (``MessageDataGenerator.generateClassWriter``), whatever the field's own
  ``flexibleVersions``;
* encoding refuses values of the wrong type (Java's types do not let them exist);
* ``from_dict`` reports malformed input as EncodeError.
"""

from __future__ import annotations

import enum
import json

import pytest
from codec_util import h, inline

from kinspect.codec import DecodeError, EncodeError, SpecError

# ---------------------------------------------------------------------------
# tagged strings and bytes are compact, whatever the field's flexibleVersions


def test_tagged_string_with_flexible_versions_none_is_written_compact():
    """Kafka's generated writer for a tagged string: writeUnsignedVarint(tag),
    writeUnsignedVarint(len + sizeOfUnsignedVarint(len + 1)), writeUnsignedVarint(len
    + 1), the bytes; likewise for bytes. The field's flexibleVersions is not looked
    at."""
    c = inline({"name": "T", "type": "data", "validVersions": "0", "flexibleVersions": "0+",
                "fields": [{"name": "S", "type": "string", "versions": "0+",
                            "flexibleVersions": "none", "taggedVersions": "0+", "tag": 1},
                           {"name": "B", "type": "bytes", "versions": "0+",
                            "flexibleVersions": "none", "taggedVersions": "0+", "tag": 2}]})
    wire = h("02 | 01 03 03 61 62 | 02 02 02 ff")
    m = c.cls(S="ab", B=b"\xff")
    assert c.encode(m, 0) == wire
    assert c.decode(wire, 0) == m


def test_field_flexible_versions_beyond_the_messages_are_a_spec_error():
    """MessageDataGenerator.fieldFlexibleVersions: "The flexible versions for field
    ... are not a subset of the flexible versions for the message as a whole"."""
    with pytest.raises(SpecError) as ei:
        inline({"name": "T", "type": "data", "validVersions": "0-2", "flexibleVersions": "2+",
                "fields": [{"name": "S", "type": "string", "versions": "0+",
                            "flexibleVersions": "1+"}]})
    assert ei.value.field == "S" and "subset" in ei.value.reason
