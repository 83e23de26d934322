"""kinspect: a Kafka wire-traffic proxy and inspector.

The codec (:mod:`kinspect.codec`) is a sans-io library driven by Apache Kafka's
JSON message specs; the proxy (:mod:`kinspect.proxy`) owns sockets and the event
loop.
"""

__version__ = "0.1.0"
