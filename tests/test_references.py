"""h3_core.inputs.references: reference audio and video decoding (every refusal's exact message, exact
samples where the codec is lossless, which source frames the 24 fps resampling keeps) and
align_reference_frames. Every file is built here with PyAV, numpy or h3_core.media."""

import io
import struct
import wave

import av
import numpy as np
import pytest

from h3_core import config
from h3_core.inputs import references
from h3_core.inputs.references import MediaLimits, align_reference_frames, decode_audio, decode_video, source_frame
from h3_core.media import encode_mp4, encode_wav

AUDIO, VIDEO = "REFERENCE_AUDIO[0]", "REFERENCE_VIDEOS[1]"
LIMITS = MediaLimits()
AUDIO_RANGE = "allowed 2.0..15.0 s"


def pcm(channels: int, samples: int, seed: int = 0) -> np.ndarray:
    """int16 noise [channels, samples] over the whole range."""
    return np.random.default_rng(seed).integers(-32768, 32768, (channels, samples), dtype=np.int16)


def encode_audio(samples: np.ndarray, rate: int, fmt: str, codec: str) -> bytes:
    """int16 [C, N] (C = 1, 2 or 6) encoded with PyAV into a `fmt` file."""
    layout = {1: "mono", 2: "stereo", 6: "5.1"}[samples.shape[0]]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples.T.reshape(1, -1)), format="s16", layout=layout)
        frame.sample_rate, frame.pts = rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


