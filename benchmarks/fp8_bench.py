"""fp8 block linears (h3_dit quantization = fp8, h3_core.model.fp8) against bf16, side by side in
one process on one GPU (issue 32).

    PYTHONUNBUFFERED=1 python benchmarks/fp8_bench.py --out DIR [--sections steps bitwise quality]
        [--captions FILE]

  steps    the full H3 DiT (config h3, 50 layers, `random:0` drawn on the GPU) built as h3_dit builds
           it (h3_core.factory.load_engine: bitwise cuBLAS, compiled blocks, CUDA graphs up to 4,096
           rows), first in bf16, then freed and built again in fp8: the weights' GPU memory (bytes
           allocated after loading), the warm-up (compile) seconds, the median step seconds
           (Engine.denoise_step, 3 runs after a warm-up) of the packs 1 x 128, 8 x 128, 1 x 16,384
           and 4 x 16,384 rows, the peak memory of the 4 x 16,384 step over the weights (activation
           bytes per row and unit of hidden_size, server.sizing's constant), and the velocity of
           the 1 x 16,384-row request's first step in fp8 against bf16 (relative L2 error, cosine).
           Then, on the fp8 DiT, the 1 x 16,384 step with the attention backends `sdpa` and
           `auto` (flash-attn-4 from 8,192 rows where it is installed), 2 interleaved runs of 3
           timed steps each.
  bitwise  on the fp8 DiT: engine_bench's bitwise packs (1 x 128; 8 x 128; 128 + 16,384;
           3 x 16,384; 64 + 1,024 + 4,096, 2 or 3 steps each): packed == solo == request mode,
           torch.equal -> fp8_bitwise_solo_packed_request.
  quality  the trained demo model (weights/demo, config demo run in bf16: the baseline), the
           same weights in fp8, and in float32 (the config's own dtype, as shipped), in-process on
           the GPU: the 36 held-out cases of every task of training.data.TASKS (t2va, fl2va
           first / last / both, ref2va image / audio), 8 steps, seeds 0, 1 and 2 (3 x 36 clips a
           task; minima and medians over all of them, and the minimum PSNR per seed), 4 requests
           a forward (training.evaluate.generate with the caption states of --captions,
           training.text_states' format: the GPU host has no MiniLM). Per clip the
           SSIM and PSNR of the decoded frames and the SNR of the audio of fp8 against bf16
           (training.measure), the same of bf16 against float32 (how far a mere rounding change
           moves these clips), and each variant's attribute accuracy (the lowest over the seeds;
           fp8_demo_accuracy_unchanged compares fp8 with bf16 seed by seed).
Writes DIR/fp8_bench.json (after every section) whose `summary` bench_report.py --merge-into files
into benchmarks/results/h200.json; prints a short table last. CUDA only.
"""

import argparse
import dataclasses
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

from engine_bench import ATTENTION_COMPARED, GPU_BITWISE, bitwise, pack_states  # noqa: E402 - after sys.path
from step_timing import timed  # noqa: E402 - after sys.path

from h3_core.config import get_config  # noqa: E402 - after sys.path
from h3_core.diffusion.request import RequestLimits  # noqa: E402 - after sys.path
from h3_core.factory import load_engine  # noqa: E402 - after sys.path
from h3_core.model.attention import get_attention_backend  # noqa: E402 - after sys.path
from h3_core.model.dit import use_bitwise_cublas  # noqa: E402 - after sys.path
from h3_core.model.fp8 import QUANTIZATIONS  # noqa: E402 - after sys.path (none, then fp8)

SECTIONS = ("steps", "bitwise", "quality")
PACKS = {"1x128": [128], "8x128": [128] * 8, "1x16384": [16384], "4x16384": [16384] * 4}
LIMITS = RequestLimits(max_height=1024, max_width=1024, max_num_frames=257, max_rows=2**20, max_request_mb=2**20)
GIB = 2**30
DEMO_WEIGHTS = ROOT / "weights" / "demo"
DEMO_STEPS, DEMO_PACK, DEMO_SEEDS = 8, 4, (0, 1, 2)


def release(device: torch.device) -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


