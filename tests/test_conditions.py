"""fl2va condition rows in the core: the layout (docs/model.md §2.1-2.3, §7 golden case), per-row
timesteps (§1.9), anchors (§3.3), and bitwise parity solo == co-batched == request mode with t2va
and other fl2va requests of other shapes and step counts."""

import numpy as np
import pytest
import torch

from h3_core import protocol
from h3_core.diffusion import layout as L
from h3_core.diffusion.conditions import CONDITION_AUG, Condition, condition_rows
from h3_core.diffusion.request import GenerationRequest
from h3_core.model.vae import keyframe_latent
from h3_core.rules import InvalidRequest
from h3_core.serving.encoder.conditioning import wire_conditions
from tests.step_loop_harness import joins_by_step
from tests.test_engine import REQUESTS, assert_same, engine, solo  # noqa: F401  (engine: the fixture)


def keyframe_block(frame: int, latent_h: int = 4, latent_w: int = 6) -> L.ConditionBlock:
    return L.ConditionBlock("keyframe", 1, latent_h, latent_w, 0, frame)


T2VA = L.RequestLayout(text_len=4, latent_t=2, latent_h=4, latent_w=6, audio_t=3, seq_len=64)
FL2VA = L.RequestLayout(4, 2, 4, 6, 3, 64, conditions=(keyframe_block(0),))


def test_golden_layout_t2va_vs_fl2va():
    """docs/model.md §7: L=4, 2x4x6 latent, T_a=3: S = 64 for both, 12 vs 18 image rows with 6
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
    sum over 5/3 x (1, 4, 4, 4, 4, ...)); h, w = the target's grid (docs/model.md §2.3)."""
    both = L.RequestLayout(4, 2, 4, 6, 3, 64, conditions=(keyframe_block(0), keyframe_block(-1)))
    pos = both.position_ids()
    first, last = pos[4:10], pos[10:16]
    assert torch.all(first[:, 0] == 4.0)
    span = np.sum(np.array([5.0 / 3.0 * 1, 5.0 / 3.0 * 4], dtype=np.float64))
    assert torch.all(last[:, 0] == 4.0 + span - 5.0 / 3.0)
    target_first_frame = pos[both.video_start : both.video_start + both.frame_rows]
    assert torch.equal(first[:, 1:], target_first_frame[:, 1:])
    assert torch.equal(last[:, 1:], target_first_frame[:, 1:])
    # 209 frames (T_lat 62): the last keyframe sits at frame 208, 5/3 x 208 after the first
    long = L.make_layout(9, 384, 672, 209, conditions=(keyframe_block(-1, 24, 42),))
    frames = [5.0 / 3.0 * (1, 4, 4, 4, 4)[k % 5] for k in range(62)]
    assert long.keyframe_time(-1) == 9.0 + float(np.sum(np.array(frames, dtype=np.float64))) - 5.0 / 3.0
    assert long.keyframe_time(-1) == pytest.approx(9 + 208 * 5 / 3, abs=1e-9)
    assert long.condition_rows == 252 and long.used == 16329 + 252 and long.seq_len == 16640


def test_row_timesteps_and_tags():
    """Condition rows take max(t_video, 0.999), audio rows t_audio, the rest t_video; condition
    rows and vision tokens are tagged 0 (video), docs/model.md §1.9 and §2.2."""
    layout = L.RequestLayout(
        4, 2, 4, 6, 3, 64, conditions=(keyframe_block(0), keyframe_block(-1)), vision_spans=((1, 3),)
    )
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
        L.make_layout(4, 64, 96, 5, conditions=tuple(keyframe_block(frame) for frame in keyframes))
    assert str(error.value) == message


