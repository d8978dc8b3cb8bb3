"""The Kubernetes preStop hook (deploy/k8s): wait until the DiT holds no request and h3_vae no
decode, so that a pod being stopped lets its requests finish, denoised results included, before
the launcher's own drain, on the SIGTERM that follows, ends whatever is left with CANCELLED.

    python -m server.drain [--metrics URL] [--timeout SECONDS]

Held requests, read from /metrics every second: h3_active_requests + h3_waiting_requests of
every h3_dit instance, Triton's backlog in front of h3_dit (nv_inference_pending_request_count)
and h3_vae's open decodes (h3_vae_decodes, queued and running).
While it waits the pod is out of its Services' endpoints, but a client whose channel is already
connected can still send requests, which are admitted. Exit status 0 once nothing is held (or
nothing answers on /metrics: no server to wait for), 1 after `--timeout` seconds with requests
still held; one line on stderr says which. Importing this module never imports torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from .environment import DEFAULT_METRICS_PORT
from .metrics import metric_samples, read_metrics
from .stubs import DIT_MODEL

POLL_S = 1.0


def held_requests(text: str) -> int:
    """The requests the server holds according to the /metrics `text`: h3_active_requests +
    h3_waiting_requests summed over the DiT's instances, h3_vae_decodes (results queued for or
    in their decode), plus nv_inference_pending_request_count of h3_dit. Raises ValueError for
    text that is not Prometheus text."""
    names = ("h3_active_requests", "h3_waiting_requests", "h3_vae_decodes")
    held = sum(s.value for name in names for s in metric_samples(text, name))
    held += sum(s.value for s in metric_samples(text, "nv_inference_pending_request_count", model=DIT_MODEL))
    return int(held)


def wait_until_idle(metrics_url: str, timeout_s: float) -> tuple[bool, str]:
    """Poll `metrics_url` every POLL_S seconds until the DiT holds no request or `timeout_s`
    seconds have passed. Returns (idle, why) with why one line for the log."""
    start = time.monotonic()
    while True:
        text = read_metrics(metrics_url)
        if text is None:
            return True, f"{metrics_url} does not answer: no server to wait for"
        held = held_requests(text)
        waited = time.monotonic() - start
        if held == 0:
            return True, f"the DiT holds no request and h3_vae no decode after {waited:.0f} s"
        if waited >= timeout_s:
            return False, f"the DiT and h3_vae still hold {held} requests after {timeout_s:g} s"
        time.sleep(POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m server.drain", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--metrics", default=f"http://127.0.0.1:{DEFAULT_METRICS_PORT}/metrics", help="default: %(default)s"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait; keep terminationGracePeriodSeconds above it + 8 s (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    idle, why = wait_until_idle(args.metrics, args.timeout)
    print(f"server.drain: {why}", file=sys.stderr)
    return 0 if idle else 1


if __name__ == "__main__":
    sys.exit(main())
