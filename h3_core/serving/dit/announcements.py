"""The registry's announcements as the DiT's step loop counts them (`Announcements`): requests
headed for the DiT (h3_encoder announces each request it passes on, the registry each cancel it
flags for another instance; h3_core.serving.shared.registry). An execute takes another step only
while none is on its way (`Announcements.quiet`), so an announced newcomer or control request waits
at most the step in flight (h3_core.serving.dit.step_loop, step 6 of its docstring)."""

import logging
from collections.abc import Container

from h3_core.serving.dit.events import Arrival
from h3_core.serving.shared.registry import Registry

log = logging.getLogger("h3_dit")

# Seconds an announced request may take from its announcement (h3_core.serving.shared.registry) to Triton's queue
# for h3_dit: the ensemble's hand-over from h3_encoder (2.6 ms for 4 MB of text embeddings on the
# 2-core CPU, docs/triton_2.51_notes.md), or h3_vae's call with a cancel; with a wide margin.
ANNOUNCED_TRANSIT_S = 0.1


class Announcements:
    """One DiT instance's count of the registry's announcements.

    Owns: `accounted` (announcements that arrived here or were written off), `at_execute_start`
    (the registry's count when this execute started) and `in_transit` (whether an announced
    request may still be on its way to the next execute).

    Args:
        registry: the Registry the server's models share (Registry.announcements,
            Registry.seconds_since_announcement are read; nothing is written).
    """

    def __init__(self, registry: Registry):
        self.registry = registry
        self.accounted = registry.announcements()
        self.at_execute_start = self.accounted
        self.in_transit = False

    def note(self, arrivals: list[Arrival], live_keys: Container) -> None:
        """At the start of an execute: record the registry's count of announcements and whether an
        announced request may still be on its way. Triton hands an execute the requests it holds
        when the execute starts; one announced just before that may reach Triton just after, and
        then waits for the next execute: this one takes one step only. Announcements are matched
        with this execute's newcomers and control requests (`arrivals` that are new or whose key
        is not in `live_keys`, fillers excepted); those left unmatched ANNOUNCED_TRANSIT_S after
        the last announcement went to another DiT instance or never came (refused on the way, a
        cancel flag another instance set in the registry) and are written off. A registry that
        cannot be read holds this execute to one step (logged)."""
        try:
            count = self.registry.announcements()
            in_transit = self.registry.seconds_since_announcement() < ANNOUNCED_TRANSIT_S
        except Exception:  # noqa: BLE001 - one step, then read again
            log.exception("the registry's announcements could not be read; this execute takes one step")
            self.in_transit = True
            return
        arrived = sum(
            1 for arrival in arrivals if arrival.key not in (0, "") and (arrival.new or arrival.key not in live_keys)
        )
        self.at_execute_start = count
        self.in_transit = count - self.accounted > arrived and in_transit
        self.accounted = self.accounted + arrived if self.in_transit else count

    def quiet(self) -> bool:
        """Whether nothing is headed for the DiT: no announced request may still be on its way to
        the next execute and no announcement came since this execute started (one pread,
        Registry.announcements). False when the registry cannot be read (logged)."""
        if self.in_transit:
            return False
        try:
            return self.registry.announcements() == self.at_execute_start
        except Exception:  # noqa: BLE001 - the execute ends; read again at the next one
            log.exception("the registry's announcements could not be read")
            return False