def test_anchor_is_seeded_blend_of_clean_latent_and_noise():
    """anchor = 0.999 c + 0.001 n, n = the first latent frame of randn(1, 24, T_lat + K, Hl, Wl)
    from a fresh generator seeded with the request's seed, patchified (docs/model.md §3.3)."""
    clean = torch.randn(2, 24, 1, 4, 6, generator=torch.Generator().manual_seed(5))
    conditions = [Condition("keyframe", 0, clean[0]), Condition("keyframe", -1, clean[1])]
    layout = L.make_layout(4, 64, 96, 22, conditions=tuple(c.block() for c in conditions))
    video, audio = condition_rows(conditions, layout, seed=7)
    noise = torch.randn(1, 24, layout.latent_t + 2, 4, 6, generator=torch.Generator().manual_seed(7))[0, :, :1]
    expected = torch.cat([L.patchify_video(CONDITION_AUG * c + (1.0 - CONDITION_AUG) * noise) for c in clean])
    assert video.shape == (2 * 6, 96) and torch.equal(video, expected) and audio.shape == (0, 32)
    assert torch.equal(condition_rows(conditions, layout, seed=7)[0], video)
    assert not torch.equal(condition_rows(conditions, layout, seed=8)[0], video)


def keyframe(model, seed: int, height: int, width: int) -> torch.Tensor:
    """The keyframe latent [24, Hl, Wl] of a seeded noise image through model's video VAE."""
    image = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return keyframe_latent(model.video_vae, image)


def fl2va(model, request_id, keyframes, seed, height, width, frames, steps, image_seed):
    """(request, its keyframe Conditions) with seeded noise images through model's video VAE."""
    request = GenerationRequest(
        f"keyframe clip {request_id}", height, width, frames, steps, seed=seed, request_id=request_id, task="fl2va"
    )
    conditions = [
        Condition("keyframe", frame, keyframe(model, image_seed + i, height, width)[:, None])
        for i, frame in enumerate(keyframes)
    ]
    return request, conditions


def run_packs(model, entries, admit_at, cancel_at=None):
    """Step mode with conditions: entries = {id: (request, its Conditions or None)}; a request joins when
    the step counter reaches admit_at[id]; cancel_at = (id, step) drops that request before the
    step. Returns the finished states by id."""
    arrivals = [(admit_at[rid], entry) for rid, entry in entries.items()]
    joins = joins_by_step(lambda entry: model.prepare(entry[0], conditions=entry[1] or ()), arrivals)
    cancels = {} if cancel_at is None else {cancel_at[1]: [cancel_at[0]]}
    return {s.request_id: s for s in model.run_to_completion([], joins=joins, cancels=cancels)}


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
    for rid, (request, conditions) in entries.items():
        solos[rid] = engine.run_to_completion([engine.prepare(request, conditions=conditions)[0]])[0]
    solos.update({r.request_id: solo(engine, r) for r in REQUESTS[:2]})
    done = run_packs(engine, {**entries, **t2va}, {"first": 0, "both": 2, "last": 0, "a": 0, "b": 1})
    assert sorted(done) == ["a", "b", "both", "first", "last"]
    for rid, state in done.items():
        assert_same(state, solos[rid])
    request, conditions = entries["both"]
    ((generated, frames, audio),) = engine.generate(request, conditions=conditions)
    assert_same(generated, solos["both"])
    assert frames.shape == (22, 32, 64, 3) and audio.shape == (2, 29333)  # 9 frames asked: 22 served
    # the conditions matter: another image gives other latents
    swapped = [Condition(c.kind, c.frame, other.video) for c, other in zip(conditions, conditions[::-1], strict=True)]
    (other,) = engine.run_to_completion([engine.prepare(request, conditions=swapped)[0]])
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


