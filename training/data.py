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
  {side}", e.g. "a red ball rolls to the left while a low tone plays on the left";
- conditions (the training task mix, TASKS): keyframes (the clip's first / last frame, fl2va);
  a reference image (the shape alone, radius RADIUS, centred on the 64 x 96 canvas: its colour
  and shape) whose caption leaves the colour out ("a ball rolls to the left while a low tone
  plays on the left"); a reference tone (REFERENCE_SAMPLES = 1 s of the clip's tone, its side)
  whose caption leaves pitch and side out ("a red ball rolls to the left while a tone plays").

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
CAPTION = "a {colour} {shape} {verb} {direction} while a {pitch} tone plays on the {side}"  # {direction}: its phrase
SPLIT_SEED, NUM_HELD_OUT = 8, 36
REFERENCE_SAMPLES = AUDIO_SAMPLE_RATE  # the reference tone: 1 s, 40 whole audio latents
# The training tasks: t2va (text only), fl2va with the first / last / both frames as keyframes,
# ref2va with a reference image / a reference tone; each with its caption kind and request task.
TASKS = ("t2va", "first", "last", "both", "image", "audio")
REQUEST_TASKS = {
    "t2va": "t2va",
    "first": "fl2va",
    "last": "fl2va",
    "both": "fl2va",
    "image": "ref2va",
    "audio": "ref2va",
}
CAPTION_KINDS = ("full", "image", "audio")  # full: every attribute; image: no colour; audio: no pitch, side
TASK_CAPTIONS = {task: "image" if task == "image" else "audio" if task == "audio" else "full" for task in TASKS}


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

    def caption_for(self, task: str) -> str:
        """The caption of this clip for a training task (TASKS): TASK_CAPTIONS[task]'s kind."""
        return caption(*self.combo, verb=self.verb, kind=TASK_CAPTIONS[task])


def caption(colour: str, shape: str, direction: str, pitch: str, side: str, verb: int = 0, kind: str = "full") -> str:
    """The caption of the attributes (module docstring): kind "full" states every attribute,
    "image" leaves the colour out (the reference image gives it), "audio" the pitch and side (the
    reference tone gives them). Raises KeyError for an unknown kind."""
    motion = f"{shape} {VERBS[shape][verb]} {DIRECTION_PHRASES[direction]}"
    return {
        "full": f"a {colour} {motion} while a {pitch} tone plays on the {side}",
        "image": f"a {motion} while a {pitch} tone plays on the {side}",
        "audio": f"a {colour} {motion} while a tone plays",
    }[kind]


ALL_COMBOS = list(itertools.product(COLOURS, SHAPES, DIRECTIONS, PITCHES, SIDES))  # 288


def _split() -> tuple[list[tuple], list[tuple]]:
    combos = list(ALL_COMBOS)
    random.Random(SPLIT_SEED).shuffle(combos)
    held = sorted(combos[:NUM_HELD_OUT], key=ALL_COMBOS.index)
    train = [c for c in ALL_COMBOS if c not in set(held)]
    return train, held


TRAIN_COMBOS, HELD_OUT = _split()


def train_captions() -> list[str]:
    """Every training caption (each training combination with each of its verbs, of every
    caption kind), sorted."""
    return sorted(
        {
            caption(*combo, verb=v, kind=kind)
            for combo in TRAIN_COMBOS
            for v in range(len(VERBS[combo[1]]))
            for kind in CAPTION_KINDS
        }
    )


def held_out_captions() -> list[str]:
    """The evaluation captions (held-out combinations, verb 0, every caption kind) that are not
    training captions, in HELD_OUT order: every full caption; a colour-free or tone-free caption
    of a held-out combination may equal a training one (another colour / tone was trained)."""
    trained = set(train_captions())
    captions = [caption(*combo, kind=kind) for combo in HELD_OUT for kind in CAPTION_KINDS]
    return [c for c in dict.fromkeys(captions) if c not in trained]


def training_metadata() -> dict:
    """The shipped training.json (h3_core.model.training_metadata): the canvas (pixels), the
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


def render_video(clips: list[Clip], device: str | torch.device = "cpu", lift: float = 0.0) -> torch.Tensor:
    """uint8 [N, 22, 64, 96, 3] frames of the clips (antialiased 1-px edges); lift (0..255) is
    added to each channel of the shape's colour, clamped at 255 (the style LoRA's brighter clips,
    training/lora_train.py)."""
    xs, ys, radii = zip(*(trajectory(c) for c in clips), strict=True)
    return _draw(clips, torch.stack(xs), torch.stack(ys), torch.tensor(radii), device, lift)


def render_reference_image(clips: list[Clip], device: str | torch.device = "cpu") -> torch.Tensor:
    """uint8 [N, 64, 96, 3]: each clip's shape in its colour, radius RADIUS, centred (its
    reference image; the same for every clip of a colour and shape)."""
    centre = torch.tensor([[(WIDTH - 1) / 2, (HEIGHT - 1) / 2]] * len(clips))
    return _draw(clips, centre[:, :1], centre[:, 1:], torch.full((len(clips),), RADIUS), device)[:, 0]


def _draw(
    clips: list[Clip], x: torch.Tensor, y: torch.Tensor, radius: torch.Tensor, device, lift: float = 0.0
) -> torch.Tensor:
    """uint8 [N, T, 64, 96, 3]: each clip's shape and colour (+ lift per channel, at most 255)
    centred at x, y float32 [N, T] (pixels), radius float32 [N], on the background."""
    x = x.to(device)[:, :, None, None]  # [N, T, 1, 1]
    y = y.to(device)[:, :, None, None]
    r = radius.to(device)[:, None, None, None]
    gy = torch.arange(HEIGHT, device=device, dtype=torch.float32)[None, None, :, None]
    gx = torch.arange(WIDTH, device=device, dtype=torch.float32)[None, None, None, :]
    disc = ((gx - x) ** 2 + (gy - y) ** 2).sqrt()
    square = torch.maximum((gx - x).abs(), (gy - y).abs())
    is_ball = torch.tensor([c.shape == "ball" for c in clips], device=device)[:, None, None, None]
    alpha = (r + 0.5 - torch.where(is_ball, disc, square)).clamp(0, 1)[..., None]  # [N, T, H, W, 1]
    colour = torch.tensor([COLOURS[c.colour] for c in clips], device=device, dtype=torch.float32)
    colour = (colour + lift).clamp(max=255.0)
    background = torch.tensor(BACKGROUND, device=device, dtype=torch.float32)
    frames = background + alpha * (colour[:, None, None, None, :] - background)
    return frames.round().to(torch.uint8)


def render_audio(clips: list[Clip], device: str | torch.device = "cpu", samples: int = AUDIO_SAMPLES) -> torch.Tensor:
    """float32 [N, 2, samples] stereo tones at 32 kHz (left, right); samples=REFERENCE_SAMPLES
    gives the clips' reference tones."""
    n = torch.arange(samples, device=device, dtype=torch.float64)
    freq = torch.tensor([PITCHES[c.pitch] for c in clips], device=device, dtype=torch.float64)
    wave = torch.sin(2 * torch.pi * freq[:, None] * n / AUDIO_SAMPLE_RATE).float()
    gains = torch.tensor([(LOUD, QUIET) if c.side == "left" else (QUIET, LOUD) for c in clips], device=device)
    return gains[:, :, None] * wave[:, None, :]


assert AUDIO_SAMPLES == 29600 and FPS == 24 and len(ALL_COMBOS) == 288
