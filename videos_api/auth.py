"""API keys of the Videos API and who may see which job.

The key file (`--api-key-file`) is UTF-8 text, one key a line: `KEY`, or `KEY admin` for a key
that sees every job. Fields are separated by whitespace, so a key holds none (any other UTF-8
character is allowed: Cyrillic, accents, emoji); blank lines are skipped. A client sends
`Authorization: Bearer KEY` (one or more spaces after Bearer), the key in one of three forms,
compared as bytes in constant time:

- its UTF-8 bytes (curl, the SDKs, most HTTP clients);
- its Latin-1 bytes, for a key whose characters all lie in Latin-1 (a browser's fetch sends a
  header's characters U+0000..U+00FF as one byte each: `café` as 63 61 66 E9);
- ENCODED_PREFIX followed by its UTF-8 bytes percent-encoded (RFC 8187's ext-value form:
  `Bearer UTF-8''%D0%BA%D0%BB%D1%8E%D1%87` for `ключ`): what the page sends for a key outside
  Latin-1, which a browser cannot put in a header.

Ownership: a job belongs to the key that created it; the store keeps the key's SHA-256 (hex),
never the key. A key sees, reads, cancels and deletes only its own jobs (another's answer 404 as
if they did not exist); an admin key sees every job, also those owned by no key (made before keys
were configured, or by a store older than ownership). Without keys everyone sees everything.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from .fields import ApiError

ADMIN = "admin"  # the marker after a key in the key file
ENCODED_PREFIX = b"UTF-8''"  # a key sent percent-encoded (module docstring)


@dataclass(frozen=True)
class Caller:
    """Who sends a request: `owner`, the SHA-256 (hex) of the caller's key (None without keys),
    and `admin`: sees every job."""

    owner: str | None
    admin: bool

    def sees(self, job: dict) -> bool:
        """Whether this caller may see `job` (a stored job with its `owner`)."""
        return self.admin or job["owner"] == self.owner


ANYONE = Caller(owner=None, admin=True)  # every caller when no keys are configured


def owner_of(key: bytes) -> str:
    """The owner recorded for jobs made with `key` (its UTF-8 bytes): SHA-256, 64 hex digits."""
    return hashlib.sha256(key).hexdigest()


def parse_key_file(text: bytes) -> dict[str, bool]:
    """The keys of a key file's bytes (module docstring), each mapped to whether it is an admin
    key. Raises ValueError naming the line for bytes that are not UTF-8, a line with more than
    `KEY admin`, or a key listed twice."""
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ValueError(f"the key file is not UTF-8 text: {error}") from None
    keys: dict[str, bool] = {}
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) > 2 or (len(fields) == 2 and fields[1] != ADMIN):
            raise ValueError(f"line {number}: expected KEY or 'KEY {ADMIN}' (a key holds no whitespace)")
        if fields[0] in keys:
            raise ValueError(f"line {number}: the key is listed twice")
        keys[fields[0]] = len(fields) == 2
    forms = [sent_as for sent_as, _, _ in Keys(keys).forms]
    if len(set(forms)) < len(forms):
        raise ValueError("two keys are the same bytes when one is sent as Latin-1 (e.g. 'é' and 'Ã©'): change one")
    return keys


class Keys:
    """The configured keys (key -> admin); empty: no authentication, every caller is ANYONE.
    `forms`: [(bytes a key may be sent as: UTF-8, Latin-1 where it fits, its UTF-8 bytes, admin)]."""

    def __init__(self, keys: Mapping[str, bool]):
        self.forms = []  # (the bytes of a form a key may come in, the key's UTF-8 bytes, admin)
        for key, admin in keys.items():
            utf8 = key.encode("utf-8")
            self.forms.append((utf8, utf8, admin))
            if key.isascii() or max(map(ord, key)) > 0xFF:
                continue
            self.forms.append((key.encode("latin-1"), utf8, admin))

    def caller(self, authorization: str | None) -> Caller:
        """The Caller of a request's Authorization header (as Starlette gives it: its bytes
        decoded as latin-1; the key in a form of the module docstring). Raises ApiError 401
        UNAUTHORIZED (WWW-Authenticate: Bearer) when keys are configured and it is missing, not
        Bearer, or not a configured key."""
        if not self.forms:
            return ANYONE
        scheme, _, presented = (authorization or "").encode("latin-1").partition(b" ")
        presented = presented.lstrip(b" ")  # RFC 9110 11.4: 1*SP after the scheme
        sent = [(presented, True)]  # (bytes, whether a key's Latin-1 form may match them)
        if presented.startswith(ENCODED_PREFIX):
            sent.append((unquote_to_bytes(presented[len(ENCODED_PREFIX) :]), False))  # UTF-8 only
        found = None
        for form, any_form in sent:  # every key and form compared: the time does not tell which matched
            for sent_as, key, admin in self.forms:
                if hmac.compare_digest(form, sent_as) and (any_form or sent_as == key):
                    found = Caller(owner_of(key), admin)
        if scheme.lower() != b"bearer" or found is None:
            raise ApiError(
                401,
                "UNAUTHORIZED",
                "a valid API key is required: send Authorization: Bearer <key>",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return found
