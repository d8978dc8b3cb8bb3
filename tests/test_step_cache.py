"""Per-request step caching (h3_core.diffusion.step_cache, issue 34): a cached request is
bit-identical solo, co-batched and in request mode; an uncached one is untouched by cached
neighbours; the first and last steps are computed; the cache lives in the request (K6); the step
loop reports skipped steps, packs only the outputs that compute and refuses bad thresholds.

The tiny DiT on seeded random weights with the identity polynomial: its modulated input changes
by about 0.03-0.1 a step, so a threshold of 0.5 skips every middle step of a short request."""

import json
from pathlib import Path

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import (
    STEP_CACHE_BYTES_PER_ROW,
    GenerationRequest,
    RequestLimits,
    request_memory_mb,
    validate_request,
)
from h3_core.diffusion.step_cache import polyval
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.model.vae import create_vaes
from h3_core.serving.dit.events import Ended, Refused, Result
from h3_core.serving.dit.simulate import SimState, make_workload, simulate, summarize
from h3_core.serving.shared.settings import DitSettings
from h3_core.weights.checkpoint import CACHE_FILE, load_cache_polynomial
from tests.step_loop_harness import Client, make_loop, text


@pytest.fixture(scope="module")
def engine():
    dit = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(dit, 0)
    video_vae, audio_vae = create_vaes(1)  # Engine.generate decodes
    return Engine(dit.eval(), video_vae.eval(), audio_vae.eval())


def request(height=32, width=64, seed=1, threshold=0.0, steps=8) -> GenerationRequest:
    return GenerationRequest("-", height, width, 5, steps, seed=seed, cache_threshold=threshold)


def prepare(engine, req):
    return engine.prepare(req, torch.from_numpy(text(req.seed)[0]))[0]


def step_together(engine, states) -> list[list[bool]]:
    """Step the states co-batched to completion; returns plan_step's answer per step (the plan
    made for that step, read back before its updates)."""
    plans = []
    engine.run_to_completion(states, on_step=lambda step, pack, velocities: plans.append(engine.plan_step(pack)))
    return plans


def assert_equal(a, b):
    assert torch.equal(a.video_latents, b.video_latents) and torch.equal(a.audio_latents, b.audio_latents)


def test_a_cached_request_is_bitwise_equal_solo_co_batched_and_in_request_mode(engine):
    solo = prepare(engine, request(threshold=0.1))
    step_together(engine, [solo])
    ((request_mode, _, _),) = engine.generate(request(threshold=0.1), torch.from_numpy(text(1)[0]))
    neighbours = [request(96, 64, 2, 0.0), request(64, 96, 3, 0.5), request(32, 64, 4, 0.05)]
    packed = [prepare(engine, req) for req in [request(threshold=0.1), *neighbours]]
    step_together(engine, packed)
    assert solo.cache.skipped > 0 and solo.cache.skipped == request_mode.cache.skipped == packed[0].cache.skipped
    assert_equal(solo, request_mode)
    assert_equal(solo, packed[0])
    for req, state in zip(neighbours, packed[1:], strict=True):  # each neighbour equals its own solo run
        alone = prepare(engine, req)
        step_together(engine, [alone])
        assert_equal(alone, state)
        assert alone.cache.skipped == state.cache.skipped
    assert packed[1].cache.skipped == 0 and packed[1].cache.planned_step == -1  # uncached: never planned


def test_the_first_and_last_steps_are_computed(engine):
    state = prepare(engine, request(threshold=0.5))
    assert step_together(engine, [state]) == [[True]] + [[False]] * 6 + [[True]]
    assert state.cache.skipped == 6
    one_step = prepare(engine, request(threshold=0.5, steps=2))
    assert step_together(engine, [one_step]) == [[True], [True]] and one_step.cache.skipped == 0


