import itertools

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest, RequestLimits
from h3_core.model import H3DiT
from h3_core.model.encoder import TextEncoder
from h3_core.model.initialization import init_weights
from h3_core.model.vae import create_vaes, decode_clip
from h3_core.serving.dit.events import Result
from tests.step_loop_harness import Client, joins_by_step, make_loop


@pytest.fixture(scope="module")
def engine():
    dit = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(dit, 0)
    video_vae, audio_vae = create_vaes(1)
    return Engine(
        dit.eval(),
        video_vae.eval(),
        audio_vae.eval(),
        TextEncoder(),
        RequestLimits(max_height=128, max_width=128, max_num_frames=64, max_steps=20),
    )


REQUESTS = [
    GenerationRequest("a red ball rolls to the left", 64, 96, 22, 5, seed=11, request_id="a"),
    GenerationRequest(
        "a blue square slides up while a high tone plays on the right side", 64, 64, 9, 3, seed=22, request_id="b"
    ),
    GenerationRequest("green", 32, 64, 5, 4, seed=33, request_id="c"),
]


def solo(engine, request):
    return engine.run_to_completion([engine.prepare(request)[0]])[0]


def assert_same(a, b):
    assert torch.equal(a.video_latents, b.video_latents) and torch.equal(a.audio_latents, b.audio_latents)


def test_request_mode_equals_step_mode(engine):
    """Request mode (Engine.generate: one request stepped alone to completion, then decoded)
    against step mode as h3_dit runs it (StepLoop, one packed step per execute, a neighbour
    joining at step 2), decoded from the Result's latents as h3_vae does (decode_clip)."""
    request = REQUESTS[0]
    text_embeds = engine.encode_prompt(request.prompt)
    ((state, frames, audio),) = engine.generate(request, text_embeds)
    client = Client(make_loop(engine))
    shape = dict(height=request.height, width=request.width, num_frames=request.num_frames)
    client.send("a", request.num_inference_steps, request.seed, text_embeds=text_embeds[None].numpy(), **shape)
    client.iterate()
    client.iterate()
    neighbour = REQUESTS[1]
    client.send(
        "b",
        neighbour.num_inference_steps,
        neighbour.seed,
        text_embeds=engine.encode_prompt(neighbour.prompt)[None].numpy(),
        height=neighbour.height,
        width=neighbour.width,
        num_frames=neighbour.num_frames,
    )
    client.run()
    (stepped,) = client.of("a", Result)
    assert stepped.info["largest_pack"] == 2 and stepped.info["num_inference_steps"] == 5
    assert torch.equal(stepped.video_latent, L.unpatchify_video(state.video_latents, state.layout))
    assert torch.equal(stepped.audio_latent, L.audio_rows_to_latent(state.audio_latents, state.layout))
    frames2, audio2 = decode_clip(
        engine.video_vae, engine.audio_vae, request.num_frames, stepped.video_latent, stepped.audio_latent
    )
    assert torch.equal(frames, frames2) and torch.equal(audio, audio2)
    assert frames.dtype == torch.uint8 and frames.shape == (22, 64, 96, 3)
    assert audio.dtype == torch.float32 and audio.shape == (2, 29333)  # 22 / 24 s at 32 kHz
    assert state.step_index == state.total_steps == 5


def run_cobatched(engine, requests, admit_at):
    """Step mode: requests[i] joins when the step counter reaches admit_at[i]; finished states
    leave the batch. Returns final states by request id."""
    joins = joins_by_step(engine.prepare, [(admit_at[r.request_id], r) for r in requests])
    return {s.request_id: s for s in engine.run_to_completion([], joins=joins)}


def test_cobatched_mid_flight_admission_equals_solo(engine):
    solos = {r.request_id: solo(engine, r) for r in REQUESTS}
    # b joins at a's step 2; c (4 steps) joins at once; b (3 steps) finishes before a.
    done = run_cobatched(engine, REQUESTS, {"a": 0, "b": 2, "c": 0})
    for rid, state in done.items():
        assert_same(state, solos[rid])
    frames, audio = engine.decode(done["b"])
    solo_frames, solo_audio = engine.decode(solos["b"])
    assert torch.equal(frames, solo_frames) and torch.equal(audio, solo_audio)


def test_batch_order_does_not_matter(engine):
    solos = {r.request_id: solo(engine, r) for r in REQUESTS}
    for order in itertools.islice(itertools.permutations(REQUESTS), 1, 3):
        done = run_cobatched(engine, list(order), {"a": 0, "b": 0, "c": 0})
        for rid, state in done.items():
            assert_same(state, solos[rid])


