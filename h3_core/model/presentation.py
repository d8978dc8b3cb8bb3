"""The Qwen3-VL presentation of a prompt with its visual conditions (docs/model.md §4.1, §2.2): the token
ids the text encoder runs, the token spans of its vision blocks (the DiT tags them 0) and the
vision tower's inputs.

fl2va shows its keyframes, ref2va its guides and references in their block order (by default
reference images, videos, audio clips), each kind numbered from 1, then the prompt verbatim:

    <Picture 1>: <|vision_start|><|image_pad|>...<|vision_end|>        one per image
    <Video 1>: <0.0 seconds><|vision_start|><|video_pad|>...<|vision_end|><0.1 seconds>...
                                                                       one per video
    <Audio 1>:                                                         one per audio clip
    prompt

The official presentation is not in public code: the picture labels follow docs/model.md §4.1; the video
and audio labels are written like them (assumed). A video's block is what transformers' Qwen3-VL
processor writes for a video (Qwen3VLProcessor.replace_video_token, transformers 5.24): for each
of its grid_t temporal patch groups the group's timestamp "<t seconds>" (one decimal) and a vision
block of grid_h * grid_w / merge_size**2 <|video_pad|> tokens. Qwen3-VL has no audio tower: an
audio reference is presented by its label alone (assumed), its sound reaches the DiT through its
own rows. The text between vision blocks is tokenized as one piece without special tokens, as
the processor tokenizes its whole string (its tokenizer splits text at special tokens), so
"<Audio 1>: " and the prompt are tokenized together.

Pixels are computed without torchvision: images by transformers' PIL image processor
(Qwen2VLImageProcessorPil), videos by video_patches, a PIL/numpy port of transformers'
Qwen3VLVideoProcessor (whose own pipeline needs torchvision).
"""

import math
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen2VLImageProcessorPil
from transformers.image_transforms import normalize, rescale, resize
from transformers.image_utils import ChannelDimension
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor, smart_resize
from transformers.video_utils import VideoMetadata

from h3_core.config import FPS as VIDEO_FPS
from h3_core.rules import check_prompt

IMAGE_PROCESSOR_FILE = "preprocessor_config.json"  # Qwen3-VL's image processor settings, beside config.json
VIDEO_PROCESSOR_FILE = "video_preprocessor_config.json"  # its video processor settings, beside config.json
PICTURE_LABEL = "<Picture {}>: "  # docs/model.md §4.1: the text before image i's vision block (1-based)
VIDEO_LABEL = "<Video {}>: "  # the text before video j's timestamped blocks (1-based; assumed, module docstring)
AUDIO_LABEL = "<Audio {}>: "  # an audio clip's whole presentation (1-based; assumed, module docstring)
TIMESTAMP = "<{:.1f} seconds>"  # before each temporal patch group of a video (Qwen3VLProcessor.replace_video_token)


def check_processor(processor, file: Path, vision_config) -> None:
    """Raise ValueError naming `file` when the image or video `processor`'s patch_size,
    temporal_patch_size or merge_size differ from the vision tower's `vision_config`."""
    pairs = (
        ("patch_size", "patch_size"),
        ("temporal_patch_size", "temporal_patch_size"),
        ("merge_size", "spatial_merge_size"),
    )
    for ours, theirs in pairs:
        if getattr(processor, ours) != getattr(vision_config, theirs):
            raise ValueError(
                f"{file} has {ours}={getattr(processor, ours)} but the vision tower's "
                f"config.json has {theirs}={getattr(vision_config, theirs)}"
            )


def load_image_processor(folder: Path, vision_config) -> Qwen2VLImageProcessorPil | None:
    """Qwen3-VL's image processor from `folder`/preprocessor_config.json (None when the file is
    absent): transformers' PIL class Qwen2VLImageProcessorPil whatever class the file names
    (the torchvision one may differ in its resampling and needs torchvision), so an image's
    pixels do not depend on what is installed. Raises ValueError when its patch_size,
    temporal_patch_size or merge_size differ from the vision tower's `vision_config`."""
    if not (folder / IMAGE_PROCESSOR_FILE).is_file():
        return None
    processor = Qwen2VLImageProcessorPil.from_pretrained(str(folder), local_files_only=True)
    check_processor(processor, folder / IMAGE_PROCESSOR_FILE, vision_config)
    return processor


def load_video_processor(folder: Path, vision_config) -> Qwen3VLVideoProcessor | None:
    """Qwen3-VL's video processor settings from `folder`/video_preprocessor_config.json (None when
    the file is absent), as transformers' Qwen3VLVideoProcessor (only its settings and its
    sample_frames are used: video_patches). Raises ValueError as load_image_processor does."""
    if not (folder / VIDEO_PROCESSOR_FILE).is_file():
        return None
    processor = Qwen3VLVideoProcessor.from_pretrained(str(folder), local_files_only=True)
    check_processor(processor, folder / VIDEO_PROCESSOR_FILE, vision_config)
    return processor


