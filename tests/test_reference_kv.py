"""Reference rows' keys and values reused every k steps (h3_core.model.reference_kv, docs/model.md §3.6):
k = 1 is today's forward; with k = 2 a ref2va request's refresh steps are bitwise today's, its
reuse steps leave its reference rows out of the pack and equal a full forward whose reference keys
and values are the cached ones; solo == co-batched (with t2va and with a ref2va request at another
step) bitwise; a t2va request is unaffected; the cache is freed on finish and cancel; refusals."""

import argparse
import dataclasses
import os

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest, RequestLimits, request_memory_mb, validate_request
from h3_core.model import H3DiT
from h3_core.model.attention import sdpa_per_document
from h3_core.model.encoder import TextEncoder
from h3_core.model.initialization import init_weights
from h3_core.model.reference_kv import ReferenceKV, bytes_per_reference_row
from h3_core.rules import InvalidRequest
from h3_core.serving.shared.settings import DitSettings
from server import sizing
from tests.test_conditions import run_packs
from tests.test_engine import REQUESTS, assert_same
from tests.test_lora_step import ADAPTERS
from tests.test_ref2va import ref2va

LIMITS = RequestLimits(max_height=128, max_width=128, max_num_frames=64, max_steps=20, max_ref_kv_refresh=4)


@pytest.fixture(scope="module")
def model():
    dit = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(dit, 0)
    return Engine(dit.eval(), None, None, TextEncoder(), LIMITS)


def with_refresh(entry, k):
    request, conditions = entry
    return dataclasses.replace(request, ref_kv_refresh=k), conditions


def prepared(model, entry, k):
    """The state of entry = (request, Conditions) asking ref_kv_refresh k."""
    request, conditions = with_refresh(entry, k)
    return model.prepare(request, conditions=conditions)[0]


def solo(model, entry):
    request, conditions = entry
    return model.run_to_completion([model.prepare(request, conditions=conditions or ())[0]])[0]


R1 = ref2va("r1", 31, 64, 96, 22, 6, latent_seed=1)  # 149 used rows, references at rows 11..33
R2 = ref2va("r2", 32, 32, 64, 9, 5, latent_seed=2)


def test_refresh_steps_are_todays_forward_and_reuse_steps_take_fewer_rows(model):
    """k = 1 builds no plan (today's H3DiT.forward); with k = 2 step 0 (a refresh) gives the same
    velocity bit for bit through reference_kv.forward, keeps 22 reference rows x 2 blocks, and the
    reuse steps (odd) pack 128 rows instead of 192 (149 - 22 = 127 used)."""
    today = model.prepare(R1[0], conditions=R1[1])[0]
    assert today.reference_plan() is None and today.reference_kv.refresh == 1
    state = prepared(model, R1, 2)
    assert state.layout.reference_span == (11, 33) and (state.layout.used, state.rows) == (149, 192)
    ((video, audio),) = model.denoise_step([today])
    ((video2, audio2),) = model.denoise_step([state])
    assert torch.equal(video, video2) and torch.equal(audio, audio2)
    assert [tuple(k.shape) for k in state.reference_kv.keys] == [(22, 8, 16)] * 2
    assert state.reference_kv.nbytes == 22 * bytes_per_reference_row(model.dit.cfg) == 22 * 2048
    rows = []
    model.run_to_completion([state], on_step=lambda n, pack, v: rows.append(pack[0].step_rows))
    assert rows == [192, 128, 192, 128, 192, 128]  # steps 0..5


