"""The demo model's training code: data set, measurements, dense training forward, resumable
state, and a smoke run of every training stage on the CPU (tiny sizes, seconds)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from h3_core.config import audio_num_samples, get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.conditions import Condition, condition_rows
from h3_core.diffusion.engine import Engine
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.model.vae import VideoVAE, create_vaes, keyframe_latent
from training import data, dit_train, evaluate, evaluate_conditions, measure, state, strips, text_states, vae_train
from training.loop import lr_at, read_loss_csv


def test_captions_state_the_attributes_and_held_out_combinations_are_never_trained():
    clip = data.Clip("red", "ball", "left", "low", "left")
    assert clip.caption == "a red ball rolls to the left while a low tone plays on the left"
    assert len(data.ALL_COMBOS) == 288 and len(data.HELD_OUT) == 36
    assert not set(data.HELD_OUT) & set(data.TRAIN_COMBOS)
    trained = set(data.train_captions())
    assert all(c.caption not in trained for c in data.held_out_clips())
    for i, values in enumerate((data.COLOURS, data.SHAPES, data.DIRECTIONS, data.PITCHES, data.SIDES)):
        assert {combo[i] for combo in data.TRAIN_COMBOS} == set(values)  # every value is trained


def test_generator_is_seeded_and_measurements_recover_every_attribute():
    clips = data.train_clips(1)[::9] + data.held_out_clips()[:6]
    frames, audio = data.render_video(clips), data.render_audio(clips)
    assert frames.shape == (len(clips), 22, 64, 96, 3) and frames.dtype == torch.uint8
    assert audio.shape == (len(clips), 2, 29600)
    assert torch.equal(frames, data.render_video(clips))
    for clip, f, a in zip(clips, frames.numpy(), audio[:, :, : audio_num_samples(22)].numpy(), strict=True):
        assert all(measure.score(clip, f, a)["correct"].values()), clip


def test_measurements_of_a_blank_clip_find_no_shape():
    result = measure.measure_video(np.full((22, 64, 96, 3), 32, np.uint8))
    assert result["colour"] is None and result["direction"] is None


def test_condition_captions_leave_out_what_the_reference_gives():
    clip = data.Clip("red", "ball", "left", "low", "right")
    assert clip.caption_for("t2va") == clip.caption_for("both") == clip.caption
    assert clip.caption_for("image") == "a ball rolls to the left while a low tone plays on the right"
    assert clip.caption_for("audio") == "a red ball rolls to the left while a tone plays"
    train = data.train_captions()
    assert len(train) == 756 + 144 + 144 and clip.caption_for("image") in train
    assert data.held_out_captions() == [c.caption for c in data.held_out_clips()]  # the rest are trained


def test_reference_image_and_tone_carry_the_clip_attributes():
    clips = [data.Clip("purple", "square", "up", "high", "right"), data.Clip("green", "ball", "down", "low", "left")]
    images = data.render_reference_image(clips).numpy()
    assert images.shape == (2, 64, 96, 3)
    assert measure.object_centre(images[0]) == (47.5, 31.5)  # centred on the canvas
    assert measure.measure_video(images[:1])["colour"] == "purple"
    assert measure.measure_video(images[1:])["colour"] == "green"
    tones = data.render_audio(clips, samples=data.REFERENCE_SAMPLES).numpy()
    assert tones.shape == (2, 2, 32000)
    assert [measure.measure_audio(t)["pitch"] for t in tones] == ["high", "low"]
    assert [measure.measure_audio(t)["side"] for t in tones] == ["right", "left"]


def test_object_centre_and_psnr_of_hand_made_frames():
    frame = np.full((64, 96, 3), 32, np.uint8)
    assert measure.object_centre(frame) is None
    frame[10:14, 20:24] = (220, 50, 50)  # a 4 x 4 square: centre (21.5, 11.5)
    assert measure.object_centre(frame) == (21.5, 11.5)
    assert measure.psnr(frame, frame) == float("inf")
    assert measure.psnr(frame, frame + np.uint8(5)) == pytest.approx(10 * np.log10(255**2 / 25))  # 34.15 dB


def test_keyframe_scores_measure_the_shift_from_the_keyframe():
    clips = data.held_out_clips()[:3]
    frames = data.render_video(clips).numpy()
    shifted = np.roll(frames, 2, axis=3)  # 2 px to the right; the background stays uniform
    blank = np.full_like(frames[2], 32)
    outputs = [(shifted[0], None), (shifted[1], None), (blank, None)]
    scores = evaluate_conditions.keyframe_scores(clips, outputs, 0)
    assert scores["distance_px"] == pytest.approx([2.0, 2.0, evaluate_conditions.MISSING_DISTANCE])
    assert scores["psnr_db"][0] == pytest.approx(measure.psnr(shifted[0, 0], frames[0, 0]))
    assert evaluate_conditions.summary([scores]) == {
        "centre_px": 2.0,
        "within_3px": round(2 / 3, 4),
        "psnr_db": round(float(np.mean(scores["psnr_db"])), 4),
    }


def test_evaluation_conditions_have_the_training_layouts():
    video_vae, audio_vae = create_vaes(0)
    engine = Engine(H3DiT(get_config("tiny"), row_tile=0), video_vae, audio_vae)
    clip = data.held_out_clips()[0]
    for task in data.TASKS:
        conditions = evaluate.conditions(engine, clip, task)
        assert tuple(c.block() for c in conditions) == dit_train.task_conditions(task), task
    frames = data.render_video([clip])[0]
    (last,) = evaluate.conditions(engine, clip, "last")
    assert torch.equal(last.video[:, 0], keyframe_latent(video_vae, frames[-1]))


def random_conditions(task: str, gen: torch.Generator) -> list[Condition]:
    """Conditions of a training task with random clean latents (keyframes and image [24, 1, 4, 6],
    tone [2, 32, 40])."""

    def still() -> torch.Tensor:
        return torch.randn(24, 1, 4, 6, generator=gen)

    frames = {"first": [L.FIRST_FRAME], "last": [L.LAST_FRAME], "both": [L.FIRST_FRAME, L.LAST_FRAME]}
    if task in frames:
        return [Condition("keyframe", frame, still()) for frame in frames[task]]
    if task == "image":
        return [Condition("image", 0, still())]
    if task == "audio":
        return [Condition("audio", 0, None, torch.randn(2, 32, dit_train.REFERENCE_AUDIO_T, generator=gen))]
    return []


@pytest.mark.parametrize("config", ["tiny", "demo"])
def test_train_forward_matches_the_inference_forward_for_every_task(config):
    cfg = get_config(config)
    model = H3DiT(cfg, row_tile=0)
    init_weights(model, 3)  # nothing zero, so every path matters
    lengths = [15, 18, 16, 17, 15, 16]  # one clip per task of data.TASKS
    templates = dit_train.Templates.build(cfg, lengths, "cpu")
    assert templates.seq_len == 256  # the reference tone's 80 rows push past 192
    gen = torch.Generator().manual_seed(0)
    batch = len(lengths)
    video = torch.randn(batch, templates.video_inputs, 96, generator=gen)  # unused slots stay random
    audio = torch.randn(batch, templates.audio_inputs, 32, generator=gen)
    text = torch.zeros(batch, 18, cfg.text_dim)
    layouts, want_video_in, want_audio_in = [], [], []
    frame_rows = templates.frame_rows
    for i, (task, n) in enumerate(zip(data.TASKS, lengths, strict=True)):
        text[i, :n] = torch.randn(n, cfg.text_dim, generator=gen)
        conditions = list(L.order_conditions(random_conditions(task, gen)))
        layout = L.make_layout(n, 64, 96, 22, conditions=tuple(c.block() for c in conditions))
        layouts.append(layout)
        cond_video, cond_audio = condition_rows(conditions, layout, seed=i)
        row = 0
        for c in conditions:  # each block's rows into its slot of train_forward's input
            if c.video is not None:
                slot = dit_train.VIDEO_SLOTS.index((c.kind, c.frame))
                video[i, slot * frame_rows : (slot + 1) * frame_rows] = cond_video[row : row + frame_rows]
                row += frame_rows
        audio[i, : cond_audio.shape[0]] = cond_audio
        want_video_in.append(torch.cat([cond_video, video[i, -templates.video_rows :]]))
        want_audio_in.append(torch.cat([cond_audio, audio[i, -templates.audio_rows :]]))
    t_video = torch.tensor([0.1, 0.5, 0.9995, 0.3, 0.7, 0.999])  # 0.9995: above CONDITION_TIMESTEP
    t_audio = torch.tensor([0.3, 0.5, 0.05, 0.9, 0.2, 0.6])
    with torch.no_grad():
        got_v, got_a = dit_train.train_forward(
            model, templates, video, audio, text, torch.tensor(lengths), torch.arange(batch), t_video, t_audio
        )
    packed = L.pack_requests(layouts, t_video.tolist(), t_audio.tolist())
    out_v, out_a = model(
        torch.cat(want_video_in),
        torch.cat(want_audio_in),
        torch.cat([text[i, :n] for i, n in enumerate(lengths)]),
        packed,
    )
    for i, (want_v, want_a) in enumerate(L.split_rows(packed, out_v, out_a)):
        torch.testing.assert_close(got_v[i], want_v, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(got_a[i], want_a, atol=2e-5, rtol=1e-4)


def test_train_forward_has_gradients_for_every_parameter():
    cfg = get_config("tiny")
    model = H3DiT(cfg, row_tile=0)
    init_weights(model, 1)
    templates = dit_train.Templates.build(cfg, [16], "cpu")
    v, a = dit_train.train_forward(
        model,
        templates,
        torch.randn(2, templates.video_inputs, 96),
        torch.randn(2, templates.audio_inputs, 32),
        torch.randn(2, 16, 384),
        torch.tensor([16, 16]),
        torch.tensor([0, 5]),
        torch.rand(2),
        torch.rand(2),
    )
    assert v.shape == (2, 42, 96) and a.shape == (2, 74, 32)
    (v.square().mean() + a.square().mean()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_task_mix_is_parsed_and_bad_mixes_are_refused():
    mix = dit_train.parse_task_mix(dit_train.DEFAULT_TASK_MIX)
    assert mix.tolist() == pytest.approx([0.4, 0.15, 0.1, 0.1, 0.125, 0.125])
    assert dit_train.parse_task_mix("t2va=1,audio=3").tolist() == [0.25, 0, 0, 0, 0, 0.75]
    for text, message in (
        ("t2va=1,ball=1", "--task-mix entry 'ball=1': task must be one of"),
        ("t2va=1,t2va=2", "--task-mix entry 't2va=2': task must be one of"),
        ("first=-1", "--task-mix entry 'first=-1': the weight must be a number >= 0"),
        ("first=x", "--task-mix entry 'first=x': the weight must be a number >= 0"),
        ("first=0", "--task-mix 'first=0': the weights sum to 0"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            dit_train.parse_task_mix(text)


def test_state_round_trip_with_shards_and_bf16_moments(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    paths = state.save_state(tmp_path / "s", model, opt, {"step": 7}, torch.bfloat16, max_shard_bytes=20_000)
    assert len(paths) > 1
    model2 = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)
    assert state.load_state(tmp_path / "s", model2, opt2) == {"step": 7}
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)
        m, m2 = opt.state[p]["exp_avg"], opt2.state[q]["exp_avg"]
        assert m2.dtype == torch.float32 and torch.allclose(m, m2, rtol=1e-2, atol=1e-6)
    assert state.load_state(tmp_path / "missing", model2, opt2) is None


def test_lr_schedule_warms_up_then_decays():
    assert lr_at(0.0, 1.0) < lr_at(0.03, 1.0) == pytest.approx(1.0)
    assert lr_at(1.0, 1.0) == pytest.approx(0.05)
    assert lr_at(0.5, 1.0) > lr_at(0.9, 1.0)


def fake_caption_states(path):
    """A caption-states file like text_states.compute's, with random states (no MiniLM)."""
    captions = data.train_captions() + data.held_out_captions()
    gen = torch.Generator().manual_seed(0)
    states = [torch.randn(15 + i % 4, 384, generator=gen) for i in range(len(captions))]
    offsets = torch.tensor([0] + [len(s) for s in states]).cumsum(0)
    save_file(
        {"states": torch.cat(states).half(), "offsets": offsets},
        str(path),
        metadata={"captions": json.dumps(captions), "num_train": str(len(data.train_captions()))},
    )


