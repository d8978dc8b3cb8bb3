import math

import pytest
import torch

from h3_core.config import align_num_frames, audio_latent_frames, audio_num_samples, latent_frames
from h3_core.diffusion import layout as L
from h3_core.diffusion.sampling import euler_step, sigma_schedule
from h3_core.model.attention import Documents, check_cu_seqlens


def test_shape_math_benchmark_request():
    # docs/model.md §4.4: 672x384, 209 frames, 9 text tokens -> 16,329 used / 16,384 rows.
    lay = L.make_layout(9, 384, 672, 209)
    assert (lay.latent_t, lay.latent_h, lay.latent_w, lay.audio_t) == (62, 24, 42, 348)
    assert (lay.video_rows, lay.audio_rows, lay.used, lay.seq_len) == (15624, 696, 16329, 16384)
    assert audio_num_samples(209) == 278667  # 209 / 24 s at 32 kHz


def test_frame_alignment_and_latent_counts():
    assert [align_num_frames(f) for f in (1, 5, 6, 22, 23, 200, 209)] == [5, 5, 22, 22, 39, 209, 209]
    assert [latent_frames(f) for f in (1, 5, 22, 39, 200, 209)] == [2, 2, 7, 12, 62, 62]
    assert audio_latent_frames(22) == 37 and audio_latent_frames(209) == 348


def test_tiny_layout_and_seq_len_pinning():
    lay = L.make_layout(9, 64, 96, 22)  # docs/model.md §8 tiny: 9 + 74 + 42 = 125 -> 128
    assert (lay.used, lay.seq_len) == (125, 128)
    assert L.make_layout(9, 64, 96, 22, seq_len=256).seq_len == 256
    with pytest.raises(ValueError, match="seq_len 100 must be a multiple of 64 and >= 125 used rows"):
        L.make_layout(9, 64, 96, 22, seq_len=100)


def test_position_ids_golden():
    lay = L.make_layout(9, 384, 672, 209)
    pos = lay.position_ids()
    assert pos.dtype == torch.float64 and pos.shape == (16384, 3)
    assert pos[3].tolist() == [3.0, 0.0, 0.0]  # text row 3
    h_grid, w_grid = lay.spatial_grid()
    assert round(h_grid[0], 3) == 3.905 and round(h_grid[1], 3) == 5.921 and round(h_grid[-1], 3) == 26.079
    assert round(w_grid[0], 3) == -5.166 and round(w_grid[-1], 3) == 35.150
    # audio: channel 0 at w_grid[0], channel 1 at w_grid[-1], t = L + tau
    assert pos[9 + 5].tolist() == [14.0, 0.0, w_grid[0]]
    assert pos[9 + 348 + 5].tolist() == [14.0, 0.0, w_grid[-1]]
    # video latents sit at frames 0, 1, 5, 9, 13, 17, 18, 22: t = 9 + frame * 5/3
    per_frame = 12 * 21
    times = [pos[lay.video_start + k * per_frame, 0].item() for k in range(8)]
    expected = [9 + f * 5 / 3 for f in (0, 1, 5, 9, 13, 17, 18, 22)]
    assert times == pytest.approx(expected, abs=1e-12)
    assert pos[lay.video_start + 1].tolist()[1:] == [h_grid[0], w_grid[1]]
    assert pos[16329:].abs().sum().item() == 0.0  # padding rows at (0, 0, 0)


def test_token_tags():
    lay = L.make_layout(9, 64, 96, 22)
    tags = lay.token_tags()
    assert tags[:9].tolist() == [1] * 9
    assert tags[9:83].tolist() == [2] * 74
    assert tags[83:125].tolist() == [0] * 42
    assert tags[125:].tolist() == [-1] * 3


