"""Train the DiT by flow matching on VAE latents of the procedural clips; resumable.

    python -m training.dit_train --work build/demo/train --vaes build/demo/train \
        --captions build/demo/caption_states.safetensors --config demo \
        --seconds 240 --total-seconds 240 [--batch 256] [--device cuda]

Objective (the sampler's convention, h3_core/diffusion/sampling.py): for clean latent rows x0 and noise n,
x_t = (1 - sigma) x0 + sigma n, the model gets t = 1 - sigma and is trained to output the
velocity v = x0 - n (MSE, video and audio rows averaged separately and summed). sigma is drawn
like the sampler's shifted schedule (sampling.shift_sigma): u ~ U(0, 1) once per clip,
sigma_video = 12u / (1 + 11u), sigma_audio = 3u / (1 + 2u) (shift 12 / 3 over the same base
value, as sigma_schedule pairs them at every step). Conditioning: the MiniLM token states of
the clip's caption (carried in the caption-states file, text_states.py).

The latents: `--variants` clips of every training combination (data.train_clips) rendered and
encoded once with the trained VAEs, normalised by their latents_mean / latents_std, as the
sampler's rows (patchify_video, channel-major audio rows).

Tasks (--task-mix over data.TASKS): each example draws t2va (text only), fl2va with the first,
the last or both rendered frames as keyframes, or ref2va with the reference image (colour-free
caption) or the reference tone (tone-free caption). Condition rows sit where layout.make_layout
puts them, hold the anchors conditions.condition_rows makes (visual: CONDITION_AUG x clean +
(1 - CONDITION_AUG) x noise; the tone: clean rows), take their own timesteps (visual max(t_video,
0.999), tone 1.0) and are left out of the loss. --init starts from existing DiT weights.

The forward (`train_forward`) is H3DiT.forward for a batch of clips that all pad to the same
row count (256 rows on the 64 x 96 x 22 canvas, every task), with the embedding written densely and the
blocks and final layer run by H3DiT.transformer, the serving forward's own code: one masked
SDPA call per layer for all clips instead of one per document, and one AdaLN projection for all
timesteps (per_timestep=False) instead of one per unique timestep (the inference forward does
those for bitwise batch invariance, which training does not need). tests/test_train.py checks
it against H3DiT.forward. Initialisation: init_weights, then biases, every AdaLN projection and both
output heads zeroed (adaLN-zero: each block starts as the identity, the output at 0). AdamW
(lr 5e-4, warm-up + cosine over --total-seconds, weight decay 0.01, clip 1.0), bf16 autocast on
CUDA. State every --save-every seconds; the optimizer moments are stored in bfloat16.

At the end it evaluates every task on --eval-clips held-out combinations with the engine
(evaluate_conditions.evaluate: Euler, --eval-steps steps, seed 0, the inference forward, the
carried caption states) and writes <work>/dit_eval.json: a check on the training machine; the
evaluation of the shipped weights is evaluate.py's and evaluate_conditions.py's, with the real
text encoder.
"""

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from h3_core.config import (
    AUDIO_CHANNELS,
    AUDIO_HOP,
    AUDIO_LATENT_CHANNELS,
    AUDIO_ROW_WIDTH,
    VIDEO_ROW_WIDTH,
    VIDEO_SPATIAL_DOWNSAMPLE,
    get_config,
)
from h3_core.diffusion import layout as L
from h3_core.diffusion.conditions import CONDITION_AUG
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.sampling import DEFAULT_AUDIO_SHIFT, DEFAULT_VIDEO_SHIFT, shift_sigma
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.model.rope import rope_table
from h3_core.model.vae import AudioVAE, VideoVAE, keyframe_latent
from h3_core.weights.checkpoint import load_weights
from h3_core.weights.vae_hook import load_vaes

from . import data, evaluate_conditions, text_states
from .loop import Run

DEFAULT_TASK_MIX = "t2va=0.4,first=0.15,last=0.1,both=0.1,image=0.125,audio=0.125"


