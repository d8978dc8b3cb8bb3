"""Few-step schedules pinned (issue 51 item 1): golden sigma lists, per-request sigma lists and their
validation, and an adapter's base_schedule as a request's default sigmas (docs/model.md §3.1)."""

import numpy as np
import pytest
import torch

from client.errors import H3Error
from client.inputs import sigma_inputs
from h3_core.config import get_config
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest, RequestLimits, validate_request
from h3_core.diffusion.sampling import default_sigmas, sigma_schedule
from h3_core.model import H3DiT
from h3_core.model.encoder import TextEncoder
from h3_core.model.initialization import init_weights
from h3_core.rules import InvalidRequest
from tests.step_loop_harness import joins_by_step

# The uniform base b = linspace(1, 0, N + 1) for N = 4 and 8 forwards, written out by hand.
BASE = {
    4: (1.0, 0.75, 0.5, 0.25, 0.0),
    8: (1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0),
}


def shifted(base: tuple[float, ...], shift: float) -> list[float]:
    """sigma = s b / (1 + (s - 1) b), in Python's float64: the expected values, not our code's."""
    return [shift * b / (1 + (shift - 1) * b) for b in base]


def assert_close(got: list[float], expected: list[float], tolerance: float = 1e-5) -> None:
    assert len(got) == len(expected)
    assert all(abs(g - e) <= tolerance for g, e in zip(got, expected, strict=True)), (got, expected)


@pytest.mark.parametrize("steps", [4, 8])
@pytest.mark.parametrize("video_shift,audio_shift", [(12.0, 3.0), (6.0, 3.0)])
def test_golden_few_step_schedules(steps, video_shift, audio_shift):
    """The Turbo / FastH3 schedules: N forwards on N + 1 shifted uniform points, video shift 12
    (6 at 768p) and audio shift 3, each clock its own list of the same length."""
    video, audio = sigma_schedule(steps, video_shift), sigma_schedule(steps, audio_shift)
    assert_close(video, shifted(BASE[steps], video_shift))
    assert_close(audio, shifted(BASE[steps], audio_shift))
    assert video[0] == audio[0] == 1.0 and video[-1] == audio[-1] == 0.0


def test_golden_numbers_written_out():
    """The issue's example and the other lists, each value rounded by hand to 5-6 digits."""
    assert_close(sigma_schedule(4, 12.0), [1, 0.97297, 0.92308, 0.8, 0])
    assert_close(sigma_schedule(4, 6.0), [1, 0.947368, 0.857143, 0.666667, 0])
    assert_close(sigma_schedule(4, 3.0), [1, 0.9, 0.75, 0.5, 0])
    assert_close(sigma_schedule(8, 12.0), [1, 0.988235, 0.972973, 0.952381, 0.923077, 0.878049, 0.8, 0.631579, 0])
    assert_close(sigma_schedule(8, 6.0), [1, 0.976744, 0.947368, 0.909091, 0.857143, 0.782609, 0.666667, 0.461538, 0])
    assert_close(sigma_schedule(8, 3.0), [1, 0.954545, 0.9, 0.833333, 0.75, 0.642857, 0.5, 0.3, 0])


LIMITS = RequestLimits(max_steps=8)
ALLOWED = "allowed strictly decreasing values from exactly 1 to exactly 0"