def test_reuse_step_equals_full_forward_with_cached_reference_keys(model):
    """Step 1 of a k = 2 request against an independent computation: the full forward of all its
    rows in which every block's reference keys and values are replaced by those kept at step 0.
    Equal within 1e-6 (torch.equal on the 2-core CPU: same row order of keys, linears in 64-row
    tiles; not asserted bitwise, as the reuse step calls sdpa with 128 instead of 192 query rows and
    a CPU kernel may block queries by their count); the exact step differs by about 5e-5, so the
    check tells a stale cache from a wrong one."""
    state = prepared(model, R1, 2)
    exact = model.prepare(R1[0], conditions=R1[1])[0]
    for s in (state, exact):
        model.update(s, model.denoise_step([s])[0])
    keys, values = list(state.reference_kv.keys), list(state.reference_kv.values)
    ((video, audio),) = model.denoise_step([state])
    start, end = state.layout.reference_span
    batch = L.pack_requests([state.layout], [1 - state.sigmas_video[1]], [1 - state.sigmas_audio[1]])
    layers = iter(range(2))

    def cached_references(q, k, v, documents):
        layer, k, v = next(layers), k.clone(), v.clone()
        k[start:end], v[start:end] = keys[layer], values[layer]
        return sdpa_per_document(q, k, v, documents)

    dit = model.dit
    with torch.inference_mode():
        rows = (
            torch.cat([state.condition_video, state.video_latents]),
            torch.cat([state.condition_audio, state.audio_latents]),
        )
        e = dit.embed(*rows, state.text_embeds, batch)
        out = dit.transformer(
            e.x, e.t_emb, e.mod_index, e.timestep_index, cached_references, e.rows.documents, e.rows.rope
        )
        ((video_ref, audio_ref),) = L.split_rows(batch, out[0][e.rows.video_rows], out[1][e.rows.audio_rows])
    assert (video - video_ref).abs().max() <= 1e-6 and (audio - audio_ref).abs().max() <= 1e-6
    ((video_exact, audio_exact),) = model.denoise_step([exact])
    assert (video - video_exact).abs().max() > 1e-5 and (audio - audio_exact).abs().max() > 1e-5


def test_reuse_solo_equals_cobatched_and_t2va_is_unaffected(model):
    """k = 2: r1 solo == r1 packed with a t2va request and with r2 (k = 2) admitted one step later,
    so that one reuses while the other refreshes; r2 and the t2va request equal their solo runs;
    a t2va request that asks k = 2 has no references: it runs k = 1, bit for bit."""
    r1, r2, t2va = with_refresh(R1, 2), with_refresh(R2, 2), (dataclasses.replace(REQUESTS[0], ref_kv_refresh=2), None)
    solos = {"r1": solo(model, r1), "r2": solo(model, r2), "a": solo(model, t2va)}
    assert solos["a"].reference_kv.refresh == 1
    assert_same(solos["a"], solo(model, (REQUESTS[0], None)))
    done = run_packs(model, {"r1": r1, "a": t2va, "r2": r2}, {"r1": 0, "a": 0, "r2": 1})
    assert sorted(done) == ["a", "r1", "r2"]
    for request_id, state in done.items():
        assert_same(state, solos[request_id])
    assert not torch.equal(solos["r1"].video_latents, solo(model, R1).video_latents)  # k = 2 is not k = 1


def test_a_reusing_pack_keeps_every_requests_lora_deltas():
    """Reference reuse and per-request LoRA in one pack (h3_core.model.lora on the compact pack's
    rows): r1 (k = 2, adapter "style") and a t2va request with "style" at 0.5 each equal their solo
    runs bit for bit, packed together and with r2 (k = 2, no adapter) joining a step later; the
    adapter changes r1's result (its deltas apply on the rows its reuse steps keep)."""
    dit = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(dit, 0)
    engine = Engine(dit.eval(), None, None, TextEncoder(), LIMITS)
    engine.add_lora("style", ADAPTERS["style"])
    r1 = with_refresh((dataclasses.replace(R1[0], lora=(("style", 1.0),)), R1[1]), 2)
    t2va = (dataclasses.replace(REQUESTS[0], lora=(("style", 0.5),)), None)
    r2 = with_refresh(R2, 2)
    solos = {"r1": solo(engine, r1), "a": solo(engine, t2va), "r2": solo(engine, r2)}
    done = run_packs(engine, {"r1": r1, "a": t2va, "r2": r2}, {"r1": 0, "a": 0, "r2": 1})
    assert sorted(done) == ["a", "r1", "r2"]
    for request_id, state in done.items():
        assert_same(state, solos[request_id])
    assert not torch.equal(solos["r1"].video_latents, solo(engine, with_refresh(R1, 2)).video_latents)