def wav(samples: np.ndarray, rate: int = config.AUDIO_SAMPLE_RATE) -> bytes:
    """int16 [C, N] as a PCM WAV file (the standard library's writer)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(samples.shape[0])
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(np.ascontiguousarray(samples.T).astype("<i2").tobytes())
    return buffer.getvalue()


def flac_claiming(samples: np.ndarray, claimed: int) -> bytes:
    """A FLAC file of `samples` whose STREAMINFO states `claimed` samples per channel: the 36 low
    bits of the big-endian 64-bit word at byte 18 (after "fLaC", the block header and 10 bytes)."""
    data = bytearray(encode_audio(samples, config.AUDIO_SAMPLE_RATE, "flac", "flac"))
    (word,) = struct.unpack(">Q", data[18:26])
    data[18:26] = struct.pack(">Q", word >> 36 << 36 | claimed)
    return bytes(data)


def grey_frames(count: int, height: int = 32, width: int = 32) -> np.ndarray:
    """uint8 [count, height, width, 3]: frame i is flat grey 16 + 6 (i mod 40) (H.264 keeps it within
    +-2)."""
    levels = (16 + 6 * (np.arange(count) % 40)).astype(np.uint8)
    return np.broadcast_to(levels[:, None, None, None], (count, height, width, 3)).copy()


def which_frames(frames: np.ndarray) -> list[int]:
    """The grey_frames index of each decoded frame (the nearest level to its mean)."""
    return [round((float(frame.mean()) - 16) / 6) for frame in frames]


def refused(decode, data: bytes, limits: MediaLimits = LIMITS) -> str:
    field = AUDIO if decode is decode_audio else VIDEO
    with pytest.raises(ValueError) as caught:
        decode(data, field, limits)
    return str(caught.value)


# Reference audio: refusals


def test_empty_and_over_max_bytes_are_refused_before_ffmpeg():
    assert refused(decode_audio, b"") == f"{AUDIO}: is empty (0 bytes); expected a WAV, FLAC, MP3 file"
    assert refused(decode_video, b"") == f"{VIDEO}: is empty (0 bytes); expected a MP4 file"
    data = wav(pcm(2, 64000))
    assert (
        refused(decode_audio, data, MediaLimits(max_bytes=1000))
        == f"{AUDIO}: is {len(data)} bytes, over max_bytes 1000"
    )


def test_bytes_ffmpeg_cannot_read_are_refused():
    unreadable = "(Invalid data found when processing input)"
    expected = f"{AUDIO}: cannot be read as WAV, FLAC, MP3 {unreadable}"
    assert refused(decode_audio, b"some text, not a sound\n" * 50) == expected
    # a RIFF header of no WAVE, random bytes after it
    assert refused(decode_audio, b"RIFF\x00\x10\x00\x00" + np.random.default_rng(1).bytes(4096)) == expected
    assert refused(decode_video, b"some text\n" * 50) == f"{VIDEO}: cannot be read as MP4 {unreadable}"
    # an MP4 cut in half: its index (moov, written last) is gone
    mp4 = encode_mp4(grey_frames(24), None)
    assert refused(decode_video, mp4[: len(mp4) // 2]) == f"{VIDEO}: cannot be read as MP4 {unreadable}"


def test_a_video_of_corrupt_frames_is_refused():
    data = bytearray(encode_mp4(grey_frames(24), None))
    at = data.index(b"mdat")  # the box holding the coded frames: [size, "mdat", payload]
    (size,) = struct.unpack(">I", data[at - 4 : at])
    data[at + 4 : at - 4 + size] = bytes(size - 8)  # the whole payload zeroed, the index kept
    expected = f"{VIDEO}: is not a complete MP4 file: Invalid data found when processing input"
    assert refused(decode_video, bytes(data)) == expected


def test_audio_of_a_codec_ffmpeg_cannot_decode_is_refused():
    data = bytearray(wav(pcm(2, 64000)))
    data[20:22] = struct.pack("<H", 0x1234)  # the fmt chunk's format tag: no codec has it
    assert refused(decode_audio, bytes(data)) == f"{AUDIO}: its audio codec has no decoder in this FFmpeg build"


def test_a_file_of_another_format_is_refused():
    ogg = encode_audio(pcm(2, 64000), 32000, "ogg", "flac")
    assert refused(decode_audio, ogg) == f"{AUDIO}: is in another format; the allowed formats are WAV, FLAC, MP3"
    mp4 = encode_mp4(grey_frames(5), None)
    assert refused(decode_audio, mp4) == f"{AUDIO}: is in another format; the allowed formats are WAV, FLAC, MP3"
    assert refused(decode_video, wav(pcm(2, 64000))) == f"{VIDEO}: is in another format; the allowed formats are MP4"


def test_a_wav_header_without_samples_is_refused():
    header_only = wav(pcm(2, 0))
    assert len(header_only) == 44
    assert refused(decode_audio, header_only) == f"{AUDIO}: holds no audio samples"


def test_too_long_and_too_short_audio_are_refused_from_the_header():
    assert (
        refused(decode_audio, wav(pcm(2, 16 * 32000))) == f"{AUDIO}: is 16.000 s long (from its header); {AUDIO_RANGE}"
    )
    assert (
        refused(decode_audio, wav(pcm(1, 44100), 44100)) == f"{AUDIO}: is 1.000 s long (from its header); {AUDIO_RANGE}"
    )
    # the limits are inclusive: exactly 2 s and exactly 15 s are accepted
    assert decode_audio(wav(pcm(2, 2 * 32000)), AUDIO, LIMITS).shape == (2, 64000)
    assert decode_audio(wav(pcm(2, 15 * 32000)), AUDIO, LIMITS).shape == (2, 480000)


def test_a_lying_header_is_caught_by_the_decoded_length():
    # the FLAC header claims 3 s: 16 s of samples are refused while decoding, 1 s after it
    long = flac_claiming(pcm(2, 16 * 32000), 3 * 32000)
    assert refused(decode_audio, long) == f"{AUDIO}: holds more than 15.0 s of audio (decoded); {AUDIO_RANGE}"
    short = flac_claiming(pcm(2, 32000), 3 * 32000)
    expected = f"{AUDIO}: is 1.000 s long (decoded, 32000 samples at 32000 Hz); {AUDIO_RANGE}"
    assert refused(decode_audio, short) == expected


def test_more_than_two_channels_are_refused():
    surround = wav(pcm(6, 64000))
    assert (
        refused(decode_audio, surround) == f"{AUDIO}: has 6 audio channels; allowed 1 (mono, duplicated) or 2 (stereo)"
    )


def test_without_pyav_the_message_says_so(monkeypatch):
    monkeypatch.setattr(references, "av", None)
    expected = f"{AUDIO}: decoding WAV, FLAC, MP3 files needs PyAV, which is not installed (`pip install av`)"
    assert refused(decode_audio, wav(pcm(2, 64000))) == expected


# Reference audio: decoded samples


def test_stereo_32khz_wav_round_trips_exactly():
    samples = pcm(2, 3 * 32000)
    audio = decode_audio(wav(samples), AUDIO, LIMITS)
    assert audio.dtype == np.float32
    np.testing.assert_array_equal(audio, samples.astype(np.float32) / 32768)  # s16 -> float: x / 32768, exact
    # h3_core.media's writer: round(x 32767) / 32768 is within 1.5 / 32768 of x
    source = np.random.default_rng(2).uniform(-1, 1, (2, 64000)).astype(np.float32)
    assert np.abs(decode_audio(encode_wav(source), AUDIO, LIMITS) - source).max() <= 1.5 / 32768


def test_silence_is_accepted():
    audio = decode_audio(wav(np.zeros((2, 64000), np.int16)), AUDIO, LIMITS)
    np.testing.assert_array_equal(audio, np.zeros((2, 64000), np.float32))


def test_mono_is_duplicated_to_both_channels():
    samples = pcm(1, 80000)
    audio = decode_audio(wav(samples), AUDIO, LIMITS)
    np.testing.assert_array_equal(audio, np.repeat(samples.astype(np.float32) / 32768, 2, axis=0))


def test_flac_is_lossless_and_mp3_decodes_to_its_length():
    samples = pcm(2, 70000)
    np.testing.assert_array_equal(
        decode_audio(encode_audio(samples, 32000, "flac", "flac"), AUDIO, LIMITS), samples.astype(np.float32) / 32768
    )
    # LAME writes its encoder delay and padding into the file, FFmpeg trims both: the same length back
    tone = (np.sin(2 * np.pi * 440 * np.arange(70000) / 32000) * 16000).astype(np.int16)[None]
    audio = decode_audio(encode_audio(tone, 32000, "mp3", "libmp3lame"), AUDIO, LIMITS)
    assert audio.shape == (2, 70000)
    np.testing.assert_array_equal(audio[0], audio[1])
    assert np.abs(audio).max() <= 1.0


def test_44_1_khz_is_resampled_to_32_khz():
    # n samples at 44.1 kHz are n x 32000 / 44100 at 32 kHz; FFmpeg's resampler, flushed, gives
    # that count to within one sample (its filter phase decides the rounding: 88201 -> 64000,
    # 100003 -> 72565)
    for count in (88201, 100003):
        tone = (np.sin(2 * np.pi * 1000 * np.arange(count) / 44100) * 16000).astype(np.int16)
        audio = decode_audio(wav(np.stack([tone, tone // 2]), 44100), AUDIO, LIMITS)
        assert audio.shape[0] == 2 and abs(audio.shape[1] - count * 32000 / 44100) < 1
        # still a 1 kHz tone, the right channel at half the left's level
        spectrum = np.abs(np.fft.rfft(audio[0]))
        assert np.argmax(spectrum) * 32000 / audio.shape[1] == pytest.approx(1000, abs=1)
        middle = audio[:, 1000:-1000]
        np.testing.assert_allclose(middle[1], middle[0] / 2, atol=2e-3)


# Reference video: refusals


def m4a() -> bytes:
    """An MP4 holding only an AAC track (what an .m4a file is)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=32000, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.zeros((2, 32000), np.float32), format="fltp", layout="stereo")
        frame.sample_rate, frame.pts = 32000, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buffer.getvalue()


