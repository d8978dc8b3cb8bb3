"""The container's health check (the Dockerfile's HEALTHCHECK): healthy when tritonserver answers
ready (/v2/health/ready), every model process its configuration asks for runs (`missing_stub`:
Triton 2.51 keeps ready at 200 when a model's stub dies, and then every request fails or hangs),
and the DiT's heartbeat is on /metrics and not stalled (h3_heartbeat_timestamp_seconds, judged by
server.metrics.dit_stall, the rule --supervise uses).

    python -m server.health [--http URL] [--metrics URL] [--stale-after SECONDS]

Exit status 0 when healthy, else 1 after one line on stderr saying why. Importing this module
never imports torch.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from .environment import DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT
from .metrics import dit_stall, metric_samples, read_metrics
from .process import DEFAULT_STALE_AFTER_S
from .stubs import stub_pids, tritonserver_pid

HEARTBEAT = "h3_heartbeat_timestamp_seconds"


def expected_stubs(http_url: str, timeout_s: float = 2.0) -> collections.Counter:
    """Instance name -> how many stubs of that name the server's python-backend models run, read
    from Triton's model configurations (/v2/repository/index, /v2/models/NAME/config): each
    instance group's `count` instances, `NAME_k`, on each of its `gpus` (Triton names them alike
    on every GPU). Raises OSError or ValueError when the server does not answer as Triton."""
    request = urllib.request.Request(f"{http_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        models = [model["name"] for model in json.load(response) if model.get("state") == "READY"]
    expected = collections.Counter()
    for name in models:
        with urllib.request.urlopen(f"{http_url}/v2/models/{name}/config", timeout=timeout_s) as response:
            config = json.load(response)
        if config.get("backend") != "python":
            continue  # the ensemble runs in tritonserver itself
        for group in config.get("instance_group", []):
            for k in range(int(group["count"])):
                expected[f"{group['name']}_{k}"] += max(1, len(group.get("gpus") or []))
    return expected


def missing_stub(http_url: str, timeout_s: float = 2.0) -> str | None:
    """Which model process of the tritonserver serving `http_url` on this host is gone, or None
    (also when no such tritonserver runs here, e.g. a check from another host, or the server's
    configuration cannot be read: the ready and heartbeat checks still apply)."""
    port = urllib.parse.urlsplit(http_url).port
    pid = None if port is None else tritonserver_pid(port)
    if pid is None:
        return None
    try:
        expected = expected_stubs(http_url, timeout_s)
    except (OSError, ValueError, KeyError):
        return None
    running = collections.Counter(stub_pids(pid).values())
    for instance, count in sorted(expected.items()):
        if running[instance] < count:
            return (
                f"the model process {instance} is gone ({running[instance]} of {count} running): Triton does not "
                "restart it and every request to its model fails"
            )
    return None


def problem(
    http_url: str,
    metrics_url: str,
    stale_after: float = DEFAULT_STALE_AFTER_S,
    now: float | None = None,
    timeout_s: float = 2.0,
) -> str | None:
    """Why the server at `http_url` (http://host:port) / `metrics_url` (http://host:port/metrics)
    is unhealthy at unix time `now` (default: the clock), or None: not ready (any answer but 200,
    or none within timeout_s seconds), a model process gone (missing_stub), /metrics unreachable,
    no h3_dit heartbeat on it, or a stall (server.metrics.dit_stall with stale_after seconds)."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2/health/ready", timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError as error:
        return f"{http_url}/v2/health/ready unreachable: {error}"
    if status != 200:
        return f"{http_url}/v2/health/ready answered {status}: not ready"
    gone = missing_stub(http_url, timeout_s)
    if gone is not None:
        return gone
    text = read_metrics(metrics_url, timeout_s)
    if text is None:
        return f"{metrics_url} unreachable"
    if not metric_samples(text, HEARTBEAT):
        return f"no {HEARTBEAT} on {metrics_url}: the h3_dit step loop publishes none"
    return dit_stall(text, stale_after, time.time() if now is None else now)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m server.health", description=__doc__.split("\n\n")[0])
    parser.add_argument("--http", default=f"http://127.0.0.1:{DEFAULT_HTTP_PORT}", help="default: %(default)s")
    parser.add_argument(
        "--metrics", default=f"http://127.0.0.1:{DEFAULT_METRICS_PORT}/metrics", help="default: %(default)s"
    )
    parser.add_argument(
        "--stale-after",
        type=float,
        default=DEFAULT_STALE_AFTER_S,
        metavar="SECONDS",
        help="heartbeat age that counts as a stalled DiT; must exceed the longest execute() "
        "(default: %(default)s, as server.launch --stale-after)",
    )
    args = parser.parse_args(argv)
    reason = problem(args.http, args.metrics, args.stale_after)
    if reason is not None:
        print(f"unhealthy: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
