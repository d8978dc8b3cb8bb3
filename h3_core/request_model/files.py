"""A request's files: where they come from (read_uri: a data: URL, a multipart part, or an http(s)
URL fetched under a UrlPolicy) and what they are (media_type from the first bytes, media_seconds
with PyAV). Refusals are RequestErrors at the sender's field path."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from .request import RequestError

DATA_URL = re.compile(r"^data:[^,]*;base64,", re.IGNORECASE)
FETCH_CHUNK_BYTES = 64 * 1024  # fetch_url reads this much at a time, checking its limits between reads


@dataclass(frozen=True)
class UrlPolicy:
    """Which http(s) URIs a request may name: hosts (exact names) the operator allows (empty: no
    URL is fetched), whether private, loopback and link-local addresses may be reached, the largest
    download in bytes, the longest in seconds, and the most redirects (each checked again)."""

    hosts: frozenset[str] = frozenset()
    allow_private: bool = False
    max_bytes: int = 16 * 1024 * 1024
    timeout_s: float = 10.0
    max_redirects: int = 3


def data_url_bytes(path: str, uri: str) -> bytes | None:
    """The decoded bytes of a base64 data: URL ("data:image/png;base64,..."), None when `uri` is
    not one. Raises RequestError at `path` for bad base64. The one data: URL rule of the request
    formats and the Videos API's file fields."""
    match = DATA_URL.match(uri)
    if match is None:
        return None
    try:
        return base64.b64decode(uri[match.end() :], validate=True)
    except binascii.Error as error:
        raise RequestError(path, f"is not valid base64 after 'data:...;base64,': {error}") from None


def read_uri(path: str, uri, parts: Mapping[str, bytes], policy: UrlPolicy | None = None) -> bytes:
    """The bytes a condition's `uri` names: a base64 data: URL, "part:NAME" (the file part NAME of
    the same multipart body, in `parts`), or an http(s) URL of a host `policy` allows (fetch_url).
    Raises RequestError at `path` for file:// (never read), another scheme, a host not allowed,
    bad base64, a missing part, or no bytes."""
    if not isinstance(uri, str):
        raise RequestError(path, f"must be a string URI, got {type(uri).__name__}")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if DATA_URL.match(uri):
        data = data_url_bytes(path, uri)
    elif scheme == "part":
        name = uri[5:]
        if name not in parts:
            raise RequestError(path, f"names part {name!r}, which the body does not hold (parts: {sorted(parts)})")
        data = parts[name]
    elif scheme == "file":
        raise RequestError(path, "file:// URIs are refused: send a data: URL, a part:NAME file part or an allowed URL")
    elif scheme in ("http", "https"):
        data = fetch_url(path, uri, policy or UrlPolicy())
    else:
        raise RequestError(path, "must be a data: URL, part:NAME or an http(s) URL of an allowed host")
    if not isinstance(data, bytes) or not data:
        raise RequestError(path, "holds no bytes")
    return data


def _check_host(path: str, url: str, policy: UrlPolicy) -> None:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise RequestError(path, f"redirects to {url!r}: only http(s) URLs are fetched")
    if parsed.hostname not in policy.hosts:
        raise RequestError(path, f"host {parsed.hostname!r} is not allowed (allowed hosts: {sorted(policy.hosts)})")
    if not policy.allow_private:
        for info in socket.getaddrinfo(parsed.hostname, parsed.port or 80, proto=socket.IPPROTO_TCP):
            address = ipaddress.ip_address(info[4][0])
            if address.is_private or address.is_loopback or address.is_link_local or address.is_reserved:
                raise RequestError(path, f"host {parsed.hostname!r} resolves to {address}, a private address")


def fetch_url(path: str, url: str, policy: UrlPolicy) -> bytes:
    """The body of an http(s) GET of `url` under `policy`: the host (and every redirect's) in
    policy.hosts and not private unless allowed, at most policy.max_redirects redirects, at most
    policy.max_bytes bytes, within policy.timeout_s seconds in all. Raises RequestError at
    `path` otherwise, and for an HTTP error or a failed connection."""
    redirects = []

    class Redirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            redirects.append(newurl)
            if len(redirects) > policy.max_redirects:
                raise RequestError(path, f"more than {policy.max_redirects} redirects")
            _check_host(path, newurl, policy)
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    _check_host(path, url, policy)
    opener = urllib.request.build_opener(Redirects)
    deadline = time.monotonic() + policy.timeout_s
    data = bytearray()
    try:
        with opener.open(url, timeout=policy.timeout_s) as response:
            while chunk := response.read1(FETCH_CHUNK_BYTES):  # what has arrived, up to the chunk
                data += chunk
                if len(data) > policy.max_bytes:
                    raise RequestError(path, f"is larger than {policy.max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError
    except RequestError:
        raise
    except OSError as error:  # URLError, HTTPError, timeouts
        if isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError):
            raise RequestError(path, f"took longer than {policy.timeout_s:g} s to download") from None
        raise RequestError(path, f"could not be fetched: {error}") from None
    return bytes(data)


# A file's kind from its first bytes: PNG, JPEG, WebP images; WAV (RIFF), FLAC, MP3 (an ID3 tag or
# an MPEG frame sync) audio; MP4 (ISO BMFF ftyp box) video.
SIGNATURES = (
    (re.compile(rb"^\x89PNG\r\n\x1a\n"), "image/png"),
    (re.compile(rb"^\xff\xd8\xff"), "image/jpeg"),
    (re.compile(rb"^RIFF....WEBP", re.DOTALL), "image/webp"),
    (re.compile(rb"^RIFF....WAVE", re.DOTALL), "audio/wav"),
    (re.compile(rb"^fLaC"), "audio/flac"),
    (re.compile(rb"^(ID3|\xff[\xe0-\xff])"), "audio/mpeg"),
    (re.compile(rb"^....ftyp", re.DOTALL), "video/mp4"),
)
UNKNOWN_MEDIA_TYPE = "application/octet-stream"


def media_type(data: bytes) -> str:
    """The media type of a file from its first bytes (SIGNATURES), else UNKNOWN_MEDIA_TYPE."""
    return next((kind for pattern, kind in SIGNATURES if pattern.match(data)), UNKNOWN_MEDIA_TYPE)


def media_seconds(data: bytes, path: str) -> float:
    """The duration in seconds of an audio or video file (PyAV reads its container). Raises
    RequestError at `path` when it cannot be read."""
    import io

    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if container.duration is None:
                raise ValueError("no duration")
            return container.duration / av.time_base
    except (av.FFmpegError, ValueError) as error:
        raise RequestError(path, f"has no readable duration: {error}") from None
