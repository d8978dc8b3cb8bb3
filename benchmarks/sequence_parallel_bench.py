"""Sequence parallelism measured (issue 17): one DiT step over sp_degree GPUs (Ulysses,
h3_core.parallel.workers) against one GPU, in-process and through tritonserver, with the bitwise
checks in the same run.

    PYTHONUNBUFFERED=1 python3 benchmarks/sequence_parallel_bench.py --out DIR [--work DIR]
                                    [--parts inprocess served] [--sp N]

On CUDA (`nvidia-h200-x2`): the `bench` DiT (the full H3 width, 8 layers, bf16, seeded random
weights `random:0` drawn on each GPU at load), requests of 672x384, 209 frames, a 45-token prompt
(16,384 rows, docs/model.md §4.4), sp_degree 1 (cuda:0) and N (--sp, default every visible GPU, at most
the heads' divisors; cuda:0..N-1).
  inprocess: load_engine(..., sp_degree=1 / N) in this process (for N: the driver here, one
     worker process per GPU over NCCL). Per sp_degree: load and warm-up seconds; step time
     (Engine.run_to_completion's steps, the device synchronised around each of 5 steps after 2
     unmeasured ones) of one request (16,384 rows) and of 4 packed (65,536 rows); for N also the
     slowest worker's own forward (step minus it = the driver's transport), one profiled step per
     pack with the device synchronised around each all-to-all (seconds per layer = its two
     all-to-alls, the slowest rank; includes waiting for the other ranks) and the seconds of a
     restart of every worker (what a lost worker costs). 30 steps of one request (seconds).
     Bitwise, sp N against sp 1 (torch.equal): the velocities of one step of the 16,384-row pack,
     the 65,536-row pack and a mixed pack (192 + 1,920 + 16,384 rows: share boundaries inside
     documents); the latents after the 7 timed steps of both packs; the latents after the 30
     steps; and per-document SDPA over every head against over each rank's heads alone
     (documents of 128, 1,920, 16,384 rows). Max absolute difference where not equal.
  served: per sp_degree a repository (server.repository; h3_dit on GPU 0 driving GPUs 0..N-1,
     h3_encoder and h3_vae on GPU 0, the benchmark text encoder of width 5120, max_batch_rows
     65,536) and tritonserver; an unmeasured 2-step request of the full shape, then one 30-step
     16,384-row request through benchmarks/bench_client.py (end-to-end latency, time to first
     step, step interval; return_mp4=false) with the mean step on /metrics (h3_step_seconds),
     and one 30-step 672x384, 22-frame request whose FRAMES and AUDIO must be equal byte for byte
     between the sp 1 and sp N servers.
Writes DIR/sequence_parallel_bench.json after every part (hardware, torch, command, date,
settings, every measurement, bitwise results, summary: sp{N}_over_sp1_step_time_16384 (issue
target <= 0.55), _65536, all-to-all ms per layer, 30-step latencies) and prints a table last.
With --work the document is also kept there and a later call adds its parts to it (split the
run over two calls: --parts inprocess, then --parts served, same --work). With
TORCHINDUCTOR_DETERMINISTIC=1 in the environment every process (this one, the workers, the
servers) compiles the DiT blocks in Inductor's deterministic mode (recorded in the settings).
Expected on two H200s: inprocess about 3 minutes, served about 3-4 minutes (server starts
compile the DiT; restarts reuse the compiler's cache).

On a machine without CUDA the same code runs as a CPU smoke test: the `tiny` DiT, 96x64, 22
frames (192 rows with the 45-token prompt; 4 packed: 768), 2 ranks over gloo, the default MiniLM text encoder, a few
steps (about 1-2 minutes on 2 cores).
"""

import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

