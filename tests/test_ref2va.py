"""ref2va in the core: a layout written out by hand from docs/model.md §2.1-2.3 (rows, cu_seqlens,
img_pos / audio_pos, RoPE positions exact in float64 for a guide and image, audio and video
references), per-row timesteps and tags (§1.9, §2.2), the clean reference-audio rows (§3.3), and
bitwise parity: ref2va solo == co-batched with t2va and fl2va requests of other shapes == request
mode, and a cancelled ref2va request leaves its neighbours unchanged."""

import pytest
import torch

from h3_core.diffusion import layout as L
from h3_core.diffusion.conditions import Condition, condition_rows
from h3_core.diffusion.request import GenerationRequest
from tests.test_conditions import fl2va, run_packs
from tests.test_engine import REQUESTS, assert_same, engine, solo  # noqa: F401  (engine: the fixture)

GUIDE = L.ConditionBlock("guide", 1, 4, 6, 0, frame=2)
IMAGE = L.ConditionBlock("image", 1, 2, 2)
AUDIO = L.ConditionBlock("audio", 0, 0, 0, 2)
VIDEO_AUDIO = L.ConditionBlock("video_audio", 2, 2, 4, 3)
# given out of order: the layout puts the guide first, then the references in the given order
HAND = L.RequestLayout(4, 2, 4, 6, 3, 64, conditions=L.order_conditions((IMAGE, GUIDE, AUDIO, VIDEO_AUDIO)))
SPAN_2 = 5.0 / 3.0 * 1 + 5.0 / 3.0 * 4  # two latent frames: 1 + 4 frames of 5/3 each


def test_hand_written_ref2va_rows():
    """text 0-3 | guide 4-9 (6 rows) | image 10 | audio ref 11-14 | video_audio ref: audio 15-20,
    video 21-24 | target audio 25-30 | target video 31-42 | padding 43-63."""
    assert HAND.conditions == (GUIDE, IMAGE, AUDIO, VIDEO_AUDIO)
    assert (HAND.condition_rows, HAND.audio_start, HAND.video_start, HAND.used, HAND.seq_len) == (21, 25, 31, 43, 64)
    batch = L.pack_requests([HAND], [0.5], [0.25])
    assert batch.cu_seqlens.tolist() == [0, 43, 64]
    assert batch.video_rows.tolist() == [*range(4, 10), 10, *range(21, 25), *range(31, 43)]  # img_pos
    assert batch.audio_rows.tolist() == [*range(11, 15), *range(15, 21), *range(25, 31)]  # audio_pos
    assert (HAND.image_rows, HAND.all_audio_rows) == (6 + 1 + 4 + 12, 4 + 6 + 6)


def test_hand_written_ref2va_positions_exact_in_float64():
    """The cursor starts at L_txt = 4: the image sits at 4 and advances it by 1, the audio (T_ref 2)
    at 5 (+2), the video with audio at 7 (+ max(3, span(2)) = 25/3); the targets start at the
    origin 15 1/3; the guide at origin + 5/3 x 2. Each reference on its own grid, the guide and
    the targets on the target's (4 x 6 latent), the audio-only reference on the target's w
    extremes."""
    pos = HAND.position_ids()
    origin = 4.0 + 1.0 + 2.0 + max(3.0, SPAN_2)
    assert HAND.origin == origin
    target_h = [32 * ((1 - 4 / 24**0.5) / 2 + 4 / 24**0.5 * i / 2) for i in range(2)]
    target_w = [32 * ((1 - 6 / 24**0.5) / 2 + 6 / 24**0.5 * i / 3) for i in range(3)]
    assert HAND.spatial_grid() == (target_h, target_w)
    guide = [[origin + 5.0 / 3.0 * 2, h, w] for h in target_h for w in target_w]
    assert pos[4:10].tolist() == guide
    assert pos[10].tolist() == [4.0, 0.0, 0.0]  # a 2 x 2 latent: one patch at the grid's origin
    assert pos[11:15].tolist() == [
        [5.0, 0.0, target_w[0]],
        [6.0, 0.0, target_w[0]],
        [5.0, 0.0, target_w[-1]],
        [6.0, 0.0, target_w[-1]],
    ]
    own_h = [32 * (1 - 2 / 8**0.5) / 2]
    own_w = [32 * ((1 - 4 / 8**0.5) / 2 + 4 / 8**0.5 * i / 2) for i in range(2)]
    assert L.spatial_grid(2, 4) == (own_h, own_w)
    assert pos[15:21].tolist() == [[7.0 + tau, 0.0, own_w[c]] for c in (0, -1) for tau in range(3)]
    assert pos[21:25].tolist() == [[t, own_h[0], w] for t in (7.0, 7.0 + 5.0 / 3.0) for w in own_w]
    assert pos[25:31].tolist() == [[origin + tau, 0.0, target_w[c]] for c in (0, -1) for tau in range(3)]
    assert pos[31:43].tolist() == [[t, h, w] for t in (origin, origin + 5.0 / 3.0) for h in target_h for w in target_w]
    assert torch.all(pos[43:] == 0)


