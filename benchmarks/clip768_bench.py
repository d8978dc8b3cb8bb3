"""The clip H3's users make, on one GPU (issue 48): 1344 x 768 px, 124 frames (5 s at 24 fps), 49
DiT forwards, t2va; here 37 latent frames x 1,008 = 37,296 video rows + 414 audio rows + the
prompt's text rows = 37,824 packed rows.

    PYTHONUNBUFFERED=1 python3 benchmarks/clip768_bench.py --out DIR --stages profile adaln
    PYTHONUNBUFFERED=1 python3 benchmarks/clip768_bench.py --out DIR --stages decode served [--quantization fp8]
        [--clips N] [--warmup-steps N]

Stages (each writes DIR/clip768_bench.json after every part, so a run cut short keeps what it
measured, and prints a table last):
  profile: the DiT as served (h3_core.factory.load_engine: bitwise cuBLAS, compiled blocks, the
           AdaLN table; no CUDA graphs at this size) from `random:0`, in this process, bf16 then
           fp8. For each: the load's peak allocated GPU memory (`bf16_load_peak_gib`,
           `fp8_load_peak_gib`: fp8 quantises each block linear while loading,
           h3_core.model.fp8.build_dit), the first (compiling) step, the median of STEP_REPEATS
           steps of one clip-sized request (`step768_<q>_s`), and one step's GPU kernel time per
           family (torch.profiler, benchmarks/engine_bench.py's families: attention, GEMM,
           norm, elementwise/copy), plus the AdaLN family measured apart: the seconds of one
           AdaLN table fill (every block's projection of one new timestep value,
           `adaln_fill_ms`); a warm table's step reads only gathers. Then, beside the fp8 DiT,
           the fp8 DiT again with h3_dit adaln_weights = host (the AdaLN weights in pinned host
           memory, h3_core.model.adaln_table): its GPU memory after load
           (`fp8_dit_gpu_gib_adaln_off`, beside the device-resident `fp8_dit_gpu_gib`), the
           seconds of one admission fill of a 49-forward schedule's values from a cold table
           (`adaln_host_fill_49_s`: one pass streaming the weights to the GPU) and whether its
           values are bitwise the device-resident DiT's (`adaln_host_bitwise`). The summary then
           computes whether fp8 with host AdaLN weights plus the real-size Qwen3-VL's weights
           (and our VAE's decode peak, when the decode stage ran) fit one 80 GB H100
           (`fp8_adaln_off_fits_h100`, from the measured fp8 step peak less the AdaLN weights the
           host load left off the GPU; the numbers beside it).
  adaln:   on the bf16 DiT (CUDA graphs on, as served for packs <= 4,096 rows), ADALN_REQUESTS
           requests of 128 rows (64 x 64 px, 9 frames) run whole 49-step trajectories twice:
           admitted one step apart ("mixed": up to 16 distinct timesteps a step) and all at one
           step ("single"); each measured pass starts from a cold table (its values forgotten,
           its memory and the captured graphs kept) after a pass that warmed graphs and
           compilation. `adaln_mixed_over_single_8x128` = the mean step of the mixed passes'
           full packs over the single pass's mean step; the same without the table
           (`adaln_mixed_over_single_8x128_no_table`); table fills per step reported.
  decode:  our VAEs (the project's own) decode one clip's random latents on the device, in tiles
           as h3_vae does: `decode768_5s_s` (median of 2 after a warm-up), `decode768_5s_peak_gib`
           (peak allocated over what was allocated before), in this process before the server.
  served:  the clip through tritonserver as full_model_bench.py --encoder qwen3vl serves it: the
           h3 DiT (`random:0`), MiniMax-H3's Qwen3-VL at its real sizes encoding every request
           (50 layers, drawn weights) and our VAEs (the project's own, not H3's), all on GPU 0,
           h3_dit with max_height 768, max_width 1344, max_num_frames 124 and max_batch_rows =
           row_budget = CLIP_ROWS (sized for this request, issue 48 item 1; the writer's own
           sizing budgets a whole-clip decode and gives fewer, see its note in the JSON). One
           request of the clip's shape and --warmup-steps forwards first (the cold request,
           recorded apart), then --clips requests of 49 forwards one after another:
           `clip768_5s_<bf16|fp8>_s` = the median seconds from the client's send to the result
           (MP4 when PyAV is importable, else return_mp4=false as the JSON says),
           `clip768_5s_<q>_denoise_s` its denoise stage, stage seconds per clip (queue, encode,
           denoise, decode), the GPU's peak memory and each process's. --attention-backend sets
           h3_dit's attention (auto routes documents of >= 8,192 rows to flash_attn4 where
           flash-attn-4 is installed: docs/gpu_backends.md); --earlier adds the clips of earlier
           runs of the same settings to the median (one call of a GPU host fits one bf16 clip).
On a machine without CUDA the same code runs as a CPU smoke test (tests/test_benchmarks_smoke.py):
the `tiny` DiT, 96 x 64 px, 22 frames, 2 forwards, a tiny Qwen3-VL; no GPU figures (null).
"""