def test_shape_centres_is_the_foreground_centre_of_mass_with_gradients_on_the_shape_only():
    background = torch.tensor(data.BACKGROUND) / 127.5 - 1.0
    frames = background[None, :, None, None].repeat(3, 1, 64, 96)  # [3 frames, 3, H, W]
    red = torch.tensor(data.COLOURS["red"]) / 127.5 - 1.0
    frames[0, :, 10:14, 20:24] = red[:, None, None]  # a 4 x 4 square: centre (21.5, 11.5)
    frames[1, :, 10:14, 22:26] = red[:, None, None]  # 2 px to the right
    frames.requires_grad_()
    centres = vae_train.shape_centres(frames)
    assert centres.tolist() == [[21.5, 11.5], [23.5, 11.5], [0.0, 0.0]]  # frame 2 is blank
    centres[:2, 0].sum().backward()
    moved = frames.grad[0].abs().sum(0) > 0
    assert moved[10:14, 20:24].all() and moved.sum() == 16  # background pixels weigh nothing


def test_video_loss_adds_the_centre_term_with_its_weight():
    vae = VideoVAE()
    init_weights(vae, 0)
    groups = vae_train.video_groups(data.held_out_clips()[:1], "cpu")[1:3]  # two 4-frame groups
    losses = []
    for weight in (0.0, 1.0):
        torch.manual_seed(0)  # the same latent noise
        losses.append(vae_train.video_loss(vae, groups, weight))
    (plain, logs), (with_centre, logs_centre) = losses
    assert logs == logs_centre and logs["centre_px"] > 1.0  # random weights miss the shape
    assert with_centre.item() - plain.item() == pytest.approx(logs["centre_px"], rel=1e-5)