@pytest.mark.parametrize(
    "fields,field,message",
    [
        ({"video_sigmas": (1.0,)}, "video_sigmas", "video_sigmas has 1 point: allowed 2..9 (one more than the "
         "forwards, at most max_steps=8)"),
        ({"audio_sigmas": tuple(x / 9 for x in range(9, -1, -1))}, "audio_sigmas",
         "audio_sigmas has 10 points: allowed 2..9 (one more than the forwards, at most max_steps=8)"),
        ({"video_sigmas": (1.0, float("nan"), 0.0)}, "video_sigmas",
         "video_sigmas[1]=nan is not finite: allowed values from exactly 1 down to exactly 0"),
        ({"video_sigmas": (1.0, 0.5, float("-inf"))}, "video_sigmas",
         "video_sigmas[2]=-inf is not finite: allowed values from exactly 1 down to exactly 0"),
        ({"video_sigmas": (0.99, 0.5, 0.0)}, "video_sigmas",
         "video_sigmas[0]=0.99 is out of range: allowed exactly 1 first (pure noise)"),
        ({"audio_sigmas": (1.0, 0.5, 0.01)}, "audio_sigmas",
         "audio_sigmas[2]=0.01 is out of range: allowed exactly 0 last (clean)"),
        ({"video_sigmas": (1.0, 0.5, 0.5)}, "video_sigmas",
         "video_sigmas[2]=0.5 is out of range: allowed exactly 0 last (clean)"),
        ({"video_sigmas": (1, 0.5, 0.5, 0)}, "video_sigmas",
         f"video_sigmas[2]=0.5 is not below video_sigmas[1]=0.5: {ALLOWED}"),
        ({"audio_sigmas": (1.0, 0.4, 0.6, 0.0)}, "audio_sigmas",
         f"audio_sigmas[2]=0.6 is not below audio_sigmas[1]=0.4: {ALLOWED}"),
        ({"video_sigmas": (1.0, 1.5, 0.0)}, "video_sigmas",
         f"video_sigmas[1]=1.5 is not below video_sigmas[0]=1.0: {ALLOWED}"),
        ({"video_sigmas": (1.0, "0.5", 0.0)}, "video_sigmas",
         "video_sigmas must be a list of numbers, got (1.0, '0.5', 0.0)"),
        ({"video_sigmas": (True, False)}, "video_sigmas", "video_sigmas must be a list of numbers, got (True, False)"),
        ({"video_sigmas": "1, 0"}, "video_sigmas", "video_sigmas must be a list of numbers, got '1, 0'"),
        ({"video_sigmas": (1.0, 0.5, 0.0), "audio_sigmas": (1.0, 0.0)}, "audio_sigmas",
         "audio_sigmas has 2 points but video_sigmas has 3: allowed the same number (one DiT forward advances "
         "both clocks)"),
        ({"video_sigmas": (1.0, 0.5, 0.0), "audio_sigmas": (1.0, 0.3, 0.0)}, "num_inference_steps",
         "num_inference_steps=4 does not match video_sigmas (3 points): allowed 2, the list's number of forwards"),
        ({"audio_sigmas": (1.0, 0.0)}, "num_inference_steps",
         "num_inference_steps=4 does not match audio_sigmas (2 points): allowed 1, the list's number of forwards"),
    ],
)  # fmt: skip
def test_sigma_lists_refused_with_field_value_and_range(fields, field, message):
    request = GenerationRequest("ok", 32, 32, 5, 4, **fields)
    with pytest.raises(InvalidRequest) as info:
        validate_request(request, LIMITS)
    assert (info.value.field, str(info.value)) == (field, message)


def test_sigma_lists_accepted_at_the_bounds():
    """2 points (one forward) and max_steps + 1 points, ints or floats, list or tuple."""
    for request in (
        GenerationRequest("ok", 32, 32, 5, 1, video_sigmas=(1, 0), audio_sigmas=[1.0, 0.0]),
        GenerationRequest("ok", 32, 32, 5, 8, video_sigmas=BASE[8]),
        GenerationRequest("ok", 32, 32, 5, 8, audio_sigmas=tuple(shifted(BASE[8], 3.0))),
    ):
        validate_request(request, LIMITS)


@pytest.fixture(scope="module")
def engine():
    dit = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(dit, 0)
    return Engine(dit.eval(), None, None, TextEncoder(), RequestLimits(max_height=128, max_width=128, max_steps=20))


def run(engine, *requests, admit_at=None):
    """Final states by request id: the requests co-batched, each joining at its step of admit_at
    (default: all at step 0)."""
    admit_at = admit_at or {r.request_id: 0 for r in requests}
    joins = joins_by_step(engine.prepare, [(admit_at[r.request_id], r) for r in requests])
    return {s.request_id: s for s in engine.run_to_completion([], joins=joins)}


def assert_same(a, b):
    assert torch.equal(a.video_latents, b.video_latents) and torch.equal(a.audio_latents, b.audio_latents)


def request(request_id, steps, **fields):
    return GenerationRequest("a red ball rolls to the left", 32, 64, 9, steps, seed=5, request_id=request_id, **fields)


def test_sigma_schedule_lists_give_the_steps_and_shift_output_bitwise(engine):
    plain = run(engine, request("r", 5))["r"]
    listed = request("r", 5, video_sigmas=tuple(sigma_schedule(5, 12.0)), audio_sigmas=tuple(sigma_schedule(5, 3.0)))
    assert_same(run(engine, listed)["r"], plain)