import argparse
import datetime
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from adaln_host import ADALN_HOST_VALUES, h100_fit, host_fill, qwen3vl_gib  # noqa: E402 - after the sys.path set-up above
from full_model_bench import (  # noqa: E402 - after the sys.path set-up above
    QWEN3VL_DIMS,
    QWEN3VL_WEIGHTS,
    Setting,
    bench,
    per_process_gib,
    stage_seconds,
)
from gpu_memory import PeakMemory, gib, gpu_memory_mib  # noqa: E402 - after the sys.path set-up above
from step_timing import kernel_profile  # noqa: E402 - after the sys.path set-up above

from h3_core.diffusion import layout as L  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion.sampling import (  # noqa: E402 - after the sys.path set-up above
    DEFAULT_AUDIO_SHIFT,
    DEFAULT_VIDEO_SHIFT,
    sigma_schedule,
)
from h3_core.factory import load_engine  # noqa: E402 - after the sys.path set-up above
from h3_core.model.adaln_table import DEFAULT_CAPACITY  # noqa: E402 - after the sys.path set-up above
from h3_core.model.attention import BACKENDS, installed_version  # noqa: E402 - after the sys.path set-up above
from h3_core.model.encoder import QWEN3VL_H3_LAYER  # noqa: E402 - after the sys.path set-up above
from h3_core.model.fp8 import QUANTIZATIONS  # noqa: E402 - after the sys.path set-up above
from h3_core.weights.official_checkpoint import write_weightless_qwen3vl  # noqa: E402 - after the sys.path set-up above
from server.process import TritonServer, stub_pids  # noqa: E402 - after the sys.path set-up above
from server.repository import plan, write_repository  # noqa: E402 - after the sys.path set-up above

GIB = 2**30
WEIGHTS = "random:0"
STAGES = ("profile", "adaln", "decode", "served")
DECODE_REPEATS = 2
NAMES = {"none": "bf16", "fp8": "fp8"}  # quantization -> the name in summary keys
TEXT_ROWS = 64  # the profiled request's text rows (bench_client.py's prompts are shorter)
STEP_REPEATS = 2
ADALN_REQUESTS, ADALN_CANVAS, ADALN_STEPS = 8, (64, 64, 9), 49  # 128 rows each (64 x 64 px, 9 frames)
SERVER_TIMEOUT_S = 900.0
GPU = Setting("h3", "cuda", 768, 1344, 124, steps=49, b_requests=1, qwen3vl="h3")
CPU = Setting("tiny", "cpu", 64, 96, 22, steps=2, b_requests=1, qwen3vl="tiny")
CLIP_ROWS = {"h3": 38_400, "tiny": 4_096}  # h3_dit's max_batch_rows = row_budget for the clip (item 1)
# SGLang's, vLLM-Omni's and Diffusers' own reports of this clip, as issue 48 quotes them: (system, H200s,
# wall s, GPU-seconds per clip; the last from the reports' unrounded walls)
PUBLISHED = (
    ("SGLang diffusion, Ulysses 4", 4, 74.4, 297.5),
    ("SGLang diffusion, Ulysses 8", 8, 39.7, 317.4),
    ("vLLM-Omni, SP4 (quality=lossless)", 4, 85.5, 342.0),
    ("Diffusers, CP8", 8, 74.3, 594.7),
)


def sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def clip_inputs(setting: Setting, text_dim: int, device: str):
    """The clip's one-request pack (t = 0.5 video and audio) and random inputs on `device`."""
    layout = L.make_layout(TEXT_ROWS, setting.height, setting.width, setting.num_frames)
    g = torch.Generator(device).manual_seed(0)
    video = torch.randn(layout.video_rows, 96, generator=g, device=device)
    audio = torch.randn(layout.audio_rows, 32, generator=g, device=device)
    text = torch.randn(layout.text_len, text_dim, generator=g, device=device)
    return (video, audio, text), L.pack_requests([layout], [0.5], [0.75])


def load(setting: Setting, quantization: str, cuda: bool, **options) -> tuple[object, dict]:
    """load_engine's DiT (no encoder, no VAEs; `options` more of load_engine's arguments) and its
    load figures: seconds, and the peak GiB allocated while loading over what was allocated
    before (a DiT freed earlier may linger), and what stays allocated."""
    before = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    dit = load_engine(setting.config, WEIGHTS, setting.device, with_encoder=False, with_vaes=False,
                      quantization=quantization, **options).dit  # fmt: skip
    sync(cuda)
    return dit, {
        "load_s": time.perf_counter() - start,
        "load_peak_gib": (torch.cuda.max_memory_allocated() - before) / GIB if cuda else None,
        "allocated_gib_loaded": (torch.cuda.memory_allocated() - before) / GIB if cuda else None,
        "allocated_gib_before": before / GIB,
    }


def profile_stage(dit, setting: Setting, cuda: bool) -> dict:
    """The profile stage on a loaded DiT (module docstring): its figures."""
    result = {}
    values, batch = clip_inputs(setting, dit.cfg.text_dim, setting.device)
    result["rows"] = batch.total_rows

    def step():
        return dit(*values, batch)

    start = time.perf_counter()
    step()
    sync(cuda)
    result["first_step_s"] = time.perf_counter() - start
    times = []
    for _ in range(STEP_REPEATS):
        start = time.perf_counter()
        step()
        sync(cuda)
        times.append(time.perf_counter() - start)
    result["step_s"] = {"median": statistics.median(times), "runs": times}
    result["step_peak_gib"] = torch.cuda.max_memory_allocated() / GIB if cuda else None
    result["kernels"] = kernel_profile(step, torch.device(setting.device), warm_up=False)
    fills = []
    for value in (0.123, 0.234, 0.345):  # new timestep values: each fills every block's projection
        sync(cuda)
        start = time.perf_counter()
        dit.adaln_table.slots(torch.tensor([value]))
        sync(cuda)
        fills.append((time.perf_counter() - start) * 1000)
    result["adaln_fill_ms"] = statistics.median(fills)
    return result


def trajectory(dit, stagger: int, cuda: bool, steps: int) -> dict:
    """ADALN_REQUESTS 128-row requests, request r admitted at step r x stagger, each stepping
    `steps` sigma points: per global step its seconds (host wall, synchronised), requests in the
    pack, distinct timesteps and table fills; "outputs": the velocities of the last full pack's
    step (what the table must not change, bitwise)."""
    height, width, frames = ADALN_CANVAS
    layout = L.make_layout(16, height, width, frames)
    g = torch.Generator(dit.device).manual_seed(1)
    text_dim = dit.cfg.text_dim
    inputs = [
        (
            torch.randn(layout.video_rows, 96, generator=g, device=dit.device),
            torch.randn(layout.audio_rows, 32, generator=g, device=dit.device),
            torch.randn(layout.text_len, text_dim, generator=g, device=dit.device),
        )
        for _ in range(ADALN_REQUESTS)
    ]
    video_t, audio_t = sigma_schedule(steps, DEFAULT_VIDEO_SHIFT), sigma_schedule(steps, DEFAULT_AUDIO_SHIFT)
    table = dit.adaln_table
    out = {"seconds": [], "requests": [], "timesteps": [], "fills": []}
    for k in range(steps + stagger * (ADALN_REQUESTS - 1)):
        active = [(r, k - r * stagger) for r in range(ADALN_REQUESTS) if 0 <= k - r * stagger < steps]
        batch = L.pack_requests(
            [layout] * len(active), [video_t[i] for _, i in active], [audio_t[i] for _, i in active]
        )
        values = [torch.cat([inputs[r][part] for r, _ in active]) for part in range(3)]
        fills = table.fills if table is not None else 0
        sync(cuda)
        start = time.perf_counter()
        velocities = dit(*values, batch)
        sync(cuda)
        out["seconds"].append(time.perf_counter() - start)
        if len(active) == ADALN_REQUESTS:
            out["outputs"] = velocities
        out["requests"].append(len(active))
        out["timesteps"].append(len(batch.unique_timesteps))
        out["fills"].append((table.fills if table is not None else 0) - fills)
    return out