def test_reversal_distance_and_term_for_an_encoder_blind_to_frame_order():
    vae = VideoVAE().eval()
    init_weights(vae, 0)
    clips = data.held_out_clips()[:2]
    assert vae_train.reversal_distance(vae, clips) > 0.01
    with torch.no_grad():
        first = vae.encoder[0].weight  # [32, 12, 3, 3]: 4 frames x RGB
        first.copy_(first[:, :3].repeat(1, 4, 1, 1))  # every frame weighted alike
    assert vae_train.reversal_distance(vae, clips) == pytest.approx(0.0, abs=1e-5)
    groups = vae_train.video_groups(clips[:1], "cpu")  # 5 moving groups, 2 stills
    _, logs = vae_train.video_loss(vae, groups)
    assert logs["reversal"] == pytest.approx(vae_train.REVERSAL_MARGIN, abs=1e-4)  # the whole margin


def test_video_vae_fine_tunes_from_the_shipped_weights(tmp_path):
    torch.set_flush_denormal(True)
    shipped = Path(__file__).resolve().parents[1] / "weights" / "demo" / "video_vae.safetensors"
    vae_train.train("video", tmp_path, 0.5, 1000.0, "cpu", batch=2, stats_clips=4, init=shipped)
    rows = read_loss_csv(tmp_path / "video_vae_loss.csv")
    assert float(rows[0]["loss"]) < 0.3  # a fresh init starts near 1.5 (docs/demo_model.md)
    with pytest.raises(FileNotFoundError):
        vae_train.train("video", tmp_path / "x", 0.5, 1000.0, "cpu", batch=2, init=tmp_path / "missing.safetensors")