# Imports that load transformers (the servers' part) are made where they are used: every worker
# process of h3_core.parallel.workers imports this script again (multiprocessing's start methods
# other than fork import the parent's __main__), and a restart would pay them.
# NVLink multicast stays off (the GPU machines' rule; NCCL all-to-all does not use it anyway):
# set before torch loads NCCL, inherited by the workers and the servers started here.
for _name, _value in (
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402 - after the environment above

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from client_runs import bench_client_command, dit_totals, without_machine_paths  # noqa: E402 - after the sys.path set-up above

from h3_core.config import get_config  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion import layout as L  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion.request import GenerationRequest, RequestLimits  # noqa: E402 - after the sys.path set-up above
from h3_core.factory import load_engine  # noqa: E402 - after the sys.path set-up above
from h3_core.model.attention import sdpa_document  # noqa: E402 - after the sys.path set-up above
from h3_core.parallel.ulysses import Shares  # noqa: E402 - after the sys.path set-up above

TEXT_LEN = 45  # tokens of "Random prompt {i} for benchmarking diffusion models" with the bench encoder
WEIGHTS = "random:0"  # h3_core.weights.checkpoint: the DiT drawn with seed 0 on each device, the VAEs with seed 1
PACKED = 4  # requests in the larger pack
RESULT = "sequence_parallel_bench.json"


@dataclass(frozen=True)
class Setting:
    """Sizes of one run (GPU or CPU smoke). Shapes are (height, width, num_frames)."""

    config: str
    device: str  # the instance's device: "cuda:0" or "cpu"
    shape: tuple[int, int, int]  # one request of the step-time packs
    mixed: tuple[tuple[int, int, int], ...]  # the mixed pack of the bitwise check
    parity_shape: tuple[int, int, int]  # the served byte-for-byte request
    warm_steps: int
    timed_steps: int
    long_steps: int  # the 30-step request
    attention_lengths: tuple[int, ...]
    server_timeout_s: float


GPU = Setting(
    "bench",
    "cuda:0",
    (384, 672, 209),
    ((64, 96, 22), (384, 672, 22), (384, 672, 209)),
    (384, 672, 22),
    warm_steps=2,
    timed_steps=5,
    long_steps=30,
    attention_lengths=(128, 1920, 16384),
    server_timeout_s=900.0,
)
CPU = Setting(
    "tiny",
    "cpu",
    (64, 96, 22),
    ((32, 32, 1), (64, 96, 22), (128, 128, 39)),
    (64, 96, 22),
    warm_steps=1,
    timed_steps=2,
    long_steps=6,
    attention_lengths=(7, 125, 331),
    server_timeout_s=300.0,
)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def limits(setting: Setting) -> RequestLimits:
    shapes = (setting.shape, *setting.mixed)
    side, frames = max(max(shape[:2]) for shape in shapes), max(shape[2] for shape in shapes)
    return RequestLimits(
        max_height=side, max_width=side, max_num_frames=frames, max_rows=1 << 20, max_request_mb=1 << 30
    )


def prepare(engine, shapes, steps: int, seed: int) -> list:
    """States of one request per shape, seeds seed, seed + 1, ..., seeded random text states."""
    states = []
    for i, (height, width, frames) in enumerate(shapes):
        text = torch.randn(TEXT_LEN, engine.dit.cfg.text_dim, generator=torch.Generator().manual_seed(seed + i))
        states += engine.prepare(GenerationRequest(f"r{i}", height, width, frames, steps, seed=seed + i), text)
    return states


def timed_steps(engine, states, device: str, warm_steps: int, sp: int) -> tuple[list[float], list[float]]:
    """Step `states` to completion (Engine.run_to_completion). Returns the seconds of each step
    after the first warm_steps, the device synchronised around each, and for sp > 1 the slowest
    worker's own forward in each of them (else [])."""
    seconds, worker = [], []

    @contextmanager
    def timed(step: int, pack: list) -> Iterator[None]:
        if step < warm_steps:
            yield
            return
        synchronize(device)
        start = time.perf_counter()
        yield
        synchronize(device)
        seconds.append(time.perf_counter() - start)
        if sp > 1:
            worker.append(max(stats["forward_s"] for stats in engine.dit.last_stats))

    engine.run_to_completion(states, step_context=timed)
    return seconds, worker


def packed_inputs(states) -> tuple:
    """What Engine.denoise_step hands the DiT for `states`: (video, audio, text, batch)."""
    batch = L.pack_requests(
        [s.layout for s in states],
        [1.0 - s.sigmas_video[s.step_index] for s in states],
        [1.0 - s.sigmas_audio[s.step_index] for s in states],
    )
    tensors = (
        torch.cat([getattr(s, name) for s in states]) for name in ("video_latents", "audio_latents", "text_embeds")
    )
    return (*tensors, batch)


def latents(states) -> list[torch.Tensor]:
    return [t.cpu() for s in states for t in (s.video_latents, s.audio_latents)]


def in_process(setting: Setting, sp: int) -> tuple[dict, dict]:
    """(measurements, tensors to compare) of one sp_degree (the module docstring's inprocess)."""
    began = time.perf_counter()
    engine = load_engine(
        setting.config,
        WEIGHTS,
        setting.device,
        with_encoder=False,
        with_vaes=False,
        limits=limits(setting),
        sp_degree=sp,
        sp_timeout_s=300.0,
    )
    result = {"load_s": time.perf_counter() - began, "warm_up_s": engine.warm_up(), "packs": {}}
    if sp > 1:
        result["workers_start_s"] = engine.dit.start_seconds[0]
    tensors = {}
    steps = setting.warm_steps + setting.timed_steps
    for count in (1, PACKED):
        states = prepare(engine, [setting.shape] * count, steps, seed=10)
        rows = sum(state.rows for state in states)
        seconds, worker = timed_steps(engine, states, setting.device, setting.warm_steps, sp)
        pack = {"requests": count, "rows": rows, "step_s": statistics.mean(seconds), "steps_s": seconds}
        if sp > 1:
            pack["worker_forward_s"] = statistics.mean(worker)
            pack["transport_s"] = pack["step_s"] - pack["worker_forward_s"]
            engine.dit(*packed_inputs(states), profile=True)
            per_layer = [
                [pair[0] + pair[1] for pair in zip(s["exchange_s"][::2], s["exchange_s"][1::2], strict=True)]
                for s in engine.dit.last_stats
            ]
            pack["all_to_all_s_per_layer"] = statistics.mean(max(layer) for layer in zip(*per_layer, strict=True))
            pack["all_to_all_s_per_layer_by_rank"] = [statistics.mean(layer) for layer in per_layer]
            cfg, share = engine.dit.cfg, Shares(rows, sp).share
            pack["all_to_all_bytes_per_layer"] = 4 * share * cfg.attn_width * cfg.torch_dtype.itemsize  # qkv + out
        result["packs"][str(rows)] = pack
        tensors[f"latents after {steps} steps, {rows} rows"] = latents(states)
        print(f"sp {sp}, {rows:,} rows: {pack['step_s'] * 1e3:.1f} ms a step", flush=True)
    for name, shapes in (
        (f"{setting.shape}", [setting.shape]),
        (f"{PACKED} x {setting.shape}", [setting.shape] * PACKED),
        ("mixed", list(setting.mixed)),
    ):
        states = prepare(engine, shapes, 2, seed=20)
        tensors[f"velocities of one step, {name}"] = [t.cpu() for pair in engine.denoise_step(states) for t in pair]
    states = prepare(engine, [setting.shape], setting.long_steps, seed=30)
    synchronize(setting.device)
    start = time.perf_counter()
    engine.run_to_completion(states)
    synchronize(setting.device)
    result[f"{setting.long_steps}_steps_s"] = time.perf_counter() - start
    tensors[f"latents after {setting.long_steps} steps"] = latents(states)
    if sp > 1:
        engine.dit.stop()
        start = time.perf_counter()
        engine.dit.start()
        result["restart_s"] = time.perf_counter() - start
        engine.run_to_completion(prepare(engine, [setting.shape], 1, seed=40))  # the new workers step
    engine.close()
    del engine
    gc.collect()
    if setting.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result, tensors


def attention_head_subsets(setting: Setting, sp: int) -> dict:
    """Per-document SDPA over all heads against over each rank's heads / sp alone (contiguous, as
    the all-to-all delivers them), random q, k, v in the config's dtype: torch.equal per length."""
    cfg = get_config(setting.config)
    mine, results = cfg.num_heads // sp, {}
    for rows in setting.attention_lengths:
        g = torch.Generator().manual_seed(rows)
        q, k, v = (
            torch.randn(rows, cfg.num_heads, cfg.head_dim, generator=g).to(setting.device, cfg.torch_dtype)
            for _ in range(3)
        )
        whole = sdpa_document(q, k, v)
        parts = torch.cat(
            [sdpa_document(*(t[:, j * mine : (j + 1) * mine].contiguous() for t in (q, k, v))) for j in range(sp)],
            dim=1,
        )
        results[str(rows)] = compare([whole.cpu()], [parts.cpu()])
    return results


def compare(first: list[torch.Tensor], second: list[torch.Tensor]) -> dict:
    equal = all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    diff = max(
        ((a.float() - b.float()).abs().max().item() if a.numel() else 0.0) for a, b in zip(first, second, strict=True)
    )
    return {"equal": equal, "max_abs_diff": diff}


def served(setting: Setting, sp: int, encoder_path: str, work: Path, out: Path) -> tuple[dict, list]:
    """One server with sp_degree `sp` (the module docstring's served): its measurements and the
    parity request's FRAMES and AUDIO."""
    from client.api import H3Client
    from server.process import TritonServer
    from server.repository import plan, write_repository

    cuda = setting.device.startswith("cuda")
    height, width, frames = setting.shape
    dit = {
        "sp_degree": sp,
        "max_batch_rows": 65536,
        "row_budget": 65536,
        "max_num_seqs": 4,
        "max_height": max(height, width),
        "max_width": max(height, width),
        "max_num_frames": frames,
        "max_request_mb": 1 << 20,
    }
    repository = write_repository(
        work / f"sp{sp}" / "model_repository",
        plan(
            setting.config,
            WEIGHTS,
            "cuda" if cuda else "cpu",
            list(range(sp)) if cuda else [],
            overrides={"h3_dit": dit, "h3_encoder": {"encoder_path": encoder_path}},
        ),
    )
    log = work / f"sp{sp}" / "server.log"
    began = time.perf_counter()
    with TritonServer(repository, free_ports=True, timeout=setting.server_timeout_s, log_file=log) as server:
        result = {"ready_s": time.perf_counter() - began}
        client = H3Client(server.grpc_url, idle_timeout_s=900)
        client.generate(
            "warm-up", height=height, width=width, num_frames=frames, num_inference_steps=2, return_mp4=False
        )
        before = dit_totals(server.metrics_url)
        bench_json = work / f"sp{sp}" / "bench.json"
        command = bench_client_command(
            server.grpc_url,
            num_prompts=1,
            steps=setting.long_steps,
            shape=(height, width, frames),
            label=f"sp{sp}",
            output_json=bench_json,
        )
        print(f"--- sp {sp}: {' '.join(command[1:])}", flush=True)
        done = subprocess.run(command, cwd=ROOT)
        after = dit_totals(server.metrics_url)
        if done.returncode != 0:
            raise RuntimeError(f"bench_client.py for sp {sp} exited with {done.returncode}; server log {log}")
        document = json.loads(bench_json.read_text())
        summary = document["summary"]
        result.update(
            latency_s=summary["latency_s"]["mean"],
            time_to_first_step_s=summary["time_to_first_step_s"]["mean"],
            step_interval_s=summary["step_interval_s"]["mean"],
            server_step_s=(after["h3_step_seconds_sum"] - before["h3_step_seconds_sum"])
            / max(1.0, after["h3_step_seconds_count"] - before["h3_step_seconds_count"]),
            bench_client=without_machine_paths(document, work, out),
        )
        h, w, f = setting.parity_shape
        (parity,) = client.generate(
            "a red ball rolls to the left",
            height=h,
            width=w,
            num_frames=f,
            num_inference_steps=setting.long_steps,
            seed=5,
            return_frames=True,
            return_audio=True,
            return_mp4=False,
        )
        restarts = server.log_text().count("restarting the")
    result["worker_restarts_logged"] = restarts
    print(f"sp {sp} served: {result['latency_s']:.2f} s for {setting.long_steps} steps", flush=True)
    return result, [torch.from_numpy(parity.frames.copy()), torch.from_numpy(parity.audio.copy())]


def summarize(results: dict, sp: int) -> dict:
    summary = {}
    inprocess = results.get("in_process", {})
    one, many = inprocess.get("sp1"), inprocess.get(f"sp{sp}")
    if one and many:
        for rows, pack in many["packs"].items():
            summary[f"sp{sp}_over_sp1_step_time_{rows}"] = pack["step_s"] / one["packs"][rows]["step_s"]
            summary[f"sp1_step_s_{rows}"] = one["packs"][rows]["step_s"]
            summary[f"sp{sp}_step_s_{rows}"] = pack["step_s"]
            summary[f"sp{sp}_all_to_all_ms_per_layer_{rows}"] = pack["all_to_all_s_per_layer"] * 1e3
            summary[f"sp{sp}_transport_ms_{rows}"] = pack["transport_s"] * 1e3
        steps = next(key for key in one if key.endswith("_steps_s"))
        summary[f"in_process_{steps}_sp1"] = one[steps]
        summary[f"in_process_{steps}_sp{sp}"] = many[steps]
        summary[f"sp{sp}_worker_restart_s"] = many["restart_s"]
    service = results.get("served", {})
    for key in ("sp1", f"sp{sp}"):
        if key in service:
            summary[f"served_latency_s_{key}"] = service[key]["latency_s"]
            summary[f"served_step_s_{key}"] = service[key]["server_step_s"]
    if "sp1" in service and f"sp{sp}" in service:
        summary[f"served_sp{sp}_over_sp1_latency"] = service[f"sp{sp}"]["latency_s"] / service["sp1"]["latency_s"]
    checks = [check["equal"] for part in results.get("bitwise", {}).values() for check in part.values()]
    summary["bitwise_checks"] = len(checks)
    summary["bitwise_all_equal"] = all(checks)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--work", type=Path, help="repositories, logs, the encoder, the document (default: a temporary folder)"
    )
    parser.add_argument("--parts", nargs="+", choices=("inprocess", "served"), default=["inprocess", "served"])
    parser.add_argument("--sp", type=int, help="sp_degree to compare with 1 (default: every visible GPU; 2 on the CPU)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    setting = GPU if cuda else CPU
    if not cuda:
        torch.set_num_threads(1)  # as h3_dit's cpu_threads: the workers take the driver's setting
    sp = args.sp or (torch.cuda.device_count() if cuda else 2)
    if sp < 2:
        parser.error(f"needs sp_degree >= 2 (found {torch.cuda.device_count()} GPUs)")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="h3_sp_bench."))
    work.mkdir(parents=True, exist_ok=True)
    kept = work / RESULT
    results = json.loads(kept.read_text()) if kept.is_file() else {}
    results.update(
        date=datetime.date.today().isoformat(),
        hardware=f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}" if cuda else "CPU",
        torch=torch.__version__,
        command="PYTHONUNBUFFERED=1 python3 benchmarks/sequence_parallel_bench.py " + " ".join(sys.argv[1:]),
        setting={
            **asdict(setting),
            "weights": WEIGHTS,
            "text_len": TEXT_LEN,
            "sp_degree": sp,
            # Inductor's deterministic mode (TORCHINDUCTOR_DETERMINISTIC=1, inherited by the workers and
            # the servers): no run-time benchmarking of reduction configs or matmul padding, whose choices
            # may differ between the processes of sp 1 and of the ranks
            "inductor_deterministic": os.environ.get("TORCHINDUCTOR_DETERMINISTIC") == "1",
        },
    )
    results.setdefault("bitwise", {})

    def save() -> None:
        results["summary"] = summarize(results, sp)
        text = json.dumps(without_machine_paths(results, work, args.out), indent=2) + "\n"
        (args.out / RESULT).write_text(text)
        kept.write_text(text)

    if "inprocess" in args.parts:
        results["in_process"] = {}
        one, one_tensors = in_process(setting, 1)
        results["in_process"]["sp1"] = one
        save()
        many, many_tensors = in_process(setting, sp)
        results["in_process"][f"sp{sp}"] = many
        results["bitwise"]["in_process"] = {
            name: compare(one_tensors[name], many_tensors[name]) for name in one_tensors
        }
        results["bitwise"]["attention_head_subsets"] = attention_head_subsets(setting, sp)
        save()
    if "served" in args.parts:
        from bench_text_encoder import write_bench_text_encoder

        encoder = ""
        if cuda:
            encoder = str(work / "bench_text_encoder")
            if not (Path(encoder) / "model.safetensors").is_file():
                write_bench_text_encoder(encoder, width=get_config(setting.config).text_dim)
        results["served"] = {}
        parity = {}
        for degree in (1, sp):
            results["served"][f"sp{degree}"], parity[degree] = served(setting, degree, encoder, work, args.out)
            save()
        name = f"FRAMES and AUDIO, {setting.parity_shape}, {setting.long_steps} steps"
        results["bitwise"]["served"] = {name: compare(parity[1], parity[sp])}
        save()
    print(f"\n{results['hardware']}, {setting.config} DiT, sp_degree {sp} against 1 ({args.out / RESULT})")
    for name, value in results["summary"].items():
        print(f"{name:<48}{value:.4f}" if isinstance(value, float) else f"{name:<48}{value}")
    for part, checks in results["bitwise"].items():
        for name, check in checks.items():
            verdict = "equal" if check["equal"] else f"DIFFERS by up to {check['max_abs_diff']:g}"
            print(f"bitwise {part}: {name:<52} {verdict}")


if __name__ == "__main__":
    main()
