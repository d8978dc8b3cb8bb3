"""Train the demo DiT's two LoRAs on the CPU: a few-step (turbo) student and a style adapter.

    python -m training.lora_train [--which turbo,style] [--weights weights/demo] [--out weights/demo]

Both train a rank-RANK A/B pair on every block's attn.qkv_proj, attn.out_proj, mlp.fc1 and mlp.fc2
(the base frozen), with autograd through dit_train.train_forward (the blocks' own code, t2va rows),
and are saved in FlashGen naming (`transformer.blocks.N.<linear>.lora_A.weight` / `lora_B`,
metadata lora_rank, lora_alpha, base_schedule), which h3_core.weights.lora_formats.read_lora reads
into what the server adds: the delta alpha / rank * (x A^T) B^T, as `LoraDelta` adds it here.

- turbo (`turbo_lora.safetensors`): distilled from the base's own TEACHER_STEPS-step outputs. The
  teacher latents x0 of TRAIN_CLIPS training captions, each with its own seed's noise n, are
  generated first with the served engine (Engine.run_to_completion). The student's sigma points
  are default_sigmas(TURBO_SCHEDULE): video [1, 0.923, 0], audio [1, 0.75, 0] (2 forwards; its
  first point alone is the 1-step sampler, [1, 0]). At each point the target is the velocity
  that carries the student's own current x onto the teacher's x0 in one Euler step, (x0 - x) /
  sigma: at sigma 1, x = n and the target is x0 - n; at the second point x is where the student's
  own first step lands, n + (1 - sigma_1) v (detached). Loss: MSE of video and audio velocities,
  summed over both points.
- style (`style_lora.safetensors`): flow matching (dit_train's objective: shifted sigma draws,
  velocity x0 - n) on clips whose shape is drawn STYLE_LIFT brighter per channel
  (data.render_video's lift, clamped at 255), with the clips' own tones: brighter shapes, the same
  motion and sound.

Seeded and counted in optimizer steps (not seconds), so a run is reproducible: AdamW, lr
loop.lr_at's warm-up + cosine over the steps, batch BATCH. The figures of the shipped files are
training.lora_evaluate's (docs/lora.md §"The demo's LoRAs").
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from h3_core.config import AUDIO_ROW_WIDTH, VIDEO_ROW_WIDTH
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest
from h3_core.diffusion.sampling import DEFAULT_AUDIO_SHIFT, DEFAULT_VIDEO_SHIFT, default_sigmas, shift_sigma
from h3_core.factory import load_engine
from h3_core.model import H3DiT

from . import data
from .dit_train import Templates, encode_clips, train_forward
from .loop import lr_at

TARGETS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")  # in every block
RANK, ALPHA = 16, 16.0
TURBO_SCHEDULE = "[1, 0.5, 0]"  # base positions of the turbo student's 2 forwards (default_sigmas)
TEACHER_STEPS = 8
STYLE_LIFT = 75.0  # RGB levels added to the shape's colour in the style LoRA's clips
TRAIN_CLIPS, BATCH = 160, 8
FILES = {"turbo": "turbo_lora.safetensors", "style": "style_lora.safetensors"}


class LoraDelta(torch.nn.Module):
    """Trainable LoRA pairs on the TARGETS linears of a DiT's blocks: per target A float32 [rank,
    in] (seeded normal, std 1 / sqrt(in)) and B [out, rank] (zeros: the adapter starts as the identity).
    `attach` adds alpha / rank * (x A^T) B^T to each target's output (x [rows, in]); `save` writes
    the FlashGen file read_lora reads."""

    def __init__(self, model: H3DiT, rank: int = RANK, alpha: float = ALPHA, seed: int = 0):
        super().__init__()
        self.rank, self.alpha = rank, alpha
        gen = torch.Generator().manual_seed(seed)
        self.names = [f"blocks.{i}.{t}" for i in range(len(model.blocks)) for t in TARGETS]
        self.a, self.b = torch.nn.ParameterList(), torch.nn.ParameterList()
        for name in self.names:
            linear = model.get_submodule(name)
            self.a.append(
                torch.nn.Parameter(torch.randn(rank, linear.in_features, generator=gen) / linear.in_features**0.5)
            )
            self.b.append(torch.nn.Parameter(torch.zeros(linear.out_features, rank)))

    def attach(self, model: H3DiT) -> list:
        """Forward hooks adding each target's delta; returns their handles (remove() detaches)."""

        def hook(a, b):
            return lambda module, args, out: out + F.linear(F.linear(args[0], a), b) * (self.alpha / self.rank)

        return [
            model.get_submodule(name).register_forward_hook(hook(a, b))
            for name, a, b in zip(self.names, self.a, self.b, strict=True)
        ]

    def save(self, path: Path, base_schedule: str | None = None, **metadata: str) -> None:
        """Write the pairs (float32) in FlashGen naming with metadata lora_rank, lora_alpha, the
        optional base_schedule and `metadata`."""
        tensors = {}
        for name, a, b in zip(self.names, self.a, self.b, strict=True):
            tensors[f"transformer.{name}.lora_A.weight"] = a.detach().contiguous()
            tensors[f"transformer.{name}.lora_B.weight"] = b.detach().contiguous()
        meta = {"lora_rank": str(self.rank), "lora_alpha": str(self.alpha), **metadata}
        if base_schedule is not None:
            meta["base_schedule"] = base_schedule
        save_file(tensors, str(path), metadata=meta)


