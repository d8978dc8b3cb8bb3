"""h3_encoder's keyframe work (fl2va): the KEYFRAMES files checked, decoded and fitted to the
canvas, the canvas chosen, and their clean latents from the video VAE's encoder.

Geometry policy (one rule, echoed in the result's INFO "geometry"): the canvas is HEIGHT x WIDTH
when both are given; otherwise the first keyframe's aspect decides the missing side(s)
(h3_core.images.canvas_for_image: with neither given, at about the model's default canvas area,
within h3_dit's limits, multiples of 32). Every keyframe is then fitted to the canvas by the
request parameter "fit" (h3_core.protocol.FITS, default DEFAULT_FIT).
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from ..diffusion.conditions import Condition
from ..diffusion.request import RequestLimits, check_canvas
from ..images import canvas_for_image, decode_image, fit_image
from ..model.vae import keyframe_latent
from ..protocol import DEFAULT_FIT, KEYFRAMES, keyframe_indices
from .settings import EncoderSettings


@dataclass
class Keyframes:
    """A request's keyframes, ready for the encoders: `frames` the frame index of each
    (FIRST_FRAME 0, LAST_FRAME -1), `images` uint8 [height, width, 3] each, fitted to the canvas,
    `geometry` the JSON echo of the policy applied (REQUEST's "geometry")."""

    frames: list[int] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)
    height: int | None = None
    width: int | None = None
    geometry: dict | None = None


def read_keyframes(
    files: list[bytes],
    indices: list[int] | None,
    height: int | None,
    width: int | None,
    fit: str | None,
    settings: EncoderSettings,
    area: int,
) -> Keyframes:
    """Decode and fit a request's KEYFRAMES (files: the encoded images, indices: KEYFRAME_INDICES
    or None) to its canvas (height, width: HEIGHT / WIDTH or None; area: the model's default
    canvas area in pixels). No keyframes -> Keyframes() with height/width as given.

    Raises ValueError naming the input: the count or indices (h3_core.protocol.keyframe_indices),
    a file (h3_core.images.decode_image: format, bytes, pixels, sides, aspect, animation,
    truncation), or the canvas (height/width out of h3_dit's limits or not multiples of 32)."""
    frames = keyframe_indices(len(files), indices)
    if not files:
        return Keyframes(height=height, width=width)
    limits = settings.image_limits()
    decoded = [decode_image(data, f"{KEYFRAMES}[{i}]", limits) for i, data in enumerate(files)]
    source = decoded[0].shape[:2]
    canvas = "requested" if height is not None and width is not None else "from the first keyframe's aspect"
    height, width = canvas_for_image(
        source[0], source[1], area, settings.max_height, settings.max_width, height=height, width=width
    )
    check_canvas(height, width, 1, RequestLimits(max_height=settings.max_height, max_width=settings.max_width))
    fit = fit or DEFAULT_FIT
    geometry = {
        "canvas": canvas,
        "height": height,
        "width": width,
        "fit": fit,
        "keyframe_sizes": [list(image.shape[:2]) for image in decoded],
    }
    images = [fit_image(image, height, width, fit) for image in decoded]
    return Keyframes(frames, images, height, width, geometry)


def keyframe_conditions(video_vae, keyframes: Keyframes) -> list[Condition]:
    """The keyframes as Conditions: each its clean normalised latent, float32 [24, 1, height/16,
    width/16] on the CPU (h3_core.model.vae.keyframe_latent), in keyframes.frames' order."""
    return [
        Condition("keyframe", frame, keyframe_latent(video_vae, torch.from_numpy(image.copy())).cpu()[:, None])
        for frame, image in zip(keyframes.frames, keyframes.images, strict=True)
    ]


def wire_conditions(conditions: list[Condition]) -> tuple[np.ndarray, list[dict]]:
    """What h3_encoder sends h3_dit of a request's conditions: CONDITION_LATENTS float32 [1, N]
    (each block's video latent then audio latent, flattened, in order) and REQUEST's "conditions"
    entries (h3_core.protocol.CONDITION_FIELDS: kind, frame for keyframes and guides, the latents'
    shapes)."""
    pieces, entries = [], []
    for condition in conditions:
        entry = {"kind": condition.kind}
        if condition.kind in ("keyframe", "guide"):
            entry["frame"] = condition.frame
        for name in ("video", "audio"):
            latent = getattr(condition, name)
            if latent is not None:
                entry[name] = list(latent.shape)
                pieces.append(latent.float().reshape(-1).numpy())
        entries.append(entry)
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    return np.ascontiguousarray(flat[None], dtype=np.float32), entries
