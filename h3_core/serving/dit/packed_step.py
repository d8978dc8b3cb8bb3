"""One packed step of the DiT's step loop (h3_core.serving.dit.step_loop): `PackedStep.launch` queues
the packed forward and each state's Euler update, `PackedStep.settle` reads the step's finiteness
flags (through a CUDA event on a GPU) and says, as plain data (`Settled`), what the step produced:
progress, previews, failures and the jobs whose last step it was. The step between the two is
`InFlight`. `result_events` are a finished job's results. The step loop sends the events and ends
the jobs; this part sends nothing and knows nothing of the registry."""

import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import Engine, GroupFailure
from h3_core.serving.dit.admission import WORKER_FAULTS
from h3_core.serving.dit.events import LiveJob, Progress, Result, Status
from h3_core.serving.dit.metrics import MetricsRecord
from h3_core.serving.dit.scheduler import Scheduler

# Steps overlap (the next one is launched before the previous one settles) while the last settled
# step took less than this. The overlap hides the host's work of a step (about 1.7 ms on the H200
# host at 128 rows: packing, Triton's calls; docs/benchmarks.md, issue 16), 3 % or more of a step
# below 50 ms; in exchange an announced newcomer or cancel may wait for the step launched behind
# the one in flight too. Longer steps settle before their boundary ends (lockstep), so after a
# long step no one waits a step more.
OVERLAP_MAX_STEP_S = 0.05

Velocities = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class InFlight:
    """A packed step launched and not yet settled (PackedStep.launch, PackedStep.settle).

    jobs: the jobs it advances, in pack order; steps: job -> the step it takes (1-based);
    finite: bool [states of jobs, in order] on the CPU, whether each state's velocity is
    finite; on a GPU it is filled by a copy queued right after the forward, and `copied` (a
    CUDA event recorded after that copy) tells when it may be read: waiting for the event
    waits for this step only, not for the next one queued behind it (reading a device tensor
    would). previews: job -> uint8 [Hl * p, Wl * p, 3] on the CPU, due with the step's progress; start:
    clock seconds when it was launched; computed: (outputs, rows) in its forward (the states
    whose step the step cache skips are not; (0, 0): no forward ran)."""

    jobs: list[LiveJob]
    steps: dict[LiveJob, int]
    finite: torch.Tensor | None
    copied: torch.cuda.Event | None
    previews: dict[LiveJob, torch.Tensor]
    start: float
    computed: tuple[int, int] = (0, 0)


@dataclass
class Settled:
    """What a settled step did for one job of its pack, in pack order (PackedStep.settle).

    job: the job; step: the step it took (1-based); failure: why it failed (a non-finite
    velocity or the device's error: "denoise step 2 failed: ..."; its step count is already
    undone), or None; progress: the Progress due to it after this step (a preview included), or
    None; last: whether it was the job's last step (its results are due)."""

    job: LiveJob
    step: int
    failure: str | None = None
    progress: Progress | None = None
    last: bool = False