def test_a_list_replaces_its_clocks_shift(engine):
    """video_sigmas of shift 6 (sigma_schedule's fp32 values) with the default video shift 12 ==
    video_shift=6; the audio clock still follows its shift; the output differs from shift 12's."""
    as_list = run(engine, request("r", 4, video_sigmas=tuple(sigma_schedule(4, 6.0))))["r"]
    as_shift = run(engine, request("r", 4, video_shift=6.0))["r"]
    assert as_list.sigmas_video == sigma_schedule(4, 6.0) and as_list.sigmas_audio == sigma_schedule(4, 3.0)
    assert_same(as_list, as_shift)
    assert not torch.equal(as_list.video_latents, run(engine, request("r", 4))["r"].video_latents)


def test_own_sigma_lists_solo_equal_cobatched_with_default_schedules(engine):
    """A 3-forward request on its own non-uniform lists, packed with requests on the default
    schedule (5 and 2 forwards, one joining mid-flight): each equals its solo run bitwise."""
    own = request("own", 3, video_sigmas=(1.0, 0.9, 0.5, 0.0), audio_sigmas=(1.0, 0.7, 0.2, 0.0))
    others = [request("five", 5), GenerationRequest("green", 32, 32, 5, 2, seed=9, request_id="two")]
    solos = {r.request_id: run(engine, r)[r.request_id] for r in [own, *others]}
    assert solos["own"].sigmas_video == [1.0, 0.9, 0.5, 0.0] and solos["own"].total_steps == 3
    for admit_at in ({"own": 0, "five": 0, "two": 0}, {"five": 0, "own": 1, "two": 2}):
        done = run(engine, *others, own, admit_at=admit_at)
        assert sorted(done) == ["five", "own", "two"]
        for request_id, state in done.items():
            assert state.step_index == solos[request_id].step_index
            assert_same(state, solos[request_id])


def test_default_sigmas_of_a_uniform_base_are_sigma_schedules_lists():
    video, audio = default_sigmas("[1, 0.75, 0.5, 0.25, 0]", 12.0, 3.0)
    assert list(video) == sigma_schedule(4, 12.0) and list(audio) == sigma_schedule(4, 3.0)
    assert_close(list(video), [1, 0.97297, 0.92308, 0.8, 0])
    video, audio = default_sigmas(str(list(BASE[8])))  # the default shifts 12 and 3
    assert list(video) == sigma_schedule(8, 12.0) and list(audio) == sigma_schedule(8, 3.0)


def test_default_sigmas_of_a_pinned_base_drive_a_request(engine):
    """A non-uniform base (FastH3-style: more of the steps at high noise) at video shift 10: each
    clock is the formula on the pinned positions; a request given them runs, with
    num_inference_steps = len(base) - 1."""
    base = (1.0, 0.9, 0.6, 0.0)
    video, audio = default_sigmas("[1.0, 0.9, 0.6, 0.0]", 10.0, 3.0)
    assert_close(list(video), shifted(base, 10.0)) and assert_close(list(audio), shifted(base, 3.0))
    assert_close(list(video), [1, 0.989011, 0.9375, 0])
    state = run(engine, request("r", 3, video_sigmas=video, audio_sigmas=audio))["r"]
    assert (state.sigmas_video, state.sigmas_audio, state.step_index) == (list(video), list(audio), 3)


@pytest.mark.parametrize(
    "base_schedule,message",
    [
        ("turbo-4", "base_schedule='turbo-4' is not JSON: allowed an array of positions 1 to 0"),
        ('{"steps": 4}', "base_schedule must be a list of numbers, got {'steps': 4}"),
        ("[1, 0.5]", "base_schedule[1]=0.5 is out of range: allowed exactly 0 last (clean)"),
        ("[1]", "base_schedule has 1 point: allowed at least 2 (one more than the forwards)"),
        ("[1, 0.5, 0.75, 0]", f"base_schedule[2]=0.75 is not below base_schedule[1]=0.5: {ALLOWED}"),
        (
            "[1, 0.99999994, 0]",
            "base_schedule=[1, 0.99999994, 0] at video_shift=12.0 gives sigmas [1.0, 1.0, 0.0] with equal neighbours "
            "in float32: allowed positions that stay strictly decreasing once shifted",
        ),
    ],
)
def test_default_sigmas_refuses_a_bad_base_schedule(base_schedule, message):
    with pytest.raises(InvalidRequest) as info:
        default_sigmas(base_schedule)
    assert (info.value.field, str(info.value)) == ("base_schedule", message)


