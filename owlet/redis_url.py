"""A Redis URL as Owlet prints it: its password never reaches a terminal or a log."""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def without_password(url: str) -> str:
    """``url`` with its password (``redis://user:secret@host``, or ``redis://:secret@host``) shown as ``***``;
    unchanged when it has none or cannot be read as a URL."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 address goes back in brackets
            host = f"[{host}]"
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    except ValueError:
        return url.split("@", 1)[-1] if "@" in url else url
    return urlunsplit(parts._replace(netloc=netloc))
