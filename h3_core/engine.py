"""The step-execution contract (h3_spec §5): prepare -> denoise_step(states) -> update -> decode.

Request mode (`Engine.generate`) is the same four functions driven to completion for one
request, so request mode, solo step mode and co-batched step mode run identical arithmetic.
All per-request state lives in RequestState; the Engine holds only the models.
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import layout as L
from .checkpoint import load_dit
from .config import AUDIO_CHANNELS, AUDIO_LATENT_CHANNELS, VIDEO_LATENT_CHANNELS, get_config
from .model import H3DiT
from .model.dit import use_bitwise_cublas
from .request import GenerationRequest, RequestLimits, random_seed, request_memory_mb, validate_request
from .sampling import euler_step, sigma_schedule
from .sequence_parallel import DEFAULT_TIMEOUT_S as DEFAULT_SP_TIMEOUT_S
from .sequence_parallel import SequenceParallelDiT, check_sp_degree
from .vae import AudioVAE, VideoVAE
from .vae_hook import load_vaes

if TYPE_CHECKING:
    from .encoder import TextEncoder


DEFAULT_LIMITS = RequestLimits()  # the shipped CPU repository's limits


@dataclass(eq=False)  # a state is itself: compared by identity (its fields hold tensors)
class RequestState:
    """Everything request-specific between steps (h3_spec §5.6).

    video_latents: float32 [V, 96] video rows; audio_latents: float32 [2*T_a, 32] audio rows
    (channel-major); text_embeds: [L, text_dim]; all three on the engine's device from prepare()
    on (the Euler update runs there; they reach the CPU only when the result is sent). Sigma
    lists have num_inference_steps + 1 entries; step_index counts completed DiT forwards.
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
    step_index: int = 0

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