def check_image(noun: str, index: int, image) -> None:
    """Raise ValueError naming `noun` `index` (1-based, e.g. "keyframe 2") unless `image` is a
    uint8 [H, W, 3] array with H, W >= 1."""
    if not (
        isinstance(image, np.ndarray)
        and image.dtype == np.uint8
        and image.ndim == 3
        and image.shape[2] == 3
        and min(image.shape) > 0
    ):
        got = f"{image.dtype} {list(image.shape)}" if isinstance(image, np.ndarray) else type(image).__name__
        raise ValueError(f"{noun} {index} must be a uint8 [H, W, 3] RGB array, got {got}")


def check_video(index: int, video, min_frames: int) -> None:
    """Raise ValueError naming video `index` (1-based) unless `video` is a uint8 [T, H, W, 3]
    array with T >= min_frames (the temporal patch size) and H, W >= 1."""
    if not (
        isinstance(video, np.ndarray)
        and video.dtype == np.uint8
        and video.ndim == 4
        and video.shape[3] == 3
        and video.shape[0] >= min_frames
        and min(video.shape) > 0
    ):
        got = f"{video.dtype} {list(video.shape)}" if isinstance(video, np.ndarray) else type(video).__name__
        raise ValueError(
            f"video {index} must be a uint8 [T, H, W, 3] RGB array of at least {min_frames} frames, got {got}"
        )


def frame_timestamps(indices: list[int], fps: float, temporal_patch_size: int) -> list[float]:
    """Seconds of each temporal patch group of frames `indices` (of a video at `fps` frames a
    second): the mean of its first and last frame's time, the indices padded with the last to a
    multiple of temporal_patch_size (transformers 5.24 Qwen3VLProcessor._calculate_timestamps)."""
    padded = list(indices) + [indices[-1]] * (-len(indices) % temporal_patch_size)
    seconds = [index / fps for index in padded]
    return [
        (seconds[i] + seconds[i + temporal_patch_size - 1]) / 2 for i in range(0, len(seconds), temporal_patch_size)
    ]


