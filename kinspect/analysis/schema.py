"""Column layouts of the analysis: the per-flow rows the decoder emits and the
Parquet tables written under ``--out``.

Schemas are pyarrow schemas; the Spark job converts them with
``pyspark.sql.pandas.types.from_arrow_schema`` so both engines share one definition.

Units: sizes in bytes, times in nanoseconds since the epoch (``time.time_ns()`` of
the proxy), latencies in nanoseconds.
"""

from __future__ import annotations

import pyarrow as pa

#: one request/response pair, before decoding (input of the decoder)
PAIR = pa.schema([
    ("capture", pa.string()),          # capture file name (basename)
    ("conn", pa.int64()),
    ("correlation_id", pa.int32()),
    ("seq", pa.int32()),               # n-th use of this correlation id on the connection
    #                                    (negative: a frame that pairs with nothing, see
    #                                    kinspect.analysis.reference)
    ("flow", pa.int64()),
    ("client", pa.string()),
    ("upstream", pa.string()),
    ("api_key", pa.int32()),
    ("api_version", pa.int32()),
    ("req_frame", pa.binary()),
    ("resp_frame", pa.binary()),
    ("req_ns", pa.int64()),
    ("resp_ns", pa.int64()),
    ("req_flags", pa.list_(pa.string())),   # with closed added: no response on a
    #                                          connection that closed (reference.pair_frames)
    ("resp_flags", pa.list_(pa.string())),
    ("resp_sent_bytes", pa.int64()),
])

PARTITION_ERROR = pa.struct([
    ("topic", pa.string()), ("partition", pa.int32()), ("error_code", pa.int32()),
])

TAGGED = pa.struct([
    ("direction", pa.string()),        # "request" | "response"
    ("message", pa.string()),          # spec name: "RequestHeader", "MetadataResponse"...
    ("path", pa.string()),             # struct path: "MetadataResponse.Topics.Partitions"
    ("tag", pa.int32()),               # -1 for the "section" rows
    ("name", pa.string()),             # field name; null for unknown tags and sections
    ("kind", pa.string()),             # "known" | "unknown" | "section"
    ("count", pa.int64()),
    ("data_bytes", pa.int64()),        # tagged values only
    ("bytes", pa.int64()),             # with the tag/size varints (sections: whole section)
])

TOPIC = pa.struct([
    ("direction", pa.string()),        # "produce" (request records) | "fetch" (response)
    ("topic", pa.string()),            # null when only a topic id is on the wire
    ("topic_id", pa.string()),         # Kafka's text form, null when absent/zero
    ("partition", pa.int32()),
    ("codec", pa.string()),            # none|gzip|snappy|lz4|zstd|(partial)|(undecodable)
    ("batches", pa.int64()),
    ("records", pa.int64()),
    ("bytes", pa.int64()),             # wire bytes of the batches
    ("payload_bytes", pa.int64()),     # compressed payload as carried
    ("uncompressed_bytes", pa.int64()),
])

TOPIC_NAME = pa.struct([("topic_id", pa.string()), ("topic", pa.string())])

#: the flows table columns
FLOW_FIELDS = [
    ("capture", pa.string()),
    ("conn", pa.int64()),
    ("flow", pa.int64()),
    ("client", pa.string()),
    ("upstream", pa.string()),
    ("api_key", pa.int32()),
    ("api_name", pa.string()),
    ("api_version", pa.int32()),
    ("correlation_id", pa.int32()),
    ("client_id", pa.string()),
    ("request_header_version", pa.int32()),
    ("response_header_version", pa.int32()),
    ("request_bytes", pa.int64()),
    ("response_bytes", pa.int64()),
    ("response_sent_bytes", pa.int64()),
    ("request_ns", pa.int64()),
    ("response_ns", pa.int64()),
    ("latency_ns", pa.int64()),
    ("error_code", pa.int32()),
    ("partition_errors", pa.list_(PARTITION_ERROR)),
    ("request_decoded", pa.bool_()),
    ("response_decoded", pa.bool_()),
    ("decode_error", pa.string()),
    ("flags", pa.list_(pa.string())),
    ("client_software_name", pa.string()),      # from this flow's ApiVersions v3+ request
    ("client_software_version", pa.string()),
]
FLOWS = pa.schema(FLOW_FIELDS)