TASK_CASES = [  # (task, condition kinds, the core's refusal, the wire's words for it)
    (
        "t2va",
        ["keyframe"],
        "task='t2va' takes no conditions; got 1",
        "TASK='t2va' takes no conditions; got 1 (send TASK 'fl2va' / 'ref2va' or no TASK)",
    ),
    (
        "fl2va",
        [],
        "task='fl2va' needs keyframes (1 or 2 images) and nothing else; got 0 keyframes and 0 guides or references",
        "TASK='fl2va' needs KEYFRAMES (1 or 2 images) and nothing else; got 0 keyframes and 0 guides or references",
    ),
    (
        "ref2va",
        ["keyframe"],
        "task='ref2va' needs references or guides and no keyframes; got 0 references or guides and 1 keyframes",
        "TASK='ref2va' needs references or guides (REFERENCE_IMAGES, REFERENCE_VIDEOS, REFERENCE_AUDIO, GUIDES) "
        "and no KEYFRAMES; got 0 references or guides and 1 keyframes",
    ),
    (
        "i2v",
        [],
        "task='i2v' is not allowed: allowed ['t2va', 'fl2va', 'ref2va']",
        "TASK='i2v' is not allowed: allowed ['t2va', 'fl2va', 'ref2va']",
    ),
]


@pytest.mark.parametrize("task, kinds, message, wire", TASK_CASES)
def test_task_must_agree_with_the_conditions(engine, task, kinds, message, wire):  # noqa: F811
    """The engine refuses in the core's words (InvalidRequest naming the field "task"); the wire's
    check_task refuses the same requests naming its inputs (TASK, KEYFRAMES) and passes the rest."""
    request = GenerationRequest("x", 32, 32, 5, 1, seed=1, task=task)
    conditions = [Condition(kind, 0, torch.zeros(24, 1, 2, 2)) for kind in kinds]
    with pytest.raises(InvalidRequest) as error:
        engine.prepare(request, conditions=conditions)
    assert (error.value.field, str(error.value)) == ("task", message)
    with pytest.raises(ValueError) as error:
        protocol.check_task(task, kinds)
    assert (type(error.value), str(error.value)) == (ValueError, wire)
    assert [protocol.check_task(*good) for good in (("t2va", []), ("fl2va", ["keyframe"]), ("ref2va", ["image"]))] == [
        "t2va",
        "fl2va",
        "ref2va",
    ]


def test_a_direct_h3_dit_caller_gets_the_task_refusal_in_the_wires_words(engine):  # noqa: F811
    """REQUEST fields sent straight to h3_dit with task t2va and a keyframe: the engine refuses in
    the core's words (InvalidRequest, field "task"), and h3_dit's admission answers INVALID_ARG in
    the wire's (check_task: TASK, KEYFRAMES), as h3_encoder does; the neighbour runs on."""
    from h3_core.serving.dit.events import Refused, Result
    from tests.step_loop_harness import Client, make_loop

    request, conditions = fl2va(engine, "kf", (0,), 21, 32, 64, 9, 2, image_seed=400)
    latents, entries = wire_conditions(conditions)
    client = Client(make_loop(engine))
    text = engine.encode_prompt(request.prompt)[None].numpy()
    fields = dict(num_frames=9, conditions=entries, task="t2va")
    client.send("bad", 2, 21, text_embeds=text, condition_latents=latents, **fields)
    client.send("plain", 2, 3)
    client.run()
    assert [(event.code, event.message) for event in client.events if isinstance(event, Refused)] == [
        ("INVALID_ARG", "TASK='t2va' takes no conditions; got 1 (send TASK 'fl2va' / 'ref2va' or no TASK)")
    ]
    assert len(client.of("plain", Result)) == 1


@pytest.mark.parametrize(
    "condition, message",
    [
        (
            Condition("keyframe", 0, torch.zeros(24, 1, 2, 2)),
            "condition 0 (keyframe) has latent shape t=1 h=2 w=2 audio_t=0, which its kind does not allow",
        ),
        (
            Condition("keyframe", 0, torch.zeros(24, 2, 4)),
            "a keyframe condition's video latent has shape [24, 2, 4]; expected [24, T, h, w]",
        ),
        (Condition("keyframe", 0), "a keyframe condition needs video latent"),
        (
            Condition("keyframe", 0, torch.full((24, 1, 2, 4), float("nan"))),
            "a keyframe condition's video latent holds non-finite values",
        ),
    ],
)
def test_condition_latents_must_match(engine, condition, message):  # noqa: F811
    request = GenerationRequest("x", 32, 64, 5, 1, seed=1, task="fl2va")
    with pytest.raises(ValueError) as error:
        engine.prepare(request, conditions=[condition])
    assert str(error.value) == message