class PackedStep:
    """Launch and settle one packed step at a time (see the module docstring).

    Owns the step in flight (`in_flight`: launched and not yet settled, held here between
    executes' steps), when the last step settled (`settled_at`, clock seconds) and how long it
    took (`last_step_s`, seconds; `overlaps` compares it with OVERLAP_MAX_STEP_S).

    Args:
        engine: the Engine whose denoise_step and update it calls.
        scheduler: the Scheduler a job leaves when its last step is launched.
        metrics: MetricsRecord or an object with its three methods (h3_step_seconds, h3_pack_*,
            h3_time_to_first_step_seconds, h3_cached_steps_total, h3_failures_total).
        clock: monotonic seconds.
    """

    def __init__(self, engine: Engine, scheduler: Scheduler, metrics: MetricsRecord, clock: Callable[[], float]):
        self.engine, self.scheduler, self.metrics, self.clock = engine, scheduler, metrics, clock
        self.in_flight: InFlight | None = None
        self.settled_at = -math.inf
        self.last_step_s = math.inf

    @property
    def overlaps(self) -> bool:
        """Whether the next step may be launched before the one in flight settles: the last settled
        step took less than OVERLAP_MAX_STEP_S."""
        return self.last_step_s < OVERLAP_MAX_STEP_S

    def hold(self, flight: InFlight) -> InFlight | None:
        """Keep `flight` in flight; returns the step that was in flight before (None if none)."""
        previous, self.in_flight = self.in_flight, flight
        return previous

    def take(self) -> InFlight | None:
        """The step in flight (None if none), no longer held here: the caller settles it."""
        flight, self.in_flight = self.in_flight, None
        return flight

    def launch(
        self, pack: list[LiveJob], forward: Callable[[list[LiveJob]], Velocities] | None = None
    ) -> tuple[InFlight, list[tuple[LiveJob, str]]]:
        """Launch one packed forward for `pack` and queue each state's Euler update after it. On
        a GPU nothing here waits for this step's forward (a preview due at this step is the
        exception); the pack's small host-to-device copies wait for the step queued before, so
        what runs beside a forward is the previous step's settling, the answer pass, the next
        boundary and the packing. A forward that raises is retried one job at a time, so only
        the offending job fails; a GroupFailure (the DiT's devices or workers lost,
        h3_core.diffusion.engine) fails every job left in the pack with its message instead,
        retrying none alone. A state's velocity that is not finite is applied as
        zero, so no non-finite latent enters a later forward before `settle` fails its job
        (with flex attention a masked NaN would reach the other documents). The forward holds
        only the states that compute (Engine.denoise_step; a state whose step its step cache
        skips takes it with its cached velocity, counted in h3_cached_steps_total; when all
        skip, no forward runs). A job whose last step this is leaves the scheduler now; its
        result follows when the step settles. `forward`: the packed forward (default
        `self.forward`; the step loop passes its own, which tests replace).
        Returns the step in flight, for `settle`, and the jobs that failed with their messages
        ("denoise step 1 failed: ..."), in pack order: the caller ends them (INTERNAL)."""
        forward = forward or self.forward
        start, pack, failures = self.clock(), list(pack), []
        outputs = sum(len(job.states) for job in pack)
        for job in pack:
            job.status = Status.RUNNING
            job.first_step_s = job.first_step_s or start
            job.largest_pack = max(job.largest_pack, outputs)
        try:
            velocities = forward(pack)
        except Exception as error:  # noqa: BLE001 - retried one job at a time below, unless the group failed
            velocities, group = [], error if isinstance(error, GroupFailure) else None
            for job in list(pack):
                try:
                    if group is not None:
                        raise group  # a solo retry would only restart the lost workers again
                    velocities += forward([job])
                except Exception as failure:  # noqa: BLE001 - the offender fails alone
                    if isinstance(failure, GroupFailure):
                        group = failure
                    self.metrics.increment("h3_failures_total")
                    failures.append((job, f"denoise step {job.step_index + 1} failed: {failure}"))
                    pack.remove(job)
        finite, copied = None, None
        if velocities:
            flags = torch.stack(
                [torch.isfinite(video).all() & torch.isfinite(audio).all() for video, audio in velocities]
            )
            finite = flags.to("cpu", non_blocking=True)  # into pinned memory on a GPU
            if flags.is_cuda:
                copied = torch.cuda.Event()
                copied.record(torch.cuda.current_stream(flags.device))
            velocities = [
                (torch.where(ok, video, 0.0), torch.where(ok, audio, 0.0))
                for ok, (video, audio) in zip(flags, velocities, strict=True)
            ]
        computing = [state for job in pack for state in job.states if state.step_rows]
        skipped = sum(len(job.states) for job in pack) - len(computing)  # pack: without the jobs that failed
        if skipped:
            self.metrics.increment("h3_cached_steps_total", skipped)
        flight = InFlight(
            pack,
            {job: job.step_index + 1 for job in pack},
            finite,
            copied,
            {},
            start,
            (len(computing), sum(state.rows for state in computing)),
        )
        velocity_of = iter(velocities)
        for job in pack:
            for state in job.states:
                velocity = next(velocity_of)
                if job.preview_every and state.output_index == 0 and (state.step_index + 1) % job.preview_every == 0:
                    flight.previews[job] = self.engine.preview_frame(state, velocity[0])
                self.engine.update(state, velocity)
            if job.finished:
                self.scheduler.remove(job)
        return flight, failures

    def settle(self, flight: InFlight | None, live: Mapping[object, LiveJob]) -> list[Settled] | None:
        """Settle `flight` (None: nothing to do): read its finiteness flags (on a GPU this waits
        for its forward, InFlight.copied), record the step's time and metrics, and say for each
        job of its pack that is still live (`live`: the live jobs by key; one that ended while
        the step was in flight is skipped) what is due, in pack order (`Settled`): a job with a
        non-finite velocity fails (its step is undone in its step count), the others get their
        progress and previews, and their results when it was their last step. Returns None when
        there was no step, else the list."""
        if flight is None:
            return None
        try:
            if flight.copied is not None:
                flight.copied.synchronize()
            finite = flight.finite.tolist() if flight.finite is not None else []
        except Exception as error:  # noqa: BLE001 - a device error surfaces here; the pack fails
            finite = [False] * sum(len(job.states) for job in flight.jobs)
            failure = f"{type(error).__name__}: {error}"
        else:
            failure = None
        end = self.clock()
        self.last_step_s = end - max(flight.start, self.settled_at)
        self.metrics.observe("h3_step_seconds", self.last_step_s)
        if flight.computed[0]:
            self.metrics.observe("h3_pack_requests", flight.computed[0])
            self.metrics.observe("h3_pack_rows", flight.computed[1])
        self.settled_at = end
        flags, settled = iter(finite), []
        for job in flight.jobs:
            ok, step = all([next(flags) for _ in job.states]), flight.steps[job]
            if live.get(job.key) is not job:
                continue  # ended while in flight (cancelled, past its deadline, draining)
            if not ok:
                for state in job.states:
                    state.step_index = step - 1
                self.metrics.increment("h3_failures_total")
                cause = failure or f"non-finite velocity for request {job.request_id}"
                settled.append(Settled(job, step, failure=f"denoise step {step} failed: {cause}"))
                continue
            if step == 1:
                self.metrics.observe("h3_time_to_first_step_seconds", end - job.arrival_s)
            job.last_step_s = end
            preview, progress = flight.previews.get(job), None
            if (
                job.progress_every and (step % job.progress_every == 0 or step == job.total_steps)
            ) or preview is not None:
                progress = Progress(job.handle, job.request_id, step, job.total_steps, 0, preview)
            settled.append(Settled(job, step, progress=progress, last=step == job.total_steps))
        return settled

    def forward(self, jobs: list[LiveJob]) -> Velocities:
        """engine.denoise_step for the jobs' states: velocities on the engine's device (on a GPU
        the forward may still run when this returns). Injected faults (see check_fault) act
        here, at a job's first step: "nan" makes its velocities non-finite (found by `settle`)."""
        for job in jobs:
            fault = job.fault if job.step_index == 0 else None
            if fault == "raise":
                raise RuntimeError(f"injected fault in the forward of request {job.request_id}")
            if fault in WORKER_FAULTS:
                self.engine.dit.inject_fault(fault.removeprefix("worker_"))
                if fault != "worker_raise":
                    job.fault = None  # exit and hang act once
            if fault is not None and fault.startswith("slow:"):
                job.fault = None  # slowed once
                time.sleep(float(fault[5:]))
        states = [state for job in jobs for state in job.states]
        velocities = self.engine.denoise_step(states)
        nan = {id(state) for job in jobs if job.fault == "nan" and job.step_index == 0 for state in job.states}
        return [
            (torch.full_like(video, float("nan")), audio) if id(state) in nan else (video, audio)
            for state, (video, audio) in zip(states, velocities, strict=True)
        ]


