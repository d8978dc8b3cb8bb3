"""fl2va condition rows in the core: the layout (h3_spec §2.1-2.3, §7.3 golden case), per-row
timesteps (§1.9), anchors (§3.3), and bitwise parity solo == co-batched == request mode with t2va
and other fl2va requests of other shapes and step counts."""

import numpy as np
import pytest
import torch

from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import CONDITION_AUG, condition_anchors
from h3_core.diffusion.request import GenerationRequest
from h3_core.model.vae import keyframe_latent
from tests.test_engine import REQUESTS, assert_same, engine, solo  # noqa: F401  (engine: the fixture)

T2VA = L.RequestLayout(text_len=4, latent_t=2, latent_h=4, latent_w=6, audio_t=3, seq_len=64)
FL2VA = L.RequestLayout(text_len=4, latent_t=2, latent_h=4, latent_w=6, audio_t=3, seq_len=64, keyframes=(0,))


def test_golden_layout_t2va_vs_fl2va():
    """h3_spec §7.3: L=4, 2x4x6 latent, T_a=3: S = 64 for both, 12 vs 18 image rows with 6
    condition rows, 6 audio rows, target video starting at row 10 vs 16."""
    assert (T2VA.seq_len, FL2VA.seq_len) == (64, 64)
    assert (T2VA.image_rows, FL2VA.image_rows, FL2VA.condition_rows) == (12, 18, 6)
    assert (T2VA.audio_rows, FL2VA.audio_rows) == (6, 6)
    assert (T2VA.video_start, FL2VA.video_start) == (10, 16)
    assert (T2VA.used, FL2VA.used) == (22, 28)
    batch = L.pack_requests([FL2VA], [0.5], [0.25])
    assert batch.video_rows.tolist() == list(range(4, 10)) + list(range(16, 28))
    assert batch.audio_rows.tolist() == list(range(10, 16))
    assert batch.cu_seqlens.tolist() == [0, 28, 64]


def test_keyframe_positions_exact_in_float64():
    """First keyframe at t = L_txt, last at L_txt + span(T_lat) - 5/3 (numpy's pairwise float64
    sum over 5/3 x (1, 4, 4, 4, 4, ...)); h, w = the target's grid (h3_spec §2.3)."""
    both = L.RequestLayout(4, 2, 4, 6, 3, 64, keyframes=(0, -1))
    pos = both.position_ids()
    first, last = pos[4:10], pos[10:16]
    assert torch.all(first[:, 0] == 4.0)
    span = np.sum(np.array([5.0 / 3.0 * 1, 5.0 / 3.0 * 4], dtype=np.float64))
    assert torch.all(last[:, 0] == 4.0 + span - 5.0 / 3.0)
    target_first_frame = pos[both.video_start : both.video_start + both.frame_rows]
    assert torch.equal(first[:, 1:], target_first_frame[:, 1:])
    assert torch.equal(last[:, 1:], target_first_frame[:, 1:])
    # 209 frames (T_lat 62): the last keyframe sits at frame 208, 5/3 x 208 after the first
    long = L.make_layout(9, 384, 672, 209, keyframes=(-1,))
    frames = [5.0 / 3.0 * (1, 4, 4, 4, 4)[k % 5] for k in range(62)]
    assert long.keyframe_time(-1) == 9.0 + float(np.sum(np.array(frames, dtype=np.float64))) - 5.0 / 3.0
    assert long.keyframe_time(-1) == pytest.approx(9 + 208 * 5 / 3, abs=1e-9)
    assert long.condition_rows == 252 and long.used == 16329 + 252 and long.seq_len == 16640


def test_row_timesteps_and_tags():
    """Condition rows take max(t_video, 0.999), audio rows t_audio, the rest t_video; condition
    rows and vision tokens are tagged 0 (video), h3_spec §1.9 and §2.2."""
    layout = L.RequestLayout(4, 2, 4, 6, 3, 64, keyframes=(0, -1), vision_spans=((1, 3),))
    rows = layout.row_timesteps(0.5, 0.25)
    assert torch.all(rows[4:16] == torch.tensor(0.999, dtype=torch.float32))
    assert torch.all(rows[16:22] == 0.25) and torch.all(rows[:4] == 0.5) and torch.all(rows[22:] == 0.5)
    assert torch.all(layout.row_timesteps(1.0, 1.0)[4:16] == 1.0)
    assert layout.token_tags()[:40].tolist() == [1, 0, 0, 1] + [0] * 12 + [2] * 6 + [0] * 12 + [-1] * 6
    batch = L.pack_requests([T2VA, layout], [0.5, 0.75], [0.25, 0.5])
    assert batch.unique_timesteps.tolist() == pytest.approx([0.25, 0.5, 0.75, 0.999])