def test_step_loop_serves_fl2va_beside_t2va_and_echoes_the_conditioning(engine):  # noqa: F811
    """Through h3_dit's StepLoop (REQUEST fields + CONDITION_LATENTS as h3_encoder sends them): an
    fl2va request packed with a t2va one ends with the latents of its engine-level solo run, and
    its INFO says task, keyframes, geometry and the flow shifts it ran with."""
    from h3_core.serving.dit.events import Result
    from tests.step_loop_harness import Client, make_loop

    request, conditions = fl2va(engine, "kf", (-1, 0), 21, 32, 64, 9, 3, image_seed=400)
    text = engine.encode_prompt(request.prompt)
    (state,) = engine.run_to_completion([engine.prepare(request, text, conditions)[0]])
    latents, entries = wire_conditions(conditions)
    client = Client(make_loop(engine))
    geometry = {"canvas": "requested", "height": 32, "width": 64, "fit": "crop", "keyframe_sizes": [[32, 64]] * 2}
    client.send(
        "kf",
        3,
        21,
        text_embeds=text[None].numpy(),
        condition_latents=latents,
        height=32,
        width=64,
        num_frames=9,
        conditions=entries,
        task="fl2va",
        geometry=geometry,
    )
    client.send("plain", 4, 3, parameters={"flow_shift": 5.0, "audio_flow_shift": 2})
    client.run()
    (result,) = client.of("kf", Result)
    assert result.info["largest_pack"] == 2
    assert {key: result.info[key] for key in ("task", "conditions", "geometry", "flow_shift", "audio_flow_shift")} == {
        "task": "fl2va",
        "conditions": [{"kind": "keyframe", "frame": -1}, {"kind": "keyframe", "frame": 0}],
        "geometry": geometry,
        "flow_shift": 12.0,
        "audio_flow_shift": 3.0,
    }
    assert torch.equal(result.video_latent, L.unpatchify_video(state.video_latents, state.layout))
    assert torch.equal(result.audio_latent, L.audio_rows_to_latent(state.audio_latents, state.layout))
    (plain,) = client.of("plain", Result)
    assert (plain.info["task"], plain.info["flow_shift"], plain.info["audio_flow_shift"]) == ("t2va", 5.0, 2)
    assert "conditions" not in plain.info


KEYFRAME = {"kind": "keyframe", "frame": 0, "video": [24, 1, 2, 4]}


