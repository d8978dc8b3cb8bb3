import pytest
import torch
from safetensors.torch import load_file, save_file

from h3_core import config
from h3_core.model.vae import (
    VideoVAE,
    create_vaes,
    frames_to_groups,
    groups_to_frames,
    num_video_frames,
    num_video_latents,
)
from h3_core.weights.checkpoint import load_weights, save_weights


@pytest.fixture(scope="module")
def vaes():
    return create_vaes(0)


def _frames(num_frames, height=64, width=96, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_frames, height, width, 3), dtype=torch.uint8, generator=generator)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_frame_count_contract():
    assert [num_video_latents(f) for f in (5, 22, 39, 209)] == [2, 7, 12, 62]
    assert [num_video_frames(t) for t in (2, 7, 12, 62)] == [5, 22, 39, 209]
    with pytest.raises(ValueError, match=r"^num_frames must be 17n \+ 5 \(5, 22, 39, \.\.\.\), got 21$"):
        num_video_latents(21)
    with pytest.raises(ValueError, match=r"^latent frame count must be 5n \+ 2 \(2, 7, 12, \.\.\.\), got 6$"):
        num_video_frames(6)


def test_frame_grouping_is_1_4_4_4_4():
    # Frame f is filled with the value f, so every group channel shows which frame it holds.
    frames = torch.arange(22, dtype=torch.uint8)[:, None, None, None].expand(22, 16, 32, 3).contiguous()
    groups = frames_to_groups(frames)
    assert groups.shape == (7, 12, 16, 32) and groups.dtype == torch.float32
    held = ((groups[:, ::3, 0, 0] + 1.0) * 127.5).round().long()  # [T_lat, 4] frame index per slot
    assert held.tolist() == [
        [0, 0, 0, 0],
        [1, 2, 3, 4],
        [5, 6, 7, 8],
        [9, 10, 11, 12],
        [13, 14, 15, 16],
        [17, 17, 17, 17],
        [18, 19, 20, 21],
    ]
    assert torch.equal(groups_to_frames(groups), frames.float() / 127.5 - 1.0)


def test_video_shapes_tiny_canvas(vaes):
    video, _ = vaes
    latent = video.encode(_frames(22))
    assert latent.shape == (24, 7, 4, 6) and latent.dtype == torch.float32
    frames = video.decode(latent)
    assert frames.shape == (22, 64, 96, 3) and frames.dtype == torch.uint8


@pytest.mark.parametrize("num_frames,latent_t", [(5, 2), (22, 7), (39, 12), (209, 62)])
def test_video_temporal_contract(vaes, num_frames, latent_t):
    video, _ = vaes
    latent = video.encode(_frames(num_frames, 16, 32))
    assert latent.shape == (24, latent_t, 1, 2)
    assert video.decode(latent).shape == (num_frames, 16, 32, 3)


def test_video_deterministic(vaes):
    video, _ = vaes
    frames = _frames(22)
    assert torch.equal(video.encode(frames), video.encode(frames))
    latent = _randn(24, 7, 4, 6)
    assert torch.equal(video.decode(latent), video.decode(latent))


def test_video_latent_normalisation(vaes):
    video, _ = vaes
    frames, z = _frames(5, 32, 32), _randn(24, 2, 2, 2)
    normed = VideoVAE()
    normed.load_state_dict(video.state_dict())
    mean, std = torch.linspace(-1.0, 1.0, 24), torch.linspace(0.5, 2.0, 24)
    normed.latents_mean.copy_(mean)
    normed.latents_std.copy_(std)
    mean, std = mean[:, None, None, None], std[:, None, None, None]
    assert torch.equal(normed.encode(frames), (video.encode(frames) - mean) / std)
    assert torch.equal(normed.decode(z), video.decode(z * std + mean))
    assert not torch.equal(normed.decode(z), video.decode(z))


