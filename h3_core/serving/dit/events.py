"""What the step loop (h3_core.serving.dit.step_loop) takes and gives, as plain data: an `Arrival` per
live Triton request in, the `Event`s to send out (Progress, Result, Ended, Refused, CancelAnswer,
Heartbeat), and the `LiveJob` of a request in the loop with its lifecycle `Status`. h3_dit turns
Triton requests into Arrivals and Events into responses."""

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import torch

from h3_core.serving.dit import scheduler


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class Arrival:
    """One live Triton request as h3_dit's execute() sees it.

    handle: the adapter's object for the request (opaque here; events carry it back).
    key: Triton's correlation (sequence) id; 0 or "" marks a filler request (skipped).
    request_id: Triton's request id ("" when the client sent none).
    new: the START flag (first delivery); sequence_end: the END flag (refused).
    request_json: REQUEST's elements (bytes); text_embeds: TEXT_EMBEDS float32 [1, L, text_dim];
    condition_latents: CONDITION_LATENTS float32 [1, N] (None or N = 0 without conditions);
    parameters_json: Triton's JSON text of the request parameters.
    is_cancelled: whether the client cancelled the request natively (gRPC cancellation of a
    direct call); called only for the request of a live job at its step boundary, never after
    the request's final response (asking Triton 2.51 then crashes the server)."""

    handle: Any
    key: object
    request_id: str = ""
    new: bool = False
    sequence_end: bool = False
    request_json: list = field(default_factory=list)
    text_embeds: np.ndarray | None = None
    condition_latents: np.ndarray | None = None
    parameters_json: str = "{}"
    is_cancelled: Callable[[], bool] = lambda: False


@dataclass
class Progress:
    """A progress response: step of total after this step, queue_position (0 = in the
    pack), preview uint8 [Hl * p, Wl * p, 3] (Engine.preview_frame) when one is due."""

    handle: Any
    request_id: str
    step: int
    total: int
    queue_position: int
    preview: torch.Tensor | None = None


@dataclass
class Result:
    """One output's final latents: video float32 [24, T_lat, Hl, Wl], audio float32 [2, 32, T_a],
    on the CPU (copied there once, from the engine's device, when the result is sent); info is
    the INFO JSON; final marks the request's last response."""

    handle: Any
    request_id: str
    video_latent: torch.Tensor
    audio_latent: torch.Tensor
    info: dict
    final: bool


@dataclass
class Ended:
    """The final response of a started request that ends early (code CANCELLED or INTERNAL) at
    step of total: sent as a normal response with INFO {"kind": "error"} (see h3_dit)."""

    handle: Any
    request_id: str
    code: str
    message: str
    step: int = 0
    total: int = 0


@dataclass
class Refused:
    """An error response (code INVALID_ARG, UNAVAILABLE or INTERNAL) to a request that never
    started; final."""

    handle: Any
    code: str
    message: str


@dataclass
class CancelAnswer:
    """The final answer to a cancel-by-id control request: state is one of CANCEL_STATES."""

    handle: Any
    request_id: str
    state: str


@dataclass
class Heartbeat:
    """Sent to a live request that got no response for DitSettings.heartbeat_s seconds (at the
    next answer pass, StepLoop.answer): through the ensemble it reaches h3_vae, which, when
    Triton marks that request cancelled (its client is gone), cancels the request by id.
    Without it a request that asked for no progress sends nothing until its result, and a gone
    client would be noticed only then (Triton 2.51 tells h3_dit nothing; docs/reliability.md)."""

    handle: Any
    request_id: str


Event = Progress | Result | Ended | Refused | CancelAnswer | Heartbeat
EVENT_NAMES = {  # how log lines and error messages name each kind of event
    Progress: "progress response",
    Result: "result",
    Ended: "final response",
    Refused: "refusal",
    CancelAnswer: "cancel answer",
    Heartbeat: "heartbeat",
}
Send = Callable[[Event], None]  # what iterate() hands each event to


@dataclass(eq=False)
class LiveJob(scheduler.Job):
    """A request in the step loop: the scheduler's Job (key, request_id, states, priority,
    arrival_s, first_step_s) plus its lifecycle. Times are seconds on the loop's clock."""

    responded_s: float = 0.0  # when the last response (progress, heartbeat, result) went to it; its arrival before
    handle: Any = None  # the adapter's request object, refreshed every execute
    is_cancelled: Callable[[], bool] = lambda: False  # its Arrival's, refreshed every execute
    status: Status = Status.WAITING
    progress_every: int = 0
    preview_every: int = 0
    deadline_s: float | None = None
    deadline_at: float | None = None  # clock time after which the job is cancelled
    encode_s: float = 0.0
    fault: str | None = None  # inject_fault (tests only)
    last_step_s: float | None = None
    largest_pack: int = 0  # most request outputs in one of its forwards
    conditioning: dict = field(
        default_factory=dict
    )  # echoed in its results' INFO: task, flow shifts, keyframes, geometry
    queue_position: int | None = None  # last reported position (progress events)
    absent: int = 0  # executes in a row without delivery
    cancel_reason: str | None = None