def adaln_stage(dit, cuda: bool, steps: int) -> dict:
    """The adaln stage (module docstring) on the bf16 DiT of the profile stage."""
    result, runs, outputs = {}, {}, {}
    for table in (True, False):
        if not table:
            dit.adaln_table = None
            if cuda:
                dit.use_cuda_graphs()  # graphs captured with the table read its memory
        for mode, stagger in (("mixed", 1), ("single", 0)):
            trajectory(dit, stagger, cuda, steps)  # compiles and captures this pass's packs
            if dit.adaln_table is not None:
                dit.adaln_table.slot_of.clear()  # a cold table: every value filled again
            captures = dit.graphs.captures if dit.graphs is not None else 0
            run = trajectory(dit, stagger, cuda, steps)
            run["captures"] = (dit.graphs.captures if dit.graphs is not None else 0) - captures
            full = [s for s, n in zip(run["seconds"], run["requests"], strict=True) if n == max(run["requests"])]
            run["mean_full_step_s"] = statistics.mean(full)
            run["fills_per_step"] = sum(run["fills"]) / len(run["fills"])
            outputs[mode, table] = run.pop("outputs", None)
            runs[f"{mode}_{'table' if table else 'no_table'}"] = run
    result["runs"] = runs
    dit.use_adaln_table(DEFAULT_CAPACITY)  # as served again, for the profile stage after this one
    result["table_bitwise"] = all(
        outputs[mode, True] is not None
        and all(torch.equal(a, b) for a, b in zip(outputs[mode, True], outputs[mode, False], strict=True))
        for mode in ("mixed", "single")
    )
    for suffix, name in (("", "table"), ("_no_table", "no_table")):
        result[f"mixed_over_single{suffix}"] = (
            runs[f"mixed_{name}"]["mean_full_step_s"] / runs[f"single_{name}"]["mean_full_step_s"]
        )
    return result


