"""Attention backends, GEMM row parity and the bench DiT on the GPU (issue 4).

    PYTHONUNBUFFERED=1 python benchmarks/gpu_backends.py --out DIR [--backends NAME ...] [--sections NAME ...]

On a CUDA device (bf16, 56 heads x 128) it measures:
  (a) parity per attention backend: a document's output solo vs packed (behind the largest
      document, followed by a 55-row padding document) for documents of 128..16,384 rows;
      strided q/k/v views of a fused projection vs contiguous copies at 3 x 16,384 rows (field
      case C13); the relative error of a packed call against a float32 reference;
  (b) time per backend for packs of n documents of L rows, and 3 x 16,384 rows at 24 heads;
  (c) the DiT's linear shapes as plain and as row-tiled GEMMs (dit.Linear): is a request's
      result bitwise the same solo and co-batched (second of 3 requests, behind a small
      request, a 64-row text block as second of 3), and the time of a 3-request GEMM;
  (d) the `bench` DiT (random weights from seed 0, text width 5120, 9 text tokens): a request
      of 672x384, 209 frames (16,384 rows) solo vs co-batched with two more and behind a
      128-row request, bitwise, with one step's time (CUDA events, after a warm-up), per
      attention backend and row tile (0 = plain cuBLAS GEMMs);
  (e) flex attention compiled for each shape (automatic dynamic shapes off): parity and time.
--backends picks the attention backends of (a) and (b) (default: every one in BACKENDS, e.g.
`--backends sdpa varlen flash_attn4`); one that cannot run is recorded with the reason, as is
one that fails. --sections picks the sections (default: all: attention, flex_static, gemm, dit).
On the CPU the same code runs with tiny sizes (float32, 4 heads x 16, the `tiny` DiT) as a
smoke test. Prints a short table last; writes DIR/gpu_backends.json.
"""

import argparse
import datetime
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3_core.config import AUDIO_ROW_WIDTH, VIDEO_ROW_WIDTH, get_config  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion import layout as L  # noqa: E402 - after the sys.path set-up above
from h3_core.model import H3DiT  # noqa: E402 - after the sys.path set-up above
from h3_core.model.attention import (  # noqa: E402 - after the sys.path set-up above
    BACKENDS,
    Documents,
    get_attention_backend,
    installed_version,
    sdpa_per_document,
    unavailable_reason,
)
from h3_core.model.dit import Linear, use_bitwise_cublas  # noqa: E402 - after the sys.path set-up above
from h3_core.model.initialization import init_weights  # noqa: E402 - after the sys.path set-up above


@dataclass(frozen=True)
class Sizes:
    dtype: torch.dtype
    heads: int
    head_dim: int
    doc_rows: tuple[int, ...]  # document lengths for parity and timing
    pack_docs: tuple[int, ...]  # documents per timed pack
    max_pack_rows: int  # timed packs hold at most this many rows
    dit: str  # DiT config name
    request: tuple[int, int, int, int]  # make_layout(text_len, height, width, num_frames)
    small_request: tuple[int, int, int, int]
    dit_variants: tuple[tuple[str, int], ...]  # (attention backend, row tile; 0 = one GEMM)
    gemm_tiles: tuple[int, ...]  # row tiles for the GEMM probe