def test_every_stage_runs_and_resumes_on_the_cpu(tmp_path):
    torch.set_flush_denormal(True)
    for which in ("video", "audio"):
        vae_train.train(which, tmp_path, seconds=0.5, total_seconds=1000.0, device="cpu", batch=2, stats_clips=4)
        first = read_loss_csv(tmp_path / f"{which}_vae_loss.csv")
        vae_train.train(
            which, tmp_path, seconds=0.5, total_seconds=1000.0, device="cpu", batch=2, stats_clips=4
        )  # resumes
        rows = read_loss_csv(tmp_path / f"{which}_vae_loss.csv")
        assert int(rows[-1]["step"]) > int(first[-1]["step"]) >= 1
        assert (tmp_path / f"{which}_vae.safetensors").is_file()
    fake_caption_states(tmp_path / "captions.safetensors")
    captions, num_train, states = text_states.load(tmp_path / "captions.safetensors")
    assert num_train == 1044 and len(captions) == len(states) == 1080
    args = [
        "--work",
        str(tmp_path),
        "--vaes",
        str(tmp_path),
        "--captions",
        str(tmp_path / "captions.safetensors"),
        "--config",
        "tiny",
        "--batch",
        "2",
        "--max-clips",
        "4",
        "--log-every",
        "1",
        "--device",
        "cpu",
    ]
    dit_train.main(args + ["--seconds", "0.5", "--total-seconds", "1000", "--eval-clips", "0"])
    first = read_loss_csv(tmp_path / "dit_loss.csv")
    dit_train.main(args + ["--seconds", "0.5", "--total-seconds", "1000", "--eval-clips", "1", "--eval-steps", "1"])
    rows = read_loss_csv(tmp_path / "dit_loss.csv")
    assert int(rows[-1]["step"]) > int(first[-1]["step"]) >= 1
    assert all(np.isfinite(float(r["loss"])) for r in rows)
    report = json.loads((tmp_path / "dit_eval.json").read_text())
    assert report["n_cases"] == 1 and report["steps"] == 1 and 0.0 <= report["t2va_attribute_accuracy"] <= 1.0
    assert set(report["per_task"]) == set(data.TASKS)


def test_strip_tiles_are_the_condition_then_the_frames():
    """training.strips: a task's condition tile is the clip's rendered first / last frame or its
    reference image (none for t2va); a strip is the tiles with GAP white columns between them and a
    double gap after the condition."""
    clip = data.held_out_clips()[0]
    video = data.render_video([clip])[0].numpy()
    assert np.array_equal(strips.condition_tile(clip, "first"), video[0])
    assert np.array_equal(strips.condition_tile(clip, "last"), video[-1])
    assert np.array_equal(strips.condition_tile(clip, "image"), data.render_reference_image([clip])[0].numpy())
    assert strips.condition_tile(clip, "t2va") is None
    frames = [video[i] for i in strips.FRAMES]
    with_condition, text_only = strips.strip(video[-1], frames), strips.strip(None, frames)
    assert with_condition.shape == (64, 5 * 96 + 5 * strips.GAP, 3)
    assert text_only.shape == (64, 4 * 96 + 3 * strips.GAP, 3)
    assert np.array_equal(with_condition[:, :96], video[-1])
    assert (with_condition[:, 96 : 96 + 2 * strips.GAP] == 255).all()
    assert np.array_equal(with_condition[:, 96 + 2 * strips.GAP :], text_only)
