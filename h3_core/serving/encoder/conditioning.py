"""h3_encoder's condition work: fl2va's KEYFRAMES and ref2va's guides and references checked,
decoded and sized, the canvas chosen, and their clean latents from the VAEs' encoders.

Geometry policy (one rule, echoed in the result's INFO "geometry"): the canvas is HEIGHT x WIDTH
when both are given; otherwise the first keyframe's aspect decides the missing side(s)
(h3_core.inputs.images.canvas_for_image: with neither given, at about the model's default canvas area,
within h3_dit's limits, multiples of 32). Every keyframe is then fitted to the canvas by the
request parameter "fit" (h3_core.protocol.FITS, default DEFAULT_FIT).
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from h3_core.config import AUDIO_HOP, AUDIO_SAMPLE_RATE, VIDEO_SPATIAL_DOWNSAMPLE, get_config, latent_frames
from h3_core.diffusion.conditions import Condition
from h3_core.diffusion.layout import ConditionBlock, make_layout
from h3_core.diffusion.request import RequestLimits, check_canvas, request_memory_mb
from h3_core.inputs.images import canvas_for_image, fit_image
from h3_core.inputs.references import Decoding, align_reference_frames, decode_audio, decode_video
from h3_core.model.vae import keyframe_latent
from h3_core.protocol import (
    DEFAULT_FIT,
    FIRST_FRAME,
    GUIDE_FRAMES,
    GUIDES,
    KEYFRAMES,
    REFERENCE_AUDIO,
    REFERENCE_IMAGES,
    REFERENCE_INPUTS,
    REFERENCE_VIDEOS,
    keyframe_indices,
    reference_list,
)
from h3_core.serving.shared.settings import EncoderSettings


class Cancelled(Exception):
    """A request cancelled by id while h3_encoder decoded its files (Decoding.between_files)."""


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
    num_frames: int,
    decoding: Decoding | None = None,
    num_outputs: int = 1,
) -> Keyframes:
    """Decode and fit a request's KEYFRAMES (files: the encoded images, indices: KEYFRAME_INDICES
    or None) to its canvas (height, width: HEIGHT / WIDTH or None; area: the model's default
    canvas area in pixels; num_frames: NUM_FRAMES as asked; decoding: the request's Decoding, None
    for none; num_outputs: NUM_OUTPUTS). No keyframes -> Keyframes() with
    height/width as given. The keyframes are sorted once, first frame then last (the row order of
    h3_core.diffusion.layout.order_conditions): `frames`, `images`, the presentation's picture
    numbers, `geometry`'s keyframe_sizes and the canvas (from the first frame's keyframe) all
    follow it, whatever order KEYFRAME_INDICES lists them in.

    Raises ValueError naming the input: the count or indices (h3_core.protocol.keyframe_indices),
    a file (h3_core.inputs.images.decode_image: format, bytes, pixels, sides, aspect, animation,
    truncation; named by its position in KEYFRAMES as sent), the canvas (height/width out of
    h3_dit's limits or not multiples of 32), rows or memory of num_outputs over h3_dit's limits
    (check_request_size: before any VAE runs), or two different keyframes for NUM_FRAMES 1 (a
    one-frame request's first frame is its last)."""
    frames = keyframe_indices(len(files), indices)
    if not files:
        return Keyframes(height=height, width=width)
    order = sorted(range(len(files)), key=lambda i: frames[i] != FIRST_FRAME)  # first, then last
    limits = settings.image_limits()
    decoding = decoding or Decoding()
    decoded = [decoding.image(files[i], f"{KEYFRAMES}[{i}]", limits) for i in order]
    frames = [frames[i] for i in order]
    source = decoded[0].shape[:2]
    canvas = "requested" if height is not None and width is not None else "from the first keyframe's aspect"
    height, width = canvas_for_image(
        source[0], source[1], area, settings.max_height, settings.max_width, height=height, width=width
    )
    check_canvas(height, width, 1, RequestLimits(max_height=settings.max_height, max_width=settings.max_width))
    down = VIDEO_SPATIAL_DOWNSAMPLE
    check_request_size(
        [ConditionBlock("keyframe", 1, height // down, width // down, 0, frame) for frame in frames],
        height,
        width,
        num_frames,
        num_outputs,
        settings,
        "keyframes",
        "fewer outputs, fewer frames, or a smaller canvas",
    )
    fit = fit or DEFAULT_FIT
    geometry = {
        "canvas": canvas,
        "height": height,
        "width": width,
        "fit": fit,
        "keyframe_sizes": [list(image.shape[:2]) for image in decoded],
    }
    images = [fit_image(image, height, width, fit) for image in decoded]
    if num_frames == 1 and len(images) == 2 and not np.array_equal(images[0], images[1]):
        first, last = (f"{KEYFRAMES}[{i}]" for i in order)
        raise ValueError(
            f"{first} (first frame) and {last} (last frame) are different images, but NUM_FRAMES=1 asks for "
            "one frame, which is both: send one keyframe, or NUM_FRAMES >= 2"
        )
    return Keyframes(frames, images, height, width, geometry)


def keyframe_conditions(video_vae, keyframes: Keyframes) -> list[Condition]:
    """The keyframes as Conditions: each its clean normalised latent, float32 [24, 1, height/16,
    width/16] on the CPU (h3_core.model.vae.keyframe_latent), in keyframes.frames' order."""
    return [
        Condition("keyframe", frame, keyframe_latent(video_vae, torch.from_numpy(image.copy())).cpu()[:, None])
        for frame, image in zip(keyframes.frames, keyframes.images, strict=True)
    ]


def wire_conditions(conditions: list[Condition], sources: list[dict] | None = None) -> tuple[np.ndarray, list[dict]]:
    """What h3_encoder sends h3_dit of a request's conditions: CONDITION_LATENTS float32 [1, N]
    (each block's video latent then audio latent, flattened, in order) and REQUEST's "conditions"
    entries (h3_core.protocol.CONDITION_FIELDS: kind, frame for keyframes and guides, the latents'
    shapes, and each block's `sources` entry when given: "input", the file it came from, and a
    video's "start_time_seconds"; References.sources)."""
    pieces, entries = [], []
    for index, condition in enumerate(conditions):
        entry = {"kind": condition.kind, **(sources[index] if sources else {})}
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


@dataclass
class References:
    """A ref2va request's guides and references, decoded, checked and sized (read_references):
    guides (frame index, uint8 [height, width, 3] fitted to the canvas), images (uint8 [h, w, 3]
    at their own aspect), videos (uint8 [17n + 5, h, w, 3] at 24 fps, and their audio track
    float32 [2, 800 k] or None: none in the file, or the video used without its audio), audio
    (float32 [2, 800 k] at 32 kHz), each list in its input's order; `order` the references' block
    order (protocol.reference_list's entries: input, index, start_time_seconds, audio); the canvas
    and `geometry` (REQUEST's "geometry")."""

    guides: list[tuple[int, np.ndarray]] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)
    videos: list[tuple[np.ndarray, np.ndarray | None]] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)
    height: int | None = None
    width: int | None = None
    geometry: dict | None = None
    order: list[dict] = field(default_factory=list)

    def entries(self) -> list[dict]:
        """`order`, or where it is empty the default block order (protocol.reference_list without
        REFERENCES: images, then videos, then audio), so no reference is ever left out."""
        counts = {REFERENCE_IMAGES: len(self.images), REFERENCE_VIDEOS: len(self.videos)}
        return self.order or reference_list(None, {**counts, REFERENCE_AUDIO: len(self.audio)})

    def ordered(self) -> list[tuple[str, object]]:
        """The references in block order (entries()): ("image", uint8 [h, w, 3]), ("video",
        (frames, track)) or ("audio", float32 [2, N])."""
        lists = {REFERENCE_IMAGES: ("image", self.images), REFERENCE_VIDEOS: ("video", self.videos)}
        lists[REFERENCE_AUDIO] = ("audio", self.audio)
        return [(lists[entry["input"]][0], lists[entry["input"]][1][entry["index"]]) for entry in self.entries()]

    @property
    def kinds(self) -> list[str]:
        """The condition kinds, in block order: guides, then the references in `order`."""
        kinds = [kind if kind != "video" or item[1] is None else "video_audio" for kind, item in self.ordered()]
        return ["guide"] * len(self.guides) + kinds

    def presentation(self) -> tuple[list[np.ndarray], list[np.ndarray], int, list[str]]:
        """TextEncoder.encode_references' arguments after the prompt, in block order: (the guides'
        and reference images, the reference videos' frames, the number of audio clips, the
        order: "image" for each guide, then each reference's kind)."""
        ordered = self.ordered()
        images = [image for _, image in self.guides] + [item for kind, item in ordered if kind == "image"]
        videos = [item[0] for kind, item in ordered if kind == "video"]
        order = ["image"] * len(self.guides) + [kind for kind, _ in ordered]
        return images, videos, order.count("audio"), order

    def sources(self) -> list[dict]:
        """Each block's REQUEST "conditions" extras (wire_conditions), in block order: guides {},
        references {"input": "REFERENCE_AUDIO[0]"}, a video's also {"start_time_seconds"}."""
        extras = []
        for entry in self.entries():
            extra = {"input": f"{entry['input']}[{entry['index']}]"}
            if entry["input"] == REFERENCE_VIDEOS:
                extra["start_time_seconds"] = entry["start_time_seconds"]
            extras.append(extra)
        return [{}] * len(self.guides) + extras


def _whole_latents(audio: np.ndarray) -> np.ndarray:
    """Audio cut to whole 40 Hz latents (a multiple of AUDIO_HOP samples; under 25 ms dropped)."""
    return audio[:, : audio.shape[1] // AUDIO_HOP * AUDIO_HOP]


def read_references(
    files: dict[str, list[bytes]],
    guide_frames: list[int] | None,
    height: int | None,
    width: int | None,
    num_frames: int,
    num_outputs: int,
    fit: str | None,
    settings: EncoderSettings,
    default_canvas: tuple[int, int],
    order: str | bytes | None = None,
    decoding: Decoding | None = None,
) -> References:
    """Decode, check and size a request's ref2va inputs (files: REFERENCE_IMAGES, REFERENCE_VIDEOS,
    REFERENCE_AUDIO, GUIDES -> their files; guide_frames: GUIDE_FRAMES or None; order: REFERENCES'
    JSON text or None, h3_core.protocol.reference_list: the references' block order, each
    video's start_time_seconds and whether its audio is used; decoding: the request's Decoding,
    its budget and the check between files, None for none). The canvas is
    HEIGHT x WIDTH when given, else the first guide's aspect (as fl2va's first keyframe), else the
    model's default canvas (default_canvas: height, width). Guides are fitted to the canvas by
    `fit`; reference images and video frames keep their own aspect at about the canvas area
    (h3_core.inputs.images.canvas_for_image), sides multiples of 32; videos are cut to 17n + 5 frames
    (h3_core.inputs.references.align_reference_frames); audio to whole latents.

    Raises ValueError naming the input: counts over the settings' limits, REFERENCES
    (protocol.reference_list), GUIDE_FRAMES that do
    not match GUIDES or lie outside 0..num_frames - 1, a file (h3_core.inputs.images.decode_image,
    h3_core.inputs.references.decode_audio / decode_video), audio over max_total_audio_s in all, the
    canvas out of h3_dit's limits, rows of all num_outputs (conditions included; the text's not
    yet known) over max_batch_rows, or the memory of num_outputs such requests (request_memory_mb) over
    max_request_mb: refused before any VAE runs."""
    counts = {name: len(files.get(name, [])) for name in REFERENCE_INPUTS}
    for name, limit in (
        (REFERENCE_IMAGES, settings.max_reference_images),
        (REFERENCE_VIDEOS, settings.max_reference_videos),
        (REFERENCE_AUDIO, settings.max_reference_audio),
    ):
        if counts[name] > limit:
            raise ValueError(f"{name} holds {counts[name]} files: allowed 0..{limit}")
    total = sum(counts.values())
    if total > settings.max_references:
        raise ValueError(f"the request holds {total} references and guides: allowed 1..{settings.max_references}")
    listed = reference_list(order, counts)
    video_use = {entry["index"]: entry for entry in listed if entry["input"] == REFERENCE_VIDEOS}
    guides = files.get(GUIDES, [])
    if guide_frames is None and guides:
        raise ValueError(f"{GUIDES} needs {GUIDE_FRAMES}: the frame (0..{num_frames - 1}) each guide should appear at")
    guide_frames = guide_frames or []
    if len(set(guide_frames)) != len(guide_frames):
        raise ValueError(f"{GUIDE_FRAMES} {guide_frames} repeats a frame: one guide per frame")
    if len(guide_frames) != len(guides):
        raise ValueError(f"{GUIDE_FRAMES} holds {len(guide_frames)} values for {len(guides)} {GUIDES}: one per guide")
    for frame in guide_frames:
        if not 0 <= frame < num_frames:
            raise ValueError(
                f"{GUIDE_FRAMES} value {frame} is out of range: allowed 0..{num_frames - 1} (the clip's frames)"
            )
    images, media = settings.image_limits(), settings.media_limits()
    decoding = decoding or Decoding()
    guide_images = [decoding.image(data, f"{GUIDES}[{i}]", images) for i, data in enumerate(guides)]
    reference_images = [
        decoding.image(d, f"{REFERENCE_IMAGES}[{i}]", settings.reference_image_limits())
        for i, d in enumerate(files.get(REFERENCE_IMAGES, []))
    ]
    videos, audio = [], []
    for i, data in enumerate(files.get(REFERENCE_VIDEOS, [])):
        field, use = f"{REFERENCE_VIDEOS}[{i}]", video_use[i]
        decoding.between_files(field)
        videos.append(decode_video(data, field, media, use["start_time_seconds"], use["audio"], decoding.budget))
    for i, data in enumerate(files.get(REFERENCE_AUDIO, [])):
        decoding.between_files(f"{REFERENCE_AUDIO}[{i}]")
        audio.append(decode_audio(data, f"{REFERENCE_AUDIO}[{i}]", media, decoding.budget))
    seconds = sum(track.shape[1] for track in audio) / AUDIO_SAMPLE_RATE
    if seconds > settings.max_total_audio_s:
        raise ValueError(
            f"{REFERENCE_AUDIO} holds {seconds:.2f} s of audio in all: allowed up to {settings.max_total_audio_s} s"
        )
    if guide_images:
        canvas = "requested" if height is not None and width is not None else "from the first guide's aspect"
        source = guide_images[0].shape[:2]
        height, width = canvas_for_image(
            source[0],
            source[1],
            default_canvas[0] * default_canvas[1],
            settings.max_height,
            settings.max_width,
            height=height,
            width=width,
        )
    else:
        canvas = "requested" if height is not None or width is not None else "the model's default"
        height, width = height or default_canvas[0], width or default_canvas[1]
    check_canvas(height, width, 1, RequestLimits(max_height=settings.max_height, max_width=settings.max_width))
    fit = fit or DEFAULT_FIT
    area = height * width

    def own_size(image: np.ndarray) -> tuple[int, int]:
        return canvas_for_image(image.shape[0], image.shape[1], area, settings.max_height, settings.max_width)

    sized_images = [fit_image(image, *own_size(image), "stretch") for image in reference_images]
    sized_videos = []
    for frames, track in videos:
        size = own_size(frames[0])
        frames = align_reference_frames(np.stack([fit_image(frame, *size, "stretch") for frame in frames]))
        track = None if track is None else _whole_latents(track)
        sized_videos.append((frames, track if track is not None and track.shape[1] else None))
    refs = References(
        guides=[
            (frame, fit_image(image, height, width, fit))
            for frame, image in zip(guide_frames, guide_images, strict=True)
        ],
        images=sized_images,
        videos=sized_videos,
        audio=[_whole_latents(track) for track in audio],
        height=height,
        width=width,
        order=listed,
    )
    refs.geometry = {
        "canvas": canvas,
        "height": height,
        "width": width,
        "fit": fit,
        "guide_sizes": [list(image.shape[:2]) for image in guide_images],
        "reference_image_sizes": [
            [list(a.shape[:2]), list(b.shape[:2])] for a, b in zip(reference_images, sized_images, strict=True)
        ],
        "reference_video_sizes": [list(frames.shape[:3]) for frames, _ in sized_videos],
        "reference_audio_seconds": [track.shape[1] / AUDIO_SAMPLE_RATE for track in refs.audio],
    }
    check_request_size(
        _blocks(refs),
        height,
        width,
        num_frames,
        num_outputs,
        settings,
        "references and guides",
        "fewer or shorter references, fewer outputs, or a smaller canvas",
    )
    return refs


def check_request_size(
    blocks: list[ConditionBlock],
    height: int,
    width: int,
    num_frames: int,
    num_outputs: int,
    settings: EncoderSettings,
    conditions: str,
    advice: str,
) -> None:
    """Raise ValueError when the rows of num_outputs requests with these condition blocks (the
    text's rows not yet known) pass max_batch_rows, or their memory (request_memory_mb) passes
    max_request_mb: what h3_dit would refuse, said before any VAE runs. `conditions` names the
    blocks in the message ("keyframes"), `advice` what to send instead."""
    rows = make_layout(1, height, width, num_frames, conditions=tuple(blocks)).seq_len
    if rows * num_outputs > settings.max_batch_rows:
        raise ValueError(
            f"rows={rows * num_outputs} ({num_outputs} x {rows}, {conditions} included) is out of range: "
            f"allowed 1..{settings.max_batch_rows} (max_batch_rows): send {advice}"
        )
    memory = request_memory_mb(
        height, width, num_frames, rows * num_outputs, get_config(settings.config_name).hidden_size
    )
    if memory > settings.max_request_mb:
        raise ValueError(
            f"memory={memory} MiB ({conditions} included) is out of range: allowed up to "
            f"{settings.max_request_mb} MiB (max_request_mb)"
        )


def _blocks(refs: References) -> list[ConditionBlock]:
    """The condition blocks the references will make (their shapes from the sizes, no VAE run)."""
    down = VIDEO_SPATIAL_DOWNSAMPLE
    blocks = [ConditionBlock("guide", 1, refs.height // down, refs.width // down, 0, frame) for frame, _ in refs.guides]
    for kind, item in refs.ordered():
        if kind == "image":
            blocks.append(ConditionBlock("image", 1, item.shape[0] // down, item.shape[1] // down))
        elif kind == "audio":
            blocks.append(ConditionBlock("audio", 0, 0, 0, item.shape[1] // AUDIO_HOP))
        else:
            frames, track = item
            audio_t = 0 if track is None else track.shape[1] // AUDIO_HOP
            kind = "video" if track is None else "video_audio"
            shape = (latent_frames(frames.shape[0]), frames.shape[1] // down, frames.shape[2] // down)
            blocks.append(ConditionBlock(kind, *shape, audio_t))
    return blocks


def reference_conditions(video_vae, audio_vae, refs: References) -> list[Condition]:
    """The references as Conditions with their clean normalised latents (on the CPU), in block
    order (guides, then refs.order): guides and images through keyframe_latent ([24, 1, h/16,
    w/16]), videos through the video VAE ([24, 5n + 2, h/16, w/16]) and their tracks and the
    audio through the audio VAE ([2, 32, T_ref])."""

    def still(image: np.ndarray) -> torch.Tensor:
        return keyframe_latent(video_vae, torch.from_numpy(image.copy())).cpu()[:, None]

    def sound(track: np.ndarray) -> torch.Tensor:
        return audio_vae.encode(torch.from_numpy(np.ascontiguousarray(track, dtype=np.float32))).cpu()

    conditions = [Condition("guide", frame, still(image)) for frame, image in refs.guides]
    for kind, item in refs.ordered():
        if kind == "image":
            conditions.append(Condition("image", 0, still(item)))
        elif kind == "audio":
            conditions.append(Condition("audio", 0, None, sound(item)))
        else:
            frames, track = item
            video = video_vae.encode(torch.from_numpy(frames.copy())).cpu()
            kind = "video" if track is None else "video_audio"
            conditions.append(Condition(kind, 0, video, None if track is None else sound(track)))
    return conditions