LATENT_H, LATENT_W = data.HEIGHT // VIDEO_SPATIAL_DOWNSAMPLE, data.WIDTH // VIDEO_SPATIAL_DOWNSAMPLE
REFERENCE_AUDIO_T = data.REFERENCE_SAMPLES // AUDIO_HOP  # 40 audio latents
# The condition slots of train_forward's inputs: video [first keyframe | last keyframe | image |
# target rows], audio [reference tone | target rows]; keyed by (ConditionBlock kind, frame).
VIDEO_SLOTS = (("keyframe", L.FIRST_FRAME), ("keyframe", L.LAST_FRAME), ("image", 0))
AUDIO_SLOTS = (("audio", 0),)
# A row's timestep (Templates.clock): the clip's t_video (text, target video, padding), t_audio
# (target audio), max(t_video, CONDITION_TIMESTEP) (condition video rows), max(t_audio,
# AUDIO_CONDITION_TIMESTEP) (condition audio rows): layout.RequestLayout.row_timesteps.
CLOCK_VIDEO, CLOCK_AUDIO, CLOCK_CONDITION_VIDEO, CLOCK_CONDITION_AUDIO = range(4)


def task_conditions(task: str) -> tuple[L.ConditionBlock, ...]:
    """The condition blocks of a training task (data.TASKS) on the training canvas: keyframes
    (one latent frame at the 4 x 6 latent grid), a reference image of the canvas's size, a
    reference tone of REFERENCE_AUDIO_T latents; () for t2va. Raises KeyError for another task."""

    def keyframe(frame: int) -> L.ConditionBlock:
        return L.ConditionBlock("keyframe", 1, LATENT_H, LATENT_W, 0, frame)

    return {
        "t2va": (),
        "first": (keyframe(L.FIRST_FRAME),),
        "last": (keyframe(L.LAST_FRAME),),
        "both": (keyframe(L.FIRST_FRAME), keyframe(L.LAST_FRAME)),
        "image": (L.ConditionBlock("image", 1, LATENT_H, LATENT_W),),
        "audio": (L.ConditionBlock("audio", audio_t=REFERENCE_AUDIO_T),),
    }[task]


