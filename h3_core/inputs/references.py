"""Reference audio and reference video for ref2va (protocol.REFERENCE_AUDIO, REFERENCE_VIDEOS):
strict, bounded decoding of the uploaded files, and the cut of a reference video to a length the
video VAE takes (17n + 5 frames, docs/model.md §4.2).

numpy and PyAV (FFmpeg) only; no torch here. Audio is float32 stereo [2, N] (left, right) at
config.AUDIO_SAMPLE_RATE (32000) Hz in [-1, 1]; video frames are uint8 RGB [T, H, W, 3] (frames,
rows, columns, channels) at config.FPS (24) frames per second. Every refusal of a file is a
ValueError whose message names the input (e.g. "REFERENCE_AUDIO[0]"), the limit and what was
found, so the encoder can pass it on as INVALID_ARG; no PyAV exception escapes.

PyAV is optional as in h3_core.media: without it this module imports, and decode_audio /
decode_video raise ValueError "... needs PyAV ...".

FFmpeg picks the demuxer from the file's content, but only demuxers on the input's list are
allowed to read it (FFmpeg's format_whitelist: a file of any other format is refused after the
content probe, before that format's demuxer parses anything): wav, flac, mp3 for audio; mov (the
MP4 / MOV / M4A / 3GP family) for video. Decoding is bounded: the duration from the container is
checked before the samples are decoded, and decoding stops as soon as the decoded length passes
the limit (a header may lie). The limit on each request's total audio length (15 s in all,
conditioned_serving_notes.md) is the caller's: these functions see one file at a time.
"""

import errno
import io
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from h3_core import config
from h3_core.inputs.images import decode_image, size_problem

try:
    import av
except ImportError:
    av = None

AUDIO_FORMATS = {"wav": "WAV", "flac": "FLAC", "mp3": "MP3"}  # FFmpeg demuxer -> the name users know
VIDEO_FORMATS = {"mov": "MP4"}  # FFmpeg's "mov,mp4,m4a,3gp,3g2,mj2" demuxer
MIN_FRAMES = 5  # the shortest clip the video VAE takes: 17n + 5 with n = 0 (docs/model.md §4.2)
FLOAT_SAMPLE_FORMATS = ("flt", "fltp", "dbl", "dblp")  # FFmpeg's sample formats that can hold NaN
FRAMES_PER_CLIP = 17  # the video VAE's clip length: a clip holds 17n + 5 frames


@dataclass(frozen=True)
class MediaLimits:
    """What decode_audio and decode_video accept.

    max_bytes: the file's size in bytes (64 MiB). min_audio_s, max_audio_s: a reference audio
    file's duration in seconds (2.0..15.0, the reference's limits, conditioned_serving_notes.md).
    max_video_s: a reference video's duration in seconds (10.0). min_video_frames: a video's frames
    after resampling to 24 fps (5, the shortest VAE clip, about 0.21 s). max_video_pixels: width x
    height of a frame (1920 x 1080: 240 frames of it are 1.5 GB as uint8 RGB). min_side, max_side:
    each side in pixels (32..4096). max_aspect: long side / short side (4.0, as for images).
    min_video_fps, max_video_fps: the stream's average frame rate (12..60 frames per second; a
    rate other than 24 is resampled to 24, see decode_video; the maximum bounds the frames decoded
    to max_video_s x max_video_fps = 600). Raises ValueError for a limit out of its range.
    """

    max_bytes: int = 64 * 1024 * 1024
    min_audio_s: float = 2.0
    max_audio_s: float = 15.0
    max_video_s: float = 10.0
    min_video_frames: int = MIN_FRAMES
    max_video_pixels: int = 1920 * 1080
    min_side: int = 32
    max_side: int = 4096
    max_aspect: float = 4.0
    min_video_fps: float = 12.0
    max_video_fps: float = 60.0

    def __post_init__(self):
        if self.max_bytes < 1:
            raise ValueError(f"MediaLimits.max_bytes must be >= 1, got {self.max_bytes}")
        if not 0 < self.min_audio_s <= self.max_audio_s:
            raise ValueError(
                f"MediaLimits needs 0 < min_audio_s <= max_audio_s, got {self.min_audio_s}, {self.max_audio_s}"
            )
        if not self.max_video_s > 0:
            raise ValueError(f"MediaLimits.max_video_s must be > 0, got {self.max_video_s}")
        if self.min_video_frames < 1:
            raise ValueError(f"MediaLimits.min_video_frames must be >= 1, got {self.min_video_frames}")
        if not 1 <= self.min_side <= self.max_side:
            raise ValueError(f"MediaLimits needs 1 <= min_side <= max_side, got {self.min_side}, {self.max_side}")
        if self.max_video_pixels < self.min_side**2:
            raise ValueError(
                f"MediaLimits.max_video_pixels must be >= min_side^2 = {self.min_side**2}, got {self.max_video_pixels}"
            )
        if not self.max_aspect >= 1.0:
            raise ValueError(f"MediaLimits.max_aspect must be >= 1.0, got {self.max_aspect}")
        if not 0 < self.min_video_fps <= self.max_video_fps:
            raise ValueError(
                f"MediaLimits needs 0 < min_video_fps <= max_video_fps, got {self.min_video_fps}, {self.max_video_fps}"
            )