@pytest.mark.parametrize(
    "keyframes, message",
    [
        ((1,), "keyframes=[1] is not allowed: distinct frame indices 0 (first) or -1 (last)"),
        ((0, 0), "keyframes=[0, 0] is not allowed: distinct frame indices 0 (first) or -1 (last)"),
    ],
)
def test_bad_keyframes_are_refused(keyframes, message):
    with pytest.raises(ValueError) as error:
        L.make_layout(4, 64, 96, 5, keyframes=keyframes)
    assert str(error.value) == message


def test_anchor_is_seeded_blend_of_clean_latent_and_noise():
    """anchor = 0.999 c + 0.001 n, n = the first latent frame of randn(1, 24, T_lat + K, Hl, Wl)
    from a fresh generator seeded with the request's seed, patchified (h3_spec §3.3)."""
    layout = L.make_layout(4, 64, 96, 22, keyframes=(0, -1))
    clean = torch.randn(2, 24, 4, 6, generator=torch.Generator().manual_seed(5))
    anchors = condition_anchors(clean, layout, seed=7)
    noise = torch.randn(1, 24, layout.latent_t + 2, 4, 6, generator=torch.Generator().manual_seed(7))[0, :, :1]
    expected = torch.cat([L.patchify_video(CONDITION_AUG * c[:, None] + (1.0 - CONDITION_AUG) * noise) for c in clean])
    assert anchors.shape == (2 * 6, 96) and torch.equal(anchors, expected)
    assert torch.equal(condition_anchors(clean, layout, seed=7), anchors)
    assert not torch.equal(condition_anchors(clean, layout, seed=8), anchors)


def keyframe(model, seed: int, height: int, width: int) -> torch.Tensor:
    """The keyframe latent [24, Hl, Wl] of a seeded noise image through model's video VAE."""
    image = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return keyframe_latent(model.video_vae, image)


def fl2va(model, request_id, keyframes, seed, height, width, frames, steps, image_seed):
    request = GenerationRequest(
        f"keyframe clip {request_id}",
        height,
        width,
        frames,
        steps,
        seed=seed,
        request_id=request_id,
        keyframes=keyframes,
        task="fl2va",
    )
    latents = torch.stack([keyframe(model, image_seed + i, height, width) for i in range(len(keyframes))])
    return request, latents


def run_packs(model, entries, admit_at, cancel_at=None):
    """Step mode with condition latents: entries = {id: (request, latents)}; a request joins when
    the step counter reaches admit_at[id]; cancel_at = (id, step) drops that request before the
    step. Returns the finished states by id."""
    pending, active, done, tick = dict(entries), [], {}, 0
    while pending or active:
        for rid in [rid for rid in pending if admit_at[rid] <= tick]:
            request, latents = pending.pop(rid)
            active += model.prepare(request, keyframe_latents=latents)
        if cancel_at is not None and cancel_at[1] == tick:
            active = [s for s in active if s.request_id != cancel_at[0]]
        for state, velocity in zip(active, model.denoise_step(active), strict=True):
            model.update(state, velocity)
        done.update({s.request_id: s for s in active if s.finished})
        active = [s for s in active if not s.finished]
        tick += 1
    return done