def test_num_outputs_gives_consecutive_seeds_in_both_modes(engine):
    request = GenerationRequest("two clips", 32, 32, 5, 2, seed=100, num_outputs=2)
    results = engine.generate(request)
    assert [s.seed for s, _, _ in results] == [100, 101]
    states = engine.run_to_completion(engine.prepare(request))
    for (expected, _, _), got in zip(results, states, strict=True):
        assert got.seed == expected.seed and got.output_index == expected.output_index
        assert_same(got, expected)
    assert not torch.equal(states[0].video_latents, states[1].video_latents)


def test_missing_seed_is_drawn_and_recorded(engine):
    state = engine.prepare(GenerationRequest("no seed", 32, 32, 5, 1))[0]
    assert 0 <= state.seed < 2**31
    again = engine.prepare(GenerationRequest("no seed", 32, 32, 5, 1, seed=state.seed))[0]
    assert torch.equal(state.video_latents, again.video_latents)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("prompt", "   ", "prompt must contain visible characters, got '   '"),
        ("height", 48, "height=48 is out of range: allowed multiples of 32 in 32..128"),
        ("width", 0, "width=0 is out of range: allowed multiples of 32 in 32..128"),
        ("width", 160, "width=160 is out of range: allowed multiples of 32 in 32..128"),
        (
            "num_frames",
            0,
            "num_frames=0 is out of range: allowed 1..56 (NUM_FRAMES; the clip is aligned up to 17n+5 frames, at "
            "most max_num_frames=64)",
        ),
        ("num_inference_steps", 21, "num_inference_steps=21 is out of range: allowed 1..20"),
        ("seed", -1, "seed=-1 is out of range: allowed 0..9223372036854775807"),
        ("num_outputs", 0, "num_outputs=0 is out of range: allowed 1..4"),
        ("fps", 30, "fps=30 is not supported: the model generates 24 fps"),
    ],
)
def test_validation_errors_name_field_value_and_range(engine, field, value, message):
    fields = dict(prompt="ok", height=32, width=32, num_frames=5, num_inference_steps=1)
    fields[field] = value
    with pytest.raises(ValueError) as info:
        engine.prepare(GenerationRequest(**fields))
    assert str(info.value) == message


def test_rows_limit_and_text_width(engine):
    small = Engine(engine.dit, engine.video_vae, engine.audio_vae, engine.encoder, RequestLimits(max_rows=64))
    with pytest.raises(ValueError, match=r"rows=128 is out of range: allowed 1..64"):
        small.prepare(GenerationRequest("a red ball", 64, 96, 22, 1))
    with pytest.raises(ValueError, match=r"text_embeds has shape \(3, 10\); expected \[L >= 1, 384\]"):
        engine.prepare(GenerationRequest("x", 32, 32, 5, 1), text_embeds=torch.zeros(3, 10))


def test_finished_state_cannot_step(engine):
    state = solo(engine, REQUESTS[2])
    with pytest.raises(ValueError, match="request 'c' has finished all 4 steps"):
        engine.denoise_step([state])


def by_hand(engine, requests, joins):
    """The hand-driven loop Engine.run_to_completion replaces: requests[i] prepared before step
    joins[i], one denoise_step over the unfinished states a step, each updated with its velocity."""
    active, states, step = [], [], 0
    while active or step <= max(joins):
        for request, join in zip(requests, joins, strict=True):
            if join == step:
                states += engine.prepare(request)
                active += states[-1:]
        for state, velocity in zip(active, engine.denoise_step(active), strict=True):
            engine.update(state, velocity)
        active = [state for state in active if not state.finished]
        step += 1
    return states


