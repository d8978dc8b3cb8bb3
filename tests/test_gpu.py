"""On a CUDA device, what the design promises there (docs/parity.md, docs/gpu_host.md §"Running on GPUs"):

1. solo == co-batched == request mode, bit for bit, with the DiT as a server builds it on CUDA
   (h3_core.factory.load_engine: cuBLAS workspace off, compiled blocks, CUDA graphs), for the
   `tiny` config (float32) and the `bench` config (the H3 widths, bf16); a graph replay equals
   the compiled eager forward of the same pack;
2. every linear shape of the H3 widths gives a row the same bits at 64 to 65,536 rows and any
   offset (benchmarks/batch_invariance.py's gemm_sweep, through h3_core's Linear);
3. the step loop's CUDA-event finiteness path: a job with a non-finite velocity fails alone;
4. one request served through tritonserver with the DiT, encoder and VAEs on GPU 0;
5. sequence parallelism over 2 GPUs: solo == co-batched bitwise, against one GPU within the
   measured bound (docs/parity.md: not bitwise on CUDA).

Every test is marked `gpu`: tests/conftest.py skips them without a CUDA device or without -m gpu
(`make test-gpu`), because CUBLAS_WORKSPACE_CONFIG must be set before the process's first GEMM,
which this module does before its first test."""

import dataclasses
import sys
import time

import numpy as np
import pytest
import torch

from h3_core.config import audio_num_samples, get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.conditions import Condition
from h3_core.diffusion.request import GenerationRequest
from h3_core.factory import load_engine
from h3_core.model import H3DiT
from h3_core.model.dit import GPU_ROW_TILE, use_bitwise_cublas
from h3_core.model.fp8 import E4M3, Fp8Linear, quantize_blocks
from h3_core.serving.dit.events import Ended, Refused, Result
from h3_core.serving.encoder.conditioning import wire_conditions
from h3_core.weights.lora_formats import LoraAdapter, LoraTarget, lora_targets

from .serving import ROOT
from .step_loop_harness import Client, Clock, make_loop, solo_latents, timed_forwards

sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = pytest.mark.gpu

NO_MP4 = {"return_mp4": False}  # the GPU host has no PyAV: h3_dit refuses return_mp4=true there
WEIGHTS = "random:0"  # seeded random weights drawn on the device at load, as `--checkpoint random:0` serves
# request id -> (height, width, num_frames, steps, seed): 128, 64 and 256 padded rows, steps
# that end at different times (the pack shrinks and the others' offsets move), and sigma
# schedules that differ, so later packs mix timesteps
REQUESTS = {"a": (64, 96, 22, 4, 1), "b": (32, 64, 5, 3, 2), "c": (128, 192, 22, 5, 3)}
# fl2va requests (docs/model.md §2.1): REQUESTS' shape fields plus their keyframes (first, last or both)
FL2VA = {"f": (64, 96, 22, 4, 4, (0,)), "l": (32, 64, 5, 3, 5, (-1,)), "fl": (128, 192, 22, 5, 6, (0, -1))}
# ref2va requests: REQUESTS' shape fields; their references are REFERENCES' kinds (tests/test_ref2va.py)
REF2VA = {"r": (64, 96, 22, 4, 7), "rr": (32, 64, 9, 3, 8)}
REFERENCES = ("guide", "image", "video_audio", "audio")
TEXT_LEN = 7
# sp_degree 2 against 1 on two H200s, max abs over velocities and latents (docs/parity.md,
# benchmarks/results/h200x2_sequence_parallel*.json: 0.026)
SP_CUDA_BOUND = 0.026
# the distinct linears of the H3 widths (bench = h3's first 8 layers) and the gemm sweep's
# cases per linear: 13 row counts x offsets 0, 1,088 and 65,536 - M that fit (37)
H3_LINEARS = [
    "video_patch_proj",
    "audio_patch_proj",
    "condition_proj",
    "token_refiner.blocks.0.attn.qkv_proj",
    "token_refiner.blocks.0.attn.out_proj",
    "token_refiner.blocks.0.mlp.fc1",
    "token_refiner.blocks.0.mlp.fc2",
    "time_embedder.proj_in",
    "time_embedder.proj_out",
    "blocks.0.adaln_proj.linear",
    "final_layer.adaln_proj.linear",
    "final_layer.video_out",
    "final_layer.audio_out",
]
SWEEP_CASES = 37
# the fp8 block linears of the H3 widths (h3_dit quantization = fp8), in gemm_sweep's order
H3_FP8_LINEARS = ["blocks.0.attn.qkv_proj", "blocks.0.attn.out_proj", "blocks.0.mlp.fc1", "blocks.0.mlp.fc2"]
# (config, quantization) of the parity tests: tiny (float32), bench (the H3 widths, bf16), bench in fp8
CONFIGS = [("tiny", "none"), ("bench", "none"), ("bench", "fp8")]


