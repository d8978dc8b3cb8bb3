import io
import subprocess
import sys
import wave
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from h3_core.media import encode_mp4, encode_wav, write_mp4, write_wav

REPO = Path(__file__).resolve().parents[1]


def _frames(num_frames=22, height=64, width=96):
    """Smooth moving gradients (H.264 reproduces them closely)."""
    t, y, x = np.meshgrid(np.arange(num_frames), np.arange(height), np.arange(width), indexing="ij")
    rgb = np.stack([x * 255 / width, y * 255 / height, (t * 10) % 256], axis=-1)
    return rgb.round().astype(np.uint8)


def _tone(num_samples=29600, sample_rate=32000):
    seconds = np.arange(num_samples) / sample_rate
    left, right = 0.5 * np.sin(2 * np.pi * 440 * seconds), 0.25 * np.sin(2 * np.pi * 220 * seconds)
    return np.stack([left, right]).astype(np.float32)


def test_mp4_decodes_with_exact_frames_and_stereo_audio():
    frames, audio = _frames(), _tone()
    data = encode_mp4(frames, audio)
    with av.open(io.BytesIO(data)) as container:
        video_stream, audio_stream = container.streams.video[0], container.streams.audio[0]
        assert (video_stream.codec_context.name, video_stream.codec_context.pix_fmt) == ("h264", "yuv420p")
        assert (video_stream.width, video_stream.height, video_stream.average_rate) == (96, 64, 24)
        assert (audio_stream.codec_context.name, audio_stream.channels, audio_stream.sample_rate) == ("aac", 2, 32000)
        audio_seconds = float(audio_stream.duration * audio_stream.time_base)
        assert abs(audio_seconds - 29600 / 32000) <= 1024 / 32000
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert decoded.shape == (22, 64, 96, 3)
    assert np.abs(decoded.astype(np.int16) - frames).mean() < 3.0
    with av.open(io.BytesIO(data)) as container:
        sound = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
    assert sound.shape[0] == 2 and abs(sound.shape[1] - 29600) <= 1024
    rms = np.sqrt((sound**2).mean(axis=1))  # the tones' RMS: 0.5 / sqrt(2), 0.25 / sqrt(2)
    assert np.allclose(rms, [0.5 / np.sqrt(2), 0.25 / np.sqrt(2)], rtol=0.02)


def test_mp4_video_only_and_torch_input():
    frames = _frames(5, 32, 32)
    data = encode_mp4(torch.from_numpy(frames), None)
    assert data == encode_mp4(frames, None)
    with av.open(io.BytesIO(data)) as container:
        assert len(container.streams.audio) == 0
        assert sum(1 for _ in container.decode(video=0)) == 5


def test_mp4_deterministic_and_written(tmp_path):
    frames, audio = _frames(), _tone()
    data = encode_mp4(frames, audio)
    assert encode_mp4(frames, torch.from_numpy(audio)) == data
    write_mp4(tmp_path / "out" / "clip.mp4", frames, audio)
    assert (tmp_path / "out" / "clip.mp4").read_bytes() == data


def test_mp4_errors():
    frames, audio = _frames(5, 32, 32), _tone(800)
    with pytest.raises(ValueError, match=r"^frames must be uint8 \[T, H, W, 3\], got float32 \[5, 32, 32, 3\]$"):
        encode_mp4(frames.astype(np.float32), audio)
    with pytest.raises(ValueError, match=r"^frames must have T >= 1 and even positive H and W, got \[5, 32, 33, 3\]$"):
        encode_mp4(np.zeros((5, 32, 33, 3), np.uint8), audio)
    with pytest.raises(ValueError, match=r"^frames must have T >= 1 and even positive H and W, got \[0, 32, 32, 3\]$"):
        encode_mp4(np.zeros((0, 32, 32, 3), np.uint8), audio)
    with pytest.raises(ValueError, match=r"^audio must be float32 \[2, N\] with N >= 1, got float32 \[1, 800\]$"):
        encode_mp4(frames, audio[:1])
    with pytest.raises(ValueError, match=r"^audio must be float32 \[2, N\] with N >= 1, got float64 \[2, 800\]$"):
        encode_mp4(frames, audio.astype(np.float64))
    with pytest.raises(ValueError, match=r"^fps must be a positive int, got 0$"):
        encode_mp4(frames, audio, fps=0)
    with pytest.raises(ValueError, match=r"^sample_rate must be a positive int, got 32000.0$"):
        encode_mp4(frames, audio, sample_rate=32000.0)


def test_wav_round_trip_exact_int16(tmp_path):
    audio = np.array([[1.0, -1.0, 0.0, 2.0, 0.25, -0.5], [-0.25, 0.5, -2.0, 0.1, 1e-6, -1e-6]], np.float32)
    data = encode_wav(audio, 32000)
    with wave.open(io.BytesIO(data), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()) == (2, 2, 32000, 6)
        samples = np.frombuffer(wav.readframes(6), dtype="<i2").reshape(6, 2).T
    assert samples.tolist() == [[32767, -32767, 0, 32767, 8192, -16384], [-8192, 16384, -32767, 3277, 0, 0]]
    write_wav(tmp_path / "a.wav", torch.from_numpy(audio), 32000)
    assert (tmp_path / "a.wav").read_bytes() == data


def test_wav_errors():
    with pytest.raises(ValueError, match=r"^audio must be float32 \[2, N\] with N >= 1, got float32 \[2, 0\]$"):
        encode_wav(np.zeros((2, 0), np.float32))
    with pytest.raises(ValueError, match=r"^sample_rate must be a positive int, got -1$"):
        encode_wav(np.zeros((2, 4), np.float32), -1)


def _panning_blocks(seed, num_frames=22, height=64, width=160, step=2):
    """8 x 8-pixel blocks of seeded random colours moving left `step` pixels per frame, uint8 [T, H, W, 3].

    Leftward motion in a frame 10 macroblocks wide (not a multiple of 8) is what x264's AVX-512
    macroblock-tree kernels got wrong: with the old settings (x264 defaults, one thread) on the
    AVX-512 development CPU, three runs of the test below gave 3 to 7 different files per clip.
    """
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (height // 8, (width + step * num_frames) // 8 + 1, 3), dtype=np.uint8)
    texture = blocks.repeat(8, axis=0).repeat(8, axis=1)
    return np.stack([texture[:, step * t : step * t + width] for t in range(num_frames)])


def test_mp4_bytes_are_reproducible_in_one_process_and_across_processes():
    clips = [_panning_blocks(seed) for seed in (1, 17)]
    audio = np.random.default_rng(1).standard_normal((2, 4000)).astype(np.float32) * 0.1  # 0.125 s
    files = [set(), set()]
    for _ in range(40):  # alternating the clips varies what x264 finds in reused memory
        for clip, seen in zip(clips, files, strict=True):
            seen.add(encode_mp4(clip, audio))
    assert [len(seen) for seen in files] == [1, 1]
    script = (
        "import sys, numpy as np; from h3_core.media import encode_mp4; "
        "from tests.test_media import _panning_blocks; "
        "audio = np.random.default_rng(1).standard_normal((2, 4000)).astype(np.float32) * 0.1; "
        "sys.stdout.buffer.write(encode_mp4(_panning_blocks(1), audio))"
    )
    fresh = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, check=True).stdout
    assert fresh == next(iter(files[0]))