@pytest.mark.parametrize(
    "fields, latents, message",
    [
        (
            dict(conditions=[KEYFRAME]),
            None,
            "CONDITION_LATENTS holds 0 values but REQUEST field 'conditions' describes 192",
        ),
        (
            {},
            np.zeros((1, 192), np.float32),
            "CONDITION_LATENTS holds 192 values but REQUEST field 'conditions' describes 0",
        ),
        (
            dict(conditions=[KEYFRAME]),
            np.zeros((192,), np.float32),
            "CONDITION_LATENTS has shape [192]; expected [1, N]",
        ),
        (
            dict(conditions=[{**KEYFRAME, "video": [24, 1, 4, 4]}]),
            np.zeros((1, 384), np.float32),
            "condition 0 (keyframe) has latent shape t=1 h=4 w=4 audio_t=0, which its kind does not allow",
        ),
        (
            dict(conditions=[KEYFRAME, {**KEYFRAME, "frame": 1}]),
            np.zeros((1, 384), np.float32),
            "keyframes=[0, 1] is not allowed: distinct frame indices 0 (first) or -1 (last)",
        ),
        (
            dict(conditions="first"),
            None,
            "REQUEST field 'conditions' must be a list of at most 14 objects, got 'first'",
        ),
        (
            dict(conditions=[{"kind": "sketch"}]),
            None,
            "REQUEST field 'conditions'[0] must be an object with a kind in ['keyframe', 'guide', 'image', 'audio', "
            "'video', 'video_audio'], got {'kind': 'sketch'}",
        ),
        (
            dict(conditions=[{**KEYFRAME, "video": [24, 1, 2]}]),
            None,
            "REQUEST field 'conditions'[0] video must be a shape of 4 positive integers, got [24, 1, 2]",
        ),
        (
            dict(conditions=[{**KEYFRAME, "scale": 2}]),
            None,
            "REQUEST field 'conditions'[0] has unknown key 'scale'; allowed: ['kind', 'frame', 'video', 'audio', "
            "'input', 'start_time_seconds']",
        ),
        (
            dict(conditions=[{**KEYFRAME, "input": 5}]),
            None,
            "REQUEST field 'conditions'[0] input must be a string of at most 64 characters, got 5",
        ),
        (
            dict(conditions=[{**KEYFRAME, "start_time_seconds": -1}]),
            None,
            "REQUEST field 'conditions'[0] start_time_seconds must be a finite number >= 0, got -1",
        ),
        (
            dict(vision_spans=[[0]]),
            None,
            "REQUEST field 'vision_spans' must be a list of [start, end] integer pairs, got [[0]]",
        ),
        (dict(vision_spans=[[2, 9]]), None, "vision span [2, 9) is out of range: allowed within 0..3 text rows"),
        (dict(geometry=[1]), None, "REQUEST field 'geometry' must be an object, got [1]"),
    ],
)
def test_direct_h3_dit_condition_inputs_are_checked(engine, fields, latents, message):  # noqa: F811
    """What a direct h3_dit caller may send wrong about conditions: each refused with INVALID_ARG
    naming the field, and nothing else runs."""
    from h3_core.serving.dit.events import Refused
    from tests.step_loop_harness import Client, make_loop

    client = Client(make_loop(engine))
    client.send("bad", 2, 1, text_embeds=np.zeros((1, 3, 384), np.float32), condition_latents=latents, **fields)
    (refused,) = client.iterate()
    assert isinstance(refused, Refused) and (refused.code, refused.message) == ("INVALID_ARG", message)


def test_an_instance_serves_only_its_transformers_tasks(engine):  # noqa: F811
    """h3_dit parameter tasks: one instance loads one transformer; a request of a task it does not
    serve is refused before any work (requests of different transformers never share a pack)."""
    from h3_core.serving.dit.events import Refused, Result
    from h3_core.serving.shared.settings import DitSettings
    from tests.step_loop_harness import Client, make_loop

    request, conditions = fl2va(engine, "kf", (0,), 21, 32, 64, 5, 1, image_seed=400)
    latents, entries = wire_conditions(conditions)
    client = Client(make_loop(engine, tasks="t2va"))
    client.send("kf", 1, 21, condition_latents=latents, height=32, width=64, conditions=entries, task="fl2va")
    client.send("plain", 1, 3)
    events = client.iterate()
    refused = [event for event in events if isinstance(event, Refused)]
    assert [(event.code, event.message) for event in refused] == [
        (
            "INVALID_ARG",
            "task 'fl2va' is not served by this h3_dit: it serves ['t2va'] (h3_dit parameter tasks; one instance "
            "loads one transformer: serve another's tasks from another model repository)",
        )
    ]
    client.run()
    assert len(client.of("plain", Result)) == 1
    with pytest.raises(
        ValueError, match=r"h3_dit parameter tasks='i2v' must list some of \['t2va', 'fl2va', 'ref2va'\]"
    ):
        DitSettings(tasks="i2v")
