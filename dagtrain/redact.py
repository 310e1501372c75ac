"""Credentials out of what dagtrain records: ``url(s)`` is ``s`` without a URL's user and
password, and with its query string replaced by ``***``, so that a tracking URI with a
password, or a presigned ``data.source`` URL, can be shown, logged and written where
people read (XComs, task logs, the DAG's description, manifests, the registry,
MLflow) without what grants access. Anything that is not such a URL is returned as it
is. Standard library only: a base module."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["url"]


def url(s: str) -> str:
    if not isinstance(s, str) or "://" not in s:
        return s
    try:
        parts = urlsplit(s)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # not a URL after all (an odd port, a bracket): nothing to keep
        return s.split("://", 1)[0] + "://***"
    netloc = parts.netloc
    if "@" in netloc:  # dropped, not starred: the result stays a link a browser follows
        netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