class Batches:
    """The t2va inputs train_forward takes for a set of captions: text states from the engine's
    encoder, padded into a table; templates; zero condition slots."""

    def __init__(self, engine: Engine, captions: list[str]):
        states = [engine.encode_prompt(c) for c in captions]
        self.lengths = torch.tensor([s.shape[0] for s in states])
        self.text = torch.zeros(len(states), int(self.lengths.max()), engine.dit.cfg.text_dim)
        for i, s in enumerate(states):
            self.text[i, : s.shape[0]] = s
        self.templates = Templates.build(engine.dit.cfg, sorted(set(self.lengths.tolist())), "cpu")

    def forward(self, model, pick, x_v, x_a, sigma_v, sigma_a):
        """train_forward of rows x_v [B, V, 96], x_a [B, 2*T_a, 32] of captions `pick` int64 [B] at
        sigma_v / sigma_a (floats or float32 [B]); returns velocities (video, audio) float32."""
        tpl, batch = self.templates, pick.shape[0]
        zeros_v = torch.zeros(batch, tpl.video_inputs - tpl.video_rows, VIDEO_ROW_WIDTH)
        zeros_a = torch.zeros(batch, tpl.audio_inputs - tpl.audio_rows, AUDIO_ROW_WIDTH)
        t_v, t_a = (1 - torch.as_tensor(s, dtype=torch.float32).expand(batch) for s in (sigma_v, sigma_a))
        task = torch.zeros(batch, dtype=torch.int64)  # data.TASKS[0]: t2va
        return train_forward(
            model, tpl, torch.cat([zeros_v, x_v], 1), torch.cat([zeros_a, x_a], 1), self.text[pick],
            self.lengths[pick], task, t_v.contiguous(), t_a.contiguous(),
        )  # fmt: skip


def teacher(engine: Engine, captions: list[str], seeds: list[int], pack: int = 16) -> dict[str, torch.Tensor]:
    """The base's TEACHER_STEPS-step latents of each caption with its seed (Engine.run_to_completion,
    `pack` requests a forward): "noise_v" [N, V, 96], "noise_a" [N, 2*T_a, 32] (the initial rows),
    "x0_v", "x0_a" (the final ones)."""
    out = {key: [] for key in ("noise_v", "noise_a", "x0_v", "x0_a")}
    for start in range(0, len(captions), pack):
        states = []
        for caption, seed in zip(captions[start : start + pack], seeds[start : start + pack], strict=True):
            request = GenerationRequest(caption, data.HEIGHT, data.WIDTH, data.NUM_FRAMES, TEACHER_STEPS, seed)
            states += engine.prepare(request)
        out["noise_v"] += [s.video_latents.clone() for s in states]
        out["noise_a"] += [s.audio_latents.clone() for s in states]
        for state in engine.run_to_completion(states):
            out["x0_v"].append(state.video_latents)
            out["x0_a"].append(state.audio_latents)
    return {key: torch.stack(rows) for key, rows in out.items()}


def frozen_dit(engine: Engine) -> H3DiT:
    """A copy of the engine's DiT for training: its weights, frozen; row tiling off (one GEMM a linear)."""
    model = H3DiT(engine.dit.cfg, row_tile=0)
    missing, unexpected = model.load_state_dict(engine.dit.state_dict(), strict=False)
    if missing:
        raise ValueError(f"the engine's DiT lacks weights {missing[:3]}")
    model.requires_grad_(False)
    return model