def video_patches(processor: Qwen3VLVideoProcessor, video: np.ndarray) -> tuple[np.ndarray, list[int], list[float]]:
    """The vision tower's input for one video, uint8 [T, H, W, 3] at VIDEO_FPS (24) frames a second:
    (pixel patches float32 [grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size**2],
    [grid_t, grid_h, grid_w], the timestamps of the grid_t temporal patch groups in seconds).

    As transformers 5.24's Qwen3VLVideoProcessor does it: frames sampled by its sample_frames
    (processor.fps frames a second, between min_frames and max_frames; all frames when
    do_sample_frames is off), one size for all frames from Qwen3-VL's video smart_resize
    (multiples of patch_size * merge_size, frames x height x width within the size's shortest
    and longest edge, per frame pixels capped when cap_pixels_per_frame is set), the frames padded
    with the last to a multiple of temporal_patch_size, patches in its patchify order. Each frame
    is resized, rescaled and normalised like an image by the PIL image processor (PIL resampling
    `processor.resample`, then x * rescale_factor, then (x - image_mean) / image_std in float32),
    where transformers' video processor uses torchvision: pixels may differ from its by rounding.
    """
    total = len(video)
    if processor.do_sample_frames:
        indices = processor.sample_frames(VideoMetadata(total_num_frames=total, fps=VIDEO_FPS)).tolist()
    else:
        indices = list(range(total))
    patch, merge, temporal = processor.patch_size, processor.merge_size, processor.temporal_patch_size
    factor, count = patch * merge, len(indices)
    min_pixels, max_pixels = processor.size.shortest_edge, processor.size.longest_edge
    if processor.cap_pixels_per_frame:
        per_frame = max(min(processor.max_video_tokens * factor * factor, max_pixels // count), int(min_pixels * 1.05))
        max_pixels = per_frame * count
    height, width = smart_resize(count, *video.shape[1:3], temporal, factor, min_pixels, max_pixels)
    first = ChannelDimension.FIRST
    frames = []
    for index in indices:
        frame = np.moveaxis(video[index], -1, 0)
        frame = resize(frame, (height, width), processor.resample, data_format=first, input_data_format=first)
        frame = rescale(frame, processor.rescale_factor, data_format=first, input_data_format=first)
        frames.append(normalize(frame, processor.image_mean, processor.image_std, first, first))
    frames += frames[-1:] * (-count % temporal)
    grid = [len(frames) // temporal, height // patch, width // patch]
    patches = np.stack(frames).reshape(
        grid[0], temporal, 3, grid[1] // merge, merge, patch, grid[2] // merge, merge, patch
    )
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(math.prod(grid), 3 * temporal * patch * patch)
    return np.ascontiguousarray(patches, dtype=np.float32), grid, frame_timestamps(indices, VIDEO_FPS, temporal)


def present(
    tokenizer,
    config,
    image_processor: Qwen2VLImageProcessorPil | None,
    video_processor: Qwen3VLVideoProcessor | None,
    folder: Path,
    prompt: str,
    images: list[np.ndarray],
    videos: list[np.ndarray],
    audio_count: int,
    image_noun: str,
    order: list[str] | None = None,
) -> tuple[list[int], list[tuple[int, int]], dict[str, torch.Tensor]]:
    """The presentation (module docstring) of `prompt` with `images` (uint8 [H, W, 3], any size:
    the image processor resizes them), `videos` (uint8 [T, H, W, 3] at 24 fps) and `audio_count`
    audio labels: (token ids, the [start, end) spans of its vision blocks -- every
    <|vision_start|> ... <|vision_end|>, one per image then one per temporal patch group of each
    video, in order; a video's timestamps and the labels are text --, the vision tower's inputs
    for Qwen3VLModel: pixel_values float32 and image_grid_thw int64 [images, 3] when there are
    images, pixel_values_videos float32 and video_grid_thw int64 [videos, 3] when there are
    videos).

    tokenizer, config (Qwen3VLConfig), the processors (None when absent) and folder (named in
    errors) are the text encoder's; image_noun names images in errors ("keyframe" for fl2va).
    order: the items' order in the presentation, one "image", "video" or "audio" per item (each
    kind's items in their given order); None: the images, then the videos, then the audio clips.

    Raises ValueError as check_prompt does; when an image or video is malformed (naming it); when
    audio_count is not an int >= 0; when images or videos are given and the prompt holds
    <|image_pad|> or <|video_pad|>; when `order` does not hold each kind as many times as there
    are items of it. Raises FileNotFoundError when images are given without an
    image processor or videos without a video processor."""
    prompt = check_prompt(prompt)
    for index, image in enumerate(images, start=1):
        check_image(image_noun, index, image)
    if videos and video_processor is None:
        raise FileNotFoundError(
            f"{folder / VIDEO_PROCESSOR_FILE} not found: the Qwen3-VL text encoder needs its video processor's "
            "settings to encode videos"
        )
    for index, video in enumerate(videos, start=1):
        check_video(index, video, video_processor.temporal_patch_size)
    if not isinstance(audio_count, int) or audio_count < 0:
        raise ValueError(f"audio_count must be an int >= 0, got {audio_count!r}")
    counts = {"image": len(images), "video": len(videos), "audio": audio_count}
    order = [kind for kind, count in counts.items() for _ in range(count)] if order is None else list(order)
    if sorted(order) != sorted(kind for kind, count in counts.items() for _ in range(count)):
        raise ValueError(f"order {order} must list 'image', 'video' and 'audio' once per item: {counts}")
    given = " or ".join(f"{noun}s" for noun, items in ((image_noun, images), ("video", videos)) if items)
    prompt_ids = set(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    if given and {config.image_token_id, config.video_token_id} & prompt_ids:
        raise ValueError(
            f"prompt must not contain <|image_pad|> or <|video_pad|> when {given} are given: the vision "
            "tower's features would be placed on them"
        )
    if images and image_processor is None:
        raise FileNotFoundError(
            f"{folder / IMAGE_PROCESSOR_FILE} not found: the Qwen3-VL text encoder needs its image "
            f"processor's settings to encode {image_noun}s"
        )
    ids, spans, text, vision = [], [], "", {}

    def add_block(pad_token: int, tokens: int) -> None:
        nonlocal text
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        text = ""
        spans.append((len(ids), len(ids) + tokens + 2))
        ids.extend([config.vision_start_token_id, *[pad_token] * tokens, config.vision_end_token_id])

    image_grids, patches, video_grids, video_seconds = [], [], [], []
    if images:
        vision = dict(image_processor(images=list(images), return_tensors="pt", input_data_format="channels_last"))
        image_grids = vision["image_grid_thw"].tolist()
    for video in videos:
        pixels, grid, seconds = video_patches(video_processor, video)
        patches.append(pixels)
        video_grids.append(grid)
        video_seconds.append(seconds)
    if videos:
        vision["pixel_values_videos"] = torch.from_numpy(np.concatenate(patches))
        vision["video_grid_thw"] = torch.tensor(video_grids, dtype=torch.int64)
    shown = {"image": 0, "video": 0, "audio": 0}
    for kind in order:
        index = shown[kind]
        shown[kind] += 1
        if kind == "image":
            text += PICTURE_LABEL.format(index + 1)
            add_block(config.image_token_id, math.prod(image_grids[index]) // image_processor.merge_size**2)
        elif kind == "video":
            text += VIDEO_LABEL.format(index + 1)
            grid = video_grids[index]
            for time in video_seconds[index]:
                text += TIMESTAMP.format(time)
                add_block(config.video_token_id, grid[1] * grid[2] // video_processor.merge_size**2)
        else:
            text += AUDIO_LABEL.format(index + 1)
    text += prompt
    ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids, spans, vision