def test_fl2va_solo_equals_cobatched_equals_request_mode(engine):  # noqa: F811
    """K5: each conditioned request of a pack (different images, shapes, step counts and
    keyframe sets, t2va neighbours, one admitted mid-flight) equals its solo run bit for bit, and
    request mode (Engine.generate) equals solo step mode."""
    entries = {
        "first": fl2va(engine, "first", (0,), 11, 64, 96, 22, 5, image_seed=100),
        "both": fl2va(engine, "both", (-1, 0), 12, 32, 64, 9, 3, image_seed=200),
        "last": fl2va(engine, "last", (-1,), 13, 64, 64, 5, 4, image_seed=300),
    }
    t2va = {r.request_id: (r, None) for r in REQUESTS[:2]}
    solos = {}
    for rid, (request, latents) in entries.items():
        state = engine.prepare(request, keyframe_latents=latents)[0]
        while not state.finished:
            engine.update(state, engine.denoise_step([state])[0])
        solos[rid] = state
    solos.update({r.request_id: solo(engine, r) for r in REQUESTS[:2]})
    done = run_packs(engine, {**entries, **t2va}, {"first": 0, "both": 2, "last": 0, "a": 0, "b": 1})
    assert sorted(done) == ["a", "b", "both", "first", "last"]
    for rid, state in done.items():
        assert_same(state, solos[rid])
    request, latents = entries["both"]
    ((generated, frames, audio),) = engine.generate(request, keyframe_latents=latents)
    assert_same(generated, solos["both"])
    assert frames.shape == (9, 32, 64, 3) and audio.shape == (2, 12000)
    # the conditions matter: another image gives other latents
    other = engine.prepare(request, keyframe_latents=latents.flip(0))[0]
    while not other.finished:
        engine.update(other, engine.denoise_step([other])[0])
    assert not torch.equal(other.video_latents, solos["both"].video_latents)


def test_cancelled_conditioned_request_leaves_neighbours_unchanged(engine):  # noqa: F811
    entries = {
        "first": fl2va(engine, "first", (0,), 11, 64, 96, 22, 5, image_seed=100),
        "last": fl2va(engine, "last", (-1,), 13, 64, 64, 5, 4, image_seed=300),
        "a": (REQUESTS[0], None),
    }
    whole = run_packs(engine, entries, {"first": 0, "last": 0, "a": 0})
    cut = run_packs(engine, entries, {"first": 0, "last": 0, "a": 0}, cancel_at=("last", 2))
    assert sorted(cut) == ["a", "first"]
    for rid in ("a", "first"):
        assert_same(cut[rid], whole[rid])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(keyframes=(0,), task="t2va"), "TASK='t2va' takes no KEYFRAMES; got 1 (send TASK 'fl2va' or no TASK)"),
        (dict(task="fl2va"), "TASK='fl2va' needs KEYFRAMES (1 or 2 images)"),
        (dict(task="ref2va"), "TASK='ref2va' is not served yet: allowed 't2va', 'fl2va'"),
        (dict(task="i2v"), "TASK='i2v' is not allowed: allowed ['t2va', 'fl2va', 'ref2va']"),
    ],
)
def test_task_must_agree_with_keyframes(engine, kwargs, message):  # noqa: F811
    request = GenerationRequest("x", 32, 32, 5, 1, seed=1, **kwargs)
    latents = torch.zeros(len(request.keyframes), 24, 2, 2) if request.keyframes else None
    with pytest.raises(ValueError) as error:
        engine.prepare(request, keyframe_latents=latents)
    assert str(error.value) == message


def test_keyframe_latents_must_match(engine):  # noqa: F811
    request = GenerationRequest("x", 32, 64, 5, 1, seed=1, keyframes=(0, -1), task="fl2va")
    with pytest.raises(ValueError) as error:
        engine.prepare(request, keyframe_latents=torch.zeros(1, 24, 2, 4))
    assert (
        str(error.value)
        == "keyframe_latents has shape [1, 24, 2, 4]; expected [2, 24, 2, 4] (keyframes x 24 x Hl x Wl)"
    )
    bad = torch.zeros(2, 24, 2, 4)
    bad[1, 3, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="keyframe_latents holds non-finite values"):
        engine.prepare(request, keyframe_latents=bad)