def _names(formats: dict[str, str]) -> str:
    return ", ".join(formats.values())


class _Refusal(ValueError):
    """A refusal of this module (a ValueError), told apart from PyAV's ValueErrors."""


class DecodeBudget:
    """One request's decode budget (h3_encoder parameters max_decoded_pixels, max_decoded_samples):
    the pixels its images and video frames decode to (width x height of each image, and of each
    24 fps frame a video keeps, at the source's size, before any resize) and the audio samples per
    channel at 32 kHz its audio files and video tracks decode to. take() is called as they decode,
    so a request never holds more than its budget of decoded media (plus one image: images are
    counted once decoded, their pixels already bounded by max_image_pixels). Raises ValueError
    for a budget < 1."""

    def __init__(self, max_pixels: int, max_samples: int):
        if max_pixels < 1 or max_samples < 1:
            raise ValueError(f"DecodeBudget needs max_pixels and max_samples >= 1, got {max_pixels}, {max_samples}")
        self.max_pixels, self.max_samples = max_pixels, max_samples
        self.pixels = self.samples = 0

    def take(self, field: str, pixels: int = 0, samples: int = 0) -> None:
        """Count `pixels` and `samples` decoded for the input `field`. Raises ValueError naming the
        field and the budget when either total passes it."""
        self.pixels += pixels
        self.samples += samples
        if self.pixels > self.max_pixels:
            raise _Refusal(
                f"{field}: the request's media decode to more than max_decoded_pixels={self.max_pixels} pixels "
                "(the decode budget of one request: images and video frames in all, at their stored size)"
            )
        if self.samples > self.max_samples:
            raise _Refusal(
                f"{field}: the request's media decode to more than max_decoded_samples={self.max_samples} audio "
                f"samples per channel at {config.AUDIO_SAMPLE_RATE} Hz (the decode budget of one request: audio "
                "files and video sound tracks in all)"
            )


@dataclass
class Decoding:
    """How one request's files are decoded (h3_encoder's media workers): `budget`, the request's
    DecodeBudget (None: not counted), and `between_files(field)`, called before each file is
    decoded (h3_encoder: raises Cancelled once the request's id was cancelled)."""

    budget: DecodeBudget | None = None
    between_files: Callable[[str], None] = lambda field: None

    def image(self, data: bytes, field: str, limits) -> np.ndarray:
        """One image file decoded (h3_core.inputs.images.decode_image) and counted in the budget."""
        self.between_files(field)
        image = decode_image(data, field, limits)
        if self.budget is not None:
            self.budget.take(field, pixels=image.shape[0] * image.shape[1])
        return image