@dataclass
class Templates:
    """Row templates of every (task, text length) on the training canvas, all padded to one
    length S (the longest layout's, a multiple of 64), indexed [task index in data.TASKS, text
    length]: tags [K, Lmax+1, S] (layout.token_tags), src [K, Lmax+1, S] (a row's index into
    its modality's input: the refined text rows, train_forward's video or audio slots), clock
    [K, Lmax+1, S] (a row's CLOCK_* timestep), rope [K, Lmax+1, S, 6R] (rope_table of the
    layout's position ids), video_out [K, Lmax+1, V] and audio_out [K, Lmax+1, 2*T_a] (the target
    rows), refiner_len R (the text block's padded length in the refiner sequence). Entries of
    text lengths that do not occur are unused.
    """

    seq_len: int
    refiner_len: int
    tags: torch.Tensor
    src: torch.Tensor
    clock: torch.Tensor
    rope: torch.Tensor
    video_out: torch.Tensor
    audio_out: torch.Tensor
    frame_rows: int
    video_rows: int
    audio_rows: int

    @property
    def video_inputs(self) -> int:
        """Rows of train_forward's video input: the VIDEO_SLOTS' rows, then the target's."""
        return len(VIDEO_SLOTS) * self.frame_rows + self.video_rows

    @property
    def audio_inputs(self) -> int:
        """Rows of train_forward's audio input: the reference tone's rows, then the target's."""
        return AUDIO_CHANNELS * REFERENCE_AUDIO_T + self.audio_rows

    @classmethod
    def build(cls, cfg, text_lengths: list[int], device) -> "Templates":
        """Raises ValueError when the text lengths pad to different refiner lengths."""
        refiner = {-(-n // L.ROW_ALIGN) * L.ROW_ALIGN for n in text_lengths}
        if len(refiner) != 1:
            raise ValueError(f"captions of {sorted(text_lengths)} tokens pad to different refiner lengths {refiner}")

        def layout(task: str, n: int, seq_len: int | None = None) -> L.RequestLayout:
            return L.make_layout(n, data.HEIGHT, data.WIDTH, data.NUM_FRAMES, seq_len, task_conditions(task))

        seq_len = max(layout(task, n).seq_len for task in data.TASKS for n in text_lengths)
        shape = (len(data.TASKS), max(text_lengths) + 1, seq_len)
        tags = torch.full(shape, L.TAG_PAD, dtype=torch.int64)
        src, clock = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
        rope = torch.zeros(*shape, 6 * cfg.rope_freqs_per_axis)
        target = layout("t2va", text_lengths[0], seq_len)
        frame_rows, video_rows, audio_rows = target.frame_rows, target.video_rows, target.audio_rows
        video_out = torch.zeros(*shape[:2], video_rows, dtype=torch.int64)
        audio_out = torch.zeros(*shape[:2], audio_rows, dtype=torch.int64)
        for k, task in enumerate(data.TASKS):
            for n in text_lengths:
                lay = layout(task, n, seq_len)
                tags[k, n] = lay.token_tags()
                src[k, n, :n] = torch.arange(n)
                for block, row in lay.blocks():
                    audio_end = row + block.audio_rows
                    src[k, n, row:audio_end] = torch.arange(block.audio_rows)  # AUDIO_SLOTS: one slot
                    slot = VIDEO_SLOTS.index((block.kind, block.frame)) if block.video_rows else 0
                    src[k, n, audio_end : row + block.rows] = slot * frame_rows + torch.arange(block.video_rows)
                    clock[k, n, row:audio_end] = CLOCK_CONDITION_AUDIO
                    clock[k, n, audio_end : row + block.rows] = CLOCK_CONDITION_VIDEO
                src[k, n, lay.audio_start : lay.video_start] = AUDIO_CHANNELS * REFERENCE_AUDIO_T + torch.arange(
                    audio_rows
                )
                src[k, n, lay.video_start : lay.used] = len(VIDEO_SLOTS) * frame_rows + torch.arange(video_rows)
                clock[k, n, lay.audio_start : lay.video_start] = CLOCK_AUDIO
                rope[k, n] = rope_table(lay.position_ids(), cfg.rope_freqs_per_axis, cfg.rope_theta, torch.float32)
                audio_out[k, n] = torch.arange(lay.audio_start, lay.video_start)
                video_out[k, n] = torch.arange(lay.video_start, lay.used)
        tensors = (t.to(device) for t in (tags, src, clock, rope, video_out, audio_out))
        return cls(seq_len, refiner.pop(), *tensors, frame_rows, video_rows, audio_rows)


def document_attention(doc: torch.Tensor, heads: int):
    """An AttentionFn for B blocks of equal length S: doc int [B, S] names each row's document;
    a row attends to the rows of its block with the same document (`documents` is ignored)."""
    batch, seq = doc.shape
    mask = (doc[:, :, None] == doc[:, None, :])[:, None]  # [B, 1, S, S]

    def attention(q, k, v, documents=None):
        q, k, v = (t.view(batch, seq, heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(batch * seq, heads, -1)

    return attention


def train_forward(
    model: H3DiT,
    templates: Templates,
    video: torch.Tensor,
    audio: torch.Tensor,
    text: torch.Tensor,
    text_len: torch.Tensor,
    task: torch.Tensor,
    t_video: torch.Tensor,
    t_audio: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """H3DiT.forward for B clips of one canvas, each with its task's conditions, densely (see
    the module docstring).

    video [B, templates.video_inputs, 96]: the condition rows of VIDEO_SLOTS (first keyframe,
    last keyframe, reference image: frame_rows rows each, as conditions.condition_rows makes
    them; a slot the clip's task does not use is ignored), then the noisy target rows V;
    audio [B, templates.audio_inputs, 32]: the reference tone's rows (2 x REFERENCE_AUDIO_T,
    ignored unless the task is "audio"), then the noisy target rows 2*T_a; text [B, Lmax, 384]
    (zero beyond text_len), text_len int64 [B], task int64 [B] (index into data.TASKS), t_video /
    t_audio float32 [B] (t = 1 - sigma; condition rows get their own timesteps, CLOCK_*).
    Returns the target rows' velocities (video [B, V, 96], audio [B, 2*T_a, 32]) in float32:
    condition rows are not returned (no loss on them).
    """
    cfg, dtype = model.cfg, model.cfg.torch_dtype
    batch, seq, hidden = video.shape[0], templates.seq_len, cfg.hidden_size
    tags, src = templates.tags[task, text_len], templates.src[task, text_len]  # [B, S]
    rope = templates.rope[task, text_len].reshape(batch * seq, -1).to(dtype)

    def gather(rows: torch.Tensor) -> torch.Tensor:  # [B, n, w] -> [B, S, w] by src
        index = src.clamp(max=rows.shape[1] - 1)[..., None].expand(-1, -1, rows.shape[2])
        return torch.gather(rows, 1, index)

    # Text: condition_proj + refiner over blocks of refiner_len rows ([0, L) and the padding).
    refiner_len = templates.refiner_len
    text_in = torch.zeros(batch, refiner_len, cfg.text_dim, dtype=dtype, device=video.device)
    text_in[:, : text.shape[1]] = text.to(dtype)
    positions = torch.arange(refiner_len, device=video.device)
    refiner_doc = (positions[None, :] >= text_len[:, None]).long()
    refined = model.token_refiner(
        model.condition_proj(text_in.view(batch * refiner_len, -1)),
        document_attention(refiner_doc, cfg.num_heads),
        None,
    )
    refined = refined.view(batch, refiner_len, hidden)

    video_x = model.video_patch_proj(gather(video)).to(dtype)
    audio_x = model.audio_patch_proj(gather(audio)).to(dtype)
    text_x = gather(refined).to(dtype)
    x = torch.where(
        (tags == L.TAG_VIDEO)[..., None],
        video_x,
        torch.where(
            (tags == L.TAG_AUDIO)[..., None],
            audio_x,
            torch.where((tags == L.TAG_TEXT)[..., None], text_x, torch.zeros_like(text_x)),
        ),
    )
    x = x.reshape(batch * seq, hidden)

    # Timesteps: clip b's CLOCK_* timesteps are rows 4b .. 4b + 3 of t_emb.
    times = torch.stack(
        [t_video, t_audio, t_video.clamp(min=L.CONDITION_TIMESTEP), t_audio.clamp(min=L.AUDIO_CONDITION_TIMESTEP)], 1
    )
    t_emb = model.time_embedder(times.reshape(-1).float())
    step_index = times.shape[1] * torch.arange(batch, device=video.device)[:, None] + templates.clock[task, text_len]
    step_index = step_index.reshape(-1)
    mod_index = step_index * 3 + tags.clamp(min=0).reshape(-1)
    used = tags.ne(L.TAG_PAD).sum(1)  # [B]
    doc = (torch.arange(seq, device=video.device)[None, :] >= used[:, None]).long()
    video_out, audio_out = model.transformer(
        x, t_emb, mod_index, step_index, document_attention(doc, cfg.num_heads), None, rope, per_timestep=False
    )
    video_out, audio_out = video_out.view(batch, seq, -1), audio_out.view(batch, seq, -1)
    video_index = templates.video_out[task, text_len][..., None].expand(-1, -1, VIDEO_ROW_WIDTH)
    audio_index = templates.audio_out[task, text_len][..., None].expand(-1, -1, AUDIO_ROW_WIDTH)
    return torch.gather(video_out, 1, video_index).float(), torch.gather(audio_out, 1, audio_index).float()


def init_dit(cfg, seed: int, device) -> H3DiT:
    """init_weights, then zero biases, AdaLN projections and output heads (adaLN-zero)."""
    model = H3DiT(cfg, row_tile=0, device=device)
    init_weights(model, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if (
                name.endswith("bias")
                or "adaln_proj" in name
                or name.startswith(("final_layer.video_out", "final_layer.audio_out"))
            ):
                p.zero_()
    return model


@torch.no_grad()
def encode_clips(
    clips: list[data.Clip], video_vae: VideoVAE, audio_vae: AudioVAE, device, chunk: int = 256, lift: float = 0.0
) -> dict[str, torch.Tensor]:
    """Clean latent rows (normalised) of the clips and of their conditions, as the sampler and
    conditions.condition_rows lay them out: "video" [N, V, 96] and "audio" [N, 2*T_a, 32] (the
    clip), "first" / "last" [N, F, 96] (its first / last frame through vae.keyframe_latent, F =
    frame_rows), "image" [N, F, 96] (its reference image, keyframe_latent too) and "tone"
    [N, 2 x REFERENCE_AUDIO_T, 32] (its reference tone, channel-major). Reference images and
    tones are encoded once per colour and shape / pitch and side. lift: data.render_video's (the
    shape's colour brightened)."""

    def still(image: torch.Tensor) -> torch.Tensor:
        return L.patchify_video(keyframe_latent(video_vae, image)[:, None])

    def audio_rows(sound: torch.Tensor) -> torch.Tensor:
        return audio_vae.encode(sound).permute(0, 2, 1).reshape(-1, AUDIO_LATENT_CHANNELS)

    out = {key: [] for key in ("video", "audio", "first", "last", "image", "tone")}
    images, tones = {}, {}
    for i in range(0, len(clips), chunk):
        part = clips[i : i + chunk]
        frames = data.render_video(part, device, lift)
        sound = data.render_audio(part, device)
        for clip, f, a in zip(part, frames, sound, strict=True):
            out["video"].append(L.patchify_video(video_vae.encode(f)))
            out["audio"].append(audio_rows(a))
            out["first"].append(still(f[0]))
            out["last"].append(still(f[-1]))
            look, tone = (clip.colour, clip.shape), (clip.pitch, clip.side)
            if look not in images:
                images[look] = still(data.render_reference_image([clip], device)[0])
            if tone not in tones:
                tones[tone] = audio_rows(data.render_audio([clip], device, data.REFERENCE_SAMPLES)[0])
            out["image"].append(images[look])
            out["tone"].append(tones[tone])
    return {key: torch.stack(rows) for key, rows in out.items()}


def parse_task_mix(text: str) -> torch.Tensor:
    """--task-mix "t2va=0.4,first=0.15,..." -> float32 [len(data.TASKS)] probabilities (the
    weights normalised to sum 1; tasks not named get 0). Raises ValueError naming the entry for
    an unknown task, a repeated one, a weight that is not a finite number >= 0, or all zero."""
    weights = dict.fromkeys(data.TASKS, 0.0)
    seen = set()
    for entry in text.split(","):
        name, _, value = entry.partition("=")
        name = name.strip()
        if name not in weights or name in seen:
            raise ValueError(f"--task-mix entry {entry!r}: task must be one of {list(data.TASKS)}, each once")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not 0.0 <= weight < float("inf"):
            raise ValueError(f"--task-mix entry {entry!r}: the weight must be a number >= 0")
        weights[name] = weight
        seen.add(name)
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"--task-mix {text!r}: the weights sum to 0; give at least one task a weight > 0")
    return torch.tensor([weights[task] / total for task in data.TASKS])


def train(args) -> None:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    mix = parse_task_mix(args.task_mix).to(device)
    cfg = get_config(args.config)
    captions, num_train, states = text_states.load(args.captions)
    state_of = dict(zip(captions, states, strict=True))
    video_vae, audio_vae = load_vaes(args.vaes, device)

    start = time.monotonic()
    clips = data.train_clips(args.variants, seed=args.seed)
    if args.max_clips:
        clips = clips[:: max(1, len(clips) // args.max_clips)][: args.max_clips]
    x0 = encode_clips(clips, video_vae, audio_vae, device)
    train_caps = captions[:num_train]
    index_of = {c: i for i, c in enumerate(train_caps)}
    # caption_index[clip, caption kind]; a task's column is its kind's (data.TASK_CAPTIONS).
    caption_index = torch.tensor(
        [[index_of[data.caption(*c.combo, verb=c.verb, kind=kind)] for kind in data.CAPTION_KINDS] for c in clips],
        device=device,
    )
    task_column = torch.tensor([data.CAPTION_KINDS.index(data.TASK_CAPTIONS[t]) for t in data.TASKS], device=device)
    lengths = torch.tensor([state_of[c].shape[0] for c in train_caps], device=device)
    text_table = torch.zeros(len(train_caps), int(lengths.max()), cfg.text_dim, device=device)
    for i, c in enumerate(train_caps):
        text_table[i, : state_of[c].shape[0]] = state_of[c].to(device)
    print(
        f"[dit] {len(clips)} clips encoded in {time.monotonic() - start:.1f} s: video {tuple(x0['video'].shape)} "
        f"std {x0['video'].std():.3f}, audio {tuple(x0['audio'].shape)} std {x0['audio'].std():.3f}; "
        f"task mix {dict(zip(data.TASKS, [round(p, 4) for p in mix.tolist()], strict=True))}",
        flush=True,
    )
    templates = Templates.build(cfg, sorted({int(n) for n in lengths.tolist()} | {len(s) for s in states}), device)

    model = init_dit(cfg, args.seed, device)
    if args.init:
        load_weights(model, args.init)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.99),
    )
    run = Run(
        "dit",
        args.work,
        model,
        optimizer,
        args.seconds,
        args.total_seconds,
        args.lr,
        save_every=args.save_every,
        moment_dtype=torch.bfloat16,
        log_every=args.log_every,
    )
    begun = f"resumed at step {run.step}" if run.resumed else f"from {args.init}" if args.init else "fresh start"
    print(f"[dit] config {cfg.name}: {params / 1e6:.2f} M parameters, {templates.seq_len} rows a clip; {begun}")
    generator = torch.Generator(device=device).manual_seed(args.seed * 7919 + run.step)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    )
    model.train()
    sums, pending = torch.zeros(4, device=device), 0
    while run.running():
        pick = torch.randint(len(clips), (args.batch,), device=device, generator=generator)
        task = torch.multinomial(mix, args.batch, replacement=True, generator=generator)
        x0_v, x0_a = x0["video"][pick], x0["audio"][pick]
        cap = caption_index[pick, task_column[task]]
        u = torch.rand(args.batch, device=device, generator=generator)
        sigma_v, sigma_a = shift_sigma(u, DEFAULT_VIDEO_SHIFT), shift_sigma(u, DEFAULT_AUDIO_SHIFT)
        noise_v = torch.randn(x0_v.shape, device=device, generator=generator)
        noise_a = torch.randn(x0_a.shape, device=device, generator=generator)
        x_v = (1 - sigma_v)[:, None, None] * x0_v + sigma_v[:, None, None] * noise_v
        x_a = (1 - sigma_a)[:, None, None] * x0_a + sigma_a[:, None, None] * noise_a
        # Condition rows as condition_rows makes them: visual anchors a x clean + (1 - a) x noise, the clean tone.
        clean = torch.cat([x0[key][pick] for key in ("first", "last", "image")], 1)
        anchors = CONDITION_AUG * clean + (1 - CONDITION_AUG) * torch.randn(
            clean.shape, device=device, generator=generator
        )
        with autocast:
            pred_v, pred_a = train_forward(
                model,
                templates,
                torch.cat([anchors, x_v], 1),
                torch.cat([x0["tone"][pick], x_a], 1),
                text_table[cap],
                lengths[cap],
                task,
                1 - sigma_v,
                1 - sigma_a,
            )
        loss_v = F.mse_loss(pred_v, x0_v - noise_v)
        loss_a = F.mse_loss(pred_a, x0_a - noise_a)
        loss = loss_v + loss_a
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        sums = sums + torch.stack([loss, loss_v, loss_a, grad_norm]).detach().float()
        pending += 1
        if pending == args.log_every:  # one host sync per log_every steps
            means = (sums / pending).tolist()
            run.record(pending, **dict(zip(("loss", "video", "audio", "grad_norm"), means, strict=True)))
            sums, pending = torch.zeros(4, device=device), 0
    if pending:
        run.record(
            pending, **dict(zip(("loss", "video", "audio", "grad_norm"), (sums / pending).tolist(), strict=True))
        )
    run.save()
    print(f"[dit] {run.step} steps, {run.trained:.0f} s trained in total", flush=True)
    if args.eval_clips:
        model.eval()
        engine = Engine(model, video_vae, audio_vae)
        held = data.held_out_clips()[: args.eval_clips]
        result = evaluate_conditions.evaluate(engine, held, args.eval_steps, seed=0, pack=1, text_states=state_of)
        (args.work / "dit_eval.json").write_text(json.dumps(result, indent=1))
        print(f"[dit] held-out evaluation: {json.dumps(result)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("build/demo/train"), help="state, loss log, eval")
    parser.add_argument("--vaes", type=Path, default=Path("build/demo/train"), help="folder with the trained VAEs")
    parser.add_argument("--captions", type=Path, default=Path("build/demo/caption_states.safetensors"))
    parser.add_argument("--config", default="demo")
    parser.add_argument("--init", type=Path, help="DiT weights to start from (a dit.safetensors); default: fresh")
    parser.add_argument(
        "--task-mix",
        default=DEFAULT_TASK_MIX,
        help=f"task=weight,... over {', '.join(data.TASKS)} (normalised; tasks not named get 0)",
    )
    parser.add_argument("--seconds", type=float, default=240.0, help="training seconds of this run")
    parser.add_argument(
        "--total-seconds", type=float, default=240.0, help="training seconds over all runs (lr schedule)"
    )
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--variants", type=int, default=24, help="clips per training combination")
    parser.add_argument("--max-clips", type=int, default=0, help="use at most this many clips (smoke tests)")
    parser.add_argument("--save-every", type=float, default=60.0)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument(
        "--eval-clips", type=int, default=36, help="held-out clips evaluated per task at the end (0: none)"
    )
    parser.add_argument("--eval-steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    parse_task_mix(args.task_mix)  # a bad mix fails before any work
    torch.set_flush_denormal(True)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    train(args)


if __name__ == "__main__":
    main()
