"""The step-execution contract (docs/model.md §5): prepare -> denoise_step(states) -> update -> decode.

`Engine.run_to_completion` drives states through them until every one has finished (the one loop
of tools, benchmarks, training and tests); request mode (`Engine.generate`) is that call for each
output alone, so request mode, solo step mode and co-batched step mode run identical arithmetic.
All per-request state lives in RequestState; the Engine holds only the models.
"""

import time
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..config import AUDIO_LATENT_CHANNELS, VIDEO_LATENT_CHANNELS, align_num_frames, aligned_rows
from ..model import H3DiT
from ..model.preview import RANDOM_PREVIEW, PreviewMap
from ..model.reference_kv import ReferenceKV, ReferencePlan, bytes_per_reference_row
from ..model.reference_kv import forward as reference_forward
from ..model.vae import AudioVAE, VideoVAE, decode_clip
from ..rules import InvalidRequest, check_task
from . import layout as L
from .conditions import Condition, condition_rows
from .request import GenerationRequest, RequestLimits, random_seed, request_memory_mb, validate_request
from .sampling import euler_step, sigma_schedule
from .step_cache import IDENTITY_POLYNOMIAL, StepCache, modulated_input

if TYPE_CHECKING:
    from ..model.encoder import TextEncoder


DEFAULT_LIMITS = RequestLimits()  # the shipped CPU repository's limits
Velocity = tuple[torch.Tensor, torch.Tensor]  # a state's (video float32 [V, 96], audio float32 [2*T_a, 32])


@dataclass(eq=False)  # a state is itself: compared by identity (its fields hold tensors)
class RequestState:
    """Everything request-specific between steps (docs/model.md §5.6).

    video_latents: float32 [V, 96] target video rows; audio_latents: float32 [2*T_a, 32] audio
    rows (channel-major); text_embeds: [L, text_dim]; condition_video: float32 [C_v, 96] and
    condition_audio: float32 [C_a, 32], the condition blocks' fixed rows (docs/model.md §3.3; empty for
    t2va; h3_core.diffusion.conditions.condition_rows), the same for the whole request (the Euler
    update never touches them, so they are "re-pinned" after every step by construction);
    all on the engine's device from prepare() on (the Euler update runs there; they reach the
    CPU only when the result is sent). Sigma lists (the request's own, else sigma_schedule's)
    have num_inference_steps + 1 entries, one per clock, stepped together;
    step_index counts completed steps (computed or taken with the cached velocity); cache is
    the request's step cache (h3_core.diffusion.step_cache; threshold 0: off); reference_kv its
    reference keys and values (h3_core.model.reference_kv; refresh 1: off, always for a request
    without references), freed when it finishes or leaves.
    """

    request_id: str
    output_index: int
    seed: int
    height: int
    width: int
    num_frames: int
    layout: L.RequestLayout
    text_embeds: torch.Tensor
    video_latents: torch.Tensor
    audio_latents: torch.Tensor
    sigmas_video: list[float]
    sigmas_audio: list[float]
    condition_video: torch.Tensor
    condition_audio: torch.Tensor
    task: str = "t2va"
    num_frames_requested: int = 0  # NUM_FRAMES as asked; num_frames is the served, aligned clip
    step_index: int = 0
    cache: StepCache = field(default_factory=StepCache)
    lora: tuple[tuple[str, float], ...] = ()  # GenerationRequest.lora: its adapters (name, scale)
    reference_kv: ReferenceKV = field(default_factory=ReferenceKV)

    @property
    def total_steps(self) -> int:
        return len(self.sigmas_video) - 1

    @property
    def finished(self) -> bool:
        return self.step_index >= self.total_steps

    @property
    def rows(self) -> int:
        """Padded packed rows this request occupies in a forward."""
        return self.layout.seq_len

    @property
    def step_rows(self) -> int:
        """Rows its next step occupies in a forward: 0 when Engine.plan_step planned it skipped,
        its rows without the reference rows (padded to 64) when it reuses their keys and values,
        else `rows` (the scheduler packs by it)."""
        if self.cache.skips(self.step_index):
            return 0
        if self.reference_kv.reuses(self.step_index):
            start, end = self.layout.reference_span
            return aligned_rows(self.layout.used - (end - start))
        return self.rows

    def reference_plan(self) -> ReferencePlan | None:
        """Its part in the next forward's reference reuse (None with ref_kv_refresh 1)."""
        if self.reference_kv.refresh == 1:
            return None
        return ReferencePlan(self.reference_kv, *self.layout.reference_span, self.step_index)