def test_k6_the_cache_lives_in_the_request_across_shapes(engine):
    """docs/failure_classes.md §K6: 16:9 and 9:16 requests interleaved with caching on and off, two
    of them with the same seed and shape but different thresholds; each equals its solo run."""
    reqs = [request(64, 96, 5, 0.2), request(96, 64, 6, 0.2), request(64, 96, 5, 0.0), request(96, 64, 6, 0.05)]
    packed = [prepare(engine, req) for req in reqs]
    step_together(engine, packed)
    for req, state in zip(reqs, packed, strict=True):
        alone = prepare(engine, req)
        step_together(engine, [alone])
        assert_equal(alone, state)
        assert alone.cache.skipped == state.cache.skipped
    assert packed[0].cache.skipped > 0 and packed[2].cache.skipped == 0
    assert len({id(state.cache) for state in packed}) == 4


def test_polyval_and_threshold_range():
    assert polyval((0.5, 2.0, 1.0), 2.0) == 7.0
    limits = RequestLimits()
    for value in (-0.1, 0.6, float("nan")):
        with pytest.raises(ValueError, match=rf"^cache_threshold={value} is out of range: allowed 0..0.5 \(max_"):
            validate_request(request(threshold=value), limits)


def test_the_step_loop_reports_skipped_steps_and_packs_only_computing_outputs(engine):
    """A cached request beside an uncached one with max_num_seqs 1: while its steps are skipped
    both advance every step (the cached one costs no document), each equals its solo run, the
    skipped steps are in INFO and h3_cached_steps_total, and the packed rows count only the
    computing outputs."""
    client = Client(make_loop(engine, max_num_seqs=1, max_waiting=2))
    client.send("cached", steps=6, seed=1, parameters={"cache_threshold": 0.5, "progress_every": 1})
    client.send("plain", steps=6, seed=2)
    client.run()
    (cached,) = client.of("cached", Result)
    (plain,) = client.of("plain", Result)
    assert (cached.info["skipped_steps"], cached.info["cache_threshold"]) == (4, 0.5)
    assert (plain.info["skipped_steps"], plain.info["cache_threshold"]) == (0, 0.0)
    assert cached.info["largest_pack"] == 2  # packed beside plain while skipping, with max_num_seqs 1
    assert [event.step for event in client.of("cached") if not isinstance(event, Result)] == [1, 2, 3, 4, 5, 6]
    metrics = client.loop.metrics
    assert metrics.values["h3_cached_steps_total"] == 4
    rows = prepare(engine, request()).rows
    assert sum(metrics.observed["h3_pack_rows"]) == 12 * rows - 4 * rows  # 12 output-steps, 4 skipped
    for result, seed, threshold in ((cached, 1, 0.5), (plain, 2, 0.0)):
        state = prepare(engine, request(seed=seed, threshold=threshold, steps=6))
        step_together(engine, [state])
        assert torch.equal(result.video_latent, L.unpatchify_video(state.video_latents, state.layout))
        assert torch.equal(result.audio_latent, L.audio_rows_to_latent(state.audio_latents, state.layout))


def test_k6_a_cancelled_cached_request_leaves_nothing_to_the_request_in_its_slot(engine):
    """K6 with a slot reused: a cached 1:2 request cancelled after 3 of 8 steps (max_num_seqs 1),
    then a 2:1 one of another seed takes its slot at a threshold where only some middle steps
    skip: its decisions and latents equal its solo run's (no cached velocity, modulated input or
    change sum carried over from the slot's previous request)."""
    client = Client(make_loop(engine, max_num_seqs=1))
    client.send("first", steps=8, seed=7, parameters={"cache_threshold": 0.5}, height=64, width=32)
    for _ in range(3):
        client.iterate()
    client.cancel("first")
    client.run()
    assert not client.of("first", Result)
    (ended,) = client.of("first", Ended)
    assert (ended.code, ended.step, ended.total) == ("CANCELLED", 3, 8)
    client.send("second", steps=8, seed=1, parameters={"cache_threshold": 0.1})
    client.run()
    (second,) = client.of("second", Result)
    state = prepare(engine, request(seed=1, threshold=0.1, steps=8))
    step_together(engine, [state])
    assert 0 < state.cache.skipped < 6  # some middle steps computed, some skipped
    assert second.info["skipped_steps"] == state.cache.skipped
    assert torch.equal(second.video_latent, L.unpatchify_video(state.video_latents, state.layout))
    assert torch.equal(second.audio_latent, L.audio_rows_to_latent(state.audio_latents, state.layout))


