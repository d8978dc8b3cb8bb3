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

The forward (`train_forward`) is H3DiT.forward for a batch of clips that all pad to the same
row count (192 rows on the 64 x 96 x 22 canvas), with the embedding written densely and the
blocks and final layer run by H3DiT.transformer, the serving forward's own code: one masked
SDPA call per layer for all clips instead of one per document, and one AdaLN projection for all
timesteps (per_timestep=False) instead of one per unique timestep (the inference forward does
those for bitwise batch invariance, which training does not need). tests/test_train.py checks
it against H3DiT.forward. Initialisation: init_weights, then biases, every AdaLN projection and both
output heads zeroed (adaLN-zero: each block starts as the identity, the output at 0). AdamW
(lr 5e-4, warm-up + cosine over --total-seconds, weight decay 0.01, clip 1.0), bf16 autocast on
CUDA. State every --save-every seconds; the optimizer moments are stored in bfloat16.

At the end it samples the held-out captions with the engine (h3_core.diffusion.engine.Engine: Euler, 8
steps, seed 0, the inference forward), decodes and scores them (evaluate.generate and
evaluate.report), and writes <work>/dit_eval.json: a quick check on the training machine; the
evaluation of the shipped weights is evaluate.py's, with the real text encoder.
"""

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from h3_core.config import AUDIO_LATENT_CHANNELS, AUDIO_ROW_WIDTH, VIDEO_ROW_WIDTH, get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.sampling import DEFAULT_AUDIO_SHIFT, DEFAULT_VIDEO_SHIFT, shift_sigma
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.model.rope import rope_table
from h3_core.model.vae import AudioVAE, VideoVAE
from h3_core.weights.vae_hook import load_vaes

from . import data, evaluate, text_states
from .loop import Run


@dataclass
class Templates:
    """Per text length L: the row layout of one clip on the training canvas, padded to S rows.

    tags [Lmax+1, S] (layout.token_tags), src [Lmax+1, S] (row index within its modality's rows,
    0 elsewhere), rope [Lmax+1, S, 6R] (rope_table of the layout's position ids), refiner_len R
    (the text block's padded length in the refiner sequence). Rows for text lengths that do not
    occur are unused.
    """

    seq_len: int
    refiner_len: int
    tags: torch.Tensor
    src: torch.Tensor
    rope: torch.Tensor
    video_rows: int
    audio_rows: int

    @classmethod
    def build(cls, cfg, text_lengths: list[int], device) -> "Templates":
        layouts = {n: L.make_layout(n, data.HEIGHT, data.WIDTH, data.NUM_FRAMES) for n in text_lengths}
        seq_lens = {layout.seq_len for layout in layouts.values()}
        refiner = {-(-n // L.ROW_ALIGN) * L.ROW_ALIGN for n in text_lengths}
        if len(seq_lens) != 1 or len(refiner) != 1:
            raise ValueError(
                f"captions of {sorted(text_lengths)} tokens pad to different lengths {seq_lens} / {refiner}"
            )
        seq_len, top = seq_lens.pop(), max(text_lengths) + 1
        tags = torch.full((top, seq_len), L.TAG_PAD, dtype=torch.int64)
        src = torch.zeros(top, seq_len, dtype=torch.int64)
        rope = torch.zeros(top, seq_len, 6 * cfg.rope_freqs_per_axis)
        for n, layout in layouts.items():
            tags[n] = layout.token_tags()
            src[n, :n] = torch.arange(n)
            src[n, layout.audio_start : layout.video_start] = torch.arange(layout.audio_rows)
            src[n, layout.video_start : layout.used] = torch.arange(layout.video_rows)
            rope[n] = rope_table(layout.position_ids(), cfg.rope_freqs_per_axis, cfg.rope_theta, torch.float32)
        any_layout = next(iter(layouts.values()))
        return cls(
            seq_len,
            refiner.pop(),
            tags.to(device),
            src.to(device),
            rope.to(device),
            any_layout.video_rows,
            any_layout.audio_rows,
        )


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
    t_video: torch.Tensor,
    t_audio: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """H3DiT.forward for B clips of one canvas, densely (see the module docstring).

    video [B, V, 96], audio [B, 2*T_a, 32] (noisy rows), text [B, Lmax, 384] (zero beyond
    text_len), text_len int64 [B], t_video / t_audio float32 [B] (t = 1 - sigma).
    Returns the velocities (video [B, V, 96], audio [B, 2*T_a, 32]) in float32.
    """
    cfg, dtype = model.cfg, model.cfg.torch_dtype
    batch, seq, hidden = video.shape[0], templates.seq_len, cfg.hidden_size
    tags, src = templates.tags[text_len], templates.src[text_len]  # [B, S]
    rope = templates.rope[text_len].reshape(batch * seq, -1).to(dtype)

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

    # Timesteps: row 2b = clip b's video (and text, padding) timestep, row 2b + 1 its audio one.
    t_emb = model.time_embedder(torch.stack([t_video, t_audio], 1).reshape(-1).float())
    step_index = 2 * torch.arange(batch, device=video.device)[:, None] + (tags == L.TAG_AUDIO).long()
    step_index = step_index.reshape(-1)
    mod_index = step_index * 3 + tags.clamp(min=0).reshape(-1)
    used = templates.tags[text_len].ne(L.TAG_PAD).sum(1)  # [B]
    doc = (torch.arange(seq, device=video.device)[None, :] >= used[:, None]).long()
    video_out, audio_out = model.transformer(
        x, t_emb, mod_index, step_index, document_attention(doc, cfg.num_heads), None, rope, per_timestep=False
    )
    video_out, audio_out = video_out.view(batch, seq, -1), audio_out.view(batch, seq, -1)
    first_audio = text_len[:, None]
    audio_index = first_audio + torch.arange(audio.shape[1], device=video.device)[None, :]
    video_index = first_audio + audio.shape[1] + torch.arange(video.shape[1], device=video.device)[None, :]
    video_v = torch.gather(video_out, 1, video_index[..., None].expand(-1, -1, VIDEO_ROW_WIDTH))
    audio_v = torch.gather(audio_out, 1, audio_index[..., None].expand(-1, -1, AUDIO_ROW_WIDTH))
    return video_v.float(), audio_v.float()


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
    clips: list[data.Clip], video_vae: VideoVAE, audio_vae: AudioVAE, device, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent rows of the clips: video [N, V, 96], audio [N, 2*T_a, 32] (normalised)."""
    videos, audios = [], []
    for i in range(0, len(clips), chunk):
        part = clips[i : i + chunk]
        frames = data.render_video(part, device)
        sound = data.render_audio(part, device)
        for f, a in zip(frames, sound, strict=True):
            videos.append(L.patchify_video(video_vae.encode(f)))
            audios.append(audio_vae.encode(a).permute(0, 2, 1).reshape(-1, AUDIO_LATENT_CHANNELS))
    return torch.stack(videos), torch.stack(audios)


def quick_eval(
    model: H3DiT,
    video_vae: VideoVAE,
    audio_vae: AudioVAE,
    captions: dict[str, torch.Tensor],
    clips: list[data.Clip],
    steps: int = 8,
) -> dict:
    """Sample (seed 0, one clip per forward), decode and score clips whose caption states are in
    `captions` (caption -> [L, 384]); returns evaluate.report's dict."""
    model.eval()
    engine = Engine(model, video_vae, audio_vae)
    return evaluate.report(clips, evaluate.generate(engine, clips, steps, seed=0, pack=1, text_states=captions))


def train(args) -> None:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    cfg = get_config(args.config)
    captions, num_train, states = text_states.load(args.captions)
    state_of = dict(zip(captions, states, strict=True))
    video_vae, audio_vae = load_vaes(args.vaes, device)

    start = time.monotonic()
    clips = data.train_clips(args.variants, seed=args.seed)
    if args.max_clips:
        clips = clips[:: max(1, len(clips) // args.max_clips)][: args.max_clips]
    video_x0, audio_x0 = encode_clips(clips, video_vae, audio_vae, device)
    train_caps = captions[:num_train]
    index_of = {c: i for i, c in enumerate(train_caps)}
    caption_index = torch.tensor([index_of[c.caption] for c in clips], device=device)
    lengths = torch.tensor([state_of[c].shape[0] for c in train_caps], device=device)
    text_table = torch.zeros(len(train_caps), int(lengths.max()), cfg.text_dim, device=device)
    for i, c in enumerate(train_caps):
        text_table[i, : state_of[c].shape[0]] = state_of[c].to(device)
    print(
        f"[dit] {len(clips)} clips encoded in {time.monotonic() - start:.1f} s: video {tuple(video_x0.shape)} "
        f"std {video_x0.std():.3f}, audio {tuple(audio_x0.shape)} std {audio_x0.std():.3f}",
        flush=True,
    )
    templates = Templates.build(cfg, sorted({int(n) for n in lengths.tolist()} | {len(s) for s in states}), device)

    model = init_dit(cfg, args.seed, device)
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
    print(
        f"[dit] config {cfg.name}: {params / 1e6:.2f} M parameters; "
        f"{'resumed at step ' + str(run.step) if run.resumed else 'fresh start'}",
        flush=True,
    )
    generator = torch.Generator(device=device).manual_seed(args.seed * 7919 + run.step)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    )
    model.train()
    sums, pending = torch.zeros(4, device=device), 0
    while run.running():
        pick = torch.randint(len(clips), (args.batch,), device=device, generator=generator)
        x0_v, x0_a = video_x0[pick], audio_x0[pick]
        cap = caption_index[pick]
        u = torch.rand(args.batch, device=device, generator=generator)
        sigma_v, sigma_a = shift_sigma(u, DEFAULT_VIDEO_SHIFT), shift_sigma(u, DEFAULT_AUDIO_SHIFT)
        noise_v = torch.randn(x0_v.shape, device=device, generator=generator)
        noise_a = torch.randn(x0_a.shape, device=device, generator=generator)
        x_v = (1 - sigma_v)[:, None, None] * x0_v + sigma_v[:, None, None] * noise_v
        x_a = (1 - sigma_a)[:, None, None] * x0_a + sigma_a[:, None, None] * noise_a
        with autocast:
            pred_v, pred_a = train_forward(
                model, templates, x_v, x_a, text_table[cap], lengths[cap], 1 - sigma_v, 1 - sigma_a
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
        held = data.held_out_clips()[: args.eval_clips]
        seen = [data.Clip(*combo) for combo in data.TRAIN_COMBOS[:: max(1, len(data.TRAIN_COMBOS) // 8)]][
            : min(8, args.eval_clips)
        ]
        report = {
            "held_out": quick_eval(model, video_vae, audio_vae, state_of, held, args.eval_steps),
            "train": quick_eval(model, video_vae, audio_vae, state_of, seen, args.eval_steps),
        }
        (args.work / "dit_eval.json").write_text(json.dumps(report, indent=1))
        for key, r in report.items():
            print(
                f"[dit] quick eval {key}: accuracy {r['attribute_accuracy']:.3f} over {r['n_clips']} clips "
                f"{r['per_attribute']}",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("build/demo/train"), help="state, loss log, eval")
    parser.add_argument("--vaes", type=Path, default=Path("build/demo/train"), help="folder with the trained VAEs")
    parser.add_argument("--captions", type=Path, default=Path("build/demo/caption_states.safetensors"))
    parser.add_argument("--config", default="demo")
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
    parser.add_argument("--eval-clips", type=int, default=36, help="held-out clips sampled at the end (0: none)")
    parser.add_argument("--eval-steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    torch.set_flush_denormal(True)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    train(args)


if __name__ == "__main__":
    main()