def test_an_mp4_without_video_is_refused():
    assert refused(decode_video, m4a()) == f"{VIDEO}: has no video stream"


def test_frame_size_and_aspect_are_checked_from_the_header():
    sides = "each side must be within min_side..max_side = 32..4096 px"
    assert (
        refused(decode_video, encode_mp4(grey_frames(5, 16, 64), None))
        == f"{VIDEO}: is 64x16 px (width x height); {sides}"
    )
    expected = f"{VIDEO}: is 64x64 px (width x height) = 4096 pixels, over max_video_pixels 4000"
    assert (
        refused(decode_video, encode_mp4(grey_frames(5, 64, 64), None), MediaLimits(max_video_pixels=4000)) == expected
    )
    # 5:1 is over the default max_aspect 4; 3:1 is under it, and over a max_aspect of 2.5
    expected = f"{VIDEO}: is 160x32 px (width x height), aspect 5.00 (long side / short side), over max_aspect 4.0"
    assert refused(decode_video, encode_mp4(grey_frames(5, 32, 160), None)) == expected
    wide = encode_mp4(grey_frames(5, 32, 96), None)
    frames, _ = decode_video(wide, VIDEO, LIMITS)
    assert frames.shape == (5, 32, 96, 3)
    expected = f"{VIDEO}: is 96x32 px (width x height), aspect 3.00 (long side / short side), over max_aspect 2.5"
    assert refused(decode_video, wide, MediaLimits(max_aspect=2.5)) == expected