def decode_stage(setting: Setting, cuda: bool) -> dict:
    """The decode stage (module docstring): our VAEs of `random:0` on the device decode one clip's
    random latents (decode_clip, in tiles as h3_vae decodes): seconds (median of DECODE_REPEATS
    after one warm-up) and the peak GiB allocated over what was allocated before."""
    from h3_core.config import audio_latent_frames, latent_frames
    from h3_core.model.vae import decode_clip
    from h3_core.weights.vae_hook import load_vaes

    video_vae, audio_vae = load_vaes(WEIGHTS, setting.device)
    g = torch.Generator(setting.device).manual_seed(2)
    hw = (setting.height // 16, setting.width // 16)
    video = torch.randn(24, latent_frames(setting.num_frames), *hw, generator=g, device=setting.device)
    audio = torch.randn(2, 32, audio_latent_frames(setting.num_frames), generator=g, device=setting.device)
    decode_clip(video_vae, audio_vae, setting.num_frames, video, audio)
    sync(cuda)
    before = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(DECODE_REPEATS):
        start = time.perf_counter()
        frames, _ = decode_clip(video_vae, audio_vae, setting.num_frames, video, audio)
        sync(cuda)
        times.append(time.perf_counter() - start)
    result = {
        "seconds": {"median": statistics.median(times), "runs": times},
        "peak_gib": (torch.cuda.max_memory_allocated() - before) / GIB if cuda else None,
        "frames": list(frames.shape),
    }
    del video_vae, audio_vae, video, audio, frames
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def served_overrides(setting: Setting, quantization: str, attention_backend: str, work: Path) -> dict[str, dict]:
    """plan()'s overrides for the served clip (module docstring)."""
    folder = work / f"qwen3vl_{setting.qwen3vl}"
    if not (folder / "config.json").is_file():
        write_weightless_qwen3vl(folder, QWEN3VL_DIMS[setting.qwen3vl])
    canvas = {"max_height": setting.height, "max_width": setting.width, "max_num_frames": setting.num_frames}
    rows = CLIP_ROWS[setting.config]
    return {
        "h3_dit": {
            "quantization": quantization,
            "attention_backend": attention_backend,
            "max_num_seqs": 2,
            "max_batch_rows": rows,
            "row_budget": rows,
            "max_steps": 50,
            **canvas,
        },  # fmt: skip
        "h3_encoder": {
            "encoder_path": str(folder),
            "encoder_weights": QWEN3VL_WEIGHTS,
            "hidden_layer": QWEN3VL_H3_LAYER,
        },
        "h3_vae": {"decode_workers": 1, **canvas},
    }


def earlier_clips(paths: list[Path], settings: dict) -> list[dict]:
    """The measured clips of earlier runs of the served stage (each a clip768_bench.json) whose served
    settings equal `settings`: [{"wall_s", "denoise_s", "stage_seconds", "run"}], in the order given.

    Raises ValueError naming the file when its settings differ (another quantization, backend or
    canvas would mix two setups in one median)."""
    found = []
    for path in paths:
        document = json.loads(path.read_text())
        served = document.get("served", {})
        if served.get("settings") != settings:
            raise ValueError(f"--earlier {path}: its served settings {served.get('settings')} are not {settings}")
        for name, run in sorted(served.get("runs", {}).items()):
            if name.startswith("clip_") and not run["summary"]["failed"]:
                stages = stage_seconds(run)[0] or {}
                found.append({
                    "wall_s": run["summary"]["wall_s"],
                    "denoise_s": stages.get("denoise"),
                    "stage_seconds": stages,
                    "run": f"{path.name} {document.get('date')} {name}",
                })  # fmt: skip
    return found


def served_stage(setting, quantization, clips, warmup_steps, mp4, args, cuda, results, save) -> None:
    """The served stage (module docstring); fills results["served"] and the summary as it goes."""
    overrides = served_overrides(setting, quantization, args.attention_backend, args.work)
    repository = plan(setting.config, WEIGHTS, setting.device, [0] if cuda else [], overrides=overrides)
    served = results["served"] = {
        "settings": {key: str(value) for key, value in overrides["h3_dit"].items()},
        "notes": list(repository.notes),
        "return_mp4": mp4,
        "flash_attn_4": installed_version("flash-attn-4"),
        "runs": {},
    }
    earlier = served["earlier_clips"] = earlier_clips(args.earlier, served["settings"])
    directory = write_repository(args.work / "model_repository", repository)
    start, loading = time.perf_counter(), PeakMemory(cuda)
    with (
        loading,
        TritonServer(directory, free_ports=True, timeout=SERVER_TIMEOUT_S, log_file=args.work / "server.log") as server,
    ):
        served["load_s"] = time.perf_counter() - start
        names = {server.pid: "tritonserver", **stub_pids(server.pid)}
        loading.__exit__(None, None, None)  # the load's peaks: each process's, sampled while it loaded
        served["load_peak_gib_per_process"] = {k: gib(v) for k, v in loading.per_process_peak_mib(names).items()}
        results["summary"][f"{NAMES[quantization]}_served_load_peak_gib_h3_dit"] = served[
            "load_peak_gib_per_process"
        ].get("h3_dit_0_0")

        def run(name: str, steps: int) -> dict:
            document = bench(server, name, setting, 1, steps, mp4, args.work, args.out, cuda, names)
            served["runs"][name] = document
            save()
            return document

        cold = run("cold", warmup_steps)
        served["cold"] = {"wall_s": cold["summary"]["wall_s"], "stage_seconds": stage_seconds(cold)[0]}
        walls, denoise = [c["wall_s"] for c in earlier], [c["denoise_s"] for c in earlier]
        for i in range(clips):
            document = run(f"clip_{i}", setting.steps)
            if document["summary"]["failed"]:
                raise RuntimeError(f"clip {i} failed: {document['summary']}")
            walls.append(document["summary"]["wall_s"])
            denoise.append((stage_seconds(document)[0] or {}).get("denoise"))
            name = f"clip768_5s_{NAMES[quantization]}"
            results["summary"].update({
                f"{name}_s": statistics.median(walls),
                f"{name}_denoise_s": statistics.median(d for d in denoise if d is not None) if any(denoise) else None,
                f"{name}_clips": len(walls),
                f"{name}_attention": args.attention_backend
                + (f" (flash-attn-4 {served['flash_attn_4']})" if served["flash_attn_4"] else ""),
                f"{name}_cold_s": served["cold"]["wall_s"],
                f"{name}_seconds_per_step": document["dit_steps"]["seconds_per_step"],
                f"{name}_rows": document["dit_steps"]["rows_per_step"],
                f"{name}_peak_gpu_gib": gib(document["peak_gpu_memory_mib"]),
                f"{name}_peak_gib_per_process": per_process_gib(document),
                f"{name}_stage_seconds": [c["stage_seconds"] for c in earlier]
                + [stage_seconds(served["runs"][f"clip_{j}"])[0] for j in range(i + 1)],
            })  # fmt: skip
            save()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="clip768_bench.json and the timeline PNGs")
    parser.add_argument("--work", type=Path, help="repository, server log, encoder (default: a temporary folder)")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=["profile", "adaln"])
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="none", help="the served stage's h3_dit")
    parser.add_argument("--profile-quantizations", nargs="+", choices=QUANTIZATIONS, default=list(QUANTIZATIONS))
    parser.add_argument("--clips", type=int, default=2, help="measured clips of the served stage (median)")
    parser.add_argument("--warmup-steps", type=int, default=2, help="forwards of the served stage's cold request")
    parser.add_argument("--adaln-steps", type=int, default=ADALN_STEPS, help="sigma points of the adaln trajectories")
    parser.add_argument("--no-mp4", action="store_true", help="return_mp4=false even where PyAV is importable")
    parser.add_argument(
        "--attention-backend", choices=sorted(BACKENDS), default="sdpa", help="the served stage's h3_dit attention"
    )
    parser.add_argument(
        "--earlier",
        type=Path,
        nargs="*",
        default=[],
        help="clip768_bench.json of earlier served runs of the same "
        "settings: their clips join the median (each call of a GPU host fits one 49-forward bf16 clip)",
    )
    args = parser.parse_args()
    import importlib.util
    import tempfile

    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="h3_clip768."))
    args.work.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    setting = GPU if cuda else CPU
    mp4 = importlib.util.find_spec("av") is not None and not args.no_mp4
    results = {
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name(0) if cuda else "CPU",
        "torch": torch.__version__,
        "command": "PYTHONUNBUFFERED=1 python3 benchmarks/clip768_bench.py "
        + " ".join(sys.argv[1:]).replace(str(args.work), "WORK").replace(str(args.out), "DIR"),
        "setting": {**setting.__dict__, "weights": WEIGHTS, "clip_rows_setting": CLIP_ROWS[setting.config]},
        "gpu_memory_total_gib": gib(gpu_memory_mib("memory.total")) if cuda else None,
        "published": [{"system": s, "gpus": g, "wall_s": w, "gpu_s_per_clip": c} for s, g, w, c in PUBLISHED],
        "errors": {},
        "summary": {},
    }
    summary = results["summary"]

    def save() -> None:
        (args.out / "clip768_bench.json").write_text(json.dumps(results, indent=2, default=str) + "\n")

    def stage(name: str, body) -> None:
        try:
            body()
        except Exception as error:  # noqa: BLE001 - recorded in the JSON, the next stage still measures
            results["errors"][name] = f"{type(error).__name__}: {error}"
            print(f"--- {name} failed: {results['errors'][name]}", flush=True)
        save()

    save()
    # one load per quantization: bf16 first (the adaln stage, then its profile: an out-of-memory
    # profile on a smaller GPU then costs nothing else), then fp8
    for quantization in QUANTIZATIONS:
        name, held = NAMES[quantization], {}
        profiled = "profile" in args.stages and quantization in args.profile_quantizations
        adaln = "adaln" in args.stages and quantization == "none"
        if not (profiled or adaln):
            continue

        def load_dit(quantization=quantization, name=name, held=held):
            held["dit"], figures = load(setting, quantization, cuda)
            results.setdefault("loads", {})[name] = figures
            summary[f"{name}_load_peak_gib"] = figures["load_peak_gib"]
            print(f"--- load {name}: {json.dumps(figures)}", flush=True)

        def adaln_run(held=held):
            a = results["adaln"] = adaln_stage(held["dit"], cuda, args.adaln_steps)
            summary["adaln_mixed_over_single_8x128"] = a["mixed_over_single"]
            summary["adaln_mixed_over_single_8x128_no_table"] = a["mixed_over_single_no_table"]
            summary["adaln_fills_per_step_mixed"] = a["runs"]["mixed_table"]["fills_per_step"]
            summary["adaln_table_bitwise"] = a["table_bitwise"]

        def profile(name=name, held=held):
            p = results.setdefault("profile", {})[name] = profile_stage(held["dit"], setting, cuda)
            summary.update({
                f"step768_{name}_s": p["step_s"]["median"],
                f"step768_{name}_rows": p["rows"],
                f"step768_{name}_kernels_ms": {k: v["ms"] for k, v in p["kernels"].items()},
                f"adaln_fill_ms_{name}": p["adaln_fill_ms"],
            })  # fmt: skip
            print(f"--- profile {name}: {json.dumps({k: v for k, v in p.items() if k != 'kernels'})}", flush=True)

        def adaln_host(held=held):
            dit, figures = load(setting, "fp8", cuda, adaln_weights="host", adaln_table_values=ADALN_HOST_VALUES)
            layout = L.make_layout(TEXT_ROWS, setting.height, setting.width, setting.num_frames)
            h = results["adaln_host"] = {**figures, **host_fill(dit, held["dit"], layout, cuda)}
            summary.update({
                "fp8_dit_gpu_gib": results["loads"]["fp8"]["allocated_gib_loaded"],
                "fp8_dit_gpu_gib_adaln_off": h["allocated_gib_loaded"],
                "adaln_host_fill_49_s": h["fill_s"],
                "adaln_host_bitwise": h["bitwise"],
            })  # fmt: skip
            print(f"--- adaln host: {json.dumps(h)}", flush=True)

        stage(f"load_{name}", load_dit)
        if adaln and "dit" in held:
            stage("adaln", adaln_run)
        if profiled and "dit" in held:
            stage(f"profile_{name}", profile)
        if profiled and quantization == "fp8" and "dit" in held:
            stage("adaln_host", adaln_host)
        held.clear()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    if "decode" in args.stages:

        def decode():
            d = results["decode"] = decode_stage(setting, cuda)
            summary["decode768_5s_s"], summary["decode768_5s_peak_gib"] = d["seconds"]["median"], d["peak_gib"]

        stage("decode", decode)
    if "adaln_host" in results:
        qwen3vl = args.work / f"qwen3vl_{setting.qwen3vl}"
        stage("h100_fit", lambda: summary.update(h100_fit(summary, results, qwen3vl_gib(qwen3vl, setting.qwen3vl))))
    if "served" in args.stages:
        stage(
            "served",
            lambda: served_stage(
                setting, args.quantization, args.clips, args.warmup_steps, mp4, args, cuda, results, save
            ),
        )
    save()
    print_table(results)
    return 1 if results["errors"] else 0


def print_table(results: dict) -> None:
    s = results["summary"]
    print(f"\n{results['hardware']}: clip768 bench ({results['setting']['config']} DiT)")
    for key, value in s.items():
        if not isinstance(value, (dict, list)):
            print(f"  {key:<44} {value if not isinstance(value, float) else f'{value:.4g}'}")
    for name, p in results.get("profile", {}).items():
        kernels = ", ".join(f"{k} {v['ms']:.1f} ms" for k, v in p["kernels"].items())
        print(f"  kernels {name}: {kernels}")
    for name, error in results["errors"].items():
        print(f"stage {name} FAILED: {error}")


if __name__ == "__main__":
    sys.exit(main())