def test_run_to_completion_equals_the_hand_driven_loop_with_staggered_joins(engine):
    """Exact latents and decoded clips against the hand-driven loop: a (4 steps) from step 0, b
    (2 steps) joining at step 1, c (3 steps) at step 5, after a and b have finished."""
    requests = [
        GenerationRequest("a red ball", 32, 64, 5, 4, seed=1, request_id="a"),
        GenerationRequest("a high tone", 32, 32, 5, 2, seed=2, request_id="b"),
        GenerationRequest("green", 64, 32, 5, 3, seed=3, request_id="c"),
    ]
    expected = by_hand(engine, requests, [0, 1, 5])
    joins = {1: lambda: engine.prepare(requests[1]), 5: lambda: engine.prepare(requests[2])}
    done = engine.run_to_completion(engine.prepare(requests[0]), joins=joins, decode=True)
    assert [(s.request_id, s.step_index) for s, _, _ in done] == [("a", 4), ("b", 2), ("c", 3)]
    for (state, _, _), want in zip(done, expected, strict=True):
        assert_same(state, want)
    frames, audio = engine.decode(expected[1])
    assert torch.equal(done[1][1], frames) and torch.equal(done[1][2], audio)
    assert (frames.shape, audio.shape) == ((5, 32, 32, 3), (2, 6667))  # 5 frames / 24 s at 32 kHz
    # one state alone is request mode: Engine.generate's latents
    ((generated, _, _),) = engine.generate(requests[1])
    (alone,) = engine.run_to_completion(engine.prepare(requests[1]))
    assert_same(alone, generated)
    assert_same(alone, expected[1])


def test_run_to_completion_calls_its_hooks_in_order_and_once_a_step(engine):
    """The order and count of joins, cancels, step_context and on_step: x (3 steps) from step 0, y
    (2 steps) joining at 1, z (4 steps) joining at 1 and cancelled before step 2, w (1 step)
    joining at 5 after two steps with no state (nothing runs then); on_step sees each state at
    the step it is about to leave, the finished one given (f) takes no step."""
    events = []

    def req(request_id, steps):
        return GenerationRequest("-", 32, 32, 5, steps, seed=len(request_id), request_id=request_id)

    def prepare(*requests):
        def join():
            events.append(("join", [r.request_id for r in requests]))
            return [s for r in requests for s in engine.prepare(r, torch.ones(2, 384))]

        return join

    class Context:
        def __init__(self, step, pack):
            self.step, self.pack = step, pack

        def __enter__(self):
            events.append(("enter", self.step, [s.request_id for s in self.pack]))

        def __exit__(self, *error):
            events.append(("exit", self.step, [(s.request_id, s.step_index) for s in self.pack]))

    def on_step(step, pack, velocities):
        assert [tuple(v.shape) for v in velocities[0]] == [(2, 96), (16, 32)]  # 32 x 32 x 5 frames
        events.append(("on_step", step, [(s.request_id, s.step_index) for s in pack], len(velocities)))

    (finished,) = engine.run_to_completion([engine.prepare(req("f", 1), torch.ones(2, 384))[0]])
    done = engine.run_to_completion(
        [finished, *engine.prepare(req("x", 3), torch.ones(2, 384))],
        joins={1: prepare(req("y", 2), req("z", 4)), 5: prepare(req("w", 1))},
        cancels={2: ["z"]},
        step_context=Context,
        on_step=on_step,
    )
    assert [(s.request_id, s.step_index) for s in done] == [("f", 1), ("x", 3), ("y", 2), ("w", 1)]
    assert events == [
        ("enter", 0, ["x"]),
        ("on_step", 0, [("x", 0)], 1),
        ("exit", 0, [("x", 1)]),
        ("join", ["y", "z"]),
        ("enter", 1, ["x", "y", "z"]),
        ("on_step", 1, [("x", 1), ("y", 0), ("z", 0)], 3),
        ("exit", 1, [("x", 2), ("y", 1), ("z", 1)]),
        ("enter", 2, ["x", "y"]),
        ("on_step", 2, [("x", 2), ("y", 1)], 2),
        ("exit", 2, [("x", 3), ("y", 2)]),
        ("join", ["w"]),
        ("enter", 5, ["w"]),
        ("on_step", 5, [("w", 0)], 1),
        ("exit", 5, [("w", 1)]),
    ]


def test_run_to_completion_refuses_bad_steps_and_unknown_cancels(engine):
    state = engine.prepare(GenerationRequest("-", 32, 32, 5, 2, seed=1, request_id="x"), torch.ones(2, 384))[0]
    with pytest.raises(ValueError, match=r"^joins has step -1: allowed steps are 0 and above$"):
        engine.run_to_completion([state], joins={-1: list})
    with pytest.raises(ValueError, match=r"^cancels names request 'y', not in the pack at step 1$"):
        engine.run_to_completion([state], cancels={1: ["y"]})
    assert state.step_index == 1  # the step before the bad cancel ran
    with pytest.raises(ValueError, match=r"^cancels names request 'x', not in the pack at step 3$"):
        engine.run_to_completion([state], cancels={3: ["x"]})  # x finished at step 0 of this run
