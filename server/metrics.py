"""Reading a tritonserver's /metrics page (Prometheus text, parsed by prometheus_client):
`metric_samples` filters its samples, `read_metrics` fetches it, `dit_stall` says whether h3_dit
looks stuck. Used by server.process (TritonServer.h3_metrics, .failure), server.drain,
server.health and the benchmarks. Imports neither torch nor tritonclient.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from .stubs import DIT_MODEL

HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def metric_samples(text: str, name: str | None = None, **labels: str) -> list[Sample]:
    """The samples of a Prometheus text page (prometheus_client's parser), in page order: those
    named `name` (every name when None) whose labels include `labels`. A sample has ``name``,
    ``labels`` (dict) and ``value`` (float; the unit is the metric's, e.g. bytes or seconds).
    Raises ValueError for a line that is not Prometheus text."""
    return [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if (name is None or sample.name == name)
        and all(sample.labels.get(key) == value for key, value in labels.items())
    ]


def read_metrics(url: str, timeout_s: float = 2.0) -> str | None:
    """The text served at a metrics URL (``http://host:port/metrics``); None when nothing answers
    within timeout_s seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def dit_stall(text: str, stale_after: float, now: float) -> str | None:
    """Why the DiT looks stuck according to the /metrics `text` at unix time `now`, or None: an
    instance's heartbeat (h3_heartbeat_timestamp_seconds) older than ``stale_after`` s while its
    step runs (h3_execute_in_progress), or every instance's while requests wait in Triton's queue
    for h3_dit (nv_inference_pending_request_count; an idle instance does not iterate, so an old
    heartbeat alone is no stall). Used by TritonServer.failure and the container's health check."""
    beats = {s.labels.get("instance"): s.value for s in metric_samples(text, "h3_heartbeat_timestamp_seconds")}
    busy = {s.labels.get("instance"): s.value for s in metric_samples(text, "h3_execute_in_progress")}
    pending = sum(s.value for s in metric_samples(text, "nv_inference_pending_request_count", model=DIT_MODEL))
    ages = {instance: now - beat for instance, beat in beats.items() if beat}
    stalled = [instance for instance, age in ages.items() if age > stale_after and busy.get(instance)]
    if not stalled and pending and ages and all(age > stale_after for age in ages.values()):
        stalled = sorted(ages)  # requests wait for h3_dit, and no instance iterates
    if stalled:
        return f"the {DIT_MODEL} heartbeat of {stalled[0]} is {ages[stalled[0]]:.0f} s old with work pending"
    return None
