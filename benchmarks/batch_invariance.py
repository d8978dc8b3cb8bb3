"""Batch invariance and step cost of the DiT's GEMM and compile settings, side by side (issue 16).

    PYTHONUNBUFFERED=1 python benchmarks/batch_invariance.py --out DIR [--variants NAME ...]

Each variant runs in a process of its own (CUBLAS_WORKSPACE_CONFIG must be set before cuBLAS
starts) on the `bench` DiT (full H3 width, 8 layers, bf16, seed-0 weights drawn on the GPU):
  tile4096        row tiles of 4096 (the 2026-11 default), eager, default cuBLAS workspace
  plain           one GEMM per linear (row_tile 0), eager, default workspace
  plain_ws0       one GEMM per linear, eager, CUBLAS_WORKSPACE_CONFIG=:0:0 (no split-K workspace)
  compiled_ws0    plain_ws0 with H3DiT.compile_blocks (torch.compile, dynamic shapes)
  fp8_compiled_ws0  compiled_ws0 with h3_dit's quantization = fp8 (h3_core.model.fp8: the block
                  linears in float8 e4m3, per-row activation scales)
and measures, in the same process:
  gemm sweep  for every linear shape of the DiT (h3_core's Linear, one GEMM per call): rows
              [o, o + M) of one 65,536-row GEMM against the GEMM of those M rows alone, M in
              64 .. 65,536, offsets o = 0, 1,088 (17 x 64) and 65,536 - M: bitwise or the largest
              difference (tests/test_gpu.py asserts bitwise with the served setting);
  packs       every request of the packs 1 x 128; 8 x 128; 128 + 16,384; 3 x 16,384;
              64 + 1,024 + 4,096 (rows at offsets 0, 64, 1,088: not multiples of any tile) against
              the same request stepped alone: bitwise or the largest difference;
  steps       median step seconds (Engine.denoise_step, 5 runs after 2 warm-ups) for the roofline
              packs 1 x 128, 8 x 128, 4 x 1,024, 1 x 16,384, 4 x 16,384, beside max(weight-read
              time at 4.8 TB/s, FLOPs / the 8192^3 bf16 matmul rate measured in the same process);
  compile     seconds of the first compiled step and the number of dynamo recompilations over
              all packs (compiled variants).
Writes DIR/batch_invariance_<variant>.json per variant and DIR/batch_invariance.json with all of
them, and prints a table last. CUDA only.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_bench import make_states, max_difference  # noqa: E402 - after the sys.path set-up above
from step_timing import matmul_rate, step_flops, timed  # noqa: E402 - after the sys.path set-up above

from h3_core.config import get_config  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion.engine import Engine  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion.request import RequestLimits  # noqa: E402 - after the sys.path set-up above
from h3_core.model import H3DiT  # noqa: E402 - after the sys.path set-up above
from h3_core.model.dit import Linear  # noqa: E402 - after the sys.path set-up above
from h3_core.model.fp8 import Fp8Linear, quantize_blocks  # noqa: E402 - after the sys.path set-up above
from h3_core.model.initialization import init_weights  # noqa: E402 - after the sys.path set-up above

VARIANTS = {
    "tile4096": {"row_tile": 4096, "workspace": None, "compile": False},
    "plain": {"row_tile": 0, "workspace": None, "compile": False},
    "plain_ws0": {"row_tile": 0, "workspace": ":0:0", "compile": False},
    "compiled_ws0": {"row_tile": 0, "workspace": ":0:0", "compile": True},
    "fp8_compiled_ws0": {"row_tile": 0, "workspace": ":0:0", "compile": True, "quantization": "fp8"},
}
SWEEP_ROWS = (64, 128, 192, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 49152, 65536)
HBM_BYTES_PER_S = 4.8e12
# request shapes (height, width, num_frames) and the padded rows they are pinned to
SHAPES = {64: (64, 96, 5), 128: (64, 96, 22), 1024: (288, 448, 22), 4096: (416, 768, 39), 16384: (384, 672, 209)}
PARITY_PACKS = {
    "1x128": [128],
    "8x128": [128] * 8,
    "128+16384": [128, 16384],
    "3x16384": [16384] * 3,
    "64+1024+4096": [64, 1024, 4096],
}
ROOFLINE_PACKS = {"1x128": [128], "8x128": [128] * 8, "4x1024": [1024] * 4, "1x16384": [16384], "4x16384": [16384] * 4}


def linear_shapes(dit: H3DiT) -> dict[str, tuple[int, int, torch.dtype, bool, bool]]:
    """(in_features, out_features, dtype, has bias, fp8) of every distinct linear of the DiT, named
    by its first module (a "meta" DiT gives them without memory); an Fp8Linear's dtype is the
    model's (its input's)."""
    shapes = {}
    for name, module in dit.named_modules():
        if isinstance(module, torch.nn.Linear):
            fp8 = isinstance(module, Fp8Linear)
            dtype = dit.cfg.torch_dtype if fp8 else module.weight.dtype
            key = (module.in_features, module.out_features, dtype, module.bias is not None, fp8)
            if key not in shapes.values():
                shapes[name] = key
    return shapes


def gemm_sweep(dit: H3DiT, device: torch.device, sweep_rows: tuple[int, ...] = SWEEP_ROWS) -> dict:
    """Per distinct linear shape of `dit` (linear_shapes): an h3_core Linear of that shape (seeded
    random weight and bias, one GEMM per call: row_tile 0, as the DiT runs on CUDA; quantised by
    Fp8Linear.from_linear where the DiT's is an Fp8Linear) applied to
    max(sweep_rows) random rows at once and to rows [o, o + M) alone, for M in sweep_rows and
    offsets o = 0, 1,088 (17 x 64) and max(sweep_rows) - M. Returns {name: {"in", "out", "dtype",
    "cases", "max_difference"}} where max_difference is the largest |difference| over the cases
    (0.0: row invariant, bit for bit). On CUDA the result depends on CUBLAS_WORKSPACE_CONFIG,
    which cuBLAS reads at its first GEMM in the process (use_bitwise_cublas)."""
    results, total = {}, max(sweep_rows)
    generator = torch.Generator(device=device).manual_seed(0)
    for name, (fan_in, fan_out, dtype, bias, fp8) in linear_shapes(dit).items():
        linear = Linear(fan_in, fan_out, bias=bias, device=device, dtype=dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(fan_out, fan_in, generator=generator, device=device, dtype=dtype))
            linear.weight.mul_(fan_in**-0.5)
            if bias:
                linear.bias.copy_(torch.randn(fan_out, generator=generator, device=device, dtype=dtype))
        if fp8:
            linear = Fp8Linear.from_linear(linear)
        x = torch.randn(total, fan_in, generator=generator, device=device, dtype=dtype)
        worst, cases = 0.0, 0
        with torch.inference_mode():
            full = linear(x)
            for rows in sweep_rows:
                for offset in sorted({0, 1088, total - rows}):
                    if offset + rows > total:
                        continue
                    worst = max(worst, max_difference(linear(x[offset : offset + rows]), full[offset : offset + rows]))
                    cases += 1
        results[name] = {
            "in": fan_in,
            "out": fan_out,
            "dtype": "float8_e4m3fn" if fp8 else str(dtype),
            "cases": cases,
            "max_difference": worst,
        }
        del linear, x, full
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def pinned_states(engine: Engine, rows_list: list[int]):
    """One state per entry of rows_list, each pinned to that many padded rows (seed 0)."""
    return [make_states(engine, SHAPES[rows], 1, seq_len=rows)[0] for rows in rows_list]


def pack_parity(engine: Engine) -> dict:
    """Per pack of PARITY_PACKS: the largest difference between a request's velocity in the pack
    and stepped alone (0.0 = bitwise)."""
    results = {}
    for name, rows_list in PARITY_PACKS.items():
        states = pinned_states(engine, rows_list)
        packed = engine.denoise_step(states)
        worst = 0.0
        for state, (video, audio) in zip(states, packed, strict=True):
            ((video_solo, audio_solo),) = engine.denoise_step([state])
            worst = max(worst, max_difference(video, video_solo), max_difference(audio, audio_solo))
        results[name] = {"bitwise": worst == 0.0, "max_difference": worst}
    return results


def step_times(engine: Engine, device: torch.device, rate: float) -> dict:
    """Per pack of ROOFLINE_PACKS: median step seconds, FLOPs, the roofline floor and the ratio."""
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.dit.parameters())
    results = {}
    for name, rows_list in ROOFLINE_PACKS.items():
        states = pinned_states(engine, rows_list)
        engine.denoise_step(states)
        seconds = timed(lambda states=states: engine.denoise_step(states), device, 5)
        flops = step_flops(engine, states)
        floor = max(weight_bytes / HBM_BYTES_PER_S, flops / rate)
        results[name] = {
            "rows": sum(rows_list),
            "seconds": seconds,
            "flops": flops,
            "floor_seconds": floor,
            "over_floor": seconds / floor,
            "mfu": flops / seconds / rate,
        }
    return results


def run_variant(name: str) -> dict:
    """Measure one variant in this process (its environment is already set)."""
    variant = VARIANTS[name]
    device = torch.device("cuda")
    cfg = get_config("bench")
    dit = H3DiT(cfg, row_tile=variant["row_tile"], device=device)
    init_weights(dit, 0)
    quantize_blocks(dit, variant.get("quantization", "none"))
    compile_seconds = None
    if variant["compile"]:
        dit.compile_blocks()
    engine = Engine(
        dit.eval(),
        None,
        None,
        None,
        RequestLimits(max_height=1024, max_width=1024, max_num_frames=257, max_rows=2**20, max_request_mb=2**20),
    )
    if variant["compile"]:
        start = time.perf_counter()
        engine.denoise_step(pinned_states(engine, [128]))
        torch.cuda.synchronize()
        compile_seconds = time.perf_counter() - start
    rate = matmul_rate(device, cfg.torch_dtype)
    result = {
        "variant": name,
        "settings": variant,
        "matmul_flops_per_s": rate,
        "compile_seconds": compile_seconds,
        "gemm_sweep": gemm_sweep(dit, device),
        "packs": pack_parity(engine),
        "steps": step_times(engine, device, rate),
    }
    if variant["compile"]:
        from torch._dynamo.utils import counters

        result["recompiles"] = sum(counters["recompiles"].values()) if "recompiles" in counters else 0
        result["graph_breaks"] = sum(counters["graph_break"].values())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        result = run_variant(args.one)
        (args.out / f"batch_invariance_{args.one}.json").write_text(json.dumps(result, indent=1))
        return
    if not torch.cuda.is_available():
        sys.exit("batch_invariance.py needs a CUDA GPU")
    document = {
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "python benchmarks/batch_invariance.py --out DIR"
        + ("" if args.variants == list(VARIANTS) else " --variants " + " ".join(args.variants)),
        "variants": {},
    }
    for name in args.variants:
        env = dict(os.environ)
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if VARIANTS[name]["workspace"]:
            env["CUBLAS_WORKSPACE_CONFIG"] = VARIANTS[name]["workspace"]
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--one", name], env=env)
        print(f"--- {name}: exit {done.returncode} in {time.perf_counter() - start:.0f} s", flush=True)
        path = args.out / f"batch_invariance_{name}.json"
        if done.returncode == 0 and path.is_file():
            document["variants"][name] = json.loads(path.read_text())
        (args.out / "batch_invariance.json").write_text(json.dumps(document, indent=1))
    print(f"{'variant':>13} | {'gemm worst':>10} | {'packs bitwise':>13} | " + " | ".join(ROOFLINE_PACKS))
    for name, result in document["variants"].items():
        gemm = max(r["max_difference"] for r in result["gemm_sweep"].values())
        packs = sum(r["bitwise"] for r in result["packs"].values())
        steps = " | ".join(f"{result['steps'][p]['seconds'] * 1e3:7.1f} ms" for p in ROOFLINE_PACKS)
        print(f"{name:>13} | {gemm:10.2e} | {packs:>6}/{len(PARITY_PACKS):<6} | {steps}")


if __name__ == "__main__":
    main()