def test_video_errors(vaes):
    video, _ = vaes
    with pytest.raises(ValueError, match=r"^frames must be uint8 \[T, H, W, 3\], got torch.float32 \[22, 64, 96, 3\]$"):
        video.encode(_frames(22).float())
    with pytest.raises(ValueError, match=r"^frames must be uint8 \[T, H, W, 3\], got torch.uint8 \[22, 64, 96, 4\]$"):
        video.encode(torch.zeros(22, 64, 96, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"^frames height and width must be positive multiples of 16, got 64x40$"):
        video.encode(_frames(22, 64, 40))
    with pytest.raises(ValueError, match=r"^num_frames must be 17n \+ 5 \(5, 22, 39, \.\.\.\), got 23$"):
        video.encode(_frames(23, 16, 16))
    bad_latent = r"^latent must be float32 \[24, T_lat, Hl, Wl\], got "
    with pytest.raises(ValueError, match=bad_latent + r"torch.float32 \[32, 7, 4, 6\]$"):
        video.decode(_randn(32, 7, 4, 6))
    with pytest.raises(ValueError, match=bad_latent + r"torch.float64 \[24, 7, 4, 6\]$"):
        video.decode(_randn(24, 7, 4, 6).double())
    with pytest.raises(ValueError, match=r"^latent frame count must be 5n \+ 2 \(2, 7, 12, \.\.\.\), got 8$"):
        video.decode(_randn(24, 8, 4, 6))
    with pytest.raises(ValueError, match=r"^latent height and width must be positive, got \[24, 7, 0, 6\]$"):
        video.decode(_randn(24, 7, 0, 6))


def test_audio_shapes_and_range(vaes):
    _, audio = vaes
    latent = audio.encode(_randn(2, 29600).clamp(-1, 1))
    assert latent.shape == (2, 32, 37) and latent.dtype == torch.float32
    wave = audio.decode(_randn(2, 32, 37) * 3.0)
    assert wave.shape == (2, 29600) and wave.dtype == torch.float32
    assert wave.abs().max() <= 1.0


def test_audio_channels_are_independent_mono(vaes):
    # Both stereo channels go through the same weights: swapping them swaps the outputs.
    _, audio = vaes
    left, right = _randn(1, 32, 5, seed=1), _randn(1, 32, 5, seed=2)
    wave = audio.decode(torch.cat([left, right]))
    assert torch.equal(audio.decode(torch.cat([right, left])), wave.flip(0))
    samples = _randn(2, 4000)
    assert torch.equal(audio.encode(samples.flip(0)), audio.encode(samples).flip(0))


def test_audio_deterministic(vaes):
    _, audio = vaes
    samples, latent = _randn(2, 4000), _randn(2, 32, 37)
    assert torch.equal(audio.encode(samples), audio.encode(samples))
    assert torch.equal(audio.decode(latent), audio.decode(latent))


def test_audio_errors(vaes):
    _, audio = vaes
    with pytest.raises(ValueError, match=r"^audio must be float32 \[2, N\], got torch.float32 \[1, 800\]$"):
        audio.encode(torch.zeros(1, 800))
    with pytest.raises(ValueError, match=r"^audio length must be a positive multiple of 800 samples, got 1000$"):
        audio.encode(torch.zeros(2, 1000))
    with pytest.raises(ValueError, match=r"^audio length must be a positive multiple of 800 samples, got 0$"):
        audio.encode(torch.zeros(2, 0))
    with pytest.raises(
        ValueError, match=r"^latent must be float32 \[2, 32, T_a\] with T_a >= 1, got torch.float32 \[2, 24, 37\]$"
    ):
        audio.decode(torch.zeros(2, 24, 37))
    with pytest.raises(
        ValueError, match=r"^latent must be float32 \[2, 32, T_a\] with T_a >= 1, got torch.float32 \[2, 32, 0\]$"
    ):
        audio.decode(torch.zeros(2, 32, 0))


def test_seeds_differ_and_buffers_start_at_identity():
    video_a, audio_a = create_vaes(0)
    video_b, _ = create_vaes(1)
    assert not torch.equal(video_a.decoder[0].weight, video_b.decoder[0].weight)
    for vae, channels in ((video_a, config.VIDEO_LATENT_CHANNELS), (audio_a, config.AUDIO_LATENT_CHANNELS)):
        assert torch.equal(vae.latents_mean, torch.zeros(channels))
        assert torch.equal(vae.latents_std, torch.ones(channels))
    assert not video_a.training and not audio_a.training


def test_save_load_round_trip(tmp_path):
    video, audio = create_vaes(0)
    video.latents_mean.fill_(0.25)
    audio.latents_std.fill_(2.0)
    save_weights(video, tmp_path / "video.safetensors")
    save_weights(audio, tmp_path / "audio.safetensors")
    assert {"latents_mean", "latents_std"} <= set(load_file(str(tmp_path / "video.safetensors")))
    video2, audio2 = create_vaes(1)
    load_weights(video2, tmp_path / "video.safetensors")
    load_weights(audio2, tmp_path / "audio.safetensors")
    latent, audio_latent = _randn(24, 7, 4, 6), _randn(2, 32, 37)
    assert torch.equal(video2.decode(latent), video.decode(latent))
    assert torch.equal(audio2.decode(audio_latent), audio.decode(audio_latent))
    assert torch.equal(audio2.latents_std, torch.full((32,), 2.0))


def test_load_mis_shaped_tensor_names_it(tmp_path):
    video = VideoVAE()
    state = {name: tensor.clone() for name, tensor in video.state_dict().items()}
    state["decoder.0.weight"] = torch.zeros(64, 24, 1, 1)
    save_file(state, str(tmp_path / "bad.safetensors"))
    message = r"^tensor 'decoder.0.weight' has shape \(64, 24, 1, 1\), expected \(64, 24, 3, 3\)$"
    with pytest.raises(ValueError, match=message):
        load_weights(video, tmp_path / "bad.safetensors")
    del state["decoder.0.weight"]
    save_file(state, str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match=r"^checkpoint is missing tensor 'decoder.0.weight' \(1 missing\)$"):
        load_weights(video, tmp_path / "missing.safetensors")