def test_a_step_where_every_request_skips_runs_no_forward(engine):
    client = Client(make_loop(engine))
    client.send("only", steps=5, seed=3, parameters={"cache_threshold": 0.5, "progress_every": 1})
    client.run()
    assert [event.step for event in client.of("only") if not isinstance(event, Result)] == [1, 2, 3, 4, 5]
    assert len(client.loop.metrics.observed["h3_pack_rows"]) == 2  # the first and the last step
    assert len(client.loop.metrics.observed["h3_step_seconds"]) == 5


@pytest.mark.parametrize(
    "settings, value, message",
    [
        ({}, 0.7, "cache_threshold=0.7 is out of range: allowed 0..0.5 (max_cache_threshold)"),
        ({}, -1, "cache_threshold=-1 is out of range: allowed 0..0.5 (max_cache_threshold)"),
        ({}, "x", "request parameter 'cache_threshold' must be int or float, got 'x'"),
        (
            {"sp_degree": 2},
            0.1,
            "cache_threshold=0.1 is out of range: allowed 0 with h3_dit parameter sp_degree=2 "
            "(step caching needs sp_degree 1)",
        ),
    ],
)
def test_a_bad_cache_threshold_is_refused(engine, settings, value, message):
    client = Client(make_loop(engine, **settings))
    client.send("bad", steps=3, parameters={"cache_threshold": value})
    client.run()
    (refused,) = [event for event in client.events if isinstance(event, Refused)]
    assert (refused.code, refused.message) == ("INVALID_ARG", message)


def test_settings_check_the_cache_thresholds():
    assert DitSettings(cache_threshold=0.2).limits().max_cache_threshold == 0.5
    with pytest.raises(ValueError, match=r"^h3_dit parameter cache_threshold=0.6 is out of range: allowed 0..0.5 "):
        DitSettings(cache_threshold=0.6)
    with pytest.raises(ValueError, match=r"^h3_dit parameter max_cache_threshold=inf is out of range"):
        DitSettings(max_cache_threshold=float("inf"))
    with pytest.raises(ValueError, match=r"^h3_dit parameter cache_threshold=0.1 needs sp_degree 1"):
        DitSettings(cache_threshold=0.1, sp_degree=2)


def test_the_simulator_skips_steps_at_the_hit_rate():
    state, rows = SimState(100, 8, skipped_steps=3), []
    while not state.finished:
        rows.append(state.step_rows)
        state.step_index += 1
    assert rows == [100, 100, 0, 100, 0, 100, 0, 100]
    # reference: 20 steps of 0.26 s; half of them skipped -> 2.6 s of denoising + 0.1 encode + 0.52 decode
    cached = make_workload("reference", hit_rate=0.5)
    assert summarize(cached, simulate(cached, "srpt"))["mean_latency_s"] == 3.22
    with pytest.raises(ValueError, match=r"^hit_rate=1.0 is out of range: allowed 0 <= hit_rate < 1$"):
        make_workload("reference", hit_rate=1.0)


def test_the_polynomial_is_read_beside_the_weights(tmp_path):
    assert load_cache_polynomial(tmp_path) is None and load_cache_polynomial("random:0") is None
    (tmp_path / CACHE_FILE).write_text(json.dumps({"polynomial": [0.25, 1], "source": "a fit"}))
    assert load_cache_polynomial(tmp_path) == (0.25, 1.0)
    (tmp_path / CACHE_FILE).write_text(json.dumps({"polynomial": []}))
    with pytest.raises(ValueError, match=r"'polynomial' must be a non-empty list of finite numbers, got \[\]$"):
        load_cache_polynomial(tmp_path)
    assert (
        load_cache_polynomial(Path(__file__).parents[1] / "weights" / "demo")[0] > 0
    )  # the demo's fit: the output grows with the input's change