def result_events(job: LiveJob, quantization: str, silent_s: float) -> Iterator[Result]:
    """A finished job's results, one per output in order, the last one final: its final latents
    (video float32 [24, T_lat, Hl, Wl], audio float32 [2, 32, T_a], copied to the CPU as each is
    made) and INFO (sizes, seed, steps, the step cache's, `quantization` (h3_dit's setting), the
    job's conditioning, stage seconds and `silent_s`: seconds since its client's last response)."""
    for state in job.states:
        info = {
            "kind": "result",
            "request_id": job.request_id,
            "output_index": state.output_index,
            "num_outputs": len(job.states),
            "seed": state.seed,
            "height": state.height,
            "width": state.width,
            "num_frames_requested": state.num_frames_requested,
            "num_frames": state.num_frames,
            "num_inference_steps": state.total_steps,
            "largest_pack": job.largest_pack,
            "cache_threshold": state.cache.threshold,
            "skipped_steps": state.cache.skipped,
            "quantization": quantization,
            **job.conditioning,
            "stage_seconds": {
                "queue": job.first_step_s - job.arrival_s,
                "encode": job.encode_s,
                "denoise": job.last_step_s - job.first_step_s,
            },
            "silent_s": silent_s,
        }
        yield Result(
            job.handle,
            job.request_id,
            L.unpatchify_video(state.video_latents, state.layout).cpu(),
            L.audio_rows_to_latent(state.audio_latents, state.layout).cpu(),
            info,
            final=state is job.states[-1],
        )