def initial_noise(layout: L.RequestLayout, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial video rows [V, 96] and audio rows [2*T_a, 32], float32, each from its own CPU
    generator seeded with `seed` (docs/model.md §3.5)."""
    video_gen = torch.Generator("cpu").manual_seed(seed)
    latent = torch.randn(
        1, VIDEO_LATENT_CHANNELS, layout.latent_t, layout.latent_h, layout.latent_w, generator=video_gen
    )
    audio_gen = torch.Generator("cpu").manual_seed(seed)
    audio = torch.randn(layout.audio_rows, AUDIO_LATENT_CHANNELS, generator=audio_gen)
    return L.patchify_video(latent[0]), audio


def schedule_timesteps(
    layout: L.RequestLayout, sigmas_video: list[float], sigmas_audio: list[float], first_step: int = 0
) -> torch.Tensor:
    """The distinct model timesteps the steps first_step.. of a schedule (sigma lists of
    steps + 1 entries) pack for `layout` (RequestLayout.row_timesteps of each step: its video
    and audio values and its condition rows' values), float32 [K] in the order the steps first
    need them: what the AdaLN table fills at a request's admission (AdaLNTable.prefill)."""
    values: dict[float, None] = {}
    for step in range(first_step, len(sigmas_video) - 1):
        rows = layout.row_timesteps(1.0 - sigmas_video[step], 1.0 - sigmas_audio[step])
        values.update(dict.fromkeys(rows.unique().tolist()))
    return torch.tensor(list(values), dtype=torch.float32)


class GroupFailure(RuntimeError):
    """A DiT forward failed for no request's sake and its own recovery failed too: the devices or
    worker processes that run it were lost (h3_core.parallel.workers.WorkerLost, raised after one
    restart of the workers and one retry of the step). Retrying the pack's requests one at a time
    cannot help and would restart the workers for each, so the step loop fails every request of
    the pack with it (INTERNAL) instead of retrying them alone."""


class Engine:
    """Runs the H3 models for any number of request states.

    Args:
        dit: the DiT forward (its device is the engine's device): an H3DiT, or an object called
            like H3DiT.forward with its `cfg` and `device`, e.g. a SequenceParallelDiT running it
            over several devices (h3_core.parallel; h3_core.factory.load_engine picks one). A
            forward that raises GroupFailure failed for every request of the pack; any other
            error may be a request's own.
        video_vae, audio_vae: decoders, or None where decoding happens elsewhere (Triton's h3_vae).
        encoder: the text encoder, or None when text states arrive precomputed (Triton).
        limits: request limits checked in prepare().
        preview: the latent-to-RGB map of preview_frame (the weights' fitted one, or
            RANDOM_PREVIEW).
        cache_polynomial: the step cache's output-change polynomial (numpy.polyval
            coefficients; the weights' fitted one, h3_core.weights.checkpoint.load_cache_polynomial,
            or IDENTITY_POLYNOMIAL).
    """

    def __init__(
        self,
        dit: H3DiT,
        video_vae: VideoVAE | None,
        audio_vae: AudioVAE | None,
        encoder: "TextEncoder | None" = None,
        limits: RequestLimits = DEFAULT_LIMITS,
        preview: PreviewMap = RANDOM_PREVIEW,
        cache_polynomial: tuple[float, ...] = IDENTITY_POLYNOMIAL,
    ):
        self.dit, self.video_vae, self.audio_vae, self.encoder, self.limits = dit, video_vae, audio_vae, encoder, limits
        self.preview, self.cache_polynomial = preview, tuple(cache_polynomial)
        self.device = dit.device
        self.lora_users: weakref.WeakSet[RequestState] = weakref.WeakSet()  # live states with adapters
        self.closed_loras: set[str] = set()  # held adapters that take no new request (being unloaded)

    def warm_up(self) -> float:
        """Run one packed step of a small request so first-use set-up (oneDNN on the CPU, cuBLAS
        handles and the compilation of the DiT blocks on the GPU) is not paid by the first
        client. Returns its seconds."""
        start = time.perf_counter()
        request = GenerationRequest("warm-up", 32, 32, 1, 1, seed=0)
        self.denoise_step(self.prepare(request, torch.zeros(1, self.dit.cfg.text_dim)))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def close(self) -> None:
        """Stop the DiT's worker processes when it runs sequence-parallel (its `close`; an H3DiT
        has none: nothing to do)."""
        close = getattr(self.dit, "close", None)
        if close is not None:
            close()

    def encode_prompt(self, prompt: str) -> torch.Tensor:
        """Text states float32 [L, text_dim] of the prompt. Raises ValueError for bad prompts."""
        if self.encoder is None:
            raise RuntimeError("this engine has no text encoder; pass text_embeds to prepare()")
        return self.encoder.encode(prompt)

    def prepare(
        self,
        request: GenerationRequest,
        text_embeds: torch.Tensor | None = None,
        conditions: list[Condition] = (),
        vision_spans: tuple[tuple[int, int], ...] = (),
    ) -> list[RequestState]:
        """Validate the request and build its states: num_outputs states with seeds seed,
        seed+1, ... (a random seed is drawn when none is given), their latents, condition rows
        (condition_rows, each output with its own seed) and text states on the engine's device
        (the noise is drawn on the CPU, initial_noise, then moved once).

        text_embeds: float32 [L, text_dim] on any device; None encodes request.prompt with the
        engine's encoder. conditions: the request's keyframes, guides and references with their
        clean latents (Condition; any order: they are placed as docs/model.md §2.1 says); () for t2va.
        vision_spans: [start, end) rows of text_embeds that are vision tokens (RequestLayout).
        Raises ValueError naming the field (see validate_request; the task against the
        conditions' kinds, check_task; a condition's latents, Condition.block and
        layout.check_conditions; `rows` when the padded row count exceeds limits.max_rows;
        `memory` when request_memory_mb exceeds limits.max_request_mb; `text_embeds` for a wrong
        width; `ref_kv_refresh` above 1 when the DiT runs sequence-parallel). ref_kv_refresh
        applies only to a request with references (RequestLayout.reference_span). With the DiT's
        AdaLN weights in host memory (adaln_weights = host) the AdaLN table fills the request's
        whole schedule here, in one pass (schedule_timesteps, AdaLNTable.prefill).
        """
        validate_request(request, self.limits)
        self.check_loras_loaded(request.lora)
        conditions = L.order_conditions(conditions)
        check_task(request.task, [condition.kind for condition in conditions])
        blocks = tuple(condition.block() for condition in conditions)
        if text_embeds is None:
            text_embeds = self.encode_prompt(request.prompt)
        if text_embeds.dim() != 2 or text_embeds.shape[1] != self.dit.cfg.text_dim or text_embeds.shape[0] < 1:
            raise ValueError(
                f"text_embeds has shape {tuple(text_embeds.shape)}; expected [L >= 1, {self.dit.cfg.text_dim}]"
            )
        text_embeds = text_embeds.to(self.device)
        layout = L.make_layout(
            text_embeds.shape[0],
            request.height,
            request.width,
            request.num_frames,
            conditions=blocks,
            vision_spans=vision_spans,
        )
        refresh = request.ref_kv_refresh if layout.reference_span[0] < layout.reference_span[1] else 1
        if refresh > 1 and not hasattr(self.dit, "embed_rows"):
            raise InvalidRequest(
                "ref_kv_refresh",
                f"ref_kv_refresh={refresh} is out of range: allowed 1 with a sequence-parallel DiT (sp_degree > 1)",
            )
        if layout.seq_len > self.limits.max_rows:
            raise ValueError(f"rows={layout.seq_len} is out of range: allowed 1..{self.limits.max_rows}")
        memory = request_memory_mb(
            request.height,
            request.width,
            request.num_frames,
            layout.seq_len * request.num_outputs,
            self.dit.cfg.hidden_size,
            step_cache=request.cache_threshold > 0,
            reference_kv_bytes=0
            if refresh == 1
            else (layout.reference_span[1] - layout.reference_span[0])
            * request.num_outputs
            * bytes_per_reference_row(self.dit.cfg),
        )
        if memory > self.limits.max_request_mb:
            raise ValueError(
                f"memory={memory} MiB is out of range: allowed up to {self.limits.max_request_mb} MiB (max_request_mb)"
            )
        seed = random_seed() if request.seed is None else request.seed
        sigmas_video, sigmas_audio = (  # the request's own lists (validated), else its steps and shifts
            sigma_schedule(request.num_inference_steps, shift) if given is None else [float(s) for s in given]
            for given, shift in (
                (request.video_sigmas, request.video_shift),
                (request.audio_sigmas, request.audio_shift),
            )
        )
        states = []
        for index in range(request.num_outputs):
            video, audio = (noise.to(self.device) for noise in initial_noise(layout, seed + index))
            fixed_video, fixed_audio = condition_rows(conditions, layout, seed + index)
            states.append(
                RequestState(
                    request_id=request.request_id,
                    output_index=index,
                    seed=seed + index,
                    height=request.height,
                    width=request.width,
                    num_frames=align_num_frames(request.num_frames),
                    num_frames_requested=request.num_frames,
                    layout=layout,
                    text_embeds=text_embeds,
                    video_latents=video,
                    audio_latents=audio,
                    sigmas_video=sigmas_video,
                    sigmas_audio=sigmas_audio,
                    condition_video=fixed_video.to(self.device),
                    condition_audio=fixed_audio.to(self.device),
                    task=request.task,
                    cache=StepCache(request.cache_threshold),
                    lora=request.lora,
                    reference_kv=ReferenceKV(refresh),
                )
            )
        if request.lora:
            self.lora_users.update(states)
        table = getattr(self.dit, "adaln_table", None)
        if table is not None and table.host:  # AdaLN weights in host memory: one fill pass at admission
            table.prefill(schedule_timesteps(layout, sigmas_video, sigmas_audio))
        return states

    def plan_step(self, states: list[RequestState]) -> list[bool]:
        """Whether each state computes its next step (True) or takes it with its cached velocity
        (False): the step cache's decision (h3_core.diffusion.step_cache), made once per step of
        a state with cache threshold > 0 from its own rows alone (step_cache.modulated_input of
        this step and, recomputed from the latents the cache kept, of the last planned one: the
        cache keeps no [rows, hidden] tensor between steps; the change metric is read on the
        host, so on a GPU this waits for the state's latents) and
        kept in its StepCache (later calls for the same step return it). A state with threshold
        0 and a finished state compute. Raises AttributeError for a cached state when the DiT is
        not an H3DiT (a sequence-parallel DiT; h3_dit refuses such requests)."""
        for state in states:
            cache, step = state.cache, state.step_index
            if cache.threshold > 0 and cache.planned_step != step and not state.finished:
                last = step == state.total_steps - 1  # computed: no metric needed
                inputs = (
                    state.video_latents,
                    state.audio_latents,
                    1.0 - state.sigmas_video[step],
                    1.0 - state.sigmas_audio[step],
                )
                measured = not last and 0 < step and cache.velocity is not None and cache.inputs is not None
                modulated = modulated_input(self.dit, *inputs) if measured else None
                previous = modulated_input(self.dit, *cache.inputs) if measured else None
                cache.plan(step, state.total_steps, modulated, previous, self.cache_polynomial)
                cache.inputs = None if last else inputs
        return [not state.cache.skips(state.step_index) for state in states]

    def denoise_step(self, states: list[RequestState]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One step's velocities for all states at their own step: `plan_step` picks the states
        that compute; ONE packed DiT forward runs for those (none when every state skips), each
        state's condition rows (its anchors) before its target rows; a skipped state gets its
        cached velocity. Returns each state's (target video velocity float32 [V, 96], audio
        velocity float32 [2*T_a, 32]) on the engine's device: views of the packed output or of
        the cache, nothing is copied to the CPU (on a GPU the call returns before the forward
        ends; reading a value synchronises). The computing states' rows are concatenated once,
        on the device. Raises ValueError if a state has already finished."""
        for state in states:
            if state.finished:
                raise ValueError(f"request {state.request_id!r} has finished all {state.total_steps} steps")
        computes = self.plan_step(states)
        computed = iter(self.forward([state for state, c in zip(states, computes, strict=True) if c]))
        return [next(computed) if c else state.cache.velocity for state, c in zip(states, computes, strict=True)]

    def forward(self, states: list[RequestState]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """ONE packed DiT forward for `states` (denoise_step's outputs for them; [] for no
        states, without a forward)."""
        if not states:
            return []
        batch = L.pack_requests(
            [s.layout for s in states],
            [1.0 - s.sigmas_video[s.step_index] for s in states],
            [1.0 - s.sigmas_audio[s.step_index] for s in states],
            [s.lora for s in states],
        )
        video = torch.cat([rows for s in states for rows in (s.condition_video, s.video_latents)])
        audio = torch.cat([rows for s in states for rows in (s.condition_audio, s.audio_latents)])
        text = torch.cat([s.text_embeds for s in states])
        plans = [s.reference_plan() for s in states]
        if any(plan is not None for plan in plans):
            video_v, audio_v = reference_forward(self.dit, video, audio, text, batch, plans)
        else:
            video_v, audio_v = self.dit(video, audio, text, batch)
        return L.split_rows(batch, video_v, audio_v)

    @staticmethod
    def update(state: RequestState, velocity: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Advance `state` one Euler step with its (video, audio) velocity (docs/model.md §3.2), on the
        device of the state's latents (the velocities must be there: denoise_step's are). With
        its step cache on, a computed step's velocity is kept (a copy) for the steps it skips,
        and a skipped step is counted (StepCache.skipped)."""
        k, cache = state.step_index, state.cache
        if cache.skips(k):
            cache.skipped += 1
        elif cache.threshold > 0:
            cache.velocity = (velocity[0].clone(), velocity[1].clone())
        state.video_latents = euler_step(
            state.video_latents, velocity[0], state.sigmas_video[k], state.sigmas_video[k + 1]
        )
        state.audio_latents = euler_step(
            state.audio_latents, velocity[1], state.sigmas_audio[k], state.sigmas_audio[k + 1]
        )
        state.step_index = k + 1
        if state.finished:
            state.reference_kv.clear()

    def preview_frame(self, state: RequestState, video_velocity: torch.Tensor) -> torch.Tensor:
        """A cheap preview of the current clean estimate (no VAE call): the middle latent frame of
        x0_hat = x_t + sigma * v (docs/model.md §3.2), mapped to RGB by the engine's PreviewMap (a p x p
        patch per latent cell, from its neighbourhood), computed on the latents' device.
        video_velocity: float32 [V, 96] of this step, on that device. Returns uint8
        [Hl * p, Wl * p, 3] on the CPU (p = self.preview.patch; 1 for RANDOM_PREVIEW: latent
        resolution). Nothing of it feeds back into the denoising."""
        x0 = state.video_latents + state.sigmas_video[state.step_index] * video_velocity
        latent = L.unpatchify_video(x0, state.layout)[:, state.layout.latent_t // 2]  # [24, Hl, Wl]
        rgb = self.preview.rgb(latent)  # [Hl * p, Wl * p, 3]
        return ((rgb * 0.5 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).cpu()

    def decode(self, state: RequestState) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode a finished state: (frames uint8 [num_frames, H, W, 3], audio float32
        [2, num_frames / 24 s x 32 kHz]), num_frames the served (17n+5) clip length; audio is cut
        (or zero-padded by < 1 latent) to the clip length."""
        return decode_clip(
            self.video_vae,
            self.audio_vae,
            state.num_frames,
            L.unpatchify_video(state.video_latents, state.layout),
            L.audio_rows_to_latent(state.audio_latents, state.layout),
        )

    def run_to_completion(
        self,
        states: Sequence[RequestState],
        *,
        joins: Mapping[int, Callable[[], Sequence[RequestState]]] | None = None,
        cancels: Mapping[int, Collection[str]] | None = None,
        step_context: Callable[[int, list[RequestState]], AbstractContextManager] | None = None,
        on_step: Callable[[int, list[RequestState], list[Velocity]], None] | None = None,
        decode: bool = False,
    ) -> list[RequestState] | list[tuple[RequestState, torch.Tensor, torch.Tensor]]:
        """Step a pack until every state has finished: at each step n = 0, 1, ... the unfinished
        states form the pack, ONE `denoise_step` runs for it and `update` advances each state with
        its velocity; a finished state leaves the pack (a state given finished takes no step).
        One state alone is request mode (`generate`); several are co-batched step mode.

        states: the states that step from step 0 (RequestState, from `prepare`).
        joins: step n -> a function returning the states that join the pack before step n (called
            then, so a `prepare` in it admits the request mid-run, as h3_dit does); the run goes on
            to the last step named in joins and cancels (a step with no state runs nothing).
        cancels: step n -> request ids whose states leave the pack before step n, unfinished (a
            cancel); they are not returned.
        step_context: (n, pack) -> a context manager entered before step n's forward and left
            after its updates (timing, device synchronisation, GPU turns, counters).
        on_step: called as on_step(n, pack, velocities) after step n's forward, before its
            updates: the states still hold step n's latents; velocities are denoise_step's (video
            float32 [V, 96], audio float32 [2*T_a, 32]) per state of the pack, on the device.
        decode: False returns the states; True returns (state, frames uint8 [num_frames, H, W, 3],
            audio float32 [2, samples]) per state (`decode`).

        Returns the finished states (decoded when `decode`) in the order they entered: `states`,
        then each join's by step. Latents stay on the engine's device. Raises ValueError for a
        negative step in joins or cancels, or a cancel naming no unfinished state of the pack at
        its step; errors of denoise_step, update and the hooks propagate (the run stops there).
        """
        joins, cancels = joins or {}, cancels or {}
        for name, steps in (("joins", joins), ("cancels", cancels)):
            if any(step < 0 for step in steps):
                raise ValueError(f"{name} has step {min(steps)}: allowed steps are 0 and above")
        entered, active, step = list(states), [s for s in states if not s.finished], 0
        cancelled: list[RequestState] = []
        last = max([*joins, *cancels], default=-1)  # the run reaches every step named
        while active or step <= last:
            if step in joins:
                joined = list(joins[step]())
                entered += joined
                active += [s for s in joined if not s.finished]
            for request_id in cancels.get(step, ()):
                leaving = [s for s in active if s.request_id == request_id]
                if not leaving:
                    raise ValueError(f"cancels names request {request_id!r}, not in the pack at step {step}")
                cancelled += leaving
                for state in leaving:
                    state.reference_kv.clear()
                active = [s for s in active if s.request_id != request_id]
            if active:
                with step_context(step, active) if step_context is not None else nullcontext():
                    velocities = self.denoise_step(active)
                    if on_step is not None:
                        on_step(step, active, velocities)
                    for state, velocity in zip(active, velocities, strict=True):
                        self.update(state, velocity)
                active = [s for s in active if not s.finished]
            step += 1
        done = [s for s in entered if not any(s is c for c in cancelled)]
        return [(s, *self.decode(s)) for s in done] if decode else done

    def generate(
        self,
        request: GenerationRequest,
        text_embeds: torch.Tensor | None = None,
        conditions: list[Condition] = (),
        vision_spans: tuple[tuple[int, int], ...] = (),
    ) -> list[tuple[RequestState, torch.Tensor, torch.Tensor]]:
        """Request mode: prepare (arguments as prepare's), then step each output alone to
        completion and decode it (`run_to_completion`). Returns (state, frames, audio) per output."""
        states = self.prepare(request, text_embeds, conditions, vision_spans)
        return [result for state in states for result in self.run_to_completion([state], decode=True)]

    def add_lora(self, name: str, adapter) -> None:
        """Load LoRA adapter `adapter` (h3_core.weights.lora_formats.LoraAdapter, mapped for this
        DiT's config) as `name` for requests to name (GenerationRequest.lora); its tensors are
        copied to the DiT's device and dtype (h3_core.model.lora.LoraAdapters.add). Raises
        ValueError for an empty or already loaded name, a target the DiT lacks, or a DiT without
        per-request adapters (a sequence-parallel DiT, for now)."""
        self.lora_holder().add(name, adapter)

    def remove_lora(self, name: str) -> None:
        """Unload adapter `name`. Raises ValueError when it is not loaded, or while a prepared or
        running request's state uses it (naming the requests): remove it once they finish or are
        cancelled (their states dropped)."""
        users = sorted({s.request_id for s in self.lora_users if not s.finished and name in dict(s.lora)})
        if users:
            raise ValueError(
                f"LoRA adapter {name!r} is in use by request(s) {', '.join(map(repr, users))}: "
                "remove it once they finish or are cancelled"
            )
        self.lora_holder().remove(name)

    def loras(self) -> list[dict]:
        """The loaded adapters in name order: {"name", "rank", "targets" (linears it changes),
        "bytes" (its A and B on the device)}."""
        holder = getattr(self.dit, "loras", None)
        adapters = {} if holder is None else holder.adapters
        return [
            {"name": name, "rank": a.rank, "targets": len(a.targets), "bytes": a.bytes}
            for name, a in sorted(adapters.items())
        ]

    def check_loras_loaded(self, lora: tuple[tuple[str, float], ...]) -> None:
        """Raise InvalidRequest (field `lora`) naming the first adapter of `lora` not loaded or
        in `closed_loras` (held for its running requests until they end, refused to new ones)."""
        loaded = [entry["name"] for entry in self.loras() if entry["name"] not in self.closed_loras]
        for name, _ in lora:
            if name not in loaded:
                raise InvalidRequest(
                    "lora", f"lora {name!r} is not a loaded LoRA adapter (loaded: {', '.join(loaded) or 'none'})"
                )

    def lora_holder(self):
        """The DiT's LoRA adapters (h3_core.model.lora.LoraAdapters); ValueError for a DiT without."""
        holder = getattr(self.dit, "loras", None)
        if holder is None:
            raise ValueError(f"this DiT ({type(self.dit).__name__}) takes no per-request LoRA adapters yet")
        return holder