def test_cache_is_freed_on_finish_and_cancel(model):
    """ReferenceKV.held counts caches holding tensors: 2 while r1 and r2 step, 0 after the run in
    which r1 finishes and r2 is cancelled before its step 3."""
    held, seen = ReferenceKV.held, []
    states = {}

    def on_step(step, pack, velocities):
        seen.append(ReferenceKV.held - held)
        states.update({s.request_id: s for s in pack})

    joins = {0: lambda: [prepared(model, R1, 2)]}
    joins[1] = lambda: [prepared(model, R2, 2)]
    done = model.run_to_completion([], joins=joins, cancels={3: ["r2"]}, on_step=on_step)
    assert [s.request_id for s in done] == ["r1"]
    assert seen == [1, 2, 2, 1, 1, 1] and ReferenceKV.held == held
    assert states["r1"].reference_kv.keys == [] and states["r2"].reference_kv.nbytes == 0


def test_refusals_and_memory():
    """A request's ref_kv_refresh lies in 1..max_ref_kv_refresh (1 by default: off); a
    sequence-parallel DiT takes none above 1; request_memory_mb adds the caches' bytes."""
    request = GenerationRequest("p", 64, 96, 22, 4, ref_kv_refresh=5)
    with pytest.raises(InvalidRequest) as error:
        validate_request(request, LIMITS)
    assert (error.value.field, str(error.value)) == (
        "ref_kv_refresh",
        "ref_kv_refresh=5 is out of range: allowed 1..4 (max_ref_kv_refresh)",
    )
    with pytest.raises(
        InvalidRequest, match=r"^ref_kv_refresh=2 is out of range: allowed 1..1 \(max_ref_kv_refresh\)$"
    ):
        validate_request(dataclasses.replace(request, ref_kv_refresh=2), RequestLimits())
    with pytest.raises(InvalidRequest, match=r"^ref_kv_refresh=0 is out of range: allowed 1..4"):
        validate_request(dataclasses.replace(request, ref_kv_refresh=0), LIMITS)

    class SequenceParallel:  # what Engine.prepare sees of a SequenceParallelDiT: no embed_rows
        cfg, device = get_config("tiny"), torch.device("cpu")

    engine = Engine(SequenceParallel(), None, None, None, LIMITS)
    with pytest.raises(InvalidRequest) as error:
        engine.prepare(with_refresh(R1, 2)[0], torch.zeros(3, 384), R1[1])
    assert (
        str(error.value) == "ref_kv_refresh=2 is out of range: allowed 1 with a sequence-parallel DiT (sp_degree > 1)"
    )
    plain = request_memory_mb(64, 96, 22, 192, 96)
    assert request_memory_mb(64, 96, 22, 192, 96, reference_kv_bytes=3 * 2**20) == plain + 3
    assert bytes_per_reference_row(get_config("h3")) == 50 * 2 * 7168 * 2


@pytest.mark.parametrize(
    "values, message",
    [
        ({"max_ref_kv_refresh": 17}, "h3_dit parameter max_ref_kv_refresh=17 is out of range: allowed 1..16"),
        ({"max_ref_kv_refresh": 0}, "h3_dit parameter max_ref_kv_refresh=0 is out of range: allowed 1..16"),
        ({"ref_kv_refresh": 2}, "h3_dit parameter ref_kv_refresh=2 is out of range: allowed 1..1 (max_ref_kv_refresh)"),
        (
            {"ref_kv_refresh": 2, "max_ref_kv_refresh": 4, "sp_degree": 2},
            "h3_dit parameter ref_kv_refresh=2 needs sp_degree 1: reference reuse runs the DiT in the "
            "instance's process",
        ),
    ],
)
def test_server_settings_are_checked(values, message):
    with pytest.raises(ValueError) as error:
        DitSettings(**values)
    assert str(error.value) == message


