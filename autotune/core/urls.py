"""Storage URLs as they may be printed: a password never reaches a terminal, a log or a shared file."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode

# "scheme://[user]:password@". The password runs to the *last* '@' (SQLAlchemy's own URL grammar
# reads it as [^@]*), so a password holding '/', '?' or '#' is still masked whole. Masking too much
# of an odd URL is acceptable; showing part of a password is not.
_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@]*):(?P<pw>.*)@(?P<tail>[^@]*)$", re.S)
_SECRET_PARAMS = {"password", "passwd", "pwd", "secret", "token"}


def mask_url(url: str) -> str:
    """`postgresql://u:secret@h/db` -> `postgresql://u:***@h/db`. Paths and password-less URLs are unchanged."""
    if "://" not in url:
        return url  # a bare path (e.g. the default JournalFile studies.db) holds no secret
    out = url
    m = _USERINFO.match(out)
    if m is not None:
        out = f"{m['head']}:***@{m['tail']}"
    # Some drivers take the password as a query parameter (`?password=...`): mask that too.
    base, sep, query = out.partition("?")
    if sep:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
            masked = [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs]
            out = base + "?" + urlencode(masked, safe="*/:@")
    return out