def test_a_skipped_step_applies_the_euler_update_of_the_last_computed_velocity(engine):
    """Issue 43 item 4, by hand: a skipped step k runs no forward and moves the latents by
    x_{k+1} = x_k + (sigma_k - sigma_{k+1}) v, v the velocity of the last computed step
    (docs/model.md §3.2: sigma falls from 1 to 0 and x moves along +v), in float32."""
    state = prepare(engine, request(threshold=0.5, steps=6))
    forwards, computed, checked = [], None, 0  # forwards: states of each forward that ran
    forward = engine.forward
    engine.forward = lambda states: (forwards.append(len(states)) if states else None) or forward(states)
    try:
        while not state.finished:
            k, x_video, x_audio = state.step_index, state.video_latents.clone(), state.audio_latents.clone()
            (computes,) = engine.plan_step([state])
            before = len(forwards)
            ((v_video, v_audio),) = engine.denoise_step([state])
            engine.update(state, (v_video, v_audio))
            if computes:
                computed = (v_video.clone(), v_audio.clone())
                continue
            assert len(forwards) == before  # no forward for a skipped step
            for x, v, x_next, sigmas in (
                (x_video, computed[0], state.video_latents, state.sigmas_video),
                (x_audio, computed[1], state.audio_latents, state.sigmas_audio),
            ):
                step = torch.tensor(sigmas[k] - sigmas[k + 1], dtype=torch.float32)
                assert step > 0 and torch.equal(x_next, x + step * v)
                assert not torch.equal(x_next, x - step * v)
            checked += 1
    finally:
        del engine.forward
    assert (checked, state.cache.skipped, forwards) == (4, 4, [1, 1])  # steps 1-4 skipped; 0 and 5 computed


def test_a_cached_request_keeps_its_latents_not_the_modulated_input(engine):
    """Issue 43 item 3: between steps the cache holds the last planned step's latents (the same
    tensors, no copy) and the last computed velocity (the latents' shapes): nothing else, so not
    the modulated input ([rows, hidden] in the model dtype, recomputed when needed)."""
    state = prepare(engine, request(threshold=0.5, steps=6))
    shapes = [tuple(state.video_latents.shape), tuple(state.audio_latents.shape)]

    def check_cache(step, pack, velocities):  # after the step's plan and forward, before its update
        if state.step_index < state.total_steps - 1:
            video, audio, t_video, t_audio = state.cache.inputs
            assert video is state.video_latents and audio is state.audio_latents
            assert (t_video, t_audio) == (
                1.0 - state.sigmas_video[state.step_index],
                1.0 - state.sigmas_audio[state.step_index],
            )
        tensors = {
            name: value
            for name, value in vars(state.cache).items()
            if isinstance(value, torch.Tensor) or (isinstance(value, tuple) and isinstance(value[0], torch.Tensor))
        }
        assert set(tensors) <= {"inputs", "velocity"}
        if state.cache.velocity is not None:
            assert [tuple(t.shape) for t in state.cache.velocity] == shapes

    engine.run_to_completion([state], on_step=check_cache)
    assert state.cache.inputs is None and state.cache.skipped == 4


def test_a_cached_requests_memory_counts_its_step_cache(engine):
    """request_memory_mb counts what a cached request keeps (768 B a row): the largest tiny
    request (256 x 256 x 124 frames, 2,816 rows) needs 1,265 MiB uncached, 1,267 MiB cached."""
    assert STEP_CACHE_BYTES_PER_ROW == 768
    assert (
        request_memory_mb(256, 256, 124, 2816, 96),
        request_memory_mb(256, 256, 124, 2816, 96, step_cache=True),
    ) == (
        1265,
        1267,
    )
    limits = RequestLimits(max_height=256, max_width=256, max_num_frames=124, max_request_mb=1265)
    small = Engine(engine.dit, engine.video_vae, engine.audio_vae, limits=limits)
    plain = GenerationRequest("-", 256, 256, 124, 2, seed=1)
    cached = GenerationRequest("-", 256, 256, 124, 2, seed=1, cache_threshold=0.5)
    assert len(small.prepare(plain, torch.zeros(4, engine.dit.cfg.text_dim))) == 1
    with pytest.raises(ValueError) as error:
        small.prepare(cached, torch.zeros(4, engine.dit.cfg.text_dim))
    assert str(error.value) == "memory=1267 MiB is out of range: allowed up to 1265 MiB (max_request_mb)"
