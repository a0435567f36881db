"""Secrets masked out of URLs and messages (userinfo, secret-looking query parameters)."""

from __future__ import annotations

import re

__all__ = ["redact"]

_SECRET_QUERY = re.compile(r"(?i)(secret|token|key|password|signature|credential)[^=&]*=[^&]*")
# Userinfo of any URL in the text (a library's message quotes the endpoint URL it used).
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s\"'<>]*@")


def redact(url: str) -> str:
    """Mask userinfo and secret-looking query parameters of URLs in ``url`` (a URL, or a message
    quoting some) for messages and reprs."""
    url = _USERINFO.sub(r"\1***@", url)
    return _SECRET_QUERY.sub(lambda m: m.group(0).split("=", 1)[0] + "=***", url)