def test_pack_requests_cu_seqlens_and_timesteps():
    a = L.make_layout(46, 32, 64, 5)  # 46 + 16 + 4 = 66 -> 128
    b = L.make_layout(9, 64, 96, 22)  # 125 -> 128
    exact = L.make_layout(44, 32, 64, 5)  # 44 + 16 + 4 = 64
    assert exact.used == exact.seq_len == 64  # fills its block: no padding document
    batch = L.pack_requests([a, exact, b], [0.25, 0.5, 0.75], [0.5, 0.0, 1.0])
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.cu_seqlens.tolist() == [0, 66, 128, 192, 317, 320]
    assert Documents(batch.cu_seqlens, batch.total_rows, "cpu").max_seqlen == 125
    assert batch.offsets == [0, 128, 192] and batch.total_rows == 320
    assert batch.refiner_cu_seqlens.tolist() == [0, 46, 64, 108, 128, 137, 192]
    assert batch.unique_timesteps.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    # audio rows of request 0 take t_audio 0.5; its video/text/pad rows t_video 0.25
    u = batch.unique_timesteps
    assert u[batch.inverse_indices[46]].item() == 0.5 and u[batch.inverse_indices[0]].item() == 0.25
    assert u[batch.inverse_indices[127]].item() == 0.25
    assert batch.video_rows[:4].tolist() == [62, 63, 64, 65]
    assert len(batch.video_rows) == a.video_rows + exact.video_rows + b.video_rows
    check_cu_seqlens(batch.cu_seqlens, batch.total_rows)


def test_cu_seqlens_checks_field_case_c12():
    with pytest.raises(ValueError, match="cu_seqlens must be 1-D int32, got torch.int64"):
        check_cu_seqlens(torch.tensor([0, 64]), 64)
    with pytest.raises(ValueError, match="cu_seqlens ends at 64 but q has 128 rows"):
        check_cu_seqlens(torch.tensor([0, 64], dtype=torch.int32), 128)
    with pytest.raises(ValueError, match="strictly increasing"):
        check_cu_seqlens(torch.tensor([0, 64, 64], dtype=torch.int32), 64)


def test_patchify_round_trip_and_order():
    latent = torch.arange(24 * 2 * 4 * 6, dtype=torch.float32).reshape(24, 2, 4, 6)
    rows = L.patchify_video(latent)
    assert rows.shape == (2 * 2 * 3, 96)
    # row 1 = t 0, h-patch 0, w-patch 1; feature c*4 + ph*2 + pw
    assert rows[1, 0].item() == latent[0, 0, 0, 2].item()
    assert rows[1, 4 * 3 + 2 + 1].item() == latent[3, 0, 1, 3].item()
    lay = L.RequestLayout(text_len=1, latent_t=2, latent_h=4, latent_w=6, audio_t=1, seq_len=64)
    assert torch.equal(L.unpatchify_video(rows, lay), latent)


def test_audio_rows_are_channel_major():
    lay = L.RequestLayout(text_len=1, latent_t=2, latent_h=2, latent_w=2, audio_t=3, seq_len=64)
    rows = torch.arange(6 * 32, dtype=torch.float32).reshape(6, 32)
    latent = L.audio_rows_to_latent(rows, lay)
    assert latent.shape == (2, 32, 3)
    assert latent[1, 5, 2].item() == rows[3 + 2, 5].item()


def test_sigma_schedule_golden():
    # docs/model.md §3.1 example N=6 points = 5 steps in our convention.
    assert sigma_schedule(5, 12.0) == pytest.approx([1.0, 0.97959, 0.94737, 0.88889, 0.75, 0.0], abs=1e-5)
    assert sigma_schedule(5, 3.0) == pytest.approx([1.0, 0.92308, 0.81818, 0.66667, 0.42857, 0.0], abs=1e-5)
    assert sigma_schedule(2, 2.0) == pytest.approx([1.0, 2 / 3, 0.0], abs=1e-7)
    s = sigma_schedule(4, 12.0)
    assert s[0] == 1.0 and s[-1] == 0.0 and len(s) == 5
    with pytest.raises(ValueError, match="num_steps 0 must be >= 1"):
        sigma_schedule(0, 12.0)


def test_euler_last_step_returns_clean_estimate():
    x = torch.tensor([[0.5, -1.0]])
    v = torch.tensor([[2.0, 4.0]])
    assert torch.equal(euler_step(x, v, 0.25, 0.0), torch.tensor([[1.0, 0.0]]))
    assert math.isclose(euler_step(x, v, 1.0, 0.5)[0, 0].item(), 1.5)
