"""The read path shared by the loader and the lifecycle commands: payloads, epoch cache."""

from .payloads import (
    CORRUPT_AT_REST,
    TRANSPORT,
    PayloadRead,
    PayloadRef,
    fetch_payload,
    read_payloads,
)

__all__ = [
    "CORRUPT_AT_REST",
    "TRANSPORT",
    "PayloadRead",
    "PayloadRef",
    "fetch_payload",
    "read_payloads",
]