def measure_steps(quantization: str, device: torch.device, reference: torch.Tensor | None) -> tuple[dict, object]:
    """One variant of the `steps` section; returns (its results, the engine) and, for bf16, keeps
    the first step's velocity of the 1 x 16,384 request in results["_velocity"] (on the CPU)."""
    release(device)
    before = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    engine = load_engine("h3", "random:0", str(device), with_encoder=False, with_vaes=False, limits=LIMITS,
                         quantization=quantization)  # fmt: skip
    weights = torch.cuda.memory_allocated(device) - before
    result = {"load_seconds": time.perf_counter() - start, "weight_bytes": weights, "weight_gib": weights / GIB}
    result["compile_seconds"] = engine.warm_up()
    result["steps"] = {}
    for name, rows in PACKS.items():
        states = pack_states(engine, rows)
        torch.cuda.reset_peak_memory_stats(device)
        seconds = timed(lambda states=states: engine.denoise_step(states), device, 3)
        peak = torch.cuda.max_memory_allocated(device) - before - weights
        result["steps"][name] = {"rows": sum(rows), "seconds": seconds, "peak_activation_bytes": peak}
        if name == "1x16384":
            ((video, audio),) = engine.denoise_step(states)
            velocity = torch.cat([video.flatten(), audio.flatten()]).float().cpu()
            if reference is None:
                result["_velocity"] = velocity
            else:
                result["velocity_vs_bf16"] = {
                    "relative_l2_error": float((velocity - reference).norm() / reference.norm()),
                    "cosine": float(torch.nn.functional.cosine_similarity(velocity, reference, dim=0)),
                }
        del states
    rows = PACKS["4x16384"]
    peak = result["steps"]["4x16384"]["peak_activation_bytes"]
    result["bytes_per_row_and_width"] = peak / sum(rows) / engine.dit.cfg.hidden_size
    return result, engine


def attention_seconds(engine, device: torch.device, runs: int = 2) -> dict:
    """{backend: [median seconds of 3 steps of one 16,384-row request, per run]} for `sdpa` and
    `auto` as the DiT's attention, the order reversed every other run; the DiT's own after."""
    own, states = engine.dit.attention, pack_states(engine, [16384])
    seconds = {name: [] for name in ATTENTION_COMPARED}
    for i in range(runs):
        for name in ATTENTION_COMPARED if i % 2 == 0 else reversed(ATTENTION_COMPARED):
            engine.dit.attention = get_attention_backend(name, device, engine.dit.cfg.torch_dtype)
            seconds[name].append(timed(lambda: engine.denoise_step(states), device, 3))
    engine.dit.attention = own
    return seconds


def section_steps(device: torch.device, results: dict) -> object:
    """bf16 then fp8 (see the module docstring); returns the fp8 engine for the next sections."""
    variants, reference, engine = {}, None, None
    for quantization in QUANTIZATIONS:
        engine = None
        result, engine = measure_steps(quantization, device, reference)
        reference = result.pop("_velocity", reference)
        variants[quantization] = result
        print(f"--- steps {quantization}: " + json.dumps(result["steps"]), flush=True)
    variants["fp8"]["attention"] = attention_seconds(engine, device)
    results["steps"] = variants
    bf16, fp8 = variants["none"], variants["fp8"]
    summary = results["summary"]
    summary["fp8_dit_weight_gib"] = fp8["weight_gib"]
    summary["bf16_dit_weight_gib"] = bf16["weight_gib"]
    for name in PACKS:
        summary[f"fp8_step_s_{name}_h3"] = fp8["steps"][name]["seconds"]
        summary[f"bf16_step_s_{name}_h3"] = bf16["steps"][name]["seconds"]
        summary[f"fp8_speedup_{name}_h3"] = bf16["steps"][name]["seconds"] / fp8["steps"][name]["seconds"]
    summary["fp8_step_s_16384_h3"] = fp8["steps"]["1x16384"]["seconds"]
    summary["fp8_speedup_16384_h3"] = summary["fp8_speedup_1x16384_h3"]
    summary["fp8_velocity_relative_error"] = fp8["velocity_vs_bf16"]["relative_l2_error"]
    summary["fp8_velocity_cosine"] = fp8["velocity_vs_bf16"]["cosine"]
    summary["fp8_bytes_per_row_and_width"] = fp8["bytes_per_row_and_width"]
    summary["bf16_bytes_per_row_and_width"] = bf16["bytes_per_row_and_width"]
    attention = variants["fp8"]["attention"]
    summary["fp8_auto_over_sdpa_16384"] = statistics.median(attention["auto"]) / statistics.median(attention["sdpa"])
    return engine


def section_bitwise(engine, results: dict) -> None:
    packs = bitwise(engine, GPU_BITWISE)
    results["bitwise"] = packs
    results["summary"]["fp8_bitwise_solo_packed_request"] = all(p["bitwise"] for p in packs.values())


DEMO_VARIANTS = {"none": ("bfloat16", "none"), "fp8": ("bfloat16", "fp8"), "float32": ("float32", "none")}


def demo_engine(variant: str, device: torch.device):
    """The demo weights and VAEs with DEMO_VARIANTS[variant]'s (DiT dtype, quantization)."""
    dtype, quantization = DEMO_VARIANTS[variant]
    cfg = dataclasses.replace(get_config("demo"), dtype=dtype)
    return load_engine(cfg, DEMO_WEIGHTS, str(device), with_encoder=False, quantization=quantization)


