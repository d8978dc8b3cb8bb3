"""One packed step of the DiT's step loop (h3_core.serving.dit.step_loop): `launch` queues the packed
forward and each state's Euler update, `settle` reads the step's finiteness flags (through a CUDA
event on a GPU) and sends what the step produced: progress, previews and the results of the jobs
whose last step it was. The step between the two is `InFlight`. `PackedStep` is a base class of
StepLoop and reads the loop's engine, settings, scheduler, metrics, clock and jobs."""

import logging
import time
from dataclasses import dataclass

import torch

from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import GroupFailure
from h3_core.serving.dit.admission import WORKER_FAULTS
from h3_core.serving.dit.events import LiveJob, Progress, Result, Send, Status

log = logging.getLogger("h3_dit")


@dataclass
class InFlight:
    """A packed step launched and not yet settled (StepLoop.launch, StepLoop.settle).

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


class PackedStep:
    """launch / settle / forward / results of StepLoop (see the module docstring)."""

    def launch(self, pack: list[LiveJob], send: Send) -> InFlight:
        """Launch one packed forward for `pack` and queue each state's Euler update after it. On
        a GPU nothing here waits for this step's forward (a preview due at this step is the
        exception); the pack's small host-to-device copies wait for the step queued before, so
        what runs beside a forward is the previous step's settling, the answer pass, the next
        boundary and the packing. A forward that raises is retried one job at a time, so only
        the offending job fails (INTERNAL); a GroupFailure (the DiT's devices or workers lost,
        h3_core.diffusion.engine) fails every job left in the pack with its message instead,
        retrying none alone. A state's velocity that is not finite is applied as
        zero, so no non-finite latent enters a later forward before `settle` fails its job
        (with flex attention a masked NaN would reach the other documents). The forward holds
        only the states that compute (Engine.denoise_step; a state whose step its step cache
        skips takes it with its cached velocity, counted in h3_cached_steps_total; when all
        skip, no forward runs). A job whose last step this is leaves the scheduler now; its
        result follows when the step settles.
        Returns the step in flight, for `settle`."""
        start, pack = self.clock(), list(pack)
        outputs = sum(len(job.states) for job in pack)
        for job in pack:
            job.status = Status.RUNNING
            job.first_step_s = job.first_step_s or start
            job.largest_pack = max(job.largest_pack, outputs)
        try:
            velocities = self.forward(pack)
        except Exception as error:  # noqa: BLE001 - retried one job at a time below, unless the group failed
            velocities, group = [], error if isinstance(error, GroupFailure) else None
            for job in list(pack):
                try:
                    if group is not None:
                        raise group  # a solo retry would only restart the lost workers again
                    velocities += self.forward([job])
                except Exception as failure:  # noqa: BLE001 - the offender fails alone
                    if isinstance(failure, GroupFailure):
                        group = failure
                    self.metrics.increment("h3_failures_total")
                    message = f"denoise step {job.step_index + 1} failed: {failure}"
                    self.end(job, send, Status.FAILED, "INTERNAL", message)
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
        return flight

    def settle(self, flight: InFlight | None, send: Send) -> bool:
        """Settle `flight` (None: nothing to do): read its finiteness flags (on a GPU this waits
        for its forward, InFlight.copied), end each job with a non-finite velocity (INTERNAL;
        the step is undone in its step count), then send progress, previews and the results of
        jobs whose last step it was (a result's copy to the CPU waits for the step queued
        behind, if any). Jobs that ended while it was in flight are skipped. Returns whether a
        step was settled."""
        if flight is None:
            return False
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
        flags = iter(finite)
        for job in flight.jobs:
            ok, step = all([next(flags) for _ in job.states]), flight.steps[job]
            if self.jobs.get(job.key) is not job:
                continue  # ended while in flight (cancelled, past its deadline, draining)
            if not ok:
                for state in job.states:
                    state.step_index = step - 1
                self.metrics.increment("h3_failures_total")
                cause = failure or f"non-finite velocity for request {job.request_id}"
                self.end(job, send, Status.FAILED, "INTERNAL", f"denoise step {step} failed: {cause}")
                continue
            if step == 1:
                self.metrics.observe("h3_time_to_first_step_seconds", end - job.arrival_s)
            job.last_step_s = end
            preview = flight.previews.get(job)
            if (
                job.progress_every and (step % job.progress_every == 0 or step == job.total_steps)
            ) or preview is not None:
                send(Progress(job.handle, job.request_id, step, job.total_steps, 0, preview))
            if step == job.total_steps and self.jobs.get(job.key) is job:
                self.results(job, send)
        return True

    def forward(self, jobs: list[LiveJob]) -> list[tuple[torch.Tensor, torch.Tensor]]:
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

    # -- endings -----------------------------------------------------------------------------

    def results(self, job: LiveJob, send: Send) -> None:
        """One Result per output, with its final latents; the last one is final. A cancel that
        reached the registry during the last step wins: the request ends with CANCELLED (its
        canceller was told "cancelled")."""
        try:
            cancelled = self.registry.finish(job.request_id, self.load(leaving=1))
        except Exception as error:  # noqa: BLE001 - the request fails alone
            log.exception("request %s: the registry could not record its end", job.request_id)
            self.metrics.increment("h3_failures_total")
            self.end(
                job,
                send,
                Status.FAILED,
                "INTERNAL",
                f"request {job.request_id} could not be recorded as finished: {type(error).__name__}: {error}",
            )
            return
        if cancelled:
            self.metrics.increment("h3_cancellations_total")
            self.end(
                job,
                send,
                Status.CANCELLED,
                "CANCELLED",
                f"request {job.request_id} cancelled by request at step {job.step_index} of {job.total_steps}",
            )
            return
        silent_s = self.clock() - job.responded_s  # since the client's last response (h3_vae's keep-alives)
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
                "quantization": self.settings.quantization,
                **job.conditioning,
                "stage_seconds": {
                    "queue": job.first_step_s - job.arrival_s,
                    "encode": job.encode_s,
                    "denoise": job.last_step_s - job.first_step_s,
                },
                "silent_s": silent_s,
            }
            send(
                Result(
                    job.handle,
                    job.request_id,
                    L.unpatchify_video(state.video_latents, state.layout).cpu(),
                    L.audio_rows_to_latent(state.audio_latents, state.layout).cpu(),
                    info,
                    final=state is job.states[-1],
                )
            )
            if self.jobs.get(job.key) is not job:
                return  # its send failed: the request ended with INTERNAL (send_failed)
            self.metrics.increment("h3_completions_total")
        self.drop(job, Status.FINISHED)