#: what the decoder emits per pair: a flow row plus nested facts for the other tables
DECODED = pa.schema(FLOW_FIELDS + [
    ("tagged", pa.list_(TAGGED)),
    ("topics", pa.list_(TOPIC)),
    ("topic_names", pa.list_(TOPIC_NAME)),
    ("negative_fields", pa.list_(pa.string())),
])

API_STATS = pa.schema([
    ("api_key", pa.int32()), ("api_name", pa.string()), ("api_version", pa.int32()),
    ("count", pa.int64()), ("requests", pa.int64()), ("responses", pa.int64()),
    ("request_bytes", pa.int64()), ("response_bytes", pa.int64()), ("bytes", pa.int64()),
    ("errors", pa.int64()), ("undecoded", pa.int64()),
    ("latency_count", pa.int64()),
    ("latency_p50_ns", pa.int64()), ("latency_p95_ns", pa.int64()),
    ("latency_p99_ns", pa.int64()), ("latency_max_ns", pa.int64()),
])

CLIENTS = pa.schema([
    ("client_id", pa.string()), ("client_software_name", pa.string()),
    ("client_software_version", pa.string()),
    ("connections", pa.int64()), ("flows", pa.int64()),
    ("request_bytes", pa.int64()), ("response_bytes", pa.int64()),
    ("apis", pa.list_(pa.string())),
])

TAGGED_FIELDS = pa.schema([
    ("api_key", pa.int32()), ("api_name", pa.string()), ("api_version", pa.int32()),
    ("direction", pa.string()), ("message", pa.string()), ("path", pa.string()),
    ("tag", pa.int32()), ("name", pa.string()), ("kind", pa.string()),
    ("count", pa.int64()), ("data_bytes", pa.int64()), ("bytes", pa.int64()),
])

TOPICS = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("codec", pa.string()),
    ("produced_batches", pa.int64()), ("produced_records", pa.int64()),
    ("produced_bytes", pa.int64()),
    ("fetched_batches", pa.int64()), ("fetched_records", pa.int64()),
    ("fetched_bytes", pa.int64()),
    ("payload_bytes", pa.int64()), ("uncompressed_bytes", pa.int64()),
    ("compression_ratio", pa.float64()),   # uncompressed / payload; null when no payload
])

#: one row per decoded message (request or response frame, header included)
WHAT_IF = pa.schema([
    ("capture", pa.string()), ("conn", pa.int64()), ("flow", pa.int64()),
    ("api_key", pa.int32()), ("api_name", pa.string()), ("api_version", pa.int32()),
    ("direction", pa.string()), ("message", pa.string()),
    ("bytes", pa.int64()),              # the frame as captured
    ("fixed_bytes", pa.int64()),        # re-encoded in the final format (== bytes if lossless)
    ("packed_bytes", pa.int64()),
    ("upacked_bytes", pa.int64()),      # null: a negative int makes it unrepresentable
    ("best_bytes", pa.int64()),
    ("best_elements_bytes", pa.int64()),
    ("draft_a_bytes", pa.int64()),
    ("draft_b_bytes", pa.int64()),      # null: a tag beyond int16
])

#: the variants of the what_if table, in report order
VARIANTS = ("packed", "upacked", "best", "best_elements", "draft_a", "draft_b")

TABLES = {
    "flows": FLOWS, "api_stats": API_STATS, "clients": CLIENTS,
    "tagged_fields": TAGGED_FIELDS, "topics": TOPICS, "what_if": WHAT_IF,
}

#: sort keys that make every table's row order deterministic
SORT_KEYS = {
    "flows": ["capture", "conn", "request_ns", "response_ns", "correlation_id", "flow"],
    "api_stats": ["api_key", "api_version", "api_name"],
    "clients": ["client_id", "client_software_name", "client_software_version"],
    "tagged_fields": ["api_key", "api_version", "api_name", "direction", "message", "path",
                      "tag", "kind"],
    "topics": ["topic", "partition", "codec"],
    "what_if": ["capture", "conn", "flow", "direction"],
}