def test_default_sigmas_refuses_a_shift_of_zero_and_shows_a_long_value_cut():
    with pytest.raises(InvalidRequest) as info:
        default_sigmas("[1, 0]", 12.0, 0.0)
    assert (info.value.field, str(info.value)) == ("base_schedule", "audio_shift=0.0 is out of range: allowed > 0")
    with pytest.raises(InvalidRequest) as info:
        validate_request(GenerationRequest("ok", 32, 32, 5, 4, video_sigmas="x" * 100), LIMITS)
    assert str(info.value) == f"video_sigmas must be a list of numbers, got '{'x' * 79}..."


# Through a real tritonserver (the session's shared `server`, max_steps 400): VIDEO_SIGMAS / AUDIO_SIGMAS.
E2E = dict(height=32, width=64, num_frames=5, seed=3, return_mp4=False, return_frames=True, return_audio=True)


def test_sigma_lists_through_tritonserver_replace_the_shift_and_set_the_steps(client):
    """VIDEO_SIGMAS of shift 6 and AUDIO_SIGMAS of shift 3, without NUM_INFERENCE_STEPS, give the
    frames and audio of the request with 3 steps and flow_shift 6 (shift 12 and the default 4
    steps would differ); INFO reports 3 steps and echoes the lists."""
    (shifted_6,) = client.generate("a red ball", num_inference_steps=3, flow_shift=6.0, **E2E)
    (listed,) = client.generate(
        "a red ball", video_sigmas=sigma_schedule(3, 6.0), audio_sigmas=sigma_schedule(3, 3.0), **E2E
    )
    assert listed.info["num_inference_steps"] == shifted_6.info["num_inference_steps"] == 3
    assert (listed.info["video_sigmas"], listed.info["audio_sigmas"]) == (
        sigma_schedule(3, 6.0),
        sigma_schedule(3, 3.0),
    )
    assert "video_sigmas" not in shifted_6.info
    assert np.array_equal(listed.frames, shifted_6.frames) and np.array_equal(listed.audio, shifted_6.audio)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"video_sigmas": [1, 0.5, 0.5, 0]}, f"VIDEO_SIGMAS[2]=0.5 is not below VIDEO_SIGMAS[1]=0.5: {ALLOWED}"),
        (
            {"video_sigmas": [1, float("nan"), 0]},
            "VIDEO_SIGMAS[1]=nan is not finite: allowed values from exactly 1 down to exactly 0",
        ),
        (
            {"audio_sigmas": [1 - k / 401 for k in range(402)]},
            "AUDIO_SIGMAS has 402 points: allowed 2..401 (one more than the forwards, at most max_steps=400)",
        ),
        (
            {"video_sigmas": [1, 0.5, 0], "audio_sigmas": [1, 0]},
            "audio_sigmas has 2 points but video_sigmas has 3: allowed the same number (one DiT forward advances "
            "both clocks)",
        ),
        (
            {"video_sigmas": [1, 0.5, 0], "num_inference_steps": 5},
            "num_inference_steps=5 does not match video_sigmas (3 points): allowed 2, the list's number of forwards",
        ),
    ],
)
def test_bad_sigma_lists_through_tritonserver_are_invalid_arg(client, fields, message):
    with pytest.raises(H3Error) as info:
        client.generate("a red ball", **{**E2E, **fields})
    assert (info.value.code, info.value.message) == ("INVALID_ARG", message)


def test_client_sigma_inputs_are_fp32_rows_and_refuse_wrong_types():
    video, audio = sigma_inputs([1, 0.5, 0], (1.0, 0.25, 0.0))
    assert [(t.name(), t.datatype(), t.shape()) for t in (video, audio)] == [
        ("VIDEO_SIGMAS", "FP32", [1, 3]),
        ("AUDIO_SIGMAS", "FP32", [1, 3]),
    ]
    assert [t.name() for t in sigma_inputs(None, [1, 0])] == ["AUDIO_SIGMAS"] and sigma_inputs(None, None) == []
    for arguments, message in (
        (("1, 0", None), "video_sigmas must be a sequence (list or tuple), got str '1, 0'"),
        ((None, [1, "0"]), "audio_sigmas[1] must be number, got str '0'"),
        (([1, True], None), "video_sigmas[1] must be number, got bool True"),
    ):
        with pytest.raises(TypeError) as info:
            sigma_inputs(*arguments)
        assert str(info.value) == message