def test_frame_rates_below_the_minimum_are_refused():
    expected = f"{VIDEO}: is 5 fps; allowed 12..60 fps (resampled to 24)"
    assert refused(decode_video, encode_mp4(grey_frames(10), None, fps=5)) == expected
    assert refused(decode_video, encode_mp4(grey_frames(10), None, fps=120)) == expected.replace("is 5", "is 120")


def test_a_long_video_is_refused_from_the_header():
    expected = f"{VIDEO}: is 1.250 s long (from its header), over max_video_s 1.0"
    assert refused(decode_video, encode_mp4(grey_frames(30), None), MediaLimits(max_video_s=1.0)) == expected


def test_fewer_than_min_video_frames_are_refused():
    expected = f"{VIDEO}: is 4 frames at 24 fps (4 at 24 fps); allowed at least min_video_frames 5"
    assert refused(decode_video, encode_mp4(grey_frames(4), None)) == expected
    frames, audio = decode_video(encode_mp4(grey_frames(4), None), VIDEO, MediaLimits(min_video_frames=4))
    assert which_frames(frames) == [0, 1, 2, 3] and audio is None


# Reference video: frames and audio track


def test_24_fps_frames_are_the_source_frames():
    source = np.random.default_rng(3).integers(0, 256, (1, 32, 48, 3), dtype=np.uint8).repeat(7, axis=0)
    source[:, :, :, 0] = 16 + 30 * np.arange(7, dtype=np.uint8)[:, None, None]  # red marks the frame
    frames, audio = decode_video(encode_mp4(source, None), VIDEO, LIMITS)
    assert frames.shape == (7, 32, 48, 3) and frames.dtype == np.uint8 and audio is None
    assert [round((float(frame[:, :, 0].mean()) - 16) / 30) for frame in frames] == list(range(7))


def test_30_fps_is_resampled_to_24_fps_by_nearest_frame():
    # 30 frames at 30 fps (1 s) -> 24 frames; output frame k shows source frame floor(1.25 k + 1/2)
    frames, _ = decode_video(encode_mp4(grey_frames(30), None, fps=30), VIDEO, LIMITS)
    assert frames.shape == (24, 32, 32, 3)
    expected = [0, 1, 3, 4, 5, 6, 8, 9, 10, 11, 13, 14, 15, 16, 18, 19, 20, 21, 23, 24, 25, 26, 28, 29]
    assert which_frames(frames) == expected
    assert [source_frame(k, 30) for k in range(24)] == expected


