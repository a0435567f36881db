"""The read side's shared mechanisms: the one payload read path (:mod:`.payloads`)."""

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