def test_step_loop_serves_fl2va_beside_t2va_and_echoes_the_conditioning(engine):  # noqa: F811
    """Through h3_dit's StepLoop (REQUEST fields + KEYFRAME_LATENTS as h3_encoder sends them): an
    fl2va request packed with a t2va one ends with the latents of its engine-level solo run, and
    its INFO says task, keyframes, geometry and the flow shifts it ran with."""
    from h3_core.serving.events import Result
    from tests.test_step_loop import Client, make_loop

    request, latents = fl2va(engine, "kf", (-1, 0), 21, 32, 64, 9, 3, image_seed=400)
    text = engine.encode_prompt(request.prompt)
    state = engine.prepare(request, text, latents)[0]
    while not state.finished:
        engine.update(state, engine.denoise_step([state])[0])
    client = Client(make_loop(engine))
    geometry = {"canvas": "requested", "height": 32, "width": 64, "fit": "crop", "keyframe_sizes": [[32, 64]] * 2}
    client.send(
        "kf",
        3,
        21,
        text_embeds=text[None].numpy(),
        keyframe_latents=latents[None].numpy(),
        height=32,
        width=64,
        num_frames=9,
        keyframes=[-1, 0],
        task="fl2va",
        geometry=geometry,
    )
    client.send("plain", 4, 3, parameters={"flow_shift": 5.0, "audio_flow_shift": 2})
    client.run()
    (result,) = client.of("kf", Result)
    assert result.info["largest_pack"] == 2
    assert {key: result.info[key] for key in ("task", "keyframes", "geometry", "flow_shift", "audio_flow_shift")} == {
        "task": "fl2va",
        "keyframes": [-1, 0],
        "geometry": geometry,
        "flow_shift": 12.0,
        "audio_flow_shift": 3.0,
    }
    assert torch.equal(result.video_latent, L.unpatchify_video(state.video_latents, state.layout))
    assert torch.equal(result.audio_latent, L.audio_rows_to_latent(state.audio_latents, state.layout))
    (plain,) = client.of("plain", Result)
    assert (plain.info["task"], plain.info["flow_shift"], plain.info["audio_flow_shift"]) == ("t2va", 5.0, 2)
    assert "keyframes" not in plain.info


@pytest.mark.parametrize(
    "fields, latents, message",
    [
        (dict(keyframes=[0]), None, "KEYFRAME_LATENTS holds 0 keyframes but REQUEST field 'keyframes' lists 1"),
        (
            {},
            np.zeros((1, 1, 24, 2, 4), np.float32),
            "KEYFRAME_LATENTS holds 1 keyframes but REQUEST field 'keyframes' lists 0",
        ),
        (
            dict(keyframes=[0]),
            np.zeros((1, 24, 2, 4), np.float32),
            "KEYFRAME_LATENTS has shape [1, 24, 2, 4]; expected [1, K, 24, Hl, Wl]",
        ),
        (
            dict(keyframes=[0]),
            np.zeros((1, 1, 24, 4, 4), np.float32),
            "keyframe_latents has shape [1, 24, 4, 4]; expected [1, 24, 2, 4] (keyframes x 24 x Hl x Wl)",
        ),
        (
            dict(keyframes=[0, 1]),
            np.zeros((1, 2, 24, 2, 4), np.float32),
            "keyframes=[0, 1] is not allowed: distinct frame indices 0 (first) or -1 (last)",
        ),
        (dict(keyframes="first"), None, "REQUEST field 'keyframes' must be a list of at most 2 integers, got 'first'"),
        (
            dict(vision_spans=[[0]]),
            None,
            "REQUEST field 'vision_spans' must be a list of [start, end] integer pairs, got [[0]]",
        ),
        (dict(vision_spans=[[2, 9]]), None, "vision span [2, 9) is out of range: allowed within 0..3 text rows"),
        (dict(geometry=[1]), None, "REQUEST field 'geometry' must be an object, got [1]"),
    ],
)
def test_direct_h3_dit_keyframe_inputs_are_checked(engine, fields, latents, message):  # noqa: F811
    """What a direct h3_dit caller may send wrong about keyframes: each refused with INVALID_ARG
    naming the field, and nothing else runs."""
    from h3_core.serving.events import Refused
    from tests.test_step_loop import Client, make_loop

    client = Client(make_loop(engine))
    client.send("bad", 2, 1, text_embeds=np.zeros((1, 3, 384), np.float32), keyframe_latents=latents, **fields)
    (refused,) = client.iterate()
    assert isinstance(refused, Refused) and (refused.code, refused.message) == ("INVALID_ARG", message)
