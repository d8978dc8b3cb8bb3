"""The procedural data set: a coloured shape moving on a plain background, with a stereo tone.

Every clip is fixed by its attributes (colour, shape, direction, pitch, side) and a seed:

- video: 64 x 96 px, 22 frames at 24 fps (the `tiny` canvas); a disc ("ball") or a square of
  about 18 px in one of COLOURS on a dark grey background, moving in a straight line across
  the frame (left / right: 56 px, up / down: 36 px). The seed jitters the size (+-1 px), the
  start along the motion (+-3 px) and the position across it (+-6 px);
- audio: 37 latents x 800 = 29,600 samples at 32 kHz (the clip's 0.92 s rounded up to whole
  audio latents), a sine of PITCHES[pitch] Hz starting at phase 0, amplitude 0.5 on the named
  side and 0.05 on the other, so the tone is fully fixed by the caption;
- caption: "a {colour} {shape} {verb} {direction phrase} while a {pitch} tone plays on the
  {side}", e.g. "a red ball rolls to the left while a low tone plays on the left".

HELD_OUT (36 of the 288 attribute combinations, a seeded choice) never appears in training;
the evaluation prompts are built from it. Rendering is vectorised torch and runs on any device.
"""

import itertools
import random
from dataclasses import dataclass

import torch

from h3_core.config import AUDIO_HOP, AUDIO_SAMPLE_RATE, FPS, audio_latent_frames

HEIGHT, WIDTH, NUM_FRAMES = 64, 96, 22
AUDIO_SAMPLES = audio_latent_frames(NUM_FRAMES) * AUDIO_HOP  # 29,600: whole audio latents
BACKGROUND = (32, 32, 32)
COLOURS = {
    "red": (220, 50, 50),
    "green": (60, 200, 70),
    "blue": (60, 100, 235),
    "yellow": (235, 215, 60),
    "purple": (170, 70, 210),
    "white": (235, 235, 235),
}
SHAPES = ("ball", "square")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # (dx, dy), y down
DIRECTION_PHRASES = {"left": "to the left", "right": "to the right", "up": "up", "down": "down"}
VERBS = {"ball": ("rolls", "moves", "slides"), "square": ("slides", "moves", "glides")}
PITCHES = {"low": 220.0, "medium": 440.0, "high": 880.0}
SIDES = ("left", "right")
LOUD, QUIET = 0.5, 0.05
RADIUS = 9.0  # px: disc radius / half the square's side
TRAVEL = {"horizontal": 56.0, "vertical": 36.0}  # px covered from the first to the last frame
ATTRIBUTES = ("colour", "shape", "direction", "pitch", "side")
CAPTION = "a {colour} {shape} {verb} {direction} while a {pitch} tone plays on the {side}"  # {direction}: its phrase
SPLIT_SEED, NUM_HELD_OUT = 8, 36


@dataclass(frozen=True)
class Clip:
    """One clip's attributes; `verb` picks VERBS[shape][verb]; `seed` the jitter."""

    colour: str
    shape: str
    direction: str
    pitch: str
    side: str
    verb: int = 0
    seed: int = 0

    @property
    def combo(self) -> tuple[str, str, str, str, str]:
        return (self.colour, self.shape, self.direction, self.pitch, self.side)

    @property
    def caption(self) -> str:
        return caption(*self.combo, verb=self.verb)


def caption(colour: str, shape: str, direction: str, pitch: str, side: str, verb: int = 0) -> str:
    """The caption stating the attributes (CAPTION; see the module docstring)."""
    return CAPTION.format(
        colour=colour,
        shape=shape,
        verb=VERBS[shape][verb],
        direction=DIRECTION_PHRASES[direction],
        pitch=pitch,
        side=side,
    )


ALL_COMBOS = list(itertools.product(COLOURS, SHAPES, DIRECTIONS, PITCHES, SIDES))  # 288


def _split() -> tuple[list[tuple], list[tuple]]:
    combos = list(ALL_COMBOS)
    random.Random(SPLIT_SEED).shuffle(combos)
    held = sorted(combos[:NUM_HELD_OUT], key=ALL_COMBOS.index)
    train = [c for c in ALL_COMBOS if c not in set(held)]
    return train, held


TRAIN_COMBOS, HELD_OUT = _split()