def test_15_fps_is_resampled_to_24_fps_by_repeating_frames():
    # 9 frames at 15 fps (0.6 s) -> ceil(14.4) = 15 frames; frame k shows floor(0.625 k + 1/2),
    # the last one (9, past the source) its last frame
    frames, _ = decode_video(encode_mp4(grey_frames(9), None, fps=15), VIDEO, LIMITS)
    assert which_frames(frames) == [0, 1, 1, 2, 3, 3, 4, 4, 5, 6, 6, 7, 8, 8, 8]


def test_a_video_with_audio_returns_both():
    # 30 frames at 30 fps with 1.5 s of a 500 Hz tone: 24 frames and the track cut to their 1 s
    tone = (np.sin(2 * np.pi * 500 * np.arange(48000) / 32000) * 0.5).astype(np.float32)
    frames, audio = decode_video(encode_mp4(grey_frames(30), np.stack([tone, -tone]), fps=30), VIDEO, LIMITS)
    assert frames.shape == (24, 32, 32, 3)
    assert audio.dtype == np.float32 and audio.shape == (2, config.audio_num_samples(24)) == (2, 32000)
    spectrum = np.abs(np.fft.rfft(audio[0]))
    assert np.argmax(spectrum) * 32000 / audio.shape[1] == 500
    np.testing.assert_allclose(audio[1], -audio[0], atol=1e-2)  # AAC: the channels are coded jointly
    # a track shorter than the video stays as it is (AAC pads it to whole 1024-sample frames)
    _, short = decode_video(encode_mp4(grey_frames(48), np.stack([tone, tone])[:, :16000]), VIDEO, LIMITS)
    assert short.shape == (2, 16384)


# align_reference_frames


@pytest.mark.parametrize(
    ("count", "aligned"), [(1, 5), (3, 5), (5, 5), (21, 5), (22, 22), (38, 22), (39, 39), (240, 226)]
)
def test_align_reference_frames_cuts_to_17n_plus_5(count, aligned):
    frames = grey_frames(count)
    out = align_reference_frames(frames)
    assert out.shape == (aligned, 32, 32, 3)
    if count >= 5:
        assert np.array_equal(out, frames[:aligned])
    else:  # padded with the last frame
        assert np.array_equal(out, np.concatenate([frames, frames[-1:].repeat(5 - count, axis=0)]))


def test_align_reference_frames_refuses_no_frames():
    with pytest.raises(ValueError, match=r"frames must be \[T, H, W, 3\] with T >= 1, got \[0, 32, 32, 3\]"):
        align_reference_frames(grey_frames(0))


def test_media_limits_are_validated():
    with pytest.raises(ValueError, match="MediaLimits needs 0 < min_audio_s <= max_audio_s, got 3.0, 2.0"):
        MediaLimits(min_audio_s=3.0, max_audio_s=2.0)
    with pytest.raises(ValueError, match="MediaLimits.min_video_frames must be >= 1, got 0"):
        MediaLimits(min_video_frames=0)
    with pytest.raises(ValueError, match="MediaLimits needs 0 < min_video_fps <= max_video_fps, got 30, 24"):
        MediaLimits(min_video_fps=30, max_video_fps=24)


