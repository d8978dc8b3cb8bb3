"""h3_dit: the decoupled iterative DiT model (thin adapter over h3_core.engine / scheduler).

Every execute() receives all live sequences; new ones (START flag) are validated and queued,
the scheduler picks the jobs this step advances, ONE packed forward runs for them, progress
and finished latents are sent, and every unfinished request is rescheduled before returning.
In `request` execution mode the chosen job instead runs to completion inside one execute().
"""
import itertools
import time

import torch

from h3_core.engine import load_engine
from h3_core.request import GenerationRequest, RequestLimits
from h3_core.scheduler import Job, Overloaded, Scheduler
from server.adapter import (error_response, json_tensor, model_parameters, request_parameters,
                            resolve_path, torch_tensor)

import triton_python_backend_utils as pb_utils

OPTIONAL_INPUTS = {"HEIGHT": "height", "WIDTH": "width", "NUM_FRAMES": "num_frames",
                   "NUM_INFERENCE_STEPS": "num_inference_steps", "SEED": "seed", "NUM_OUTPUTS": "num_outputs"}
EMPTY_LATENT = torch.zeros(1, 0)


class TritonPythonModel:
    def initialize(self, args):
        params = model_parameters(args)
        self.limits = RequestLimits(
            max_height=int(params["max_height"]), max_width=int(params["max_width"]),
            max_num_frames=int(params["max_num_frames"]), max_steps=int(params["max_steps"]),
            max_outputs=int(params["max_outputs"]), max_rows=int(params["max_batch_rows"]),
        )
        self.engine = load_engine(params["config_name"], resolve_path(args, params["checkpoint_dir"]),
                                  params["device"], params["attention_backend"], with_encoder=False,
                                  with_vaes=False, limits=self.limits)
        self.engine.warm_up()
        self.mode = params["execution_mode"]
        if self.mode not in ("step", "request"):
            raise ValueError(f"execution_mode {self.mode!r} must be 'step' or 'request'")
        self.scheduler = Scheduler(int(params["max_num_seqs"]), int(params["max_batch_rows"]),
                                   int(params["max_waiting"]))
        self.jobs: dict[object, Job] = {}
        self.ids = itertools.count(1)

    def execute(self, requests):
        present = []
        for request in requests:
            key = request.correlation_id()
            if key in (0, ""):
                continue  # filler request inserted by the `direct` strategy
            job = self.jobs.get(key) or self.admit(request, key)
            if job is not None:
                job.extra["request"] = request
                job.extra["sender"] = request.get_response_sender()
                present.append(job)
        pack = [job for job in self.scheduler.schedule() if job in present]
        if pack:
            if self.mode == "request":
                pack = pack[:1]
                while not pack[0].finished:
                    self.step(pack)
            else:
                self.step(pack)
        for job in present:
            if job.key not in self.jobs:
                continue  # answered with its final response this step
            position = self.scheduler.queue_position(job)
            if job.progress_every and position > 0 and position != job.queue_position:
                self.send_progress(job, position)
            job.queue_position = position
            job.extra["request"].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return None

    def admit(self, request, key):
        """Validate a new request and queue it; on failure answer with an error at once."""
        sender = request.get_response_sender()
        try:
            job = self.parse(request, key)
            self.scheduler.add(job)
        except ValueError as error:
            sender.send(error_response("INVALID_ARG", str(error)), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        except Overloaded as error:
            sender.send(error_response("UNAVAILABLE", str(error)), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        self.jobs[key] = job
        return job

    def parse(self, request, key) -> Job:
        """Inputs and control parameters -> Job. Raises ValueError naming the bad field."""
        progress_every = request_parameters(request).get("progress_every", 0)
        if progress_every < 0:
            raise ValueError(f"progress_every={progress_every} is out of range: allowed >= 0")
        cfg = self.engine.dit.cfg
        fields = dict(height=cfg.default_height, width=cfg.default_width, num_frames=cfg.default_num_frames,
                      num_inference_steps=cfg.default_steps, seed=None, num_outputs=1)
        for name, field in OPTIONAL_INPUTS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                values = tensor.as_numpy().reshape(-1)
                if values.size != 1:
                    raise ValueError(f"{name} must hold exactly one INT64 value, got {values.size}")
                fields[field] = int(values[0])
        text = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "TEXT_EMBEDS").as_numpy().copy())
        encode_s = float(pb_utils.get_input_tensor_by_name(request, "ENCODE_SECONDS").as_numpy().reshape(-1)[0])
        request_id = request.request_id() or f"h3-{next(self.ids)}"
        generation = GenerationRequest(prompt="(encoded)", request_id=request_id, **fields)
        states = self.engine.prepare(generation, text.reshape(-1, text.shape[-1]))
        return Job(key=key, request_id=request_id, states=states, progress_every=progress_every, encode_s=encode_s)

    def step(self, pack: list[Job]) -> None:
        """One packed forward for the jobs in `pack`, then progress and final responses."""
        states = [state for job in pack for state in job.states]
        start = time.monotonic()
        for job in pack:
            job.first_step_s = job.first_step_s or start
            job.largest_pack = max(job.largest_pack, len(states))
        try:
            velocities = self.engine.denoise_step(states)
        except Exception as error:  # one bad forward fails its pack, never the server
            for job in pack:
                self.finish(job, error_response("INTERNAL", f"denoise step failed: {error!r}"))
            return
        for state, velocity in zip(states, velocities):
            self.engine.update(state, velocity)
        end = time.monotonic()
        for job in pack:
            job.last_step_s = end
            step = job.step_index
            if job.progress_every and (step % job.progress_every == 0 or step == job.total_steps):
                self.send_progress(job, 0)
            if job.finished:
                self.send_results(job)

    def progress_tensor(self, job: Job, position: int):
        return torch_tensor("PROGRESS", torch.tensor([[job.step_index, job.total_steps, position]], dtype=torch.int32))

    def send_progress(self, job: Job, position: int) -> None:
        info = {"kind": "progress", "request_id": job.request_id}
        job.extra["sender"].send(pb_utils.InferenceResponse([
            torch_tensor("LATENT", EMPTY_LATENT), self.progress_tensor(job, position), json_tensor("INFO", info)]))

    def send_results(self, job: Job) -> None:
        """One response per output with its final latent rows (video then audio, flattened)."""
        for state in job.states:
            latent = torch.cat([state.video_latents.reshape(-1), state.audio_latents.reshape(-1)])[None]
            info = {
                "kind": "result", "request_id": job.request_id, "output_index": state.output_index,
                "num_outputs": len(job.states), "seed": state.seed, "height": state.height,
                "width": state.width, "num_frames": state.num_frames,
                "num_inference_steps": state.total_steps, "largest_pack": job.largest_pack,
                "stage_seconds": {"queue": job.first_step_s - job.arrival_s, "encode": job.encode_s,
                                  "denoise": job.last_step_s - job.first_step_s},
            }
            response = pb_utils.InferenceResponse([torch_tensor("LATENT", latent), self.progress_tensor(job, 0),
                                                   json_tensor("INFO", info)])
            last = state is job.states[-1]
            job.extra["sender"].send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
        self.forget(job)

    def finish(self, job: Job, response) -> None:
        job.extra["sender"].send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self.forget(job)

    def forget(self, job: Job) -> None:
        self.scheduler.remove(job)
        del self.jobs[job.key]