def test_ref2va_timesteps_and_tags():
    """Visual condition rows max(t_video, 0.999), reference audio rows max(t_audio, 1) = 1, target
    audio t_audio, the rest t_video; tags 0 on visual rows, 2 on audio rows (condition or target)."""
    rows = HAND.row_timesteps(0.5, 0.25)
    assert rows[4:11].tolist() == pytest.approx([0.999] * 7) and rows[21:25].tolist() == pytest.approx([0.999] * 4)
    assert torch.all(rows[11:21] == 1.0) and torch.all(rows[25:31] == 0.25)
    assert torch.all(rows[:4] == 0.5) and torch.all(rows[31:] == 0.5)
    tags = HAND.token_tags()
    assert tags.tolist() == [1] * 4 + [0] * 7 + [2] * 10 + [0] * 4 + [2] * 6 + [0] * 12 + [-1] * 21


@pytest.mark.parametrize(
    "block, message",
    [
        (
            L.ConditionBlock("guide", 1, 4, 6, 0, 5),
            "condition 0 (guide) frame=5 is out of range: allowed 0..4 (num_frames)",
        ),
        (
            L.ConditionBlock("image", 1, 3, 2),
            "condition 0 (image) has latent shape t=1 h=3 w=2 audio_t=0, which its kind does not allow",
        ),
        (
            L.ConditionBlock("video", 3, 2, 2),
            "condition 0 (video) has latent shape t=3 h=2 w=2 audio_t=0, which its kind does not allow",
        ),
        (
            L.ConditionBlock("video", 2, 2, 2, 3),
            "condition 0 (video) has latent shape t=2 h=2 w=2 audio_t=3, which its kind does not allow",
        ),
        (
            L.ConditionBlock("audio", 0, 0, 0, 0),
            "condition 0 (audio) has latent shape t=0 h=0 w=0 audio_t=0, which its kind does not allow",
        ),
    ],
)
def test_malformed_blocks_are_refused(block, message):
    with pytest.raises(ValueError) as error:
        L.make_layout(4, 64, 96, 5, conditions=(block,))
    assert str(error.value) == message


def test_guides_and_keyframes_do_not_mix_and_guides_do_not_repeat():
    with pytest.raises(ValueError, match="keyframes cannot be mixed with guides or references"):
        L.make_layout(
            4, 64, 96, 5, conditions=(L.ConditionBlock("keyframe", 1, 4, 6), L.ConditionBlock("image", 1, 2, 2))
        )
    with pytest.raises(ValueError, match=r"guide frames \[1, 1\] repeat a frame: one guide per frame"):
        L.make_layout(4, 64, 96, 5, conditions=(L.ConditionBlock("guide", 1, 4, 6, 0, 1),) * 2)


def test_reference_audio_rows_are_its_clean_latent():
    """noise_aug 1.0: the reference audio rows are its clean latent, channel-major (docs/model.md §3.3),
    whatever the seed."""
    latent = torch.randn(2, 32, 5, generator=torch.Generator().manual_seed(3))
    conditions = [Condition("audio", 0, None, latent)]
    layout = L.make_layout(4, 64, 96, 5, conditions=(conditions[0].block(),))
    video, audio = condition_rows(conditions, layout, seed=11)
    assert video.shape == (0, 96) and torch.equal(audio, torch.cat([latent[0].T, latent[1].T]))
    assert torch.equal(condition_rows(conditions, layout, seed=12)[1], audio)