def optimise(delta: LoraDelta, steps: int, lr: float, loss_of, name: str, log_every: int = 10) -> list[float]:
    """`steps` AdamW steps of loss_of(step) -> scalar loss on delta's pairs, lr loop.lr_at over
    the steps, gradients clipped to 1; returns the mean loss of each log_every steps."""
    optimizer = torch.optim.AdamW(delta.parameters(), lr=lr, weight_decay=0.0)
    means, total, start = [], 0.0, time.monotonic()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step / steps, lr)
        loss = loss_of(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(delta.parameters(), 1.0)
        optimizer.step()
        total += float(loss.detach())
        if (step + 1) % log_every == 0:
            means.append(round(total / log_every, 6))
            print(f"[{name}] step {step + 1}/{steps} loss {means[-1]:.5f} {time.monotonic() - start:.0f} s", flush=True)
            total = 0.0
    return means


def train_turbo(engine: Engine, clips: list[data.Clip], steps: int, lr: float, seed: int) -> tuple[LoraDelta, list]:
    """The turbo student (module docstring) on `clips`' captions, seeds seed + 1 + i."""
    captions = [c.caption for c in clips]
    start = time.monotonic()
    target = teacher(engine, captions, [seed + 1 + i for i in range(len(clips))])
    print(f"[turbo] teacher latents of {len(clips)} clips in {time.monotonic() - start:.0f} s", flush=True)
    batches, model = Batches(engine, captions), frozen_dit(engine)
    delta = LoraDelta(model, seed=seed)
    delta.attach(model)
    video_sigmas, audio_sigmas = default_sigmas(TURBO_SCHEDULE)
    s_v, s_a = video_sigmas[1], audio_sigmas[1]
    gen = torch.Generator().manual_seed(seed)

    def loss_of(step: int) -> torch.Tensor:
        pick = torch.randint(len(clips), (BATCH,), generator=gen)
        n_v, n_a, x0_v, x0_a = (target[k][pick] for k in ("noise_v", "noise_a", "x0_v", "x0_a"))
        p_v, p_a = batches.forward(model, pick, n_v, n_a, 1.0, 1.0)
        first = F.mse_loss(p_v, x0_v - n_v) + F.mse_loss(p_a, x0_a - n_a)
        x_v, x_a = n_v + (1 - s_v) * p_v.detach(), n_a + (1 - s_a) * p_a.detach()
        q_v, q_a = batches.forward(model, pick, x_v, x_a, s_v, s_a)
        second = F.mse_loss(q_v, (x0_v - x_v) / s_v) + F.mse_loss(q_a, (x0_a - x_a) / s_a)
        return first + second

    return delta, optimise(delta, steps, lr, loss_of, "turbo")


def train_style(engine: Engine, clips: list[data.Clip], steps: int, lr: float, seed: int) -> tuple[LoraDelta, list]:
    """The style adapter (module docstring) on `clips` drawn STYLE_LIFT brighter."""
    x0 = encode_clips(clips, engine.video_vae, engine.audio_vae, "cpu", lift=STYLE_LIFT)
    batches, model = Batches(engine, [c.caption for c in clips]), frozen_dit(engine)
    delta = LoraDelta(model, seed=seed)
    delta.attach(model)
    gen = torch.Generator().manual_seed(seed)

    def loss_of(step: int) -> torch.Tensor:
        pick = torch.randint(len(clips), (BATCH,), generator=gen)
        x0_v, x0_a = x0["video"][pick], x0["audio"][pick]
        u = torch.rand(BATCH, generator=gen)
        s_v, s_a = shift_sigma(u, DEFAULT_VIDEO_SHIFT), shift_sigma(u, DEFAULT_AUDIO_SHIFT)
        n_v, n_a = torch.randn(x0_v.shape, generator=gen), torch.randn(x0_a.shape, generator=gen)
        x_v = (1 - s_v)[:, None, None] * x0_v + s_v[:, None, None] * n_v
        x_a = (1 - s_a)[:, None, None] * x0_a + s_a[:, None, None] * n_a
        p_v, p_a = batches.forward(model, pick, x_v, x_a, s_v, s_a)
        return F.mse_loss(p_v, x0_v - n_v) + F.mse_loss(p_a, x0_a - n_a)

    return delta, optimise(delta, steps, lr, loss_of, "style")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--which", default="turbo,style", help="comma list of turbo, style")
    parser.add_argument("--weights", type=Path, default=Path("weights/demo"), help="the base checkpoint folder")
    parser.add_argument("--out", type=Path, default=Path("weights/demo"), help="folder for the LoRA files")
    parser.add_argument("--turbo-steps", type=int, default=160)
    parser.add_argument("--style-steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--clips", type=int, default=TRAIN_CLIPS, help="training captions (one clip each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CPU is shared)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    engine = load_engine("demo", args.weights)
    pool = data.train_clips(1, seed=args.seed)
    clips = [pool[i] for i in torch.randperm(len(pool), generator=torch.Generator().manual_seed(args.seed))]
    clips = clips[: args.clips]
    log = {}
    for which in args.which.split(","):
        start = time.monotonic()
        if which == "turbo":
            delta, losses = train_turbo(engine, clips, args.turbo_steps, args.lr, args.seed)
            schedule, steps = TURBO_SCHEDULE, args.turbo_steps
        elif which == "style":
            delta, losses = train_style(engine, clips, args.style_steps, args.lr, args.seed)
            schedule, steps = None, args.style_steps
        else:
            raise SystemExit(f"--which {which!r}: allowed turbo, style")
        args.out.mkdir(parents=True, exist_ok=True)
        delta.save(args.out / FILES[which], schedule, trained_by="training.lora_train", steps=str(steps))
        log[which] = {"steps": steps, "seconds": round(time.monotonic() - start, 1), "loss_every_10": losses}
        print(f"[{which}] wrote {args.out / FILES[which]} in {log[which]['seconds']} s", flush=True)
    print(json.dumps(log))


if __name__ == "__main__":
    main()