def float_wav(samples: np.ndarray, rate: int = config.AUDIO_SAMPLE_RATE) -> bytes:
    """float32 [C, N] as an IEEE-float WAV file (format tag 3), which may hold NaN."""
    channels, data = samples.shape[0], np.ascontiguousarray(samples.T).astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_float_wav_with_a_non_finite_sample_is_refused_where_it_is_decoded(bad):
    """Issue 41 item 5: refused naming the input (before: only h3_dit noticed, after the encoder
    and the audio VAE ran, naming no input); finite float WAVs decode as before."""
    samples = np.random.default_rng(4).uniform(-0.5, 0.5, (2, 3 * 32000)).astype(np.float32)
    np.testing.assert_array_equal(decode_audio(float_wav(samples), AUDIO, LIMITS), samples)
    samples[1, 2 * 32000 + 5] = bad
    with pytest.raises(ValueError) as refused:
        decode_audio(float_wav(samples), AUDIO, LIMITS)
    # FFmpeg's WAV demuxer reads 1024-sample frames: sample 64005 is in the one from 63488 (1.984 s)
    assert (
        str(refused.value)
        == f"{AUDIO}: holds non-finite samples (NaN or infinity) from 1.984 s; allowed finite samples"
    )


def turned_mp4(degrees: float | None, hflip: bool = False) -> bytes:
    """A 10-frame 96x64 (w x h) H.264 MP4, a white 16x16 square in its stored top-left corner,
    with the display matrix of a counter-clockwise turn by `degrees` (and a mirror with hflip)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        if degrees is not None:
            stream.set_display_rotation(degrees, hflip=hflip)
        picture = np.zeros((64, 96, 3), np.uint8)
        picture[:16, :16] = 255
        for _ in range(10):
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "degrees, shape, corner",
    [(None, (64, 96), (8, 8)), (90, (96, 64), (88, 8)), (-90, (96, 64), (8, 56)), (180, (64, 96), (56, 88))],
)
def test_a_display_matrix_turns_the_frames_upright(degrees, shape, corner):
    """Issue 41 item 4: a phone's rotation is applied (the square's centre moves with the turn);
    before, every clip came out as stored (64 x 96)."""
    frames, _ = decode_video(turned_mp4(degrees), VIDEO, LIMITS)
    assert frames.shape == (10, *shape, 3)
    rows, columns = np.nonzero(frames[0, :, :, 0] > 128)
    assert (round(rows.mean()), round(columns.mean())) == corner


@pytest.mark.parametrize(
    "degrees, hflip, message",
    [
        (0, True, "its display matrix mirrors the picture; allowed rotations by multiples of 90 degrees"),
        (45, False, "its display matrix turns the picture by 45 degrees; allowed multiples of 90"),
    ],
)
def test_a_mirroring_or_slanted_display_matrix_is_refused(degrees, hflip, message):
    with pytest.raises(ValueError) as refused:
        decode_video(turned_mp4(degrees, hflip), VIDEO, LIMITS)
    assert str(refused.value) == f"{VIDEO}: {message}"


def test_a_decode_budget_stops_a_video_at_the_frame_that_passes_it():
    """Issue 41 item 6: 48 frames of 96 x 64 are 294,912 pixels; a budget of 100,000 is passed
    at the 17th frame (16 x 6,144 = 98,304); samples likewise (2 s of audio is 64,000)."""
    data = encode_mp4(np.zeros((48, 64, 96, 3), np.uint8), np.zeros((2, 64000), np.float32), fps=24)
    budget = references.DecodeBudget(100_000, 1_000_000)
    with pytest.raises(ValueError) as refused:
        decode_video(data, VIDEO, LIMITS, budget=budget)
    assert str(refused.value) == (
        f"{VIDEO}: the request's media decode to more than max_decoded_pixels=100000 pixels (the decode budget of "
        "one request: images and video frames in all, at their stored size)"
    )
    assert budget.pixels == 17 * 6144
    budget = references.DecodeBudget(10**9, 1_000_000)
    frames, track = decode_video(data, VIDEO, LIMITS, budget=budget)
    assert budget.pixels == 48 * 6144 and budget.samples >= track.shape[1]
    with pytest.raises(ValueError) as refused:
        decode_audio(wav(pcm(2, 3 * 32000)), AUDIO, LIMITS, references.DecodeBudget(1, 50_000))
    assert str(refused.value).startswith(f"{AUDIO}: the request's media decode to more than max_decoded_samples=50000")