@pytest.fixture(scope="module", autouse=True)
def bitwise_cublas():
    """CUBLAS_WORKSPACE_CONFIG=:0:0 before this process's first CUDA GEMM (what h3_dit does)."""
    use_bitwise_cublas()


@pytest.fixture(scope="module")
def engines():
    """engines(config, quantization="none") -> the CUDA Engine of that config as h3_dit builds it
    (DiT only, seeded random weights, h3_dit's quantization, warmed up: the compilation is paid
    here), made once per module."""
    made = {}

    def engine(config: str, quantization: str = "none"):
        if (config, quantization) not in made:
            made[config, quantization] = load_engine(
                config, WEIGHTS, "cuda", with_encoder=False, with_vaes=False, quantization=quantization
            )
            made[config, quantization].warm_up()
        return made[config, quantization]

    yield engine
    made.clear()
    torch.cuda.empty_cache()


def text_embeds(config: str, seed: int) -> np.ndarray:
    """TEXT_EMBEDS float32 [1, TEXT_LEN, text_dim] of the config, seeded."""
    width = get_config(config).text_dim
    return torch.randn(1, TEXT_LEN, width, generator=torch.Generator().manual_seed(seed)).numpy()


def conditions(request_id: str) -> list[Condition]:
    """Seeded clean latents of an FL2VA request's keyframes (float32 [24, 1, Hl, Wl] each) or of a
    REF2VA request's guide (frame 1), image (2 x 4 latent), video with audio (2 latent frames of
    2 x 2, 3 audio latents) and audio (6 latents); [] for t2va."""
    if request_id not in FL2VA and request_id not in REF2VA:
        return []
    height, width, _, _, seed, keyframes = spec(request_id)
    g = torch.Generator().manual_seed(100 + seed)
    if request_id in FL2VA:
        return [
            Condition("keyframe", frame, torch.randn(24, 1, height // 16, width // 16, generator=g))
            for frame in keyframes
        ]
    return [
        Condition("guide", 1, torch.randn(24, 1, height // 16, width // 16, generator=g)),
        Condition("image", 0, torch.randn(24, 1, 2, 4, generator=g)),
        Condition("video_audio", 0, torch.randn(24, 2, 2, 2, generator=g), torch.randn(2, 32, 3, generator=g)),
        Condition("audio", 0, None, torch.randn(2, 32, 6, generator=g)),
    ]


def spec(request_id: str) -> tuple:
    """(height, width, frames, steps, seed, keyframes) of a request of REQUESTS, FL2VA or REF2VA."""
    if request_id in FL2VA:
        return FL2VA[request_id]
    return (*(REF2VA[request_id] if request_id in REF2VA else REQUESTS[request_id]), ())


def task(request_id: str) -> str:
    return "fl2va" if request_id in FL2VA else "ref2va" if request_id in REF2VA else "t2va"


def prepare(engine, config: str, request_id: str):
    """The RequestState of a request of REQUESTS, FL2VA or REF2VA (its text_embeds on the engine's
    device)."""
    height, width, frames, steps, seed, _ = spec(request_id)
    request = GenerationRequest("-", height, width, frames, steps, seed=seed, task=task(request_id))
    return engine.prepare(request, torch.from_numpy(text_embeds(config, seed)[0]), conditions(request_id))[0]


def request_mode(engine, config: str, request_id: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Final latents (video float32 [24, T_lat, Hl, Wl], audio float32 [2, 32, T_a], on the CPU) of
    the request stepped alone to completion: Engine.generate's loop, h3_dit's request mode."""
    (state,) = engine.run_to_completion([prepare(engine, config, request_id)])
    return L.unpatchify_video(state.video_latents, state.layout).cpu(), L.audio_rows_to_latent(
        state.audio_latents, state.layout
    ).cpu()


def step_mode(engine, config: str, request_ids: list[str], quantization: str = "none") -> dict[str, Result]:
    """Run the requests through a StepLoop in step mode on the real clock, all sent at once, with
    a 60 s execute budget, so steps overlap (each launched before the previous one settles,
    OVERLAP_MAX_STEP_S); the loop's settings name the engine's quantization. Returns request id
    -> its Result."""
    loop = make_loop(
        engine, time.monotonic, execute_budget_s=60.0, max_num_seqs=max(4, len(request_ids)), quantization=quantization
    )
    client = Client(loop)
    for request_id in request_ids:
        height, width, frames, steps, seed, _ = spec(request_id)
        latents, entries = wire_conditions(conditions(request_id))
        fields = dict(conditions=entries, condition_latents=latents, task=task(request_id)) if entries else {}
        client.send(
            request_id,
            steps=steps,
            seed=seed,
            parameters=NO_MP4,
            text_embeds=text_embeds(config, seed),
            height=height,
            width=width,
            num_frames=frames,
            **fields,
        )
    client.run()
    assert [event for event in client.events if isinstance(event, (Refused, Ended))] == []
    return {request_id: client.of(request_id, Result)[0] for request_id in request_ids}


def test_every_linear_of_the_h3_widths_is_row_invariant_from_64_to_65536_rows():
    """Rows [o, o + M) of one 65,536-row GEMM through h3_core's Linear (one GEMM per linear, as
    the DiT runs on CUDA, cuBLAS workspace off) equal the GEMM of those M rows alone, for every
    distinct linear of the H3 widths, M in 64 .. 65,536, o in 0, 1,088 and 65,536 - M."""
    from batch_invariance import SWEEP_ROWS, gemm_sweep

    assert SWEEP_ROWS[0] == 64 and SWEEP_ROWS[-1] == 65536
    assert {2**k for k in range(6, 17)} <= set(SWEEP_ROWS)
    dit = H3DiT(get_config("bench"), row_tile=GPU_ROW_TILE, device="meta")  # shapes only
    sweep = gemm_sweep(dit, torch.device("cuda"))
    assert list(sweep) == H3_LINEARS
    assert {name: (r["cases"], r["max_difference"]) for name, r in sweep.items()} == {
        name: (SWEEP_CASES, 0.0) for name in H3_LINEARS
    }


def test_every_fp8_block_linear_of_the_h3_widths_is_row_invariant_from_64_to_65536_rows():
    """The same sweep with h3_dit's quantization = fp8: the four block linears become Fp8Linear
    (per-row activation scales, torch._scaled_mm), distinct shapes of their own, each row
    invariant at every row count and offset."""
    from batch_invariance import gemm_sweep

    dit = H3DiT(get_config("bench"), row_tile=GPU_ROW_TILE, device="meta")
    quantize_blocks(dit, "fp8")
    sweep = gemm_sweep(dit, torch.device("cuda"))
    fp8 = {name: r for name, r in sweep.items() if r["dtype"] == "float8_e4m3fn"}
    assert list(fp8) == H3_FP8_LINEARS
    assert {name: (r["cases"], r["max_difference"]) for name, r in fp8.items()} == {
        name: (SWEEP_CASES, 0.0) for name in H3_FP8_LINEARS
    }


@pytest.mark.parametrize(("config", "quantization"), CONFIGS)
def test_solo_co_batched_and_request_mode_are_bitwise_equal_with_compiled_blocks_and_cuda_graphs(
    engines, config, quantization
):
    """With fp8 (h3_dit quantization = fp8) too: the block linears' per-row activation scales keep
    a row's result independent of the pack."""
    engine = engines(config, quantization)
    dit = engine.dit
    assert dit.device.type == "cuda" and dit.max_compiled_rows is not None and dit.graphs is not None
    assert dit.video_patch_proj.row_tile == GPU_ROW_TILE == 0
    fc1 = dit.blocks[0].mlp.fc1
    assert fc1.weight.dtype == (E4M3 if quantization == "fp8" else get_config(config).torch_dtype)
    assert isinstance(fc1, Fp8Linear) == (quantization == "fp8")
    captures = dit.graphs.captures
    together = step_mode(engine, config, ["a", "b", "c"], quantization)
    assert together["a"].info["quantization"] == quantization
    for request_id in REQUESTS:
        (alone,) = step_mode(engine, config, [request_id]).values()
        video, audio = request_mode(engine, config, request_id)
        assert torch.isfinite(video).all() and torch.isfinite(audio).all()
        assert together[request_id].info["largest_pack"] == 3 and alone.info["largest_pack"] == 1
        assert torch.equal(together[request_id].video_latent, video), request_id
        assert torch.equal(together[request_id].audio_latent, audio), request_id
        assert torch.equal(alone.video_latent, video) and torch.equal(alone.audio_latent, audio), request_id
    assert dit.graphs.captures > captures  # the packs (all under GRAPH_MAX_ROWS rows) replayed graphs


@pytest.mark.parametrize(("config", "quantization"), CONFIGS)
def test_fl2va_and_ref2va_co_batched_with_t2va_equal_solo_and_request_mode(engines, config, quantization):
    """fl2va requests (first, last, both keyframes) and ref2va requests (a guide and image, video
    and audio references), three shapes and step counts, packed with t2va requests, equal their
    solo step-mode runs and request mode bit for bit, on CUDA with the compiled blocks and CUDA
    graphs (K5: every request's conditions reach its own rows), in fp8 too."""
    engine = engines(config, quantization)
    together = step_mode(engine, config, ["a", "f", "r", "b", "l", "fl", "rr"])
    for request_id in [*FL2VA, *REF2VA]:
        (alone,) = step_mode(engine, config, [request_id]).values()
        video, audio = request_mode(engine, config, request_id)
        assert torch.isfinite(video).all() and torch.isfinite(audio).all()
        assert together[request_id].info["largest_pack"] == 7 and together[request_id].info["task"] == task(request_id)
        assert torch.equal(together[request_id].video_latent, video), request_id
        assert torch.equal(together[request_id].audio_latent, audio), request_id
        assert torch.equal(alone.video_latent, video) and torch.equal(alone.audio_latent, audio), request_id


@pytest.mark.parametrize("config", ["tiny", "bench"])
def test_a_cuda_graph_replay_equals_the_compiled_eager_forward(engines, config):
    """The pack c, b, a with a advanced one step (two unique timesteps): a pack structure not met
    before, so it is captured, then replayed; the same pack with the graphs off runs the
    compiled blocks eagerly."""
    engine = engines(config)
    states = [prepare(engine, config, request_id) for request_id in ("c", "b", "a")]
    engine.update(states[2], engine.denoise_step(states[2:])[0])
    graphs, captures = engine.dit.graphs, engine.dit.graphs.captures
    assert sum(state.rows for state in states) <= graphs.max_rows
    replayed = engine.denoise_step(states)
    assert graphs.captures == captures + 1
    engine.dit.graphs = None
    try:
        eager = engine.denoise_step(states)
    finally:
        engine.dit.graphs = graphs
    for (video, audio), (video_eager, audio_eager) in zip(replayed, eager, strict=True):
        assert torch.isfinite(video).all() and torch.isfinite(audio).all()
        assert torch.equal(video, video_eager) and torch.equal(audio, audio_eager)


def test_a_non_finite_velocity_read_through_its_cuda_event_fails_only_its_request(engines, monkeypatch):
    """tests/test_step_loop_faults.py's overlapped case on CUDA: steps of 10 ms on the fake clock overlap,
    so the "nan" fault's step 1 settles (its finiteness flags read once its CUDA event has
    passed) after step 2 was launched with the offender in the pack; the offender ends at step 1
    with INTERNAL, the neighbour keeps its request-mode latents bit for bit."""
    engine = engines("tiny")
    clock = Clock()
    loop = make_loop(engine, clock, execute_budget_s=0.025, allow_fault_injection=True)
    client = Client(loop)
    log = timed_forwards(monkeypatch, loop, clock, seconds=0.01)
    read_through_event = []
    settle = loop.settle

    def watched_settle(flight, send):
        if flight is not None:
            read_through_event.append(isinstance(flight.copied, torch.cuda.Event))
        return settle(flight, send)

    monkeypatch.setattr(loop, "settle", watched_settle)
    client.send("good", steps=5, seed=8, parameters=NO_MP4)
    client.iterate()  # 2 steps: the step time is known, steps overlap from here
    client.send("bad", steps=3, seed=9, parameters={"inject_fault": "nan", **NO_MP4})
    client.run()
    assert [event for event in client.events if isinstance(event, Refused)] == []
    assert [sorted(ids) for _, ids in log] == [["good"]] * 2 + [["bad", "good"]] * 2 + [["good"]]
    assert read_through_event == [True] * 5
    (ended,) = client.of("bad", Ended)
    assert (ended.code, ended.message, ended.step) == (
        "INTERNAL",
        "denoise step 1 failed: non-finite velocity for request bad",
        0,
    )
    assert not client.of("bad", Result)
    (good,) = client.of("good", Result)
    video, audio = (latent.cpu() for latent in solo_latents(engine, 5, 8))
    assert torch.isfinite(video).all()
    assert torch.equal(good.video_latent, video) and torch.equal(good.audio_latent, audio)
    assert loop.metrics.values["h3_failures_total"] == 1


def test_a_request_served_through_tritonserver_runs_the_dit_on_cuda(tmp_path):
    """The repository writer's plan for config tiny on cuda GPU 0 (DiT, encoder and VAEs there,
    the VAE's decodes in turns with the DiT steps; the weight-free benchmark text encoder of width
    384), tritonserver from the pytriton wheel or the GPU-host bundle; one request through
    h3_pipeline with return_mp4=false (no PyAV)."""
    from server.environment import LaunchError, find_tritonserver

    try:
        find_tritonserver()
    except LaunchError as error:
        pytest.skip(f"gpu served: no tritonserver ({error}); on a host without internet unpack the bundle first")
    from bench_text_encoder import write_bench_text_encoder

    from client.api import H3Client
    from h3_core.weights.checkpoint_setup import create_checkpoint
    from server.process import TritonServer, metric_samples, read_metrics
    from server.repository import plan, write_repository

    create_checkpoint("tiny", tmp_path / "tiny")
    encoder = write_bench_text_encoder(tmp_path / "encoder", width=get_config("tiny").text_dim)
    repository = write_repository(
        tmp_path / "model_repository",
        plan("tiny", tmp_path / "tiny", "cuda", [0], overrides={"h3_encoder": {"encoder_path": str(encoder)}}),
    )
    with TritonServer(repository, free_ports=True, timeout=600, log_file=tmp_path / "server.log") as server:
        with H3Client(server.grpc_url, idle_timeout_s=300) as client:
            (result,) = client.generate(
                "a red ball rolls to the left",
                height=64,
                width=96,
                num_frames=22,
                num_inference_steps=3,
                seed=7,
                return_mp4=False,
                return_frames=True,
                return_audio=True,
            )
        metrics = read_metrics(server.metrics_url)
        log = server.log_text()
    assert result.video_mp4 == b""
    assert result.frames.dtype == np.uint8 and result.frames.shape == (22, 64, 96, 3)
    assert result.audio.dtype == np.float32 and result.audio.shape == (2, audio_num_samples(22))
    assert np.isfinite(result.audio).all()
    assert {key: result.info[key] for key in ("seed", "height", "width", "num_frames", "num_inference_steps")} == {
        "seed": 7,
        "height": 64,
        "width": 96,
        "num_frames": 22,
        "num_inference_steps": 3,
    }
    assert "warm-up step on cuda:0" in log, log[-3000:]
    # the writer's one-GPU placement is shared: h3_vae decodes in turns with the DiT steps there
    assert "each step takes the GPU's turn (gpu_turns)" in log, log[-3000:]
    (memory,) = metric_samples(metrics, "h3_device_memory_bytes", model="h3_dit")
    assert memory.labels["gpu"] == "0" and memory.value > 0  # torch.cuda.memory_allocated of the DiT's GPU
    (steps,) = metric_samples(metrics, "h3_step_seconds_count", model="h3_dit")
    assert steps.value == 3


def test_sequence_parallel_over_two_gpus_is_batch_invariant_and_within_the_measured_bound(engines):
    """sp_degree 2 (worker processes on GPUs 0 and 1): each request's velocity in a pack equals
    its solo step bit for bit; against one GPU it is within SP_CUDA_BOUND (not bitwise on CUDA)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (not lent)")
    one = engines("tiny")
    parallel = load_engine("tiny", WEIGHTS, "cuda", with_encoder=False, with_vaes=False, sp_degree=2)
    try:
        states = [prepare(one, "tiny", request_id) for request_id in REQUESTS]
        packed = parallel.denoise_step(states)
        for state, (video, audio) in zip(states, packed, strict=True):
            ((video_solo, audio_solo),) = parallel.denoise_step([state])
            assert torch.equal(video, video_solo) and torch.equal(audio, audio_solo), state.seed
        for (video, audio), (video_one, audio_one) in zip(packed, one.denoise_step(states), strict=True):
            assert torch.isfinite(video).all() and torch.isfinite(audio).all()
            assert float((video - video_one).abs().max()) <= SP_CUDA_BOUND
            assert float((audio - audio_one).abs().max()) <= SP_CUDA_BOUND
    finally:
        parallel.close()


@pytest.mark.parametrize("config", ["tiny", "bench"])
def test_a_cached_request_on_cuda_equals_request_mode_with_compiled_blocks_and_cuda_graphs(engines, config):
    """Issue 43 item 4: a cached request (cache_threshold 0.5: the step cache's plan reads its
    change metric on the host every step) co-batched with an uncached one in step mode, with the
    compiled blocks and CUDA graphs, equals its request-mode run bit for bit and skips the same
    steps; the uncached neighbour equals its own request mode."""
    engine = engines(config)
    captures = engine.dit.graphs.captures
    loop = make_loop(engine, time.monotonic, execute_budget_s=60.0, max_num_seqs=4)
    client = Client(loop)
    for request_id, threshold in (("cached", 0.5), ("a", 0.0)):
        height, width, frames, _, seed, _ = spec("a")
        client.send(
            request_id,
            steps=8,
            seed=seed,
            parameters={**NO_MP4, "cache_threshold": threshold},
            text_embeds=text_embeds(config, seed),
            height=height,
            width=width,
            num_frames=frames,
        )
    client.run()
    assert [event for event in client.events if isinstance(event, (Refused, Ended))] == []
    for request_id, threshold in (("cached", 0.5), ("a", 0.0)):
        (result,) = client.of(request_id, Result)
        height, width, frames, _, seed, _ = spec("a")
        request = GenerationRequest("-", height, width, frames, 8, seed=seed, cache_threshold=threshold)
        (state,) = engine.run_to_completion(engine.prepare(request, torch.from_numpy(text_embeds(config, seed)[0])))
        assert result.info["skipped_steps"] == state.cache.skipped, request_id
        assert torch.equal(result.video_latent, L.unpatchify_video(state.video_latents, state.layout).cpu())
        assert torch.equal(result.audio_latent, L.audio_rows_to_latent(state.audio_latents, state.layout).cpu())
    assert client.of("a", Result)[0].info["skipped_steps"] == 0
    if config == "tiny":  # its modulated input changes by about 0.03-0.1 a step (tests/test_step_cache.py)
        assert client.of("cached", Result)[0].info["skipped_steps"] > 0
    assert engine.dit.graphs.captures > captures


TURNS_PROCESS = """
import json, pathlib, sys, time
import torch
from h3_core.serving.shared.gpu_turns import GpuTurns
folder, side, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
done = pathlib.Path(folder) / "decoded"
turns = GpuTurns.on_device(folder, "cuda:0", share=0.04)
a = torch.randn(4096, 4096, device="cuda:0")
spans = []

def work():  # about 10 ms of one GPU's matmuls, finished on the device before the span ends
    start = time.monotonic_ns()
    for _ in range(8):
        a @ a
    torch.cuda.synchronize()
    spans.append((start, time.monotonic_ns()))

if side == "step":  # steps without pause until the decode is done (at most `count` steps)
    while not done.exists() and len(spans) < count:
        with turns.step():
            work()
else:
    while turns.turns_taken("step") < 3:  # the DiT is stepping without pause
        time.sleep(0.001)
    with turns.tiles() as tile:
        for _ in range(count):
            with tile():
                work()
    done.touch()
print(json.dumps({"spans": spans, "steps": turns.turns_taken("step"), "tiles": turns.turns_taken("tiles")}))
"""


def test_gpu_turns_between_two_processes_never_overlap_and_leave_each_side_turns(tmp_path):
    """Issue 43 item 1: a DiT-like process steps without pause on GPU 0 (until the decode is done,
    at most 5,000 steps) while an h3_vae-like process decodes 6 tiles once 3 steps were taken,
    each side holding the GPU's turn (GpuTurns.on_device, its real flocks, cross-process). No
    tile runs on the device while a step does (their spans, device work included, never overlap
    on the system's monotonic clock); the decode ends while the DiT still steps (it got turns
    between steps); every step took the turn and neither side waited out its limit (no warning)."""
    import json
    import subprocess

    runs = {
        side: subprocess.Popen(
            [sys.executable, "-c", TURNS_PROCESS, str(tmp_path), side, str(count)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for side, count in (("step", 5000), ("tiles", 6))
    }
    outputs = {side: process.communicate(timeout=300) for side, process in runs.items()}
    assert [runs[side].returncode for side in runs] == [0, 0], outputs
    assert all("not given" not in err for _, err in outputs.values()), outputs
    steps, tiles = (json.loads(outputs[side][0]) for side in ("step", "tiles"))
    assert len(tiles["spans"]) == 6 and 3 <= len(steps["spans"]) < 5000
    assert steps["steps"] == len(steps["spans"]) and 1 <= steps["tiles"] == tiles["tiles"] <= 6
    for tile_start, tile_end in tiles["spans"]:
        assert all(tile_end <= start or end <= tile_start for start, end in steps["spans"])
    assert tiles["spans"][-1][1] < steps["spans"][-1][0]  # the decode ended while the DiT still stepped


def gpu_adapter(config: str, name: str, seed: int) -> LoraAdapter:
    """A rank-16 LoraAdapter of the config's widths on blocks 0-1's linears, the text refiner's fc2
    and, for "timing", block 0's AdaLN projection; A and B drawn from `seed` on the CPU."""
    shapes, g, targets = lora_targets(get_config(config)), torch.Generator().manual_seed(seed), {}
    names = [f"blocks.{i}.{m}" for i in range(2) for m in ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")]
    names += ["token_refiner.blocks.0.mlp.fc2"] + (["blocks.0.adaln_proj.linear"] if name == "timing" else [])
    for target in names:
        out, inp = shapes[target]
        a, b = torch.randn(16, inp, generator=g) / inp**0.5, torch.randn(out, 16, generator=g) * 0.05
        targets[target] = LoraTarget(a, b, 16.0)
    return LoraAdapter("flashgen", targets, 16, sum(t.a.nbytes + t.b.nbytes for t in targets.values()), None, {})


def engine_latents(engine, config: str, states: list, joins: dict | None = None) -> dict:
    """request id -> (video, audio) final latent rows on the CPU of `states` stepped together."""
    done = engine.run_to_completion(states, joins=joins or {})
    return {s.request_id: (s.video_latents.cpu(), s.audio_latents.cpu()) for s in done}


def prepared(engine, config: str, request_id: str, **fields):
    """prepare()'s state of a request of REQUESTS or REF2VA with `fields` (lora, ref_kv_refresh) set."""
    height, width, frames, steps, seed, _ = spec(request_id)
    request = GenerationRequest(
        "-", height, width, frames, steps, seed=seed, task=task(request_id), request_id=request_id, **fields
    )
    return engine.prepare(request, torch.from_numpy(text_embeds(config, seed)[0]), conditions(request_id))[0]


@pytest.mark.parametrize(("config", "quantization"), CONFIGS)
def test_lora_and_reference_reuse_co_batched_equal_solo_with_compiled_blocks_and_cuda_graphs(
    engines, config, quantization
):
    """Issues 50 and 49 on CUDA as h3_dit builds the DiT (compiled blocks, CUDA graphs, fp8 too):
    requests with different LoRA compositions (one with an AdaLN adapter) and a ref2va request
    reusing its reference keys and values every 2 steps, packed together with one joining at step
    1, each equal their solo runs bit for bit; the adapters change the results; graphs were
    captured for the packs with adapters."""
    engine = engines(config, quantization)
    limits = engine.limits
    engine.limits = dataclasses.replace(limits, max_ref_kv_refresh=2)
    for seed, name in enumerate(("style", "timing")):
        engine.add_lora(name, gpu_adapter(config, name, seed))
    fields = {
        "a": {"lora": (("style", 1.0),)},
        "b": {},
        "c": {"lora": (("style", 0.5), ("timing", -1.0))},
        "r": {"lora": (("timing", 1.0),), "ref_kv_refresh": 2},
        "rr": {"ref_kv_refresh": 2},
    }
    try:
        captures = engine.dit.graphs.captures
        joins = {1: lambda: [prepared(engine, config, "rr", **fields["rr"])]}
        together = engine_latents(engine, config, [prepared(engine, config, k, **fields[k]) for k in "abcr"], joins)
        for request_id, given in fields.items():
            (alone,) = engine_latents(engine, config, [prepared(engine, config, request_id, **given)]).values()
            assert all(torch.isfinite(x).all() for x in alone), request_id
            assert torch.equal(together[request_id][0], alone[0]), request_id
            assert torch.equal(together[request_id][1], alone[1]), request_id
        (plain,) = engine_latents(engine, config, [prepared(engine, config, "a")]).values()
        assert not torch.equal(plain[0], together["a"][0])
        assert engine.dit.graphs.captures > captures
    finally:
        engine.limits = limits
        for name in ("style", "timing"):
            engine.remove_lora(name)