def test_server_settings_reach_the_limits_and_sizing():
    """max_ref_kv_refresh becomes the request limit; with it above 1 every held request's rows
    count bytes_per_reference_row (tiny: 2,048 B) in server.sizing, beside the step caches."""
    settings = DitSettings(ref_kv_refresh=2, max_ref_kv_refresh=4)
    assert settings.limits().max_ref_kv_refresh == 4 and DitSettings().limits().max_ref_kv_refresh == 1
    assert sizing.held_cache_bytes_per_row(12, step_cache=True, reference_row_bytes=2048) == 12 * (768 + 2048)
    assert sizing.held_cache_bytes_per_row(12, step_cache=False) == 0


def test_bench_measurement_runs_on_the_cpu():
    """benchmarks/ref_kv_reuse.py --model bench without CUDA: the tiny DiT, a 64 x 96 px request
    whose references (a 7 x 4 x 6 latent video: 42 rows, an image: 6, a 40-latent tone: 80) are 128
    of its 253 used rows. Block 1's reference keys and values never drift (their input and
    timestep, 0.999 and 1, are fixed); block 2's do; k = 2 and 4 move the latents, k = 4 further.
    On the CPU it leaves CUBLAS_WORKSPACE_CONFIG alone (this process's later subprocesses, e.g.
    test_benchmarks_smoke's engine_bench, would inherit it)."""
    from benchmarks import ref_kv_reuse

    before = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    results = ref_kv_reuse.bench(argparse.Namespace(steps=4))
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == before
    assert (results["config"], results["reference_rows"], results["used"], results["rows"]) == ("tiny", 128, 253, 256)
    for k in ("2", "4"):
        for name in ("keys", "values"):
            first, second = results["drift"][k][name]
            assert first == {"mean": 0.0, "max": 0.0} and second["max"] > 0
    errors = results["latent_error"]
    assert 0 < errors["2"]["relative"] < errors["4"]["relative"] and 0.99 < errors["4"]["cosine"] <= 1
    assert sorted(results["step_s"]) == ["1", "2", "4"]
    assert sorted(results["summary"]) == ["ref_kv_reuse_2_speedup", "ref_kv_reuse_4_speedup"]


def test_step_loop_reuses_on_request_and_frees_the_cache_of_a_cancelled_request(model):
    """Through h3_dit's StepLoop with max_ref_kv_refresh 4: a ref2va request sending
    ref_kv_refresh 2 ends with the latents of its engine-level k = 2 run (and not k = 1's); a
    second one, cancelled after two steps, leaves no cache held (StepLoop.drop)."""
    from h3_core.serving.dit.events import Result
    from h3_core.serving.encoder.conditioning import wire_conditions
    from tests.step_loop_harness import Client, make_loop

    request, conditions = R2
    text = model.encode_prompt(request.prompt)
    expected = solo(model, with_refresh(R2, 2))
    latents, entries = wire_conditions(conditions)
    shape = dict(height=32, width=64, num_frames=9, conditions=entries, task="ref2va")
    held = ReferenceKV.held
    client = Client(make_loop(model, max_ref_kv_refresh=4))
    for request_id in ("kept", "cancelled"):
        client.send(
            request_id,
            5,
            32,
            parameters={"ref_kv_refresh": 2},
            text_embeds=text[None].numpy(),
            condition_latents=latents,
            **shape,
        )
    client.iterate()
    client.iterate()
    assert ReferenceKV.held == held + 2
    client.cancel("cancelled")
    client.run()
    (result,) = client.of("kept", Result)
    assert torch.equal(result.video_latent, L.unpatchify_video(expected.video_latents, expected.layout))
    assert not torch.equal(result.video_latent, L.unpatchify_video(solo(model, R2).video_latents, expected.layout))
    assert client.of("cancelled", Result) == [] and ReferenceKV.held == held