def initial_noise(layout: L.RequestLayout, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial video rows [V, 96] and audio rows [2*T_a, 32], float32, each from its own CPU
    generator seeded with `seed` (h3_spec §3.5)."""
    video_gen = torch.Generator("cpu").manual_seed(seed)
    latent = torch.randn(
        1, VIDEO_LATENT_CHANNELS, layout.latent_t, layout.latent_h, layout.latent_w, generator=video_gen
    )
    audio_gen = torch.Generator("cpu").manual_seed(seed)
    audio = torch.randn(layout.audio_rows, AUDIO_LATENT_CHANNELS, generator=audio_gen)
    return L.patchify_video(latent[0]), audio


class Engine:
    """Runs the H3 models for any number of request states.

    Args:
        dit: the DiT (its device is the engine's device): an H3DiT, or a SequenceParallelDiT
            running it over several devices (h3_core.sequence_parallel).
        video_vae, audio_vae: decoders, or None where decoding happens elsewhere (Triton's h3_vae).
        encoder: the text encoder, or None when text states arrive precomputed (Triton).
        limits: request limits checked in prepare().
    """

    def __init__(
        self,
        dit: H3DiT | SequenceParallelDiT,
        video_vae: VideoVAE | None,
        audio_vae: AudioVAE | None,
        encoder: "TextEncoder | None" = None,
        limits: RequestLimits = DEFAULT_LIMITS,
    ):
        self.dit, self.video_vae, self.audio_vae, self.encoder, self.limits = dit, video_vae, audio_vae, encoder, limits
        self.device = dit.device

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
        """Stop the DiT's worker processes when it runs sequence-parallel (nothing otherwise)."""
        if isinstance(self.dit, SequenceParallelDiT):
            self.dit.close()

    def encode_prompt(self, prompt: str) -> torch.Tensor:
        """Text states float32 [L, text_dim] of the prompt. Raises ValueError for bad prompts."""
        if self.encoder is None:
            raise RuntimeError("this engine has no text encoder; pass text_embeds to prepare()")
        return self.encoder.encode(prompt)

    def prepare(self, request: GenerationRequest, text_embeds: torch.Tensor | None = None) -> list[RequestState]:
        """Validate the request and build its states: num_outputs states with seeds seed,
        seed+1, ... (a random seed is drawn when none is given), their latents and text states
        on the engine's device (the noise is drawn on the CPU, initial_noise, then moved once).

        text_embeds: float32 [L, text_dim] on any device; None encodes request.prompt with the
        engine's encoder.
        Raises ValueError naming the field (see validate_request; `rows` when the padded row
        count exceeds limits.max_rows; `memory` when request_memory_mb exceeds
        limits.max_request_mb; `text_embeds` for a wrong width).
        """
        validate_request(request, self.limits)
        if text_embeds is None:
            text_embeds = self.encode_prompt(request.prompt)
        if text_embeds.dim() != 2 or text_embeds.shape[1] != self.dit.cfg.text_dim or text_embeds.shape[0] < 1:
            raise ValueError(
                f"text_embeds has shape {tuple(text_embeds.shape)}; expected [L >= 1, {self.dit.cfg.text_dim}]"
            )
        text_embeds = text_embeds.to(self.device)
        layout = L.make_layout(text_embeds.shape[0], request.height, request.width, request.num_frames)
        if layout.seq_len > self.limits.max_rows:
            raise ValueError(f"rows={layout.seq_len} is out of range: allowed 1..{self.limits.max_rows}")
        memory = request_memory_mb(
            request.height,
            request.width,
            request.num_frames,
            layout.seq_len * request.num_outputs,
            self.dit.cfg.hidden_size,
        )
        if memory > self.limits.max_request_mb:
            raise ValueError(
                f"memory={memory} MiB is out of range: allowed up to {self.limits.max_request_mb} MiB (max_request_mb)"
            )
        seed = random_seed() if request.seed is None else request.seed
        sigmas_video = sigma_schedule(request.num_inference_steps, request.video_shift)
        sigmas_audio = sigma_schedule(request.num_inference_steps, request.audio_shift)
        states = []
        for index in range(request.num_outputs):
            video, audio = (noise.to(self.device) for noise in initial_noise(layout, seed + index))
            states.append(
                RequestState(
                    request_id=request.request_id,
                    output_index=index,
                    seed=seed + index,
                    height=request.height,
                    width=request.width,
                    num_frames=request.num_frames,
                    layout=layout,
                    text_embeds=text_embeds,
                    video_latents=video,
                    audio_latents=audio,
                    sigmas_video=sigmas_video,
                    sigmas_audio=sigmas_audio,
                )
            )
        return states

    def denoise_step(self, states: list[RequestState]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """ONE packed DiT forward for all states at their own step; returns each state's
        (video velocity float32 [V, 96], audio velocity float32 [2*T_a, 32]) on the engine's
        device: views of the packed output, nothing is copied to the CPU (on a GPU the call
        returns before the forward ends; reading a value synchronises). The states' rows are
        concatenated once, on the device. Raises ValueError if a state has already finished."""
        for state in states:
            if state.finished:
                raise ValueError(f"request {state.request_id!r} has finished all {state.total_steps} steps")
        batch = L.pack_requests(
            [s.layout for s in states],
            [1.0 - s.sigmas_video[s.step_index] for s in states],
            [1.0 - s.sigmas_audio[s.step_index] for s in states],
        )
        video, audio, text = (
            torch.cat([getattr(s, name) for s in states]) for name in ("video_latents", "audio_latents", "text_embeds")
        )
        video_v, audio_v = self.dit(video, audio, text, batch)
        return L.split_rows(batch, video_v, audio_v)

    @staticmethod
    def update(state: RequestState, velocity: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Advance `state` one Euler step with its (video, audio) velocity (h3_spec §3.2), on the
        device of the state's latents (the velocities must be there: denoise_step's are)."""
        k = state.step_index
        state.video_latents = euler_step(
            state.video_latents, velocity[0], state.sigmas_video[k], state.sigmas_video[k + 1]
        )
        state.audio_latents = euler_step(
            state.audio_latents, velocity[1], state.sigmas_audio[k], state.sigmas_audio[k + 1]
        )
        state.step_index = k + 1

    def decode(self, state: RequestState) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode a finished state: (frames uint8 [num_frames, H, W, 3], audio float32
        [2, num_frames / 24 s x 32 kHz]). The aligned latent is decoded and the first
        num_frames frames kept; audio is cut (or zero-padded by < 1 latent) to the clip length."""
        return decode_clip(
            self.video_vae,
            self.audio_vae,
            state.num_frames,
            L.unpatchify_video(state.video_latents, state.layout),
            L.audio_rows_to_latent(state.audio_latents, state.layout),
        )

    def generate(
        self, request: GenerationRequest, text_embeds: torch.Tensor | None = None
    ) -> list[tuple[RequestState, torch.Tensor, torch.Tensor]]:
        """Request mode: prepare, then step each output to completion, then decode.
        Returns (state, frames, audio) per output."""
        results = []
        for state in self.prepare(request, text_embeds):
            while not state.finished:
                self.update(state, self.denoise_step([state])[0])
            results.append((state, *self.decode(state)))
        return results


# Fixed latent-to-RGB projection for previews: [24, 3], seeded, scaled to keep values O(1).
PREVIEW_PROJECTION = (
    torch.randn(VIDEO_LATENT_CHANNELS, 3, generator=torch.Generator().manual_seed(0)) / VIDEO_LATENT_CHANNELS**0.5
)


def preview_frame(state: RequestState, video_velocity: torch.Tensor) -> torch.Tensor:
    """A cheap preview of the current clean estimate (no VAE call): the middle latent frame of
    x0_hat = x_t + sigma * v (h3_spec §3.2), projected to RGB with PREVIEW_PROJECTION, computed
    on the latents' device. video_velocity: float32 [V, 96] of this step, on that device.
    Returns uint8 [Hl, Wl, 3] (latent resolution) on the CPU."""
    x0 = state.video_latents + state.sigmas_video[state.step_index] * video_velocity
    latent = L.unpatchify_video(x0, state.layout)[:, state.layout.latent_t // 2]  # [24, Hl, Wl]
    rgb = torch.einsum("chw,cd->hwd", latent, PREVIEW_PROJECTION.to(latent.device))
    return ((rgb * 0.5 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).cpu()


def decode_clip(
    video_vae: VideoVAE, audio_vae: AudioVAE, num_frames: int, video_latent: torch.Tensor, audio_latent: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Final latents -> (frames uint8 [num_frames, H, W, 3], audio float32 [2, samples]); see
    Engine.decode. video_latent: float32 [24, T_lat, Hl, Wl] with T_lat = latent_frames(num_frames);
    audio_latent: float32 [2, 32, T_a] with T_a = audio_latent_frames(num_frames). Shared by the
    engine and the Triton VAE model. Raises ValueError for latents that do not fit num_frames."""
    if video_latent.dim() != 4 or video_latent.shape[1] != L.latent_frames(num_frames):
        raise ValueError(
            f"video latent has shape {tuple(video_latent.shape)}; num_frames={num_frames} needs "
            f"[{VIDEO_LATENT_CHANNELS}, {L.latent_frames(num_frames)}, Hl, Wl]"
        )
    audio_shape = (AUDIO_CHANNELS, AUDIO_LATENT_CHANNELS, L.audio_latent_frames(num_frames))
    if tuple(audio_latent.shape) != audio_shape:
        raise ValueError(
            f"audio latent has shape {tuple(audio_latent.shape)}; num_frames={num_frames} needs {list(audio_shape)}"
        )
    frames = video_vae.decode(video_latent)[:num_frames]
    audio = audio_vae.decode(audio_latent)
    samples = L.audio_num_samples(num_frames)
    audio = torch.nn.functional.pad(audio[:, :samples], (0, max(0, samples - audio.shape[1])))
    return frames, audio


def load_engine(
    config_name: str,
    source: str | Path,
    device: str = "cpu",
    attention_backend: str = "sdpa",
    with_encoder: bool = True,
    with_vaes: bool = True,
    limits: RequestLimits = DEFAULT_LIMITS,
    trust_remote_code: bool = False,
    sp_degree: int = 1,
    sp_timeout_s: float = DEFAULT_SP_TIMEOUT_S,
) -> Engine:
    """Build an Engine from a weight source (h3_core.checkpoint's module docstring): a native
    folder (dit.safetensors, video_vae.safetensors, audio_vae.safetensors; see checkpoint_setup),
    an official checkpoint folder (transformer/, video_vae/, audio_vae/; its VAEs run only with
    trust_remote_code, h3_core.vae_hook) or `random:SEED`. The DiT uses its device's bitwise
    GEMM setting (h3_core.model.dit); on CUDA its blocks are compiled (H3DiT.compile_blocks; the
    first step, Engine.warm_up, pays the compilation) and small packs replay CUDA graphs
    (H3DiT.use_cuda_graphs). with_encoder / with_vaes False leave
    those parts out (the Triton DiT needs neither). sp_degree > 1 runs the DiT in that many
    worker processes (h3_core.sequence_parallel: on the CPU, or on the consecutive GPUs from
    `device`), each of them loading the weights, with sp_timeout_s seconds as their step and
    collective timeout.
    Raises ValueError / FileNotFoundError as checkpoint.load_dit and vae_hook.load_vaes;
    ValueError for an sp_degree that does not divide the heads or GPUs that are not there, and
    sequence_parallel.WorkerFailed / WorkerLost for workers that cannot start."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        use_bitwise_cublas()
    cfg = get_config(config_name)
    check_sp_degree(cfg, sp_degree)
    if sp_degree > 1:
        dit = SequenceParallelDiT(cfg, str(source), device, sp_degree, attention_backend, sp_timeout_s)
    else:
        dit = H3DiT(cfg, attention_backend=attention_backend, device=device)
        load_dit(dit, source)
        if cuda:
            dit.compile_blocks()
            dit.use_cuda_graphs()
        dit.eval()
    video_vae, audio_vae = load_vaes(source, device, trust_remote_code) if with_vaes else (None, None)
    if with_encoder:
        from .encoder import TextEncoder  # imported here: a GPU host without MiniLM can run the DiT
    encoder = TextEncoder() if with_encoder else None
    return Engine(dit, video_vae, audio_vae, encoder, limits)