@contextmanager
def _open(data: bytes, field: str, limits: MediaLimits, formats: dict[str, str]):
    """The container of `data` read by one of `formats`' demuxers (a context manager). Refuses
    empty data, more than max_bytes, another format and what FFmpeg cannot open; inside the block
    PyAV's errors (av.FFmpegError, and its own ValueError, e.g. a resampler refusing a frame)
    become ValueError "<field>: is not a complete <format> file: <FFmpeg's reason>"."""
    if av is None:
        raise ValueError(
            f"{field}: decoding {_names(formats)} files needs PyAV, which is not installed (`pip install av`)"
        )
    if not data:
        raise _Refusal(f"{field}: is empty (0 bytes); expected a {_names(formats)} file")
    if len(data) > limits.max_bytes:
        raise _Refusal(f"{field}: is {len(data)} bytes, over max_bytes {limits.max_bytes}")
    try:
        container = av.open(io.BytesIO(data), container_options={"format_whitelist": ",".join(formats)})
    except av.FFmpegError as error:
        if error.errno == errno.EINVAL:  # FFmpeg's answer to a format off the whitelist
            raise _Refusal(f"{field}: is in another format; the allowed formats are {_names(formats)}") from None
        raise _Refusal(f"{field}: cannot be read as {_names(formats)} ({error.strerror})") from None
    # the whitelist let the demuxer in, so one of its names ("mov,mp4,m4a,...") is on the list
    found = next(formats[name] for name in container.format.name.split(",") if name in formats)
    with container:
        try:
            yield container
        except _Refusal:
            raise
        except (av.FFmpegError, ValueError, EOFError, OSError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise ValueError(f"{field}: is not a complete {found} file: {reason}") from None


def _first_stream(container, kind: str, field: str):
    """The container's first `kind` ("audio" or "video") stream; refuses none, and one whose codec
    this FFmpeg build cannot decode."""
    streams = container.streams.audio if kind == "audio" else container.streams.video
    if not streams:
        raise _Refusal(f"{field}: has no {kind} stream")
    if streams[0].codec_context is None:
        raise _Refusal(f"{field}: its {kind} codec has no decoder in this FFmpeg build")
    return streams[0]


def _header_seconds(container, stream) -> float | None:
    """The stream's duration in seconds as its container states it (the stream's own duration, else
    the container's), or None when neither is known."""
    if stream.duration is not None and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _resampled(container, stream, field: str) -> Iterator[tuple[int, np.ndarray]]:
    """Decode `stream` and yield (source samples per channel decoded so far, float32 [2, n] at 32
    kHz) chunk by chunk, then the resampler's flushed tail. Resampling is FFmpeg's (PyAV's
    AudioResampler: format fltp, rate config.AUDIO_SAMPLE_RATE); mono is resampled as mono and the
    channel then duplicated (FFmpeg's own mono -> stereo mix scales it by 1/sqrt(2)). Samples are
    clipped to [-1, 1] (a lossy decoder may overshoot). Refuses more than 2 channels, a sample
    rate or channel count changing mid-stream, and a float sample that is NaN or infinite (a
    float WAV may hold them; checked on the decoded source samples, before the resampler)."""
    channels, rate = stream.codec_context.channels, stream.codec_context.sample_rate
    if channels not in (1, 2):
        raise _Refusal(f"{field}: has {channels} audio channels; allowed 1 (mono, duplicated) or 2 (stereo)")
    layout = "mono" if channels == 1 else "stereo"
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=config.AUDIO_SAMPLE_RATE)
    decoded = 0

    def stereo(frames) -> np.ndarray:
        chunk = np.concatenate([frame.to_ndarray() for frame in frames], axis=1) if frames else np.zeros((channels, 0))
        return np.clip(np.repeat(chunk, 2 // channels, axis=0), -1.0, 1.0).astype(np.float32)

    for frame in container.decode(stream):
        if (frame.sample_rate, frame.layout.nb_channels) != (rate, channels):
            raise _Refusal(
                f"{field}: changes from {channels} channels at {rate} Hz to {frame.layout.nb_channels} "
                f"at {frame.sample_rate} Hz mid-stream"
            )
        if frame.format.name in FLOAT_SAMPLE_FORMATS and not np.isfinite(frame.to_ndarray()).all():
            raise _Refusal(
                f"{field}: holds non-finite samples (NaN or infinity) from {decoded / rate:.3f} s; "
                "allowed finite samples"
            )
        decoded += frame.samples
        yield decoded, stereo(resampler.resample(frame))
    yield decoded, stereo(resampler.resample(None))


def decode_audio(data: bytes, field: str, limits: MediaLimits, budget: DecodeBudget | None = None) -> np.ndarray:
    """Decode one reference audio file into float32 stereo [2, N] at 32 kHz in [-1, 1].

    `field` names the input in every message (e.g. "REFERENCE_AUDIO[0]"). Refusals, each a
    ValueError naming the field, the limit and what was found, in this order:
    - empty data, or more than limits.max_bytes bytes (before FFmpeg sees it);
    - a format other than AUDIO_FORMATS (WAV, FLAC, MP3), or bytes FFmpeg cannot read as media;
    - no audio stream; more than 2 channels (no downmix: mono and stereo only);
    - a duration from the container outside limits.min_audio_s..max_audio_s (before decoding);
    - while decoding: more than max_audio_s x the sample rate samples (decoding stops there);
      a corrupt stream (FFmpeg's reason); a sample rate or channel count changing mid-stream;
      a float sample that is NaN or infinite ("holds non-finite samples (NaN or infinity) from
      T s; allowed finite samples", T the start of the decoded frame that holds it);
    - after decoding: no samples at all, or fewer than min_audio_s x the sample rate.
    Durations are the source's samples / its sample rate. Silence is accepted. The first audio
    stream is decoded (cover art and other streams are ignored). A file cut short decodes to what
    it holds, then meets the same limits. Mono is duplicated to both channels; any sample rate is
    resampled to 32 kHz by FFmpeg (see _resampled: about n x 32000 / rate samples, within one).
    `budget` (the request's DecodeBudget, or None) counts the samples as they decode.
    """
    with _open(data, field, limits, AUDIO_FORMATS) as container:
        stream = _first_stream(container, "audio", field)
        allowed = f"allowed {limits.min_audio_s}..{limits.max_audio_s} s"
        seconds = _header_seconds(container, stream)
        if seconds is not None and not limits.min_audio_s <= seconds <= limits.max_audio_s:
            raise _Refusal(f"{field}: is {seconds:.3f} s long (from its header); {allowed}")
        rate = stream.codec_context.sample_rate
        chunks, decoded = [], 0
        for decoded, chunk in _resampled(container, stream, field):
            if decoded > limits.max_audio_s * rate:
                raise _Refusal(f"{field}: holds more than {limits.max_audio_s} s of audio (decoded); {allowed}")
            if budget is not None:
                budget.take(field, samples=chunk.shape[1])
            chunks.append(chunk)
        if decoded == 0:
            raise _Refusal(f"{field}: holds no audio samples")
        if decoded < limits.min_audio_s * rate:
            raise _Refusal(
                f"{field}: is {decoded / rate:.3f} s long (decoded, {decoded} samples at {rate} Hz); {allowed}"
            )
    return np.concatenate(chunks, axis=1)


def source_frame(index: int, fps: Fraction) -> int:
    """The source frame shown at output frame `index` of a 24 fps clip made from a stream at `fps`
    frames per second: the nearest in time, floor(index x fps / 24 + 1/2) (halves to the later
    frame), in exact rational arithmetic. At 30 fps: 0, 1, 3, 4, 5, 6, 8, ...; at 24 fps: index."""
    return math.floor(Fraction(index) * fps / config.FPS + Fraction(1, 2))


RIGHT_ANGLES = {(1, 0, 0, 1): 0, (0, -1, 1, 0): 1, (-1, 0, 0, -1): 2, (0, 1, -1, 0): 3}  # (a, b, c, d) -> turns


def display_turns(frame, field: str) -> int:
    """How many quarter turns counter-clockwise (np.rot90's k) show a decoded frame upright: from
    its display matrix (FFmpeg's AV_FRAME_DATA_DISPLAYMATRIX, what a phone writes in the MP4's
    track header; 0 without one). Raises ValueError naming the field for a matrix that mirrors
    the picture or turns it by other than a multiple of 90 degrees."""
    matrix = next((data for data in frame.side_data if getattr(data.type, "name", "") == "DISPLAYMATRIX"), None)
    if matrix is None:
        return 0
    a, b, _, c, d = np.frombuffer(bytes(matrix)[:20], dtype="<i4").tolist()
    if a * d - b * c < 0:
        raise _Refusal(f"{field}: its display matrix mirrors the picture; allowed rotations by multiples of 90 degrees")
    unit = 1 << 16  # 16.16 fixed point
    turns = RIGHT_ANGLES.get(tuple(round(value / unit) if abs(value) in (0, unit) else None for value in (a, b, c, d)))
    if turns is None:
        raise _Refusal(
            f"{field}: its display matrix turns the picture by {frame.rotation:g} degrees; allowed multiples of 90"
        )
    return turns


def _video_frames(
    container, stream, field: str, limits: MediaLimits, fps: Fraction, budget: DecodeBudget | None
) -> np.ndarray:
    """Decode the frames of `stream` (n of them at `fps`) and keep the 24 fps ones: output frame k
    of ceil(n x 24 / fps) is source frame min(source_frame(k, fps), n - 1), turned upright by its
    display matrix (display_turns). Each kept frame is counted in `budget` (None: not counted)."""
    width, height = stream.codec_context.width, stream.codec_context.height
    max_frames = math.floor(Fraction(limits.max_video_s) * fps)
    picked, last, count = [], None, 0
    for last in container.decode(stream):
        if (last.width, last.height) != (width, height):
            raise _Refusal(
                f"{field}: frame {count} is {last.width}x{last.height} px, the stream declares {width}x{height}"
            )
        if count == max_frames:
            raise _Refusal(
                f"{field}: holds more than {max_frames} frames at {float(fps):g} fps (decoded), "
                f"over max_video_s {limits.max_video_s}"
            )
        rgb = None
        while source_frame(len(picked), fps) == count:
            if budget is not None:
                budget.take(field, pixels=width * height)
            rgb = np.rot90(last.to_ndarray(format="rgb24"), display_turns(last, field)) if rgb is None else rgb
            picked.append(rgb)
        count += 1
    if count == 0:
        raise _Refusal(f"{field}: holds no video frames")
    total = math.ceil(Fraction(count * config.FPS) / fps)
    if total > len(picked):
        if budget is not None:
            budget.take(field, pixels=width * height * (total - len(picked)))
        picked += [np.rot90(last.to_ndarray(format="rgb24"), display_turns(last, field))] * (total - len(picked))
    if total < limits.min_video_frames:
        raise _Refusal(
            f"{field}: is {total} frames at {config.FPS} fps ({count} at {float(fps):g} fps); "
            f"allowed at least min_video_frames {limits.min_video_frames}"
        )
    return np.stack(picked)


def _check_video_stream(container, stream, field: str, limits: MediaLimits) -> Fraction:
    """Check what the video stream's header states (size, aspect, frame rate, duration); return
    its frame rate."""
    width, height = stream.codec_context.width, stream.codec_context.height
    pixels = ("max_video_pixels", limits.max_video_pixels)
    problem = size_problem(width, height, "", limits.min_side, limits.max_side, pixels, limits.max_aspect)
    if problem is not None:
        raise _Refusal(f"{field}: {problem}")
    fps = stream.average_rate or stream.guessed_rate
    if not fps:
        raise _Refusal(f"{field}: has no frame rate")
    if not limits.min_video_fps <= fps <= limits.max_video_fps:
        raise _Refusal(
            f"{field}: is {float(fps):g} fps; allowed {limits.min_video_fps:g}..{limits.max_video_fps:g} fps "
            f"(resampled to {config.FPS})"
        )
    seconds = _header_seconds(container, stream)
    if seconds is not None and seconds > limits.max_video_s:
        raise _Refusal(f"{field}: is {seconds:.3f} s long (from its header), over max_video_s {limits.max_video_s}")
    return Fraction(fps)


def decode_video(
    data: bytes,
    field: str,
    limits: MediaLimits,
    start_s: float = 0.0,
    with_audio: bool = True,
    budget: DecodeBudget | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Decode one reference video file: (frames uint8 RGB [T, H, W, 3] at 24 fps, its audio track
    float32 stereo [2, N] at 32 kHz in [-1, 1], or None when the file has no audio stream or
    `with_audio` is False: the video without its audio, its track not decoded).

    start_s: where the reference starts in the file, in seconds (protocol.REFERENCES'
    start_time_seconds): the frames from output frame round(start_s x 24) on, and the track from
    the same instant (config.audio_num_samples of those frames); refused when fewer than
    min_video_frames frames remain ("start_time_seconds=S leaves N frames ...").
    budget: the request's DecodeBudget (None: not counted): every kept frame (its stored width x
    height, before the cut at start_s) and the track's decoded samples count as they decode.

    `field` names the input in every message (e.g. "REFERENCE_VIDEOS[0]"; the audio track's as
    "REFERENCE_VIDEOS[0] audio track"). Refusals, each a ValueError naming the field, in this order:
    - empty data, or more than limits.max_bytes bytes (before FFmpeg sees it);
    - a format other than VIDEO_FORMATS (MP4, FFmpeg's mov family: MOV, M4A, 3GP read too), or
      bytes FFmpeg cannot read as media;
    - no video stream ("has no video stream": an audio-only MP4 / M4A);
    - from the stream's header, before any frame is decoded: a side outside
      limits.min_side..max_side, width x height over max_video_pixels, long / short side over
      max_aspect, no frame rate or an average rate outside min_video_fps..max_video_fps, a duration
      over max_video_s;
    - while decoding: a frame of another size than the header's; more than max_video_s x fps
      frames (decoding stops there); a corrupt stream (FFmpeg's reason);
    - fewer than min_video_frames frames at 24 fps.
    The first video stream is decoded. Its rate (the average rate; a variable-rate stream is taken
    as constant at it) becomes 24 fps by frame index: n frames at fps give T = ceil(n x 24 / fps)
    frames (the output frames starting within the source's duration), frame k being the source
    frame nearest in time, min(source_frame(k, fps), n - 1). At 24 fps the frames are the source's.
    A display matrix (a phone's rotation) is applied as images' EXIF orientation is: frames
    turned by its multiple of 90 degrees (a portrait phone clip comes out portrait); a matrix
    that mirrors or turns by another angle is refused ("its display matrix mirrors the
    picture ..."). Frames are
    converted to RGB by FFmpeg's swscale (PyAV's to_ndarray("rgb24")).

    The audio track (the first audio stream) is decoded as decode_audio does (mono duplicated, more
    than 2 channels refused, resampled to 32 kHz) and cut to the returned frames' duration,
    config.audio_num_samples(T) samples (decoding stops there: an AAC track's padding past the last
    frame is dropped); a shorter track stays as it is, one with no samples is refused.
    """
    with _open(data, field, limits, VIDEO_FORMATS) as container:
        stream = _first_stream(container, "video", field)
        fps = _check_video_stream(container, stream, field, limits)
        frames = _video_frames(container, stream, field, limits, fps, budget)
        has_track = bool(container.streams.audio)
    first = math.floor(start_s * config.FPS + 0.5)
    if len(frames) - first < limits.min_video_frames:
        latest = max(0.0, (len(frames) - limits.min_video_frames) / config.FPS)
        raise _Refusal(
            f"{field}: start_time_seconds={start_s:g} leaves {max(0, len(frames) - first)} of its {len(frames)} "
            f"frames at {config.FPS} fps; allowed 0..{latest:.3f} s (at least min_video_frames "
            f"{limits.min_video_frames} frames from it)"
        )
    frames = frames[first:]
    if not (has_track and with_audio):
        return frames, None
    track = f"{field} audio track"
    skipped = config.audio_num_samples(first)
    with _open(data, track, limits, VIDEO_FORMATS) as container:
        wanted, chunks, held = skipped + config.audio_num_samples(len(frames)), [], 0
        for _, chunk in _resampled(container, _first_stream(container, "audio", track), track):
            if budget is not None:
                budget.take(track, samples=chunk.shape[1])
            chunks.append(chunk)
            held += chunk.shape[1]
            if held >= wanted:
                break
        if held == 0:
            raise _Refusal(f"{track}: holds no audio samples")
    return frames, np.concatenate(chunks, axis=1)[:, skipped:wanted]


def align_reference_frames(frames: np.ndarray) -> np.ndarray:
    """A reference video's frames cut to a length the video VAE takes: [T', H, W, 3] of the same
    dtype, T' = the largest 17n + 5 <= T (docs/model.md §4.2; nothing invented: at most 16 frames, 0.67 s,
    dropped from the end); T of 1..4 is padded to 5 by repeating the last frame. Goldens: T 5 -> 5,
    21 -> 5, 22 -> 22, 240 -> 226, 3 -> 5. Returns the same array when T is already 17n + 5.
    Raises ValueError for an array that is not [T, H, W, 3] with T >= 1."""
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] == 0:
        raise ValueError(f"frames must be [T, H, W, 3] with T >= 1, got {list(frames.shape)}")
    count = frames.shape[0]
    if count < MIN_FRAMES:
        return np.concatenate([frames, np.repeat(frames[-1:], MIN_FRAMES - count, axis=0)])
    aligned = MIN_FRAMES + (count - MIN_FRAMES) // FRAMES_PER_CLIP * FRAMES_PER_CLIP
    return frames if aligned == count else frames[:aligned]