GPU_SIZES = Sizes(
    torch.bfloat16,
    56,
    128,
    (128, 512, 2048, 8192, 16384),
    (1, 3, 12, 96),
    49152,
    "bench",
    (9, 384, 672, 209),
    (9, 64, 96, 22),
    (("sdpa", 0), ("sdpa", 2048), ("sdpa", 4096), ("sdpa", 8192), ("auto", 4096)),
    (64, 1024, 2048, 4096, 8192, 16384),
)
CPU_SIZES = Sizes(
    torch.float32,
    4,
    16,
    (64, 192),
    (1, 3),
    576,
    "tiny",
    (9, 128, 128, 39),
    (9, 32, 32, 1),
    (("sdpa", 0), ("sdpa", 64), ("auto", 64)),
    (64, 128),
)
PAD_ROWS = 55  # a padding document, as behind a 16,329-row request
# distributions whose versions the JSON records (None: not installed), flash_attn4's among them
PACKAGES = (
    "flash_attn",
    "flash-attn-4",
    "nvidia-cutlass-dsl",
    "nvidia-cutlass-dsl-libs-base",
    "nvidia-cutlass-dsl-libs-cu13",
    "quack-kernels",
    "apache-tvm-ffi",
)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def elapsed_ms(fn, device: torch.device) -> float:
    """Milliseconds of one fn() call: CUDA events on the GPU, the wall clock on the CPU."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_ms(fn, device: torch.device, budget_ms: float = 300.0) -> float:
    """Median of 3 to 30 timed calls (as many as fit in budget_ms) after one warm-up call."""
    fn()
    synchronize(device)
    times = [elapsed_ms(fn, device)]
    reps = max(3, min(30, int(budget_ms / max(times[0], 1e-3))))
    times += [elapsed_ms(fn, device) for _ in range(reps - 1)]
    return statistics.median(times)


def fused_qkv(rows: int, heads: int, head_dim: int, s: Sizes, device, seed: int) -> torch.Tensor:
    """Random fused projection [rows, 3, heads, head_dim]; .unbind(1) gives strided q, k, v."""
    g = torch.Generator(device).manual_seed(seed)
    return torch.randn(rows, 3, heads, head_dim, generator=g, device=device, dtype=s.dtype)


def docs(bounds: list[int], device) -> Documents:
    """The attention Documents of `bounds` (cu_seqlens as ints), built once as a forward does."""
    return Documents(torch.tensor(bounds, dtype=torch.int32), bounds[-1], device)


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"bitwise": torch.equal(a, b), "max_abs_diff": (a.float() - b.float()).abs().max().item()}


def solo_vs_packed(fn, rows: int, s: Sizes, device) -> dict:
    """A document of `rows` rows alone vs behind the largest document and before a padding one."""
    neighbour = max(s.doc_rows)
    bounds = [0, neighbour, neighbour + rows, neighbour + rows + PAD_ROWS]
    fused = fused_qkv(bounds[-1], s.heads, s.head_dim, s, device, seed=rows)
    packed = fn(*fused.unbind(1), docs(bounds, device))[neighbour : neighbour + rows]
    solo = fn(*fused[neighbour : neighbour + rows].clone().unbind(1), docs([0, rows], device))
    return {"rows": rows, **compare(solo, packed)}


def attention_parity(fn, s: Sizes, device) -> dict:
    """Solo vs packed per document length, strided vs contiguous (C13), error vs float32."""
    neighbour = max(s.doc_rows)
    rows = 3 * neighbour
    bounds = [0, neighbour, 2 * neighbour, rows]
    fused = fused_qkv(rows, s.heads, s.head_dim, s, device, seed=1)
    q, k, v = fused.unbind(1)
    strided = fn(q, k, v, docs(bounds, device))
    contiguous = fn(q.contiguous(), k.contiguous(), v.contiguous(), docs(bounds, device))
    bounds = [0, 2048, 2560, 2624]
    fused = fused_qkv(bounds[-1], s.heads, s.head_dim, s, device, seed=2)
    out = fn(*fused.unbind(1), docs(bounds, device)).float()
    ref = sdpa_per_document(*fused.float().unbind(1), docs(bounds, device))
    return {
        "solo_vs_packed": [solo_vs_packed(fn, rows, s, device) for rows in s.doc_rows],
        "strided_vs_contiguous_3_docs": compare(strided, contiguous),
        "rel_error_vs_float32": ((out - ref).norm() / ref.norm()).item(),
    }


def time_attention(fn, rows: int, n: int, heads: int, s: Sizes, device) -> dict:
    """Milliseconds per call for a pack of n documents of `rows` rows."""
    q, k, v = fused_qkv(rows * n, heads, s.head_dim, s, device, seed=0).unbind(1)
    documents = docs([rows * i for i in range(n + 1)], device)
    ms = time_ms(lambda: fn(q, k, v, documents), device)
    print(f"  {rows:>6} rows x {n:>3} docs x {heads} heads: {ms:9.3f} ms")
    return {"doc_rows": rows, "docs": n, "heads": heads, "ms": ms}


def attention_timing(fn, s: Sizes, device) -> list[dict]:
    """Packs of n documents of L rows (s.pack_docs x s.doc_rows), and 3 x max L at 24 heads."""
    shapes = [(rows, n, s.heads) for rows in s.doc_rows for n in s.pack_docs if rows * n <= s.max_pack_rows]
    shapes.append((max(s.doc_rows), 3, 24))
    return [time_attention(fn, rows, n, heads, s, device) for rows, n, heads in shapes]


def flex_static_section(s: Sizes, device) -> dict:
    """Flex attention with a kernel compiled for each shape (automatic dynamic shapes off)."""
    if device.type != "cuda":
        return {"skipped": "flex runs eagerly on the CPU"}
    torch._dynamo.reset()
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=64):
        fn = BACKENDS["flex"]
        results = {
            "solo_vs_packed": [solo_vs_packed(fn, rows, s, device) for rows in (2048, 16384)],
            "timing": time_attention(fn, 16384, 3, 24, s, device),
        }
    torch._dynamo.reset()
    print(f"  {json.dumps(results)}")
    return results


def cuda_kernels(fn) -> list[str]:
    """Names of the CUDA kernels one fn() call launches (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name[:120] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def attention_section(s: Sizes, device, backends: tuple[str, ...]) -> dict:
    """Parity, timing and kernels of each backend in `backends` (those that cannot run: why)."""
    results = {}
    for name in backends:
        fn = BACKENDS[name]
        reason = unavailable_reason(name, device, s.dtype)
        print(f"backend {name}: {reason or 'available'}")
        if reason:
            results[name] = {"unavailable": reason}
            continue
        entry = results[name] = {}
        try:
            start = time.perf_counter()
            entry["parity"] = attention_parity(fn, s, device)
            entry["parity_s"] = time.perf_counter() - start  # with first-call compiles (flex, flash_attn4)
            print(f"  {json.dumps(entry['parity'])} ({entry['parity_s']:.1f} s)")
            entry["timing"] = attention_timing(fn, s, device)
            if device.type == "cuda":
                q, k, v = fused_qkv(3 * 16384, s.heads, s.head_dim, s, device, seed=0).unbind(1)
                documents = docs([0, 16384, 32768, 49152], device)
                entry["kernels"] = cuda_kernels(lambda fn=fn, q=q, k=k, v=v, d=documents: fn(q, k, v, d))
        except Exception as error:  # a backend that fails is recorded with what it measured so far
            entry["error"] = f"{type(error).__name__}: {error}"[:2000]
            print(f"  {entry['error'][:600]}")
    return results


def gemm_section(s: Sizes, device) -> list[dict]:
    """Row parity and time of the DiT's linear shapes, plain (tile 0) and row-tiled."""
    cfg = get_config(s.dit)
    rows, small = L.make_layout(*s.request).seq_len, L.make_layout(*s.small_request).seq_len
    shapes = [  # name, in, out, bias, dtype
        ("qkv_proj", cfg.hidden_size, 3 * cfg.attn_width, False, s.dtype),
        ("out_proj", cfg.attn_width, cfg.hidden_size, False, s.dtype),
        ("fc1", cfg.hidden_size, 2 * cfg.ffn_size, False, s.dtype),
        ("fc2", cfg.ffn_size, cfg.hidden_size, False, s.dtype),
        ("condition_proj", cfg.text_dim, cfg.hidden_size, True, s.dtype),
        ("video_patch_proj", VIDEO_ROW_WIDTH, cfg.hidden_size, True, torch.float32),
        ("video_out", cfg.hidden_size, VIDEO_ROW_WIDTH, True, torch.float32),
        ("audio_out", cfg.hidden_size, AUDIO_ROW_WIDTH, True, torch.float32),
    ]
    results = []
    for name, fan_in, fan_out, bias, dtype in shapes:
        linear = Linear(fan_in, fan_out, bias=bias, device=device, dtype=dtype)
        g = torch.Generator(device).manual_seed(0)
        x = torch.randn(3 * rows, fan_in, generator=g, device=device, dtype=dtype)
        for tile in (0, *s.gemm_tiles):
            linear.row_tile = tile
            with torch.inference_mode():
                request = linear(x[rows : 2 * rows])
                text = linear(x[64:128])
                entry = {
                    "linear": name,
                    "row_tile": tile,
                    "second_of_3": compare(request, linear(x)[rows : 2 * rows]),
                    "behind_small": compare(request, linear(x[rows - small : 2 * rows])[small:]),
                    "text_block_second_of_3": compare(text, linear(x[:192])[64:128]),
                    "ms_3_requests": time_ms(lambda linear=linear, x=x: linear(x), device),
                }
            results.append(entry)
            print(
                f"  {name:>16} tile {tile:>5}: "
                + " ".join(
                    f"{key}={entry[key]['bitwise']}"
                    for key in ("second_of_3", "behind_small", "text_block_second_of_3")
                )
                + f" {entry['ms_3_requests']:.3f} ms"
            )
        del x, linear
    return results


def dit_section(s: Sizes, device) -> dict:
    """Solo vs co-batched bitwise check and one step's time of the DiT, per (backend, row tile)."""
    cfg = get_config(s.dit)
    model = H3DiT(cfg, device=device)
    init_weights(model, 0)
    model.eval()
    layouts = [L.make_layout(*s.request)] * 3 + [L.make_layout(*s.small_request)]
    t_video, t_audio = [0.25, 0.5, 0.75, 0.4], [0.3, 0.55, 0.8, 0.45]
    inputs = []
    for seed, lay in enumerate(layouts):
        g = torch.Generator(device).manual_seed(seed)
        inputs.append(
            (
                torch.randn(lay.video_rows, VIDEO_ROW_WIDTH, generator=g, device=device),
                torch.randn(lay.audio_rows, AUDIO_ROW_WIDTH, generator=g, device=device),
                torch.randn(lay.text_len, cfg.text_dim, generator=g, device=device),
            )
        )

    def packed_call(indices):
        batch = L.pack_requests(
            [layouts[i] for i in indices], [t_video[i] for i in indices], [t_audio[i] for i in indices]
        )
        args = [torch.cat([inputs[i][part] for i in indices]) for part in range(3)]
        return lambda: L.split_rows(batch, *model(*args, batch))

    def same(a, b):
        return {
            "bitwise": all(torch.equal(x, y) for x, y in zip(a, b, strict=True)),
            "max_abs_diff": max((x - y).abs().max().item() for x, y in zip(a, b, strict=True)),
        }

    results = []
    for backend, tile in s.dit_variants:
        model.attention = get_attention_backend(backend, device, cfg.torch_dtype)
        model.set_row_tile(tile)
        solo = [packed_call([i])()[0] for i in range(4)]
        three = packed_call([0, 1, 2])()
        mixed = packed_call([3, 0, 1])()
        entry = {
            "attention_backend": backend,
            "row_tile": tile,
            "three_requests": [same(three[i], solo[i]) for i in range(3)],
            "behind_small_request": [same(mixed[j], solo[i]) for j, i in enumerate([3, 0, 1])],
            "ms_1_request": time_ms(packed_call([0]), device, budget_ms=0),
            "ms_3_requests": time_ms(packed_call([0, 1, 2]), device, budget_ms=0),
        }
        entry["bitwise"] = all(r["bitwise"] for r in entry["three_requests"] + entry["behind_small_request"])
        results.append(entry)
        print(
            f"  {backend}, row tile {tile}: bitwise {entry['bitwise']} "
            f"({json.dumps(entry['three_requests'] + entry['behind_small_request'])}); "
            f"1 request {entry['ms_1_request']:.1f} ms, 3 requests {entry['ms_3_requests']:.1f} ms"
        )
    return {
        "config": s.dit,
        "rows_per_request": layouts[0].seq_len,
        "small_request_rows": layouts[3].seq_len,
        "per_variant": results,
    }


def summary(results: dict) -> str:
    """The short table printed last."""
    lines = ["", "attention (ms per call; parity solo==packed for every length, strided==contiguous)"]
    attention = results.get("attention", {})
    if "error" in attention:  # the section itself failed
        attention = {"attention": attention}
    timed = {name: r for name, r in attention.items() if "timing" in r}
    names = list(timed)
    lines.append(f"{'doc rows x docs x heads':>24} " + " ".join(f"{n:>10}" for n in names))
    shapes = [(t["doc_rows"], t["docs"], t["heads"]) for t in timed[names[0]]["timing"]] if names else []
    for i, shape in enumerate(shapes):
        label = "{} x {} x {}".format(*shape)
        lines.append(f"{label:>24} " + " ".join(f"{timed[n]['timing'][i]['ms']:10.3f}" for n in names))
    for name, r in attention.items():
        if "parity" in r:
            p = r["parity"]
            diffs = max(x["max_abs_diff"] for x in p["solo_vs_packed"])
            lines.append(
                f"{name}: solo==packed bitwise {all(x['bitwise'] for x in p['solo_vs_packed'])} "
                f"(max diff {diffs:.3g}); strided==contiguous "
                f"{p['strided_vs_contiguous_3_docs']['bitwise']}; rel err {p['rel_error_vs_float32']:.3g}"
            )
        if "parity" not in r or "error" in r:
            lines.append(f"{name}: {r.get('unavailable') or r.get('error')}"[:200])
    lines.append("")
    if "flex_static" in results:
        lines.append(f"flex compiled per shape: {json.dumps(results['flex_static'])}"[:300])
        lines.append("")
    if "dit" not in results:
        return "\n".join(lines)
    if "error" in results["dit"]:
        return "\n".join(lines + [f"DiT: {results['dit']['error']}"])
    lines.append(
        f"DiT ({results['dit']['config']}): backend | row tile | bitwise solo==co-batched | 1 request ms | "
        "3 requests ms"
    )
    for r in results["dit"]["per_variant"]:
        lines.append(
            f"{r['attention_backend']:>8} | {r['row_tile']:>8} | {str(r['bitwise']):>5} | "
            f"{r['ms_1_request']:9.1f} | {r['ms_3_requests']:9.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_backends.json")
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=list(BACKENDS),
        default=list(BACKENDS),
        metavar="NAME",
        help=f"attention backends to measure, in this order (default: all of {', '.join(BACKENDS)})",
    )
    sections = {
        "attention": lambda s, device: attention_section(s, device, tuple(dict.fromkeys(args.backends))),
        "flex_static": flex_static_section,
        "gemm": gemm_section,
        "dit": dit_section,
    }
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=list(sections),
        default=list(sections),
        metavar="NAME",
        help=f"sections to run, in the order {', '.join(sections)} (default: all)",
    )
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        use_bitwise_cublas()  # before the first GEMM: the DiT's default on CUDA (h3_core.model.dit)
    s = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "packages": {name: installed_version(name) for name in PACKAGES},
        "backends": args.backends,
        "sizes": {k: str(v) if isinstance(v, torch.dtype) else v for k, v in asdict(s).items()},
    }
    if device.type == "cuda":
        results["sdp_enabled"] = {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        }
    print(json.dumps(results))
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for section, run in sections.items():
        if section not in args.sections:
            continue
        print(f"== {section} ({time.perf_counter() - start:.0f} s)")
        try:
            results[section] = run(s, device)
        except Exception as error:  # recorded; the other sections still run
            results[section] = {"error": f"{type(error).__name__}: {error}"[:2000]}
            print(results[section]["error"])
        (args.out / "gpu_backends.json").write_text(json.dumps(results, indent=1))
    print(summary(results))


if __name__ == "__main__":
    main()
