"""The project's one MP4 writer (H.264 + AAC via PyAV) and one WAV writer (stdlib `wave`), used
by the server, the client (client.generate --wav) and the Videos API alike. No torch import: the
client installs without torch (tests/test_client_install.py); torch tensors are taken as they are.

PyAV is optional: without it this module still imports, MP4_AVAILABLE is False and encode_mp4 /
write_mp4 raise RuntimeError (a server then serves only return_mp4=false requests).

Frames are uint8 RGB [T, H, W, 3]; audio is float32 stereo [2, N] in [-1, 1]. Both may be numpy
arrays or torch tensors (on any device). Files are built in memory and returned as bytes; the
`write_*` helpers put those bytes on disk.
"""

import io
import wave
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from h3_core import config

if TYPE_CHECKING:  # tensors are accepted, torch is not imported (the client has none)
    import torch

try:
    import av
except ImportError:
    av = None

MP4_AVAILABLE = av is not None  # whether encode_mp4 can run (PyAV is installed)
AAC_FRAME = 1024  # samples per AAC frame (FFmpeg's native encoder)
# x264's AVX-512 macroblock-tree kernels work on 8 or 16 macroblocks at a time and read past the
# end of a row (for a frame width that is not a multiple of 128 pixels), uninitialised memory
# included, so on an AVX-512 CPU the same frames gave different bytes from call to call.
# cpu-independent=1 makes x264 use its canonical C kernels there (and skip its other
# CPU-dependent search shortcuts): the same bytes on every call and in every process, and an
# H.264 stream that no longer depends on the CPU's SIMD (FFmpeg's RGB -> YUV conversion and AAC
# encoder still do; docs/reliability.md, "Byte-reproducible MP4").
X264_PARAMS = "cpu-independent=1"


def _as_numpy(array: "np.ndarray | torch.Tensor") -> np.ndarray:
    """`array` as a numpy array: a torch tensor (any device) copied to the host, anything else
    through np.asarray."""
    return array.detach().cpu().numpy() if hasattr(array, "detach") else np.asarray(array)


def _check_frames(frames: "np.ndarray | torch.Tensor") -> np.ndarray:
    """Return frames as a C-contiguous uint8 numpy array [T, H, W, 3], T >= 1, even H and W (yuv420p).
    Raises ValueError naming `frames` otherwise."""
    array = _as_numpy(frames)
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[3] != 3:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {array.dtype} {list(array.shape)}")
    num_frames, height, width, _ = array.shape
    if num_frames == 0 or height == 0 or width == 0 or height % 2 or width % 2:
        raise ValueError(f"frames must have T >= 1 and even positive H and W, got {list(array.shape)}")
    return np.ascontiguousarray(array)


def _check_audio(audio: "np.ndarray | torch.Tensor") -> np.ndarray:
    """Return audio as a C-contiguous float32 numpy array [2, N] with N >= 1.
    Raises ValueError naming `audio` otherwise."""
    array = _as_numpy(audio)
    if array.dtype != np.float32 or array.ndim != 2 or array.shape[0] != config.AUDIO_CHANNELS or array.shape[1] == 0:
        raise ValueError(
            f"audio must be float32 [{config.AUDIO_CHANNELS}, N] with N >= 1, got {array.dtype} {list(array.shape)}"
        )
    return np.ascontiguousarray(array)


def _check_rate(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def encode_mp4(
    frames: "np.ndarray | torch.Tensor",
    audio: "np.ndarray | torch.Tensor | None",
    fps: int = config.FPS,
    sample_rate: int = config.AUDIO_SAMPLE_RATE,
) -> bytes:
    """Encode an MP4: H.264 yuv420p video of exactly T frames at `fps`, plus AAC stereo audio.

    Deterministic: the same arrays and arguments give the same bytes on every call and in every
    process on one machine with the same PyAV build (x264 on one thread with X264_PARAMS; no
    creation time). A CPU with other SIMD features may give other (equally repeatable) bytes.

    Args:
        frames: uint8 RGB [T, H, W, 3], T >= 1, H and W even.
        audio: float32 [2, N] in [-1, 1] at `sample_rate` Hz, or None for a silent (video-only) file.
        fps: video frames per second.
        sample_rate: audio samples per second (must be an AAC rate, e.g. 32000).

    Returns the MP4 file as bytes. Raises RuntimeError when PyAV is not installed
    (MP4_AVAILABLE False), ValueError naming the offending argument.
    """
    if av is None:
        raise RuntimeError(
            "encode_mp4 needs PyAV, which is not installed: `pip install av`, or on the server send return_mp4=false"
        )
    video = _check_frames(frames)
    stereo = None if audio is None else _check_audio(audio)
    _check_rate("fps", fps)
    _check_rate("sample_rate", sample_rate)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        video_stream = container.add_stream("libx264", rate=fps, options={"x264-params": X264_PARAMS})
        video_stream.width, video_stream.height = video.shape[2], video.shape[1]
        video_stream.pix_fmt = "yuv420p"
        video_stream.thread_count = 1  # the bytes depend on x264's thread count (auto: the CPU count)
        video_stream.time_base = Fraction(1, fps)
        if stereo is not None:
            audio_stream = container.add_stream("aac", rate=sample_rate, layout="stereo")
            audio_stream.time_base = Fraction(1, sample_rate)
        for index, rgb in enumerate(video):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
            frame.pts = index
            container.mux(video_stream.encode(frame))
        container.mux(video_stream.encode(None))
        if stereo is not None:
            for start in range(0, stereo.shape[1], AAC_FRAME):
                chunk = np.ascontiguousarray(stereo[:, start : start + AAC_FRAME])
                frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
                frame.sample_rate, frame.pts = sample_rate, start
                container.mux(audio_stream.encode(frame))
            container.mux(audio_stream.encode(None))
    return buffer.getvalue()


def write_mp4(
    path: str | Path,
    frames: "np.ndarray | torch.Tensor",
    audio: "np.ndarray | torch.Tensor | None",
    fps: int = config.FPS,
    sample_rate: int = config.AUDIO_SAMPLE_RATE,
) -> None:
    """Write `encode_mp4(frames, audio, fps, sample_rate)` to `path` (parent folders are created).
    Raises what encode_mp4 raises, before anything is written."""
    data = encode_mp4(frames, audio, fps, sample_rate)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data)


def encode_wav(audio: "np.ndarray | torch.Tensor", sample_rate: int = config.AUDIO_SAMPLE_RATE) -> bytes:
    """Encode a 16-bit PCM stereo WAV file.

    Args:
        audio: float32 [2, N] in [-1, 1]; samples become round(clip(x, -1, 1) * 32767) as int16.
        sample_rate: samples per second.

    Returns the WAV file as bytes. Raises ValueError naming the offending argument.
    """
    stereo = _check_audio(audio)
    _check_rate("sample_rate", sample_rate)
    pcm = np.round(np.clip(stereo, -1.0, 1.0) * 32767.0).astype("<i2").T  # [N, 2] interleaved
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(config.AUDIO_CHANNELS)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(np.ascontiguousarray(pcm).tobytes())
    return buffer.getvalue()


def write_wav(
    path: str | Path, audio: "np.ndarray | torch.Tensor", sample_rate: int = config.AUDIO_SAMPLE_RATE
) -> None:
    """Write `encode_wav(audio, sample_rate)` to `path` (parent folders are created)."""
    data = encode_wav(audio, sample_rate)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data)