def ref2va(request_id: str, seed: int, height: int, width: int, frames: int, steps: int, latent_seed: int):
    """(request, Conditions): a guide at frame 1, an image reference, a video with audio and an
    audio reference, all with seeded random clean latents (no VAE: their shapes are what counts)."""
    g = torch.Generator().manual_seed(latent_seed)
    conditions = [
        Condition("audio", 0, None, torch.randn(2, 32, 6, generator=g)),
        Condition("guide", 1, torch.randn(24, 1, height // 16, width // 16, generator=g)),
        Condition("image", 0, torch.randn(24, 1, 2, 4, generator=g)),
        Condition("video_audio", 0, torch.randn(24, 2, 2, 2, generator=g), torch.randn(2, 32, 3, generator=g)),
    ]
    request = GenerationRequest(
        f"references {request_id}", height, width, frames, steps, seed=seed, request_id=request_id, task="ref2va"
    )
    return request, conditions


def solo_run(model, request, conditions):
    return model.run_to_completion([model.prepare(request, conditions=conditions)[0]])[0]


def test_ref2va_solo_equals_cobatched_with_t2va_and_fl2va_equals_request_mode(engine):  # noqa: F811
    entries = {
        "r1": ref2va("r1", 31, 64, 96, 22, 4, latent_seed=1),
        "r2": ref2va("r2", 32, 32, 64, 9, 3, latent_seed=2),
        "kf": fl2va(engine, "kf", (0, -1), 33, 64, 64, 5, 5, image_seed=500),
        "a": (REQUESTS[0], None),
    }
    solos = {rid: solo_run(engine, request, conditions or ()) for rid, (request, conditions) in entries.items()}
    done = run_packs(engine, entries, {"r1": 0, "r2": 2, "kf": 1, "a": 0})
    assert sorted(done) == ["a", "kf", "r1", "r2"]
    for rid, state in done.items():
        assert_same(state, solos[rid])
    request, conditions = entries["r2"]
    ((generated, frames, audio),) = engine.generate(request, conditions=conditions)
    assert_same(generated, solos["r2"])
    assert frames.shape == (22, 32, 64, 3) and audio.shape == (2, 29333)  # 9 asked: 22 served
    assert solos["r1"].layout.conditions[0].kind == "guide" and solos["r1"].layout.condition_audio_rows == 12 + 6


def test_cancelled_ref2va_request_leaves_neighbours_unchanged(engine):  # noqa: F811
    entries = {
        "r1": ref2va("r1", 31, 64, 96, 22, 4, latent_seed=1),
        "kf": fl2va(engine, "kf", (0,), 33, 64, 64, 5, 5, image_seed=500),
        "b": (REQUESTS[1], None),
    }
    whole = run_packs(engine, entries, {"r1": 0, "kf": 0, "b": 0})
    cut = run_packs(engine, entries, {"r1": 0, "kf": 0, "b": 0}, cancel_at=("r1", 2))
    assert sorted(cut) == ["b", "kf"]
    for rid in ("b", "kf"):
        assert_same(cut[rid], whole[rid])


def test_rows_and_memory_are_refused_before_any_vae():
    """read_references (h3_encoder) refuses a request whose rows or memory, conditions included,
    pass h3_dit's limits, from the decoded sizes alone."""
    from h3_core.config import get_config
    from h3_core.diffusion.request import request_memory_mb
    from h3_core.protocol import REFERENCE_IMAGES
    from h3_core.serving.encoder.conditioning import read_references
    from h3_core.serving.shared.settings import EncoderSettings
    from tests.test_fl2va_serving import png

    files = {REFERENCE_IMAGES: [png(64, 64, 1)]}
    refs = read_references(files, None, 64, 96, 9, 1, None, EncoderSettings(), (64, 96))
    assert [image.shape for image in refs.images] == [(64, 64, 3)]  # square at about 64 x 96 px: 78 -> 64
    with pytest.raises(ValueError) as error:
        read_references(files, None, 64, 96, 9, 1, None, EncoderSettings(max_batch_rows=64), (64, 96))
    assert str(error.value) == (
        "rows=128 (1 x 128, references and guides included) is out of range: allowed 1..64 (max_batch_rows): "
        "send fewer or shorter references, fewer outputs, or a smaller canvas"
    )
    with pytest.raises(ValueError) as error:
        read_references(files, None, 64, 96, 9, 4, None, EncoderSettings(max_request_mb=1), (64, 96))
    assert request_memory_mb(64, 96, 9, 4 * 128, get_config("tiny").hidden_size) == 26  # 4 outputs of 128 rows
    assert str(error.value) == (
        "memory=26 MiB (references and guides included) is out of range: allowed up to 1 MiB (max_request_mb)"
    )
