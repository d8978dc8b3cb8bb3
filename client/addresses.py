"""Where a client's requests go: check_url (host:port, or several servers as dns:///host:port or
ipv4: / ipv6: lists), server_addresses (the servers behind a url, for cancels by id) and
channel_args (gRPC's round_robin policy for several servers).
"""

from __future__ import annotations

import socket

import tritonclient.grpc as grpcclient

from .errors import H3Error

# Targets served by several servers (gRPC name syntax): a name resolved to every address, or a list.
BALANCED_PREFIXES = ("dns:///", "ipv4:", "ipv6:")


def check_url(url: str) -> str:
    """Return `url` when it is host:port (Triton's gRPC endpoint, no scheme), or a target of several
    servers: dns:///host:port (every address the name resolves to) or ipv4: / ipv6: followed by
    a comma list of address:port; raise ValueError naming it otherwise."""
    if url.startswith("dns:///"):
        parts = [url[len("dns:///") :]]
    elif url.startswith(("ipv4:", "ipv6:")):
        parts = url[len("ipv4:") :].split(",")
    elif "://" in url:
        raise ValueError(f"url must be host:port without a scheme, got {url!r}")
    else:
        parts = [url]
    for part in parts:
        port = part.rpartition(":")[2]
        if not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"url must be host:port with a port in 1..65535, got {url!r}")
    return url


def server_addresses(url: str) -> list[str]:
    """The servers behind a checked url, each as host:port: the url itself for host:port, each
    address of an ipv4: / ipv6: list, every address a dns:///host:port name resolves to now
    (getaddrinfo's order, no repeats; IPv6 as [addr]:port). Raises H3Error UNAVAILABLE when the
    name does not resolve."""
    if url.startswith("dns:///"):
        host, _, port = url[len("dns:///") :].rpartition(":")
        try:
            found = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            raise H3Error("UNAVAILABLE", f"cannot resolve {host!r} of {url}: {error}") from None
        ips = dict.fromkeys(address[4][0] for address in found)
        return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in ips]
    if url.startswith(("ipv4:", "ipv6:")):
        return url[len("ipv4:") :].split(",")
    return [url]


def channel_args(url: str) -> list[tuple[str, object]]:
    """The gRPC channel arguments for url: tritonclient's message size limits, plus the
    round_robin load-balancing policy for a target of several servers (BALANCED_PREFIXES)."""
    limits = [
        ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
    ]
    return limits + ([("grpc.lb_policy_name", "round_robin")] if url.startswith(BALANCED_PREFIXES) else [])