def train_captions() -> list[str]:
    """Every training caption (each training combination with each of its verbs), sorted."""
    return sorted({caption(*combo, verb=v) for combo in TRAIN_COMBOS for v in range(len(VERBS[combo[1]]))})


def training_metadata() -> dict:
    """The shipped training.json (h3_core.weights.training_metadata): the canvas (pixels), the
    clip length (frames), the caption template and every word of the training captions, sorted."""
    words = sorted({word for text in train_captions() for word in text.split()})
    return {"height": [HEIGHT], "width": [WIDTH], "num_frames": [NUM_FRAMES], "caption": CAPTION, "words": words}


def held_out_clips(verb: int = 0) -> list[Clip]:
    """One clip per held-out combination (seed 0), for the evaluation."""
    return [Clip(*combo, verb=verb) for combo in HELD_OUT]


def train_clips(variants: int, seed: int = 0) -> list[Clip]:
    """`variants` clips of every training combination with seeds drawn from `seed`, verbs
    cycling through the shape's verbs."""
    rng = random.Random(seed)
    return [
        Clip(*combo, verb=k % len(VERBS[combo[1]]), seed=rng.randrange(2**31))
        for combo in TRAIN_COMBOS
        for k in range(variants)
    ]


def trajectory(clip: Clip) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Shape centre per frame: x, y float32 [NUM_FRAMES] (pixels) and the radius."""
    gen = torch.Generator().manual_seed(clip.seed)
    jitter = torch.rand(3, generator=gen) * 2 - 1  # size, along, across in [-1, 1]
    radius = RADIUS + float(jitter[0])
    dx, dy = DIRECTIONS[clip.direction]
    travel = TRAVEL["horizontal" if dx else "vertical"]
    s = torch.linspace(-0.5, 0.5, NUM_FRAMES) * travel + 3.0 * float(jitter[1])
    across = 6.0 * float(jitter[2])
    cx, cy = (WIDTH - 1) / 2, (HEIGHT - 1) / 2
    if dx:
        return cx + dx * s, torch.full_like(s, cy + across), radius
    return torch.full_like(s, cx + across), cy + dy * s, radius


def render_video(clips: list[Clip], device: str | torch.device = "cpu") -> torch.Tensor:
    """uint8 [N, 22, 64, 96, 3] frames of the clips (antialiased 1-px edges)."""
    xs, ys, radii = zip(*(trajectory(c) for c in clips), strict=True)
    x = torch.stack(xs).to(device)[:, :, None, None]  # [N, T, 1, 1]
    y = torch.stack(ys).to(device)[:, :, None, None]
    r = torch.tensor(radii, device=device)[:, None, None, None]
    gy = torch.arange(HEIGHT, device=device, dtype=torch.float32)[None, None, :, None]
    gx = torch.arange(WIDTH, device=device, dtype=torch.float32)[None, None, None, :]
    disc = ((gx - x) ** 2 + (gy - y) ** 2).sqrt()
    square = torch.maximum((gx - x).abs(), (gy - y).abs())
    is_ball = torch.tensor([c.shape == "ball" for c in clips], device=device)[:, None, None, None]
    alpha = (r + 0.5 - torch.where(is_ball, disc, square)).clamp(0, 1)[..., None]  # [N, T, H, W, 1]
    colour = torch.tensor([COLOURS[c.colour] for c in clips], device=device, dtype=torch.float32)
    background = torch.tensor(BACKGROUND, device=device, dtype=torch.float32)
    frames = background + alpha * (colour[:, None, None, None, :] - background)
    return frames.round().to(torch.uint8)


def render_audio(clips: list[Clip], device: str | torch.device = "cpu") -> torch.Tensor:
    """float32 [N, 2, AUDIO_SAMPLES] stereo tones at 32 kHz (left, right)."""
    n = torch.arange(AUDIO_SAMPLES, device=device, dtype=torch.float64)
    freq = torch.tensor([PITCHES[c.pitch] for c in clips], device=device, dtype=torch.float64)
    wave = torch.sin(2 * torch.pi * freq[:, None] * n / AUDIO_SAMPLE_RATE).float()
    gains = torch.tensor([(LOUD, QUIET) if c.side == "left" else (QUIET, LOUD) for c in clips], device=device)
    return gains[:, :, None] * wave[:, None, :]


assert AUDIO_SAMPLES == 29600 and FPS == 24 and len(ALL_COMBOS) == 288