def compared(outputs: list, reference: list) -> dict:
    """Minimum and median per-clip SSIM, PSNR (frames) and audio SNR of outputs against reference."""
    from training import measure

    pairs = list(zip(outputs, reference, strict=True))
    values = {
        "ssim": [measure.ssim(a[0], b[0]) for a, b in pairs],
        "psnr_db": [measure.psnr(a[0], b[0]) for a, b in pairs],
        "audio_snr_db": [measure.snr_db(a[1], b[1]) for a, b in pairs],
    }
    return {f"{k}_{f.__name__}": f(v) for k, v in values.items() for f in (min, statistics.median)}


def section_quality(device: torch.device, captions: Path, results: dict) -> None:
    from training import data, text_states
    from training.evaluate import generate, report

    names, _, tensors = text_states.load(captions)
    states = dict(zip(names, tensors, strict=True))
    clips = data.held_out_clips()
    outputs, accuracy = {}, {}
    for variant in DEMO_VARIANTS:
        release(device)
        engine = demo_engine(variant, device)
        outputs[variant] = {
            task: [generate(engine, clips, DEMO_STEPS, seed, DEMO_PACK, states, task) for seed in DEMO_SEEDS]
            for task in data.TASKS
        }
        accuracy[variant] = {
            task: [report(clips, out)["attribute_accuracy"] for out in outputs[variant][task]] for task in data.TASKS
        }
        del engine

    def pooled(variant: str, task: str) -> list:
        return [clip for out in outputs[variant][task] for clip in out]

    per_task = {
        task: {
            "fp8_vs_bf16": compared(pooled("fp8", task), pooled("none", task)),
            "bf16_vs_float32": compared(pooled("none", task), pooled("float32", task)),
            "fp8_vs_bf16_min_psnr_db_per_seed": {
                seed: compared(outputs["fp8"][task][i], outputs["none"][task][i])["psnr_db_min"]
                for i, seed in enumerate(DEMO_SEEDS)
            },
            "attribute_accuracy": {variant: min(accuracy[variant][task]) for variant in DEMO_VARIANTS},
            "fp8_accuracy_unchanged_every_seed": accuracy["fp8"][task] == accuracy["none"][task],
        }
        for task in data.TASKS
    }
    results["quality"] = {"n_cases": len(clips), "steps": DEMO_STEPS, "seeds": list(DEMO_SEEDS), "per_task": per_task}
    summary = results["summary"]
    for pair, prefix in (("fp8_vs_bf16", "fp8_demo"), ("bf16_vs_float32", "bf16_vs_float32_demo")):
        summary[f"{prefix}_min_ssim"] = min(t[pair]["ssim_min"] for t in per_task.values())
        summary[f"{prefix}_min_psnr_db"] = min(t[pair]["psnr_db_min"] for t in per_task.values())
        summary[f"{prefix}_median_psnr_db"] = statistics.median(t[pair]["psnr_db_median"] for t in per_task.values())
        summary[f"{prefix}_min_audio_snr_db"] = min(t[pair]["audio_snr_db_min"] for t in per_task.values())
    summary["fp8_demo_accuracy_unchanged"] = all(t["fp8_accuracy_unchanged_every_seed"] for t in per_task.values())


def print_table(results: dict) -> None:
    summary = results["summary"]
    print(f"{'key':>40} | value")
    for key, value in summary.items():
        print(f"{key:>40} | {value:.4f}" if isinstance(value, float) else f"{key:>40} | {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--captions", type=Path, help="caption states of the held-out prompts (quality)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("fp8_bench.py needs a CUDA GPU")
    if "quality" in args.sections and args.captions is None:
        parser.error("the quality section needs --captions")
    use_bitwise_cublas()
    device = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python benchmarks/fp8_bench.py --out DIR --sections " + " ".join(args.sections),
        "summary": {},
    }

    def save() -> None:
        (args.out / "fp8_bench.json").write_text(json.dumps(results, indent=1))

    engine = None
    if "steps" in args.sections or "bitwise" in args.sections:
        if "steps" in args.sections:
            engine = section_steps(device, results)
        else:
            engine = load_engine("h3", "random:0", "cuda", with_encoder=False, with_vaes=False, limits=LIMITS,
                                 quantization="fp8")  # fmt: skip
            engine.warm_up()
        save()
        if "bitwise" in args.sections:
            section_bitwise(engine, results)
            save()
    del engine
    if "quality" in args.sections:
        section_quality(device, args.captions, results)
        save()
    print_table(results)


if __name__ == "__main__":
    main()
